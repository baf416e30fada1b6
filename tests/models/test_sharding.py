"""The logical-axis rule table: specs per parameter, FSDP, divisibility errors, mesh errors.

These run on the single CPU device of the test process: partition specs are computed against
mesh *sizes*; placing arrays on 8 devices is checked in tests/decode/test_mesh.py (subprocess).
"""

from __future__ import annotations

import jax
import pytest
from conftest import tiny_config
from flax import nnx
from jax.sharding import PartitionSpec as P

from specjax.models import sharding as sh
from specjax.models.transformer import Transformer


def _flat(tree) -> dict[str, P]:
    pairs = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, P))[0]
    return {sh.path_name(p): v for p, v in pairs}


@pytest.fixture(scope="module")
def tiny_state():
    abstract = nnx.eval_shape(lambda: Transformer(tiny_config(tie_embeddings=False, qkv_bias=True),
                                                  rngs=nnx.Rngs(0)))
    return nnx.split(abstract)[1]


def test_every_transformer_param_has_logical_axes(tiny_state):
    unmatched: list[str] = []
    specs = _flat(sh.param_partition_specs(tiny_state, mesh={"data": 2, "model": 2}, unmatched=unmatched))
    assert unmatched == []
    assert specs["embed"] == P("model", None) and specs["head"] == P("model", None)
    assert specs["blocks.0.attn.q.w"] == P(None, "model")
    assert specs["blocks.0.attn.q.b"] == P("model")
    assert specs["blocks.1.attn.k.w"] == P(None, "model") and specs["blocks.1.attn.v.b"] == P("model")
    assert specs["blocks.2.attn.o.w"] == P("model", None)
    assert specs["blocks.0.attn.q_norm.scale"] == P(None)
    assert specs["blocks.0.mlp.gate.w"] == P(None, "model") and specs["blocks.0.mlp.up.w"] == P(None, "model")
    assert specs["blocks.0.mlp.down.w"] == P("model", None)
    assert specs["blocks.0.post_mlp_norm.scale"] == P(None) and specs["final_norm.scale"] == P(None)


def test_fsdp_splits_the_largest_replicated_dimension_over_data(tiny_state):
    specs = _flat(sh.param_partition_specs(tiny_state, mesh={"data": 4, "model": 2}, fsdp=True))
    assert specs["embed"] == P("model", "data")  # [64, 32]: vocab already on 'model'
    assert specs["blocks.0.mlp.down.w"] == P("model", "data")
    assert specs["blocks.0.attn.q.w"] == P("data", "model")
    assert specs["final_norm.scale"] == P("data")
    # 'data' of 3 divides no dimension of the tiny model: everything stays as without FSDP.
    assert _flat(sh.param_partition_specs(tiny_state, mesh={"data": 3, "model": 1}, fsdp=True))["embed"] == P(
        "model", None)
    with pytest.raises(sh.ShardingError, match="fsdp=True needs the mesh"):
        sh.param_partition_specs(tiny_state, fsdp=True)


def test_unknown_params_are_replicated_and_reported():
    state = {"encoder": {"w": jax.ShapeDtypeStruct((8, 8), "float32")},
             "mu": {"blocks": {0: {"mlp": {"up": {"w": jax.ShapeDtypeStruct((32, 64), "float32")}}}}}}
    unmatched: list[str] = []
    specs = _flat(sh.param_partition_specs(state, mesh={"data": 1, "model": 2}, unmatched=unmatched))
    assert unmatched == ["encoder.w"]
    assert specs["encoder.w"] == P()
    assert specs["mu.blocks.0.mlp.up.w"] == P(None, "model")  # optimizer state nests parameter paths


def test_head_counts_that_do_not_divide_name_the_parameter(tiny_state):
    units = sh.model_units(tiny_config())  # 4 heads, 2 kv heads
    with pytest.raises(sh.ShardingError, match=r"blocks\.0\.attn\.k\.b \(16,\): 2 kv heads cannot be split over "
                                               r"mesh axis 'model' of size 4"):
        sh.param_partition_specs(tiny_state, mesh={"data": 1, "model": 4}, units=units)
    # Replicating kv heads instead is one rule change.
    specs = _flat(sh.param_partition_specs(tiny_state, sh.with_rules(kv_heads=None), mesh={"data": 1, "model": 4},
                                           units=units))
    assert specs["blocks.0.attn.k.w"] == P(None, None) and specs["blocks.0.attn.q.w"] == P(None, "model")
    with pytest.raises(sh.ShardingError, match=r"blocks\.0\.attn\.o\.w \(32, 32\): 4 heads cannot be split"):
        sh.param_partition_specs(tiny_state, sh.with_rules(kv_heads=None), mesh={"data": 1, "model": 8}, units=units)
    with pytest.raises(sh.ShardingError, match=r"mlp\.down\.w \(64, 32\): dimension 64 cannot be split"):
        sh.param_partition_specs(tiny_state, sh.with_rules(heads=None, kv_heads=None, vocab=None),
                                 mesh={"data": 1, "model": 128}, units=units)


def test_rule_and_mesh_errors():
    with pytest.raises(sh.ShardingError, match=r"unknown logical axes \['experts'\]"):
        sh.with_rules(experts="model")
    with pytest.raises(sh.ShardingError, match="mesh model size must be a positive integer, got 0"):
        sh.make_mesh(1, 0)
    n = len(jax.devices())
    with pytest.raises(sh.ShardingError, match=rf"mesh data={n + 1} x model=1 needs {n + 1} devices.*"
                                               r"xla_force_host_platform_device_count"):
        sh.make_mesh(n + 1, 1)
    mesh = sh.make_mesh(1, 1)
    assert mesh.axis_names == ("data", "model") and mesh.shape == {"data": 1, "model": 1}
    assert sh.cache_sharding(mesh).spec == P("data", None, "model", None)
    assert sh.cache_sharding(mesh, values=True).spec == P("data", "model", None, None)
    assert sh.batch_sharding(mesh).spec == P("data")


def test_shard_state_places_every_array_with_its_named_sharding():
    model = Transformer(tiny_config(), rngs=nnx.Rngs(0))
    state = nnx.split(model)[1]
    mesh = sh.make_mesh(1, 1)
    placed = sh.shard_state(state, sh.param_shardings(state, mesh, units=sh.model_units(model.cfg)))
    assert placed["blocks"][1]["mlp"]["down"]["w"].sharding.spec == P("model", None)
    assert placed["embed"].sharding.mesh.shape == {"data": 1, "model": 1}
    assert (placed["embed"] == state["embed"]).all()
