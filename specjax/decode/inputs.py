"""`BatchInputs`: one batch's per-call inputs, the argument both decode programs share.

`loop.generate_program(graphdef, params, cache, inputs, …)` and
`spec.program.speculative_program(graphdef, params, cache, inputs, draft_params, …)` take the same
pytree, and it says which of its arrays are per row (`row_axes`): on a mesh those are split over
'data' and everything else is replicated (`mesh.MeshPlan.place_inputs`), instead of guessing from
shapes (a grammar's state table can be as long as the batch).
"""

from __future__ import annotations

import jax
from flax import struct

from specjax.decode import constrain
from specjax.decode import stops as stops_lib

ROW_AXES = ("batch",)  # logical axes of a per-row array's leading dimension (`sharding.LOGICAL_RULES`)


@struct.dataclass
class BatchInputs:
    """The traced inputs of one batch of a decode program.

    Attributes:
      prompt_bt: right-padded prompt ids [B, T]; len_b their lengths (>= 1).
      active_b: rows to generate for (padding rows of a partial batch are False).
      max_new: new-token limit (traced scalar <= the program's n_out).
      key, temperature, top_p: sampling inputs (traced; the mode is the program's static `sampling`).
      stop_tables: compiled stop strings or None.
      grammar: the rows' grammars and initial states (`constrain.prepare`), or None for free text
        (static: None compiles the program without any grammar code).
    """

    prompt_bt: jax.Array
    len_b: jax.Array
    active_b: jax.Array
    max_new: jax.Array
    key: jax.Array
    temperature: jax.Array
    top_p: jax.Array
    stop_tables: stops_lib.StopTables | None = None
    grammar: constrain.BatchGrammar | None = None

    @property
    def rows(self) -> int:
        return self.prompt_bt.shape[0]

    def row_axes(self) -> BatchInputs:
        """The same structure with each array leaf replaced by its logical axes: `ROW_AXES` for per-row
        arrays (the prompts, lengths, active flags and the rows' grammar states), () for shared ones."""
        shared = jax.tree.map(lambda _: (), self)
        grammar = shared.grammar
        if grammar is not None:
            grammar = grammar.replace(state_b=ROW_AXES)
        return shared.replace(prompt_bt=ROW_AXES, len_b=ROW_AXES, active_b=ROW_AXES, grammar=grammar)
