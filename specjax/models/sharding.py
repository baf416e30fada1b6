"""One logical-axis rule table for placing models, caches and batches on a device mesh.

Every parameter dimension gets a *logical* axis name ("vocab", "embed", "heads", "mlp", ...)
from `PARAM_AXES`, a table of path patterns; `LOGICAL_RULES` then maps each logical name to a
mesh axis ("data", "model") or None (replicated). Decoding and training both use this module,
so a checkpoint laid out for one is laid out the same way for the other (the maxtext /
levanter scheme, with Megatron-style tensor parallelism on the 'model' axis):

  * attention: q/k/v projections split their output heads, the o projection its input heads,
    so each device holds whole heads and the only reduction is after `o` (and after `down`);
  * MLP: gate/up split the hidden width, down its input;
  * embedding / tied head: the vocabulary rows are split (the 262,144-row Gemma table is the
    biggest tensor of the model);
  * norms, biases of the residual width and the head dimension stay replicated;
  * activations and the KV cache split their batch over 'data'; the cache also splits its
    kv heads over 'model' (the layout the k/v projections produce).

FSDP (`fsdp=True`, for training): additionally, each parameter's largest still-replicated
dimension that the 'data' size divides is split over 'data', so optimizer state and weights
are not copied on every data-parallel replica.

Paths are matched on the dotted key path of any pytree leaf (an `nnx.State`, an optax state
holding parameter-shaped trees, a flat dict), so the table also covers states that nest the
model's parameters under other keys. Leaves whose path matches no pattern are REPLICATED, and
`param_partition_specs` reports them through `unmatched` (the caller decides whether to warn).

Head counts: the q/k/v/o weights store heads flattened with the head width ([d, n·h]); a
split must keep heads whole, so `units` (see `model_units`) gives the number of heads behind
the "heads" / "kv_heads" dimensions and a count that the mesh axis does not divide raises
`ShardingError` naming the parameter. Gemma 3 270M has ONE kv head: its k/v weights and cache
cannot be split over 'model' > 1; use `with_rules(kv_heads=None)` to replicate them instead.

Example:
  >>> mesh = make_mesh(data=4, model=2)
  >>> graphdef, state = nnx.split(model)
  >>> state = shard_state(state, param_shardings(state, mesh, units=model_units(model.cfg)))
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

DATA, MODEL = "data", "model"

# Logical axis → mesh axis (None: replicated). A tuple of pairs (flax's logical-rules form);
# `with_rules` returns a modified copy.
LOGICAL_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", DATA),
    ("vocab", MODEL),
    ("embed", None),
    ("heads", MODEL),
    ("kv_heads", MODEL),
    ("head_dim", None),
    ("mlp", MODEL),
    ("norm", None),
    ("cache_slots", None),
    ("quant_blocks", None),
)

# Dotted-path pattern (regex, searched at the end of the path) → logical axes of the leaf.
PARAM_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"attn\.q\.w", ("embed", "heads")),
    (r"attn\.q\.b", ("heads",)),
    (r"attn\.[kv]\.w", ("embed", "kv_heads")),
    (r"attn\.[kv]\.b", ("kv_heads",)),
    (r"attn\.o\.w", ("heads", "embed")),
    (r"attn\.[qk]_norm\.scale", ("head_dim",)),
    (r"mlp\.(gate|up)\.w", ("embed", "mlp")),
    (r"mlp\.down\.w", ("mlp", "embed")),
    (r"norm\.scale", ("norm",)),
    (r"head_quant\.values", ("vocab", "embed")),
    (r"head_quant\.(scale|offset)(_super)?", ("vocab", "quant_blocks")),
    (r"(^|\.)(embed|head)", ("vocab", "embed")),
)

# Axes of one KV-cache keys array [batch, slots, kv_heads, head_dim], of one values array (stored
# transposed, kv_cache.KVCache) and of activations [batch, ...].
CACHE_AXES = ("batch", "cache_slots", "kv_heads", "head_dim")
TRANSPOSED_CACHE_AXES = ("batch", "kv_heads", "head_dim", "cache_slots")
BATCH_AXES = ("batch",)


class ShardingError(ValueError):
    """A mesh or layout that cannot hold the given arrays (sizes that do not divide)."""


def with_rules(rules: Sequence[tuple[str, str | None]] = LOGICAL_RULES, **changes: str | None):
    """A copy of `rules` with some logical axes remapped, e.g. `with_rules(kv_heads=None)`."""
    table = dict(rules)
    unknown = sorted(set(changes) - set(table))
    if unknown:
        raise ShardingError(f"unknown logical axes {unknown} (known: {sorted(table)})")
    table.update(changes)
    return tuple(table.items())


def make_mesh(data: int = 1, model: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ('data', 'model') mesh over the first data·model devices (jax.make_mesh).

    Raises:
      ShardingError: a size is not a positive integer, or data·model does not divide the
        number of available devices.
    """
    for name, size in (("data", data), ("model", model)):
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ShardingError(f"mesh {name} size must be a positive integer, got {size!r}")
    devices = list(jax.devices() if devices is None else devices)
    n = data * model
    if n > len(devices) or len(devices) % n:
        raise ShardingError(
            f"mesh data={data} x model={model} needs {n} devices, which does not divide the {len(devices)} "
            f"available {devices[0].platform} device(s) (on CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N "
            f"before importing jax gives N devices)")
    return jax.make_mesh((data, model), (DATA, MODEL), axis_types=(AxisType.Auto, AxisType.Auto),
                         devices=devices[:n])


def model_units(cfg) -> dict[str, int]:
    """Head counts behind the flattened "heads" / "kv_heads" dimensions of a ModelConfig."""
    return {"heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads}


def path_name(path) -> str:
    """Dotted name of a pytree key path, dropping nnx's trailing `.value`."""
    parts = []
    for k in path:
        part = getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))
        parts.append(str(part))
    if parts and parts[-1] == "value":
        parts.pop()
    return ".".join(parts)


def logical_axes(name: str, ndim: int, axes_table=PARAM_AXES) -> tuple[str | None, ...] | None:
    """Logical axes of the parameter at dotted path `name`, or None when no pattern matches."""
    for pattern, axes in axes_table:
        if re.search(f"(?:{pattern})$", name) and len(axes) == ndim:
            return axes
    return None


def _mesh_axis_sizes(mesh: Mesh | Mapping[str, int] | None) -> dict[str, int] | None:
    if mesh is None:
        return None
    return dict(mesh.shape) if isinstance(mesh, Mesh) else dict(mesh)


def spec_for(name: str, shape: tuple[int, ...], axes: Iterable[str | None], rules, sizes: Mapping[str, int] | None,
             units: Mapping[str, int] | None = None) -> PartitionSpec:
    """PartitionSpec of one array with logical `axes`, checking that every split divides.

    Raises:
      ShardingError: a dimension (or its head count, for "heads"/"kv_heads") is not a
        multiple of its mesh axis size; the message names the array.
    """
    table = dict(rules)
    entries = []
    for dim, logical in zip(shape, axes, strict=True):
        mesh_axis = table.get(logical) if logical is not None else None
        if mesh_axis is not None and sizes is not None:
            size = sizes.get(mesh_axis, 1)
            count = (units or {}).get(logical, dim)
            what = f"{count} {logical.replace('_', ' ')}" if logical in (units or {}) else f"dimension {dim}"
            if count % size or dim % size:
                raise ShardingError(
                    f"{name} {tuple(shape)}: {what} cannot be split over mesh axis {mesh_axis!r} of size {size} "
                    f"(rule {logical!r} -> {mesh_axis!r}); choose a {mesh_axis} size dividing {count} or map "
                    f"{logical!r} to None (sharding.with_rules({logical}=None))")
        entries.append(mesh_axis)
    return PartitionSpec(*entries)


def _add_fsdp(spec: PartitionSpec, shape: tuple[int, ...], data: int) -> PartitionSpec:
    """Splits the largest replicated dimension divisible by `data` over 'data' (if any)."""
    entries = list(spec) + [None] * (len(shape) - len(spec))
    if DATA in entries or data == 1:
        return spec
    free = [i for i, e in enumerate(entries) if e is None and shape[i] % data == 0]
    if free:
        entries[max(free, key=lambda i: shape[i])] = DATA
    return PartitionSpec(*entries)


def param_partition_specs(state, rules=LOGICAL_RULES, *, mesh: Mesh | Mapping[str, int] | None = None,
                          fsdp: bool = False, units: Mapping[str, int] | None = None, axes_table=PARAM_AXES,
                          unmatched: list[str] | None = None):
    """A pytree like `state` with one PartitionSpec per array leaf.

    Args:
      state: any pytree of arrays (nnx.State, optax state, dict) whose leaf paths end in the
        parameter names of `axes_table`.
      rules: logical → mesh axis table (`LOGICAL_RULES`, or a `with_rules` copy).
      mesh: a Mesh or {axis: size}; given, every split is checked to divide (and FSDP needs it).
      fsdp: also split each parameter's largest replicated dimension over 'data'.
      units: head counts behind "heads"/"kv_heads" (`model_units(cfg)`), checked against 'model'.
      axes_table: path pattern → logical axes (default `PARAM_AXES`).
      unmatched: if a list is given, the names of leaves no pattern matched (replicated) are
        appended to it.

    Raises:
      ShardingError: a split does not divide (message names the parameter), or fsdp without mesh.
    """
    sizes = _mesh_axis_sizes(mesh)
    if fsdp and sizes is None:
        raise ShardingError("fsdp=True needs the mesh (its 'data' size decides which dimensions split)")

    def one(path, leaf):
        name, shape = path_name(path), tuple(leaf.shape)
        axes = logical_axes(name, len(shape), axes_table)
        if axes is None:
            if unmatched is not None:
                unmatched.append(name)
            spec = PartitionSpec()
        else:
            spec = spec_for(name, shape, axes, rules, sizes, units)
        return _add_fsdp(spec, shape, sizes.get(DATA, 1)) if fsdp else spec

    return jax.tree_util.tree_map_with_path(one, state)


def param_shardings(state, mesh: Mesh, rules=LOGICAL_RULES, *, fsdp: bool = False,
                    units: Mapping[str, int] | None = None, axes_table=PARAM_AXES, unmatched: list[str] | None = None):
    """`param_partition_specs` as NamedShardings on `mesh` (same pytree structure as `state`)."""
    specs = param_partition_specs(state, rules, mesh=mesh, fsdp=fsdp, units=units, axes_table=axes_table,
                                  unmatched=unmatched)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def _is_key(x) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _put_global(x, sharding, copy: bool):
    """One host value onto a sharding with other processes' devices: this process fills its own shards."""
    if _is_key(x):  # typed PRNG keys place through their raw uint32 data
        data = _put_global(jax.random.key_data(x), sharding, copy)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    if isinstance(x, jax.Array) and not x.is_fully_addressable:  # already global: a reshard
        return jax.device_put(x, sharding)
    host = np.array(x) if copy else np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard_state(state, shardings, *, may_alias: bool | None = None):
    """Places (copies) every array of `state` with its sharding; returns the placed pytree.

    `shardings` is one sharding or a pytree prefix of `state` (as for `jax.device_put`). On a
    mesh spanning several processes (`specjax.distributed`), every process passes the same host
    values and keeps the shards of its own devices: nothing is sent between processes (where
    `jax.device_put` would first gather every array to check that the processes agree).
    """
    is_sharding = lambda s: isinstance(s, jax.sharding.Sharding)
    if all(s.is_fully_addressable for s in jax.tree.leaves(shardings, is_leaf=is_sharding)):
        return jax.device_put(state, shardings, may_alias=may_alias)
    put = lambda s, subtree: jax.tree.map(lambda x: _put_global(x, s, copy=may_alias is False), subtree)
    if is_sharding(shardings):
        return put(shardings, state)
    return jax.tree.map(put, shardings, state, is_leaf=is_sharding)


def batch_sharding(mesh: Mesh, rules=LOGICAL_RULES) -> NamedSharding:
    """Sharding of a per-row array [batch, ...]: rows split over 'data', the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(dict(rules)["batch"]))


def replicated(mesh: Mesh) -> NamedSharding:
    """A full copy on every device of `mesh` (scalars, keys, shared tables)."""
    return NamedSharding(mesh, PartitionSpec())


def cache_sharding(mesh: Mesh, rules=LOGICAL_RULES, *, kv_heads: int | None = None,
                   shape: tuple[int, ...] | None = None, values: bool = False) -> NamedSharding:
    """Sharding of one KV-cache keys array [batch, slots, kv_heads, head_dim], or with `values` of one
    values array [batch, kv_heads, head_dim, slots].

    With `shape` (and `kv_heads`), checks that the splits divide (`ShardingError` otherwise).
    """
    sizes = dict(mesh.shape)
    axes = TRANSPOSED_CACHE_AXES if values else CACHE_AXES
    if shape is None:
        return NamedSharding(mesh, PartitionSpec(*(dict(rules).get(a) for a in axes)))
    units = None if kv_heads is None else {"kv_heads": kv_heads}
    return NamedSharding(mesh, spec_for("KV cache", shape, axes, rules, sizes, units))


def to_host(tree):
    """numpy copies of a pytree's arrays, gathering arrays split over other processes' devices.

    In a multi-process job (`specjax.distributed`) an array split over 'data' has rows on other
    hosts, which `jax.device_get` cannot read: those are gathered (`process_allgather`, a
    collective: every process must call this in the same order). Arrays this process holds
    whole (single process, or replicated) are copied without communication.
    """
    from jax.experimental import multihost_utils

    def one(x):
        if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
            return multihost_utils.process_allgather(x, tiled=True)
        return jax.device_get(x)

    return jax.tree.map(one, tree)
