"""Medusa and EAGLE drafters in the speculative loop: greedy output == plain greedy output.

Two settings:
  * the random tiny model with RANDOM heads (any weights must be lossless), batch 1 and a ragged
    batch of 8, MEDUSA_63 for Medusa and an EAGLE-2 dynamic tree;
  * a "bigram" model (next token = PERM[token]) with heads built to be right — an EAGLE head
    that copies the next token's embedding into the target's feature, Medusa heads whose residual
    blocks map the feature of x to that of PERM^{i+1}[x] — so whole paths are accepted and EOS
    lands inside accepted blocks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ByteTokenizer, tiny_config
from flax import nnx

from specjax.decode import EagleDrafter, GenerateConfig, Generator, MedusaDrafter, SpecConfig, SpeculativeGenerator
from specjax.decode.spec.trees import MEDUSA_63, StaticTree
from specjax.models import DraftVocab, EagleConfig, EagleHead, Transformer
from specjax.models.medusa import MedusaConfig, MedusaHeads, randomize
from specjax.models.params import build_model, model_weights

TOK = ByteTokenizer()
PROMPTS8 = ["abcabcabcabc", "hello hello", "xyz", "the cat the cat", "q", "mississippi", "aaaa", "zyx zyx z"]


def _eagle(model, vocab=None, depth=3, top_k=3, min_path_prob=0.0, fuse_layers=()):
    head = EagleHead(EagleConfig.from_target(model.cfg, fuse_layers), rngs=nnx.Rngs(11))
    return EagleDrafter.build(head, model, vocab, depth=depth, top_k=top_k, min_path_prob=min_path_prob)


def _medusa(model, tree=MEDUSA_63, vocab=None):
    heads = randomize(MedusaHeads(MedusaConfig.from_target(model.cfg, n_heads=4)), jax.random.key(3))
    return MedusaDrafter.build(heads, model, StaticTree.from_paths(tree), vocab)




@pytest.fixture(scope="module")
def plain(tiny_model):
    return Generator(tiny_model, TOK)


@pytest.mark.parametrize("which", ["medusa", "eagle", "eagle3"])
@pytest.mark.parametrize("batch", [pytest.param(1, marks=pytest.mark.slow), 8])
def test_random_heads_are_lossless(tiny_model, plain, which, batch):
    # The ragged batch also runs EAGLE's confidence-cut trees under the adaptive policy (plain rounds,
    # one-token observations, rows drafting nothing); "eagle3" reads fused target layers in every round kind.
    adaptive = which.startswith("eagle") and batch == 8
    if which == "medusa":
        drafter, params = _medusa(tiny_model)
        k = drafter.tree.size
    else:
        drafter, params = _eagle(tiny_model, min_path_prob=0.02 if adaptive else 0.0,
                                 fuse_layers=(0, 2) if which == "eagle3" else ())
        k = 6
    cfg = GenerateConfig(max_new_tokens=12, batch_size=batch, ignore_eos=True)
    prompts = PROMPTS8 if batch == 8 else PROMPTS8[:2]
    ref, _ = plain.generate(prompts, cfg)
    gen = SpeculativeGenerator(tiny_model, TOK, drafter=drafter, draft_params=params)
    out, stats = gen.generate(prompts, cfg, SpecConfig(k=k, adaptive=adaptive, min_best_gain=0))  # never off
    assert [o.tokens for o in out] == [r.tokens for r in ref]
    assert stats.rounds <= 11 * len(prompts) and (adaptive or stats.plain_rate == 0)
    print(which, batch, stats.line())


# ------------------------------------------------------------------------------------ bigram model
CYCLES = ["abcde", "fgh", "ijklmnop"]
BIGRAM_PROMPTS = ["abcdeabcdeab", "fghfghf", "ijklmnopijk"]
CYCLE_IDS = np.array(sorted({i for c in CYCLES for i in TOK.encode(c, add_bos=False)}))
EOS = TOK.encode("e", add_bos=False)[0]


def _perm() -> np.ndarray:
    perm = np.arange(64)
    for cycle in CYCLES:
        ids = TOK.encode(cycle, add_bos=False)
        perm[ids] = np.roll(ids, -1)
    return perm


PERM = _perm()


def oracle(prompt: str, n: int) -> list[int]:
    tok, out = TOK.encode(prompt)[-1], []
    for _ in range(n):
        tok = int(PERM[tok])
        out.append(tok)
    return out


@nnx.jit
def _features_jit(model):
    return model(jnp.arange(64)[:, None], jnp.zeros((64, 1), jnp.int32))[0][:, 0]


def _features(model) -> np.ndarray:
    """h(x) for every token x (a one-token forward at position 0)."""
    return np.asarray(_features_jit(model))


def bigram_model() -> Transformer:
    """Zeroed attention/MLP outputs leave hidden = h(token); head row PERM[x] is the unit vector of
    h(x) with its all-ones component removed (so a constant offset of a feature never changes the
    logits — the Medusa construction below relies on that), peaking the logits at PERM[x]."""
    cfg = tiny_config(tie_embeddings=False, eos_ids=(EOS,))
    w = model_weights(Transformer(cfg, rngs=nnx.Rngs(1)))
    for name in w:
        if name.endswith(("attn.o.w", "mlp.down.w")):
            w[name] = np.zeros_like(w[name])
    h_vd = _features(build_model(cfg, w))
    h_vd = h_vd - h_vd.mean(axis=1, keepdims=True)
    head = np.zeros_like(w["head"])
    head[PERM] = h_vd / np.linalg.norm(h_vd, axis=1, keepdims=True)
    model = build_model(cfg, {**w, "head": head})
    assert (np.argmax(_features(model) @ head.T, -1) == PERM).all()
    return model


def oracle_eagle(model) -> EagleHead:
    """fc passes the next token's embedding through, the layer is the identity, out_norm = the target's
    final norm: the head outputs exactly the target's feature of the next token."""
    head = EagleHead(EagleConfig.from_target(model.cfg), rngs=nnx.Rngs(0))
    d = model.cfg.d_model
    head.fc.w[...] = jnp.concatenate([jnp.eye(d), jnp.zeros((d, d))], axis=0)
    head.fc.b[...] = jnp.zeros((d,))
    head.block.attn.o.w[...] = jnp.zeros_like(head.block.attn.o.w[...])
    head.block.mlp.down.w[...] = jnp.zeros_like(head.block.mlp.down.w[...])
    head.out_norm.scale[...] = model.final_norm.scale[...]
    return head


def oracle_medusa(model, n_heads=4) -> MedusaHeads:
    """Head i: h + SiLU(hW + β) with β large enough that SiLU is the identity, W solving
    h(x) + h(x)W = h(PERM^{i+1}[x]) on the cycle tokens; the leftover β·1 is invisible to the head."""
    heads = MedusaHeads(MedusaConfig.from_target(model.cfg, n_heads=n_heads))
    h_vd = _features(model)
    h_cd = h_vd[CYCLE_IDS]
    w, b = np.zeros(heads.w.shape, np.float32), np.zeros(heads.b.shape, np.float32)
    target = CYCLE_IDS
    for i in range(n_heads):
        target = PERM[target]
        want_cd = h_vd[target]
        w_dd = np.linalg.lstsq(h_cd, want_cd - h_cd, rcond=None)[0]
        w[i, 0] = w_dd
        b[i, 0] = np.abs(h_cd @ w_dd).max() + 30.0
    heads.w[...], heads.b[...] = jnp.asarray(w), jnp.asarray(b)
    return heads


@pytest.fixture(scope="module")
def bigram():
    return bigram_model()


@pytest.mark.parametrize("which", ["medusa", "eagle"])
def test_eos_inside_accepted_blocks_with_right_heads(bigram, which):
    # Both draft over a reduced vocabulary: the cycle tokens (EOS among them) plus 4 others.
    vocab = DraftVocab.from_counts(np.bincount(CYCLE_IDS, minlength=64), size=20, always=(EOS,))
    if which == "medusa":
        tree = StaticTree.from_paths([(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (1,), (0, 1)])
        drafter, params = MedusaDrafter.build(oracle_medusa(bigram), bigram, tree, vocab)
        k = tree.size
    else:
        drafter, params = EagleDrafter.build(oracle_eagle(bigram), bigram, vocab, depth=4, top_k=2)
        k = 6
    gen = SpeculativeGenerator(bigram, TOK, drafter=drafter, draft_params=params)
    out, stats = gen.generate(BIGRAM_PROMPTS, GenerateConfig(max_new_tokens=16, batch_size=3),
                              SpecConfig(k=k, adaptive=False))
    # Row 0 continues c | d e …: EOS is the 2nd token of the first speculative round's block.
    assert out[0].finish_reason == "eos" and out[0].tokens == oracle(BIGRAM_PROMPTS[0], 2)
    for p, o in zip(BIGRAM_PROMPTS[1:], out[1:], strict=True):
        assert o.finish_reason == "length" and o.tokens == oracle(p, 16)
    # Whole 4-deep paths accepted: every round emits 5 tokens (row 0's first round is cut by EOS).
    assert stats.acceptance_by_position[:4] == (1.0,) * 4, stats.line()
    # Decode tokens exclude the prefill's first token and include row 0's EOS: 2 + 15 + 15.
    assert stats.rounds == 1 + 3 + 3 and stats.tau == pytest.approx((2 + 15 + 15) / 7)
