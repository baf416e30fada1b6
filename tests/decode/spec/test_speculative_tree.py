"""Token-tree drafts in the speculative program, end to end on tiny models.

An *oracle tree drafter* knows the plain greedy continuation (passed as draft_params) and
builds a full binary tree of depth 3 (14 nodes) in which exactly one root-to-leaf path is
right: at depth d the right child is rank (pos + d) % 2, so from round to round the accepted
path runs through different node indices — the cache compaction has to move real entries,
and any mistake there changes the tiny random model's next logits. Every other node carries
a wrong token. The row's draft length also varies (k, k-3, k-6 by position), cutting off
the last nodes, sometimes on the right path. The drafter checks every `Observation` it gets
(each hidden state must predict its token under greedy decoding, positions must chain) and
counts violations in its draft state.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ByteTokenizer
from greedy_parity import greedy_divergences
from test_speculative import BIGRAM_PROMPTS, EOS, PROMPTS, TOK, bigram_model, oracle

from specjax.decode import (
    Draft,
    GenerateConfig,
    GenerationError,
    Generator,
    SamplingConfig,
    SpecConfig,
    SpeculativeGenerator,
    speculative_program,
)
from specjax.decode.spec.trees import MEDUSA_63, StaticTree

TREE = StaticTree.from_paths([p for d in range(1, 4) for p in np.ndindex(*(2,) * d)])
K = TREE.size


@dataclasses.dataclass(frozen=True)
class OracleTreeDrafter:
    """A static tree with one right path (draft_params = the reference tokens [B, n])."""

    tree: StaticTree = TREE

    def init(self, model, ref_bn, prefill):
        return prefill.len_b.astype(jnp.int32) + 1, jnp.zeros((), jnp.int32)

    def propose(self, model, ref_bn, state, k):
        b, n = ref_bn.shape
        tree = self.tree
        d_1d = jnp.arange(1, tree.max_depth + 1)[None, :]
        right_bd = (state.pos_b[:, None] + d_1d) % 2
        # ranks along each node's path, -1 padded: [k, depth]
        ranks_kd = np.array([list(p) + [-1] * (tree.max_depth - len(p)) for p in tree.paths], np.int32)
        ranks_bkd = jnp.asarray(ranks_kd)[None]
        right_bk = jnp.all((ranks_bkd == -1) | (ranks_bkd == right_bd[:, None, :]), axis=-1)
        depth_k = jnp.asarray(tree.depths)
        idx_bk = jnp.clip(state.count_b[:, None] + depth_k[None, :] - 1, 0, n - 1)
        true_bk = jnp.take_along_axis(ref_bn, idx_bk, axis=1)
        tokens_bk = jnp.where(right_bk, true_bk, (true_bk + 1 + depth_k[None, :]) % 64).astype(jnp.int32)
        len_b = (k - 3 * (state.pos_b % 3)).astype(jnp.int32)  # cuts the right depth-3 node 11 or 8 at times
        return Draft(tokens_bk=tokens_bk, len_b=len_b, parent_bk=tree.parent_bk(b)), state.draft_state

    def observe(self, model, ref_bn, draft_state, obs):
        len_b, bad = draft_state
        t = obs.tokens_bt.shape[1]
        valid_bt = jnp.arange(t)[None, :] < obs.n_b[:, None]
        pred_bt = jnp.argmax(model.logits(obs.hidden_btd), axis=-1)
        bad = bad + jnp.sum(valid_bt & (pred_bt != obs.tokens_bt)).astype(jnp.int32)
        bad = bad + jnp.sum((obs.n_b > 0) & (obs.pos_b != len_b - 1)).astype(jnp.int32)
        return len_b + obs.n_b, bad


def _ref_params(completions, n):
    ref = np.zeros((len(completions), n), np.int32)
    for i, c in enumerate(completions):
        ref[i, :len(c.tokens)] = c.tokens
    return jnp.asarray(ref)


def _final_state(gen, prompts, cfg, spec):
    """Re-runs the compiled program directly to read its final state (draft state, positions)."""
    key, args, static = gen._batch_inputs([gen.encode([p], False)[0] for p in prompts], cfg, None, 0,
                                          extra_slots=spec.k)
    return speculative_program(gen.graphdef, *args, gen.draft_params, **static, k=spec.k, drafter=gen.drafter,
                               adapt=spec.policy())


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch4_ragged"])
def test_tree_greedy_equals_plain_greedy(tiny_model, prompts):
    cfg = GenerateConfig(max_new_tokens=20, batch_size=len(prompts), ignore_eos=True)
    ref, _ = Generator(tiny_model, ByteTokenizer()).generate(prompts, cfg)
    gen = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter=OracleTreeDrafter(),
                               draft_params=_ref_params(ref, 20))
    spec = SpecConfig(k=K, adaptive=False)
    out, stats = gen.generate(prompts, cfg, spec)
    assert [o.tokens for o in out] == [r.tokens for r in ref]
    # Depth-3 trees, cut short at some positions: between 3 and 4 tokens per forward.
    assert 2.5 < stats.tau < 4, stats.line()
    acc = stats.acceptance_by_position  # by depth
    assert acc[:2] == (1.0, 1.0) and 0 < acc[2] < 1 and acc[3:] == (0.0,) * (K - 3), acc
    assert K - 6 < stats.mean_draft_len < K, stats.line()
    state = _final_state(gen, prompts, cfg, spec)
    len_b, bad = state.draft
    assert int(bad) == 0
    np.testing.assert_array_equal(np.asarray(len_b), np.asarray(state.row.pos_b) + 1)


def test_tree_top_k_1_sampling_and_adaptive_rounds_equal_plain_greedy(tiny_model):
    """Tree sampling verification (point-mass candidates) under top-k 1 is greedy; with the
    adaptive policy the loop mixes tree rounds and plain rounds (a probe's tree shadow)."""
    cfg = GenerateConfig(max_new_tokens=20, batch_size=4, ignore_eos=True)
    ref, _ = Generator(tiny_model, ByteTokenizer()).generate(PROMPTS, cfg)
    gen = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter=OracleTreeDrafter(),
                               draft_params=_ref_params(ref, 20))
    top1 = dataclasses.replace(cfg, sampling=SamplingConfig(temperature=1.0, top_k=1, seed=5))
    out, stats = gen.generate(PROMPTS, top1, SpecConfig(k=K, adaptive=False))
    assert [o.tokens for o in out] == [r.tokens for r in ref] and stats.tau > 2.5
    # The drafter is costly (undeclared); a round costs 1 plain round, so the bar is 2 (per row: an
    # uncut tree's 3 accepted tokens, or a cut one's 2). Probes every 2 plain rounds measure tree
    # shadows, after which every row's trees pay and the batch speculates.
    out, stats = gen.generate(PROMPTS, cfg, SpecConfig(k=K, min_expected_accept=2.0, ema_weight=1.0,
                                                       verify_cost=1.0, probe_every=2))
    assert [o.tokens for o in out] == [r.tokens for r in ref]
    assert 0 < stats.plain_rate < 1, stats.line()


def test_eos_and_stop_inside_an_accepted_tree_path():
    model = bigram_model(EOS)
    n = 16
    ref = jnp.asarray([oracle(p, n) for p in BIGRAM_PROMPTS], jnp.int32)
    gen = SpeculativeGenerator(model, TOK, drafter=OracleTreeDrafter(), draft_params=ref)
    out, stats = gen.generate(BIGRAM_PROMPTS, GenerateConfig(max_new_tokens=n, batch_size=3),
                              SpecConfig(k=K, adaptive=False))
    # Row 0 continues c | d e a …: round 1 accepts a path starting d e, and EOS (e) ends the row there.
    assert out[0].finish_reason == "eos" and out[0].tokens == oracle(BIGRAM_PROMPTS[0], 2)
    for p, o in zip(BIGRAM_PROMPTS[1:], out[1:], strict=True):
        assert o.finish_reason == "length" and o.tokens == oracle(p, n)
    assert stats.acceptance_by_position[0] == 1.0
    # A stop string made of the 2nd and 3rd tokens of row 2's first accepted path.
    text = TOK.decode(oracle(BIGRAM_PROMPTS[2], n))
    out, _ = gen.generate(BIGRAM_PROMPTS, GenerateConfig(max_new_tokens=n, batch_size=3, stop=(text[1:3],),
                                                         ignore_eos=True), SpecConfig(k=K, adaptive=False))
    assert out[2].finish_reason == "stop" and out[2].tokens == oracle(BIGRAM_PROMPTS[2], 3) and out[2].text == text[:1]


class BadTreeDrafter(OracleTreeDrafter):
    """Proposes a parent array one node short."""

    def propose(self, model, ref_bn, state, k):
        draft, draft_state = super().propose(model, ref_bn, state, k)
        return draft.replace(parent_bk=draft.parent_bk[:, 1:]), draft_state


def test_a_misshapen_draft_is_one_clear_error(tiny_model):
    gen = SpeculativeGenerator(tiny_model, ByteTokenizer(), drafter=BadTreeDrafter(),
                               draft_params=jnp.zeros((1, 8), jnp.int32))
    with pytest.raises(GenerationError, match=r"BadTreeDrafter proposed Draft.parent_bk of shape \(1, 13\); "
                                              r"the loop needs \(1, 14\)"):
        # min_best_gain=0: a 14-node tree's verify forward would switch speculation off (never drafting).
        gen.generate(["ab"], GenerateConfig(max_new_tokens=8, batch_size=1), SpecConfig(k=K, min_best_gain=0))


@pytest.mark.slow
@pytest.mark.real_model
def test_medusa_shaped_tree_greedy_equals_plain_greedy_on_gemma(real_model, real_tokenizer):
    """The 63-node Medusa tree on Gemma 3 270M (sliding-window and global layers, 64-row blocks)."""
    prompts = ["The theory of general relativity, published by Albert Einstein in 1915, explains gravity as",
               "Write a short poem about the sea:"]
    cfg = GenerateConfig(max_new_tokens=32, batch_size=2)
    ref, _ = Generator(real_model, real_tokenizer).generate(prompts, cfg)
    tree = StaticTree.from_paths(MEDUSA_63)
    gen = SpeculativeGenerator(real_model, real_tokenizer, drafter=OracleTreeDrafter(tree),
                               draft_params=_ref_params(ref, 32))
    out, stats = gen.generate(prompts, cfg, SpecConfig(k=tree.size, adaptive=False))
    greedy_divergences(real_model, [real_tokenizer.encode(p) for p in prompts], ref, out, "63-node tree")
    assert stats.tau > 2.5, stats.line()
