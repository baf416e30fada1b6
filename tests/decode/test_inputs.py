"""`BatchInputs` (`decode/inputs.py`): the programs' shared batch argument declares its per-row arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decode.constrain import BatchGrammar
from specjax.decode.inputs import ROW_AXES, BatchInputs


def inputs(b, grammar=None):
    return BatchInputs(prompt_bt=jnp.zeros((b, 16), jnp.int32), len_b=jnp.ones((b,), jnp.int32),
                       active_b=jnp.ones((b,), bool), max_new=jnp.int32(8), key=jax.random.key(0),
                       temperature=jnp.float32(1.0), top_p=jnp.float32(1.0), grammar=grammar)


def test_row_axes_mark_the_per_row_arrays_only():
    axes = inputs(4).row_axes()
    assert (axes.prompt_bt, axes.len_b, axes.active_b) == (ROW_AXES,) * 3
    assert (axes.max_new, axes.key, axes.temperature, axes.top_p) == ((),) * 4
    assert axes.stop_tables is None and axes.grammar is None


def test_a_grammar_table_as_long_as_the_batch_is_not_taken_for_a_row_array():
    # The old rule (leading dimension == rows) split any array of length B; complete_s has one entry
    # per grammar state and here happens to have 4, like the batch.
    tables = {"trans_sb": jnp.zeros((4, 256), jnp.int32)}
    grammar = BatchGrammar(tables=tables, complete_s=jnp.zeros((4,), bool), state_b=jnp.ones((4,), jnp.int32))
    axes = inputs(4, grammar).row_axes()
    assert axes.grammar.state_b == ROW_AXES
    assert axes.grammar.complete_s == () and axes.grammar.tables == {"trans_sb": ()}
    # The axes tree lines up leaf for leaf with the inputs (what MeshPlan.place_inputs maps over).
    placed = jax.tree.map(lambda x, a: (x.shape, a), inputs(4, grammar), axes)
    assert placed.grammar.state_b == ((4,), ROW_AXES) and placed.prompt_bt == ((4, 16), ROW_AXES)
