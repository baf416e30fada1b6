"""Running the decode programs on a ('data', 'model') device mesh.

A `Generator` given a mesh keeps its parameters placed once with the shardings of
`specjax.models.sharding` (vocabulary, heads and MLP width split over 'model'), pads each batch
to a multiple of the 'data' size and places every per-row input and the KV cache with its
rows split over 'data'. The program itself is unchanged: the same prefill + `lax.while_loop`
is jitted with the committed input shardings and explicit output shardings, so the XLA SPMD
partitioner runs each device's rows on that device (what `pmap` used to do) and the donated
cache comes back with the sharding it went in with — the next call reuses it in place and
matches the compiled program, so calls of the same shapes never recompile.

Placement is decided by position in the argument tuple, not by name, so a program with extra
arguments (a drafter's parameters, say) needs no change here: the generator's own parameters
keep their shardings, KV caches get the cache sharding, arrays whose first dimension is the
padded batch are split over 'data', and everything else (scalars, keys, stop tables, other
parameter trees) is replicated. Outputs follow the same rule: per-row arrays (and any state
carried per row, such as a drafter's) stay split over 'data'.
"""

from __future__ import annotations

import functools

import jax
from jax.sharding import Mesh

from specjax.models import sharding as sh
from specjax.models.kv_cache import IN_PLACE_COMPILER_OPTIONS, KVCache


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

    def cache_sharding(self, cache: KVCache):
        """The rules' cache sharding; a cache whose kv heads 'model' does not divide (a drafter's
        own cache, say: the target's was checked with its k/v weights) keeps only the batch split."""
        try:
            return sh.cache_sharding(self.mesh, self.rules, shape=tuple(cache.k[0].shape))
        except sh.ShardingError:
            return self._batch

    def _place_array(self, x, rows: int):
        is_row = x.ndim >= 1 and x.shape[0] == rows
        return sh.shard_state(x, self._batch if is_row else self._replicated)

    def place_args(self, args: tuple, rows: int) -> tuple:
        """Places a program's positional arguments (see the module doc for the rule)."""
        placed = []
        for a in args:
            if a is None or a is self._params:
                placed.append(a)
            elif isinstance(a, KVCache):
                placed.append(sh.shard_state(a, self.cache_sharding(a)))
            elif isinstance(a, jax.Array):
                placed.append(self._place_array(a, rows))
            else:  # stop tables, drafter parameters, ...: shared by all rows
                placed.append(self.replicate(a))
        return tuple(placed)

    def output_shardings(self, out, rows: int):
        """Shardings of a program's (abstract) output pytree: caches, per-row arrays, the rest."""

        def one(x):
            if isinstance(x, KVCache):
                return jax.tree.map(lambda _: self.cache_sharding(x), x)
            is_row = len(x.shape) >= 1 and x.shape[0] == rows
            return self._batch if is_row else self._replicated

        return jax.tree.map(one, out, is_leaf=lambda x: isinstance(x, KVCache))

    def lower(self, program, graphdef, args: tuple, static: dict):
        """Lowers a jitted decode program (`loop.generate_program`, `speculative_program`, ...)
        for placed `args`: their shardings in, `output_shardings` out, KV caches donated.

        The batch size (rows) is read from the KV cache argument.
        """
        rows = next(a.k[0].shape[0] for a in args if isinstance(a, KVCache))
        fun = functools.partial(program.__wrapped__, graphdef, **static)
        out = jax.eval_shape(fun, *args)
        donate = tuple(i for i, a in enumerate(args) if isinstance(a, KVCache))
        jitted = jax.jit(fun, out_shardings=self.output_shardings(out, rows), donate_argnums=donate,
                         compiler_options=IN_PLACE_COMPILER_OPTIONS)
        return jitted.lower(*args)
