"""Draft costs (`draft_cost.py`) and the adaptive bar that adds them to the verify cost."""


import jax
import jax.numpy as jnp
import pytest
from conftest import tiny_config
from flax import nnx
from test_spec_rounds import CountingDrafter

from specjax.decode import DraftModelDrafter, EagleDrafter, LayerSkipDrafter, MedusaDrafter, NgramDrafter, StaticTree
from specjax.decode.errors import GenerationError
from specjax.decode.sampling import SamplingConfig
from specjax.decode.spec import SpecConfig, cost
from specjax.decode.spec.drafters.chain import reduced_head
from specjax.decode.spec.policy import PACKED_VERIFY_EXTRA, Adaptive, estimated_verify_cost
from specjax.decode.spec.rounds import RoundContext
from specjax.models import EagleConfig, EagleHead, HeadTable, MedusaConfig, MedusaHeads, Transformer
from specjax.models.backend_profile import profile_for
from specjax.models.config import gemma3_270m
from specjax.models.quant import BlockQuant
from specjax.models.weight_formats import iter_linears, pack_model


def abstract_gemma() -> Transformer:
    """Gemma 3 270M as the GGUF loader builds it (float32 blocks, an int8 copy of the Q8_0 head with a
    scale per 32), shapes only: draft costs read shapes and dtypes, nothing is computed."""
    cfg = gemma3_270m()
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    model.head_quant = nnx.eval_shape(lambda: BlockQuant(jnp.zeros((cfg.vocab_size, cfg.d_model), jnp.int8),
                                                         jnp.zeros((cfg.vocab_size, cfg.d_model // 32))))
    return model


GEMMA = abstract_gemma()


def test_the_whole_target_costs_one_step():
    assert cost.step_fraction(GEMMA, cost.target_bytes(GEMMA)) == pytest.approx(1.0)
    assert cost.step_fraction(GEMMA, 0) == cost.STEP_FIXED
    # Bytes, not parameters: the 262,144 x 640 head holds 62% of the weights but, read as int8 with a
    # float32 scale per 32, is ~32% of a step's bytes; each float32 block is ~3.8%.
    assert cost.head_bytes(GEMMA) / cost.target_bytes(GEMMA) == pytest.approx(0.32, abs=0.01)
    assert cost.blocks_bytes(GEMMA, [0]) / cost.target_bytes(GEMMA) == pytest.approx(0.038, abs=0.002)


def test_the_estimate_matches_measured_draft_steps():
    """Early exits vs `benchmarks/model_drafters.py --profile` (quiet, 2026-12-01, docs/performance.md):
    N layers through the full int8 head or a 32k-row float32 head, as fractions of a plain step."""
    big = HeadTable(table_nd=jax.ShapeDtypeStruct((32_768, GEMMA.cfg.d_model), jnp.float32))
    measured = {(2, None): 0.42, (6, None): 0.58, (12, None): 0.80, (15, None): 0.92,
                (2, big): 0.23, (6, big): 0.38, (12, big): 0.61, (15, big): 0.71}
    for (n, head), seen in measured.items():
        assert LayerSkipDrafter.early_exit(n).draft_cost(GEMMA, head, 1) == pytest.approx(seen, abs=0.04), (n, head)


def test_layer_skip_cost_grows_with_layers_and_head_rows():
    full = LayerSkipDrafter(tuple(range(GEMMA.cfg.n_layers)))
    assert full.draft_cost(GEMMA, (), 4) == pytest.approx(4.0)  # k steps of the whole target
    shallow = LayerSkipDrafter.early_exit(4).draft_cost(GEMMA, (), 4)
    deep = LayerSkipDrafter.early_exit(12).draft_cost(GEMMA, (), 4)
    assert 4 * cost.STEP_FIXED < shallow < deep < 4.0
    # A 16k-row reduced head is a fraction of the full one (only the table's shape is read).
    small = HeadTable(table_nd=jax.ShapeDtypeStruct((16_384, GEMMA.cfg.d_model), jnp.float32))
    assert LayerSkipDrafter.early_exit(4).draft_cost(GEMMA, small, 4) < shallow
    assert cost.head_bytes(GEMMA, small) == 16_384 * GEMMA.cfg.d_model * 4


def test_reduced_head_lowers_a_real_layer_skip_cost(tiny_model):
    drafter = LayerSkipDrafter.early_exit(2)
    head = reduced_head(tiny_model, list(range(8)))
    assert drafter.draft_cost(tiny_model, head, 4) < drafter.draft_cost(tiny_model, (), 4)


def test_a_draft_model_equal_to_the_target_costs_k_steps(tiny_model):
    drafter, params = DraftModelDrafter.create(tiny_model, tiny_model)
    assert drafter.draft_cost(tiny_model, params, 3) == pytest.approx(3.0)
    small = Transformer(tiny_config(n_layers=1, layer_kinds=("global",)), rngs=nnx.Rngs(1))
    drafter, params = DraftModelDrafter.create(small, tiny_model)
    assert drafter.draft_cost(tiny_model, params, 3) < 3.0


def test_head_drafters_cost_one_pass_or_one_per_depth(tiny_model):
    medusa, params = MedusaDrafter.build(MedusaHeads(MedusaConfig(d_model=32, n_heads=4)), tiny_model,
                                         StaticTree.chain(4))
    per_head = cost.step_fraction(tiny_model, 4 * (32 * 32 + 32 + 64 * 32))
    assert per_head < medusa.draft_cost(tiny_model, params, 4) < 4 * per_head  # one pass, not k
    head = EagleHead(EagleConfig.from_target(tiny_config()), rngs=nnx.Rngs(7))
    shallow, params = EagleDrafter.build(head, tiny_model, depth=2, top_k=2)
    deep, _ = EagleDrafter.build(head, tiny_model, depth=4, top_k=2)
    assert 0 < shallow.draft_cost(tiny_model, params, 4) < deep.draft_cost(tiny_model, params, 4)


def test_cheap_and_undeclared_drafters():
    assert cost.draft_cost(NgramDrafter(), GEMMA, (), 8) == 0.0
    assert cost.draft_cost(CountingDrafter(), GEMMA, (), 8) == cost.UNDECLARED_STEP * 8
    assert cost.draft_cost(LayerSkipDrafter.early_exit(4), GEMMA, (), 8) == \
        LayerSkipDrafter.early_exit(4).draft_cost(GEMMA, (), 8)


def test_the_bar_adds_the_draft_cost_unless_the_round_cost_is_given():
    policy = Adaptive()
    assert policy.bar(1, 4, True) == 2.0  # the floor: a free draft's round costs 2.52 plain rounds
    assert policy.bar(1, 4, True, draft_cost=2.5) == pytest.approx(estimated_verify_cost(1, 4, True) + 2.5 - 1)
    assert Adaptive(verify_cost=1.5).bar(1, 4, True, draft_cost=2.5) == 2.0  # verify_cost covers the round


# Whole cheap-drafter rounds in plain steps on one H200 (bfloat16, Qwen2.5-Coder 1.5B and Gemma 3 270M shapes,
# k = 8 chains / trees, docs/benchmarks.md "Speculation on an H200"): the span over both targets and setups.
H200_ROUNDS = {1: (0.83, 1.42), 8: (1.60, 2.20)}  # batch 1: against the one-row step as it was, and padded


def test_the_accelerator_estimate_stays_within_what_an_h200_measured(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    for b, (low, high) in H200_ROUNDS.items():
        assert low <= estimated_verify_cost(b, 8, True) <= high
        assert estimated_verify_cost(b, 8, False) == estimated_verify_cost(b, 8, True)  # T = 1 measured alike
    # At batch 1 a round costs about a step: the floor decides; at batch 8 the k+1 positions per row do.
    assert Adaptive().bar(1, 8, True) == profile_for().spec_min_accept == 1.0
    assert estimated_verify_cost(8, 12, True) > estimated_verify_cost(8, 8, True) > estimated_verify_cost(1, 8, True)


@pytest.mark.parametrize("backend, floor", [("cpu", 2.0), ("gpu", 1.0), ("tpu", 1.0)])
def test_the_floor_of_the_bar_is_the_backends_unless_set(monkeypatch, backend, floor):
    """A round costs ~3 plain steps on XLA:CPU and ~1 on an H200 at batch 1: a floor of 2 accepted tokens,
    fitted to the CPU's overshooting averages, would keep an accelerator's 1-2-token rows plain."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    assert Adaptive().threshold(8) == floor
    assert Adaptive().threshold(2) == min(floor, 1.5)  # capped at 3/4 of k either way
    assert Adaptive(min_expected_accept=3.0).threshold(8) == 3.0  # a floor that is set is the floor
    assert SpecConfig(k=8).policy().threshold(8) == floor
    bar_b1 = Adaptive().bar(1, 8, True)
    assert bar_b1 == (floor if backend != "cpu" else estimated_verify_cost(1, 8, True) - 1.0)
    # What a row at the floor buys per round: over 1.7x of plain on an accelerator's ~1.16-step round.
    if backend != "cpu":
        assert (1.0 + floor) / estimated_verify_cost(1, 8, True) > 1.7


def test_a_negative_floor_is_refused():
    with pytest.raises(GenerationError, match="min_expected_accept"):
        SpecConfig(min_expected_accept=-1.0)


@pytest.mark.parametrize("fmt", ["int8", "q4"])
def test_packed_blocks_make_a_batch_1_verify_dearer_where_one_row_has_its_own_path(fmt):
    """On XLA:CPU a packed matrix times one row is a fused matrix-vector dot while k+1 rows dequantize
    block by block: the batch-1 verify estimate grows with the packed share of a step's bytes; batch 8
    (many rows either way) and a backend without the one-row path (`gemv_max_cols` 0) do not change."""
    model = Transformer(tiny_config(), rngs=nnx.Rngs(0))
    cpu, accelerator = profile_for("cpu"), profile_for("gpu")
    assert cost.packed_share(model, cpu) == 0.0  # float32: nothing packed
    pack_model(model, fmt)
    in_blocks = sum(cost.nbytes(lin.packed) for name, lin in iter_linears(model) if name.startswith("blocks."))
    assert in_blocks > 0
    share = cost.packed_share(model, cpu)
    assert 0.0 < share < 1.0 and share == pytest.approx(in_blocks / cost.target_bytes(model))
    assert cost.packed_share(model, accelerator) == 0.0
    for k in (4, 8):
        assert estimated_verify_cost(1, k, True, share) == pytest.approx(
            estimated_verify_cost(1, k, True) * (1 + PACKED_VERIFY_EXTRA * share))
        assert estimated_verify_cost(8, k, True, share) == estimated_verify_cost(8, k, True)
    policy = Adaptive()
    assert policy.bar(1, 8, True, 0.0, share) > policy.bar(1, 8, True)
    assert Adaptive(verify_cost=2.5).bar(1, 8, True, 0.0, share) == 2.0  # a given round cost covers it
    ctx = RoundContext.create(model, (), 8, NgramDrafter(), SamplingConfig(), 0.0, 1.0, 16, (), None,
                              adapt=policy, profile=cpu)
    assert ctx.packed == share and ctx.kernel == cost.product_kernel(model, cpu)
    assert ctx.bar(1) == policy.bar(1, 8, True, 0.0, share, ctx.kernel)
    assert not ctx.policy_off(1)  # 9 tokens for ~3.9 plain steps: still worth probing


def test_the_verify_estimate_follows_the_kernel_that_runs_the_products():
    """Native CPU kernels make a verify forward cheaper in plain steps than XLA's block-wise products (batch 1)
    and the int8 activation kernel cheaper still, at batch 8 too (benchmarks/verify_cost.py)."""
    import dataclasses

    from specjax.models import native_kernels
    from specjax.models.int8_activations import tile_model

    model = Transformer(tiny_config(d_model=64, n_heads=4, head_dim=16, ffn_dim=128), rngs=nnx.Rngs(0))
    cpu = profile_for("cpu")
    assert cost.product_kernel(model, cpu) == "xla"  # float32: nothing packed
    pack_model(model, "q4")
    no_native = dataclasses.replace(cpu, native_max_rows=0)
    assert cost.product_kernel(model, no_native) == "xla"
    assert cost.product_kernel(model, cpu) == ("native" if native_kernels.available() else "xla")
    share = cost.packed_share(model, cpu)
    for k in (4, 8):
        xla, native, int8 = (estimated_verify_cost(1, k, True, share, kern) for kern in ("xla", "native", "int8"))
        assert int8 < native < xla
        assert estimated_verify_cost(8, k, True, share, "int8") < estimated_verify_cost(8, k, True, share, "native")
    if native_kernels.available("int8"):
        tile_model(model)
        assert cost.product_kernel(model, cpu) == "int8"


def test_deep_layer_skip_is_switched_off_on_cpu_but_a_shallow_small_head_is_not():
    """Gemma 3 270M, batch 1, k = 4, XLA:CPU estimates: early exit after 4 layers through the full head
    costs ~0.49 of a plain step per draft token (a round ~4.5 steps with the 2.5-step verify forward),
    after 12 layers through a 16k head ~0.54 (~4.7): 5 accepted tokens gain < 1.25x, so both are off.
    After 2 layers through a 16k head (~0.17 per token) the best round gains ~1.6x and the policy probes."""
    policy, k = Adaptive(), 4
    small = HeadTable(table_nd=jax.ShapeDtypeStruct((16_384, GEMMA.cfg.d_model), jnp.float32),
                      ids_n=jax.ShapeDtypeStruct((16_384,), jnp.int32))  # shapes only: nothing is computed
    for n, head in ((4, ()), (12, small)):
        cost_ = LayerSkipDrafter.early_exit(n).draft_cost(GEMMA, head, k)
        assert 1.0 < (k + 1) / policy.round_cost(1, k, True, cost_) < 1.25
        assert policy.off(1, k, True, cost_, k)
        note = policy.off_note(1, k, True, cost_, k)
        assert note.startswith("speculation off at batch 1") and "best case below 1.5x (override: min_best_gain" in note
        assert not Adaptive(min_best_gain=1.0).off(1, k, True, cost_, k)
    shallow = LayerSkipDrafter.early_exit(2).draft_cost(GEMMA, small, k)
    assert not policy.off(1, k, True, shallow, k) and policy.off_note(1, k, True, shallow, k) == ""
    assert not policy.off(1, k, True, 0.0, k)  # n-gram: free drafts


def test_tree_drafters_accept_at_most_their_depth():
    assert cost.max_accept(NgramDrafter(), 8) == 8
    medusa = MedusaDrafter(None, StaticTree.chain(3), 4)
    assert cost.max_accept(medusa, 8) == 3
    assert cost.max_accept(EagleDrafter(None, depth=5, top_k=4), 20) == 5
