"""Running the decode programs on a ('data', 'model') device mesh.

A `Generator` given a mesh keeps its parameters placed once with the shardings of
`specjax.models.sharding` (vocabulary, heads and MLP width split over 'model'), pads each batch
to a multiple of the 'data' size and places every per-row input and the KV cache with its
rows split over 'data'. The program itself is unchanged: the same prefill + `lax.while_loop`
is jitted with the committed input shardings and explicit output shardings, so the XLA SPMD
partitioner runs each device's rows on that device (what `pmap` used to do) and the donated
cache comes back with the sharding it went in with — the next call reuses it in place and
matches the compiled program, so calls of the same shapes never recompile.

Inputs are placed by what they are: the generator's own parameters keep their shardings, KV caches
get the cache sharding, a `BatchInputs` says which of its arrays are per row (`row_axes`: split over
'data'; the rest replicated), and anything else (a drafter's parameters) is replicated. Outputs are
the loop state, whose drafter part has no declared axes: per-row arrays are those whose leading
dimension is the padded batch (and any state carried per row, such as a drafter's), split over
'data'; the rest is replicated.
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import Mesh

from specjax.decode.backend import profile_for
from specjax.decode.inputs import ROW_AXES, BatchInputs
from specjax.models import sharding as sh
from specjax.models.kv_cache import KVCache


class MeshPlan:
    """Where a generator's arrays live on `mesh`.

    Args:
      mesh: a mesh with axes 'data' and 'model' (`sharding.make_mesh`).
      cfg: the model's ModelConfig (head counts for the divisibility checks).
      rules: logical-axis rules (`sharding.LOGICAL_RULES` or a `sharding.with_rules` copy).

    Raises:
      ShardingError: the mesh lacks an axis.
    """

    def __init__(self, mesh: Mesh, cfg, rules=sh.LOGICAL_RULES):
        missing = {sh.DATA, sh.MODEL} - set(mesh.axis_names)
        if missing:
            raise sh.ShardingError(f"the decode mesh needs axes 'data' and 'model'; {sorted(missing)} missing "
                                   f"from {mesh.axis_names} (use sharding.make_mesh)")
        self.mesh, self.cfg, self.rules = mesh, cfg, rules
        self.data = mesh.shape[sh.DATA]
        self._batch = sh.batch_sharding(mesh, rules)
        self._replicated = sh.replicated(mesh)
        self._params = None

    def rows(self, batch_size: int) -> int:
        """Rows of a device program: batch_size rounded up to a multiple of the 'data' size."""
        return -(-batch_size // self.data) * self.data

    def place_params(self, params):
        """Copies the model state with its parameter shardings (once per generator).

        Raises:
          ShardingError: a head count or dimension the 'model' size does not divide (named).
        """
        shardings = sh.param_shardings(params, self.mesh, self.rules, units=sh.model_units(self.cfg))
        self._params = sh.shard_state(params, shardings)
        return self._params

    def replicate(self, tree):
        """A copy of `tree` on every device (drafter weights, tables shared by all rows)."""
        return sh.shard_state(tree, self._replicated)

    def cache_sharding(self, cache: KVCache) -> KVCache:
        """The rules' cache shardings (a KVCache of them: keys and values are laid out differently); a
        cache whose kv heads 'model' does not divide (a drafter's own cache, say: the target's was
        checked with its k/v weights) keeps only the batch split."""
        try:
            keys = sh.cache_sharding(self.mesh, self.rules, shape=tuple(cache.k[0].shape))
            values = sh.cache_sharding(self.mesh, self.rules, shape=tuple(cache.v[0].shape), values=True)
        except sh.ShardingError:
            keys = values = self._batch
        return KVCache(k=tuple(keys for _ in cache.k), v=tuple(values for _ in cache.v))

    def place_cache(self, cache: KVCache) -> KVCache:
        """The KV cache with the rules' cache sharding."""
        return sh.shard_state(cache, self.cache_sharding(cache))

    def place_inputs(self, inputs: BatchInputs) -> BatchInputs:
        """A batch's inputs placed by their logical axes (`BatchInputs.row_axes`): per-row arrays split
        over 'data', the rest (scalars, keys, stop tables, grammar tables) on every device."""
        def place(x, axes):
            return sh.shard_state(x, self._batch if axes == ROW_AXES else self._replicated)

        return jax.tree.map(place, inputs, inputs.row_axes())

    def output_shardings(self, out, rows: int):
        """Shardings of a program's (abstract) output pytree: caches, per-row arrays, the rest."""

        def one(x):
            if isinstance(x, KVCache):
                return self.cache_sharding(x)
            is_row = len(x.shape) >= 1 and x.shape[0] == rows
            return self._batch if is_row else self._replicated

        return jax.tree.map(one, out, is_leaf=lambda x: isinstance(x, KVCache))

    def lower(self, program, graphdef, args: tuple, static: dict):
        """Lowers a jitted decode program (`loop.generate_program`, `speculative_program`, ...)
        for placed `args`: their shardings in, `output_shardings` out, KV caches donated.

        The batch size (rows) is read from the KV cache argument.
        """
        rows = next(a.batch for a in args if isinstance(a, KVCache))
        static = {"profile": profile_for(), **static}
        fun = functools.partial(program.__wrapped__, graphdef, **static)
        out = jax.eval_shape(fun, *args)
        donate = tuple(i for i, a in enumerate(args) if isinstance(a, KVCache))
        jitted = jax.jit(fun, out_shardings=self.output_shardings(out, rows), donate_argnums=donate,
                         compiler_options=static["profile"].options or None)
        return jitted.lower(*args)
