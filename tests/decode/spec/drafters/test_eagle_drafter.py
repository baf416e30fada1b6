"""EAGLE drafter hooks on a tiny target with a random head: every tree node's score must be what a
plain (uncached, causal) run of the head along that node's path gives — which checks the cache
slots, ancestor masks and positions of the tree expansion, for ragged rows, before and after an
`observe`."""

import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config
from flax import nnx

from specjax.decode import Observation, Prefill
from specjax.decode.spec.drafters.eagle import EagleDrafter, EagleDrafterError
from specjax.decode.spec.drafters.heads import output_head
from specjax.models import DraftVocab, EagleConfig, EagleHead
from specjax.models.config import ConfigError

DEPTH, TOPK = 3, 3
PROMPTS = [[2, 10, 11, 12, 13, 14], [2, 30, 31, 32]]  # ragged: P differs per row
WIDTH = 12  # reference length (context + path), padded


@pytest.fixture(scope="module")
def setup(tiny_model):
    head = EagleHead(EagleConfig.from_target(tiny_config()), rngs=nnx.Rngs(7))
    vocab = DraftVocab(np.arange(3, 64, 2), 64)  # a reduced vocabulary: odd ids
    return head, vocab


@pytest.fixture(scope="module")
def prefill(tiny_model):
    return _prefill(tiny_model)


def _prefill(model, taps=()):
    t = max(map(len, PROMPTS))
    tokens = np.zeros((len(PROMPTS), t), np.int32)
    for i, p in enumerate(PROMPTS):
        tokens[i, :len(p)] = p
    len_b = jnp.array([len(p) for p in PROMPTS])
    run = nnx.jit(lambda m, x: m.forward(x, jnp.broadcast_to(jnp.arange(t), x.shape), taps=taps))
    hidden, _, taps_btx = run(model, jnp.asarray(tokens))
    first = jnp.argmax(model.logits(hidden[jnp.arange(2), len_b - 1][:, None])[:, 0], -1)
    return Prefill(tokens_bt=jnp.asarray(tokens), len_b=len_b, hidden_btd=hidden, first_b=first, num_slots=16,
                   taps_btx=taps_btx)


@nnx.jit
def _ref_step(head, feats_ld, toks_l, n, embed, table):
    """Uncached causal head run over one row's first n pairs: (output feature, log-probs) after pair n-1."""
    out, _ = head(feats_ld[None], toks_l[None], embed, jnp.arange(WIDTH)[None])
    g_d = out[0, n - 1]
    return g_d, jax.nn.log_softmax(table.logits(g_d))


def _path_outputs(head, table, embed, feats, toks, parent_p, tokens_p):
    """Per pool node (and the root, key -1): the head's output feature and log-probs after its path."""
    memo = {}

    def after(node):
        if node not in memo:
            f, t = list(feats), list(toks)
            chain, n = [], node
            while n >= 0:
                chain.append(n)
                n = int(parent_p[n])
            for n in reversed(chain):
                f.append(np.asarray(after(int(parent_p[n]))[0]))
                t.append(int(tokens_p[n]))
            fa = np.stack(f + [np.zeros_like(f[0])] * (WIDTH - len(f)))
            memo[node] = _ref_step(head, fa, np.array(t + [0] * (WIDTH - len(t)), np.int32), len(f), embed, table)
        return memo[node]
    return after


@functools.partial(nnx.jit, static_argnums=(0, 1))
def _hook(drafter, name, *args):
    return getattr(drafter, name)(*args)


@functools.partial(nnx.jit, static_argnums=0)
def _grow(drafter, model, params, ds, pos_b):
    head = nnx.merge(drafter.graphdef, params.weights)
    return drafter._grow(head, output_head(model, params), model.embed[...], ds, pos_b)


def _check_pool(drafter, params, model, head, ctx_feats, ctx_toks, pos_b, ds):
    """Compares every pool node's score increment with a chain recomputation along its path."""
    table = output_head(model, params)
    pool = jax.device_get(_grow(drafter, model, params, ds, pos_b)[0])
    target_tokens = pool.tokens_bp if table.ids_n is None else np.asarray(table.ids_n)[pool.tokens_bp]
    for b in range(len(PROMPTS)):
        p_ctx = int(pos_b[b])
        after = _path_outputs(head, table, model.embed[...], ctx_feats[b][:p_ctx], ctx_toks[b][:p_ctx],
                              pool.parent_bp[b], target_tokens[b])
        for n in range(pool.size):
            parent = int(pool.parent_bp[b, n])
            base = 0.0 if parent < 0 else float(pool.score_bp[b, parent])
            lp = float(after(parent)[1][pool.tokens_bp[b, n]])
            np.testing.assert_allclose(float(pool.score_bp[b, n]), base + lp, atol=2e-4, err_msg=f"row {b} node {n}")


@pytest.mark.parametrize("reduced", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_tree_scores_match_chain_recomputation(tiny_model, setup, prefill, reduced):
    head, vocab = setup
    drafter, params = EagleDrafter.build(head, tiny_model, vocab if reduced else None, depth=DEPTH, top_k=TOPK)
    pre = prefill
    ds = _hook(drafter, "init", tiny_model, params, pre)
    assert ds.cache.num_slots == 16 + (DEPTH - 1) * TOPK
    # Context pairs (f_t, x_{t+1}); the row's last committed token is the first generated one.
    hidden = np.asarray(pre.hidden_btd)
    ctx_feats = [[hidden[b, t] for t in range(len(p))] for b, p in enumerate(PROMPTS)]
    ctx_toks = [p[1:] + [int(pre.first_b[b])] for b, p in enumerate(PROMPTS)]
    pos_b = pre.len_b
    _check_pool(drafter, params, tiny_model, head, ctx_feats, ctx_toks, pos_b, ds)

    # A round commits 2 tokens in row 0 and 1 in row 1, with (made-up) target features; the tree's
    # cache writes must be replaced by them.
    ds_after_grow = ds.replace(cache=_grow(drafter, tiny_model, params, ds, pos_b)[1])
    obs_hidden = jax.random.normal(jax.random.key(5), (2, 2, 32))
    obs = Observation(tokens_bt=jnp.array([[20, 21], [40, 0]]), hidden_btd=obs_hidden, n_b=jnp.array([2, 1]),
                      pos_b=pos_b)
    ds2 = _hook(drafter, "observe", tiny_model, params, ds_after_grow, obs)
    for b, n in enumerate([2, 1]):
        ctx_feats[b] += [np.asarray(obs_hidden)[b, i] for i in range(n)]
        ctx_toks[b] += [int(obs.tokens_bt[b, i]) for i in range(n)]
    _check_pool(drafter, params, tiny_model, head, ctx_feats, ctx_toks, pos_b + jnp.array([2, 1]), ds2)


def test_an_eagle3_head_drafts_from_the_fused_target_layers(tiny_model):
    """EAGLE-3: committed pairs carry fuse(taps) instead of the final hidden state, at init and at observe."""
    head = EagleHead(EagleConfig.from_target(tiny_config(), fuse_layers=(0, 2)), rngs=nnx.Rngs(8))
    drafter, params = EagleDrafter.build(head, tiny_model, depth=DEPTH, top_k=TOPK)
    assert drafter.feature_layers == (0, 2)
    pre = _prefill(tiny_model, drafter.feature_layers)
    ds = _hook(drafter, "init", tiny_model, params, pre)
    fused = np.asarray(nnx.jit(lambda h, x: h.fuse_features(x))(head, pre.taps_btx))
    ctx_feats = [[fused[b, t] for t in range(len(p))] for b, p in enumerate(PROMPTS)]
    ctx_toks = [p[1:] + [int(pre.first_b[b])] for b, p in enumerate(PROMPTS)]
    _check_pool(drafter, params, tiny_model, head, ctx_feats, ctx_toks, pre.len_b, ds)
    obs_taps = jax.random.normal(jax.random.key(6), (2, 1, 64))
    obs = Observation(tokens_bt=jnp.array([[20], [40]]), hidden_btd=jnp.zeros((2, 1, 32)), n_b=jnp.array([1, 1]),
                      pos_b=pre.len_b, taps_btx=obs_taps)
    ds2 = _hook(drafter, "observe", tiny_model, params, ds, obs)
    fused_obs = np.asarray(nnx.jit(lambda h, x: h.fuse_features(x))(head, obs_taps))
    for b in range(2):
        ctx_feats[b].append(fused_obs[b, 0])
        ctx_toks[b].append(int(obs.tokens_bt[b, 0]))
    _check_pool(drafter, params, tiny_model, head, ctx_feats, ctx_toks, pre.len_b + 1, ds2)
    with pytest.raises(ConfigError, match="no tapped features"):
        _hook(drafter, "observe", tiny_model, params, ds, obs.replace(taps_btx=None))


def test_budget_beyond_pool_is_refused(tiny_model, setup):
    drafter, params = EagleDrafter.build(setup[0], tiny_model, depth=2, top_k=2)
    with pytest.raises(EagleDrafterError, match=r"k=7 must be in \[1, 6\]"):
        drafter.propose(tiny_model, params, None, 7)
    with pytest.raises(EagleDrafterError, match="top_k must be a positive integer"):
        EagleDrafter(None, depth=2, top_k=0)


@functools.partial(nnx.jit, static_argnums=(0, 4))
def _propose(drafter, model, params, ds, k, pos_b):
    return drafter.propose(model, params, SimpleNamespace(draft_state=ds, pos_b=pos_b), k)[0]


def test_propose_is_best_first_and_cut_by_confidence(tiny_model, setup, prefill):
    drafter, params = EagleDrafter.build(setup[0], tiny_model, depth=DEPTH, top_k=TOPK)
    ds = _hook(drafter, "init", tiny_model, params, prefill)
    draft = _propose(drafter, tiny_model, params, ds, 8, prefill.len_b)
    assert draft.len_b.tolist() == [8, 8]
    pool, _ = _grow(drafter, tiny_model, params, ds, prefill.len_b)
    prob_bp = np.exp(np.asarray(pool.score_bp))
    for b in range(2):
        parent = np.asarray(draft.parent_bk[b])
        assert all(-1 <= parent[j] < j for j in range(8))
        order = np.argsort(-np.asarray(pool.score_bp[b]), kind="stable")[:8]  # best first
        np.testing.assert_array_equal(np.asarray(draft.tokens_bk[b]), np.asarray(pool.tokens_bp[b])[order])
    # Keep the nodes whose path probability is at least the 3rd best of row 0: a prefix of the tree.
    threshold = float(np.sort(prob_bp[0])[::-1][2]) * 0.999
    cut, _ = EagleDrafter.build(setup[0], tiny_model, depth=DEPTH, top_k=TOPK, min_path_prob=threshold)
    draft_cut = _propose(cut, tiny_model, params, ds, 8, prefill.len_b)
    want = [min(8, int((prob_bp[b] >= threshold).sum())) for b in range(2)]
    assert draft_cut.len_b.tolist() == want and want[0] == 3
    np.testing.assert_array_equal(draft_cut.tokens_bk, draft.tokens_bk)
    with pytest.raises(EagleDrafterError, match=r"min_path_prob must be in \[0, 1\]"):
        EagleDrafter(None, min_path_prob=2.0)
