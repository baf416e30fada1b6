"""Chain verification: hand-built greedy cases and statistical proof that sampling is lossless.

The statistical tests run two chained rounds of verification per PRNG key (vmapped over
N keys) on a 5-token vocabulary with fixed target distributions P[0..3] per absolute
position (independent of the prefix, so the target's joint law of the first two tokens is
P[0] ⊗ P[1]). Round 1 verifies a 2-token draft at positions 0..2; when it emits only one
token, round 2 starts at position 1, as the decode loop would. The empirical joint of the
first two emitted tokens is compared with P[0] ⊗ P[1] by Pearson's chi-square statistic
against the 0.999 quantile of the chi-square law with (cells - 1) degrees of freedom
(values from scipy.stats.chi2.ppf, hard-coded so the test needs no scipy). Keys are fixed,
so the outcome is deterministic; a correct rule passes with margin and a wrong one fails by
orders of magnitude.

Token trees use the same two-round scheme, with a 6-node tree (three candidates under the root)
whose rows sit at positions 0, 1, 2 by depth. Note that the point-mass rule is lossless for ANY
candidate choice independent of the target's coins (it only wastes acceptance when candidates
were sampled), so "ignoring q" is not a detectable bug; an unnormalised residual is (stat ~311
against the 51.2 bound, checked by hand when this test was written), as is the missing
renormalisation after a rejected sibling (`wrong_tree_verify`, tested below).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decode.spec.verify import (
    greedy_verify,
    sampling_verify,
    target_probs,
    tree_greedy_verify,
    tree_sampling_verify,
)

CHI2_999 = {8: 26.124, 15: 37.697, 24: 51.179}  # scipy.stats.chi2.ppf(0.999, dof)
N = 20_000
P = np.array([
    [0.35, 0.25, 0.20, 0.12, 0.08],
    [0.10, 0.40, 0.20, 0.20, 0.10],
    [0.30, 0.10, 0.10, 0.30, 0.20],
    [0.20, 0.20, 0.20, 0.20, 0.20],
])
LOGITS = jnp.log(jnp.asarray(P, jnp.float32))


def _logits_for(argmax_t, v=6):
    """[1, T, V] logits whose argmax at position t is argmax_t[t]."""
    x = np.zeros((1, len(argmax_t), v), np.float32)
    x[0, np.arange(len(argmax_t)), argmax_t] = 5.0
    return jnp.asarray(x)


def test_greedy_cases():
    logits = jnp.concatenate([_logits_for([3, 1, 4, 2])] * 5)
    draft_bk = jnp.array([[3, 1, 4], [0, 1, 4], [3, 0, 4], [3, 1, 4], [3, 1, 4]])
    draft_len_b = jnp.array([3, 3, 3, 1, 0])
    accepted_b, tokens_bt = greedy_verify(jnp.argmax(logits, -1), draft_bk, draft_len_b)
    assert accepted_b.tolist() == [3, 0, 1, 1, 0]  # all + bonus; first rejected; middle rejected; short drafts
    emitted = [tokens_bt[i, :a + 1].tolist() for i, a in enumerate(accepted_b.tolist())]
    assert emitted == [[3, 1, 4, 2], [3], [3, 1], [3, 1], [3]]


def test_top_k_1_sampling_is_greedy_for_any_key():
    logits = jnp.concatenate([_logits_for([3, 1, 4, 2])] * 3)
    draft_bk = jnp.array([[3, 1, 4], [0, 1, 4], [3, 0, 4]])
    g_acc, g_tok = greedy_verify(jnp.argmax(logits, -1), draft_bk, jnp.array([3, 3, 3]))
    for seed in range(5):
        acc, tok = sampling_verify(logits, draft_bk, jnp.array([3, 3, 3]), jax.random.key(seed), 1.0, 1, 1.0)
        assert acc.tolist() == g_acc.tolist()
        for i, a in enumerate(acc.tolist()):
            assert tok[i, :a + 1].tolist() == g_tok[i, :a + 1].tolist()


def test_nothing_drafted_means_nothing_accepted():
    # The draft equals a point-mass target, but draft_len 0 says it is a placeholder.
    acc, tok = sampling_verify(_logits_for([3, 1]) * 100, jnp.array([[3]]), jnp.array([0]), jax.random.key(0), 1.0, 0,
                               1.0)
    assert acc.tolist() == [0] and tok[0, 0] == 3


def wrong_verify(target_logits_btv, draft_bk, draft_len_b, key, temperature, top_k, top_p, q_probs_bkv=None):
    """A classic bug: on rejection, resample from p WITHOUT removing the rejected token."""
    b, t, _ = target_logits_btv.shape
    p_btv = target_probs(target_logits_btv, temperature, top_k, top_p)
    p_x_bk = jnp.take_along_axis(p_btv[:, :-1], draft_bk[..., None], axis=-1)[..., 0]
    key_u, key_c = jax.random.split(key)
    ok_bk = (jax.random.uniform(key_u, draft_bk.shape) < p_x_bk) & (jnp.arange(t - 1) < draft_len_b[:, None])
    accepted_b = jnp.sum(jnp.cumprod(ok_bk, axis=1), axis=1)
    resample_bt = jax.random.categorical(key_c, jnp.log(p_btv), axis=-1)
    tokens_bt = jnp.where(jnp.arange(t) < accepted_b[:, None], jnp.pad(draft_bk, ((0, 0), (0, 1))), resample_bt)
    return accepted_b, tokens_bt


def point_drafts(drafts):
    """Deterministic drafter: round r (starting at position r) proposes drafts[r], q = None."""
    return lambda key, r, draft_len: (jnp.asarray(drafts[r]), None)


def sampled_drafts(q_tv):
    """Stochastic drafter: the token at position r + i is drawn from q_tv[r + i]."""
    q = jnp.asarray(q_tv, jnp.float32)

    def draft(key, r, draft_len):
        q_kv = q[r:r + 2]
        return jax.random.categorical(key, jnp.log(q_kv), axis=-1), q_kv[None]

    return draft


@functools.partial(jax.jit, static_argnames=("drafter", "rule", "top_k", "random_len"))
def first_two_tokens(keys, temperature, *, drafter, rule, top_k, random_len=False):
    def one(key):
        k1, k2, kd1, kd2, kl = jax.random.split(key, 5)
        draft_len = jax.random.randint(kl, (1,), 0, 3) if random_len else jnp.array([2])
        d1, q1 = drafter(kd1, 0, draft_len)
        acc1, tok1 = rule(LOGITS[None, 0:3], d1[None], draft_len, k1, temperature, top_k, 1.0, q1)
        d2, q2 = drafter(kd2, 1, draft_len)
        _, tok2 = rule(LOGITS[None, 1:4], d2[None], draft_len, k2, temperature, top_k, 1.0, q2)
        return tok1[0, 0], jnp.where(acc1[0] >= 1, tok1[0, 1], tok2[0, 0])

    return jax.vmap(one)(keys)


def chi_square(first, second, expected_2d):
    """Pearson statistic of the joint counts against N * expected; cells of probability 0 must be empty."""
    counts = np.zeros(expected_2d.shape)
    np.add.at(counts, (np.asarray(first), np.asarray(second)), 1)
    exp = expected_2d * len(first)
    assert counts[exp == 0].sum() == 0, "a token outside the filtered support was emitted"
    live = exp > 0
    return float(((counts[live] - exp[live]) ** 2 / exp[live]).sum()), int(live.sum()) - 1


def filtered(p_v, temperature, top_k):
    """The target law after temperature and top-k, computed independently of filter_logits."""
    x = p_v ** (1.0 / temperature)
    if top_k:
        x = np.where(x >= np.sort(x)[-top_k], x, 0.0)
    return x / x.sum()


KEYS = jax.random.split(jax.random.key(1234), N)


def test_point_mass_draft_preserves_the_target_distribution():
    # Drafts of moderate probability: both acceptance and rejection happen often.
    drafter = point_drafts([[0, 1], [1, 3]])
    stat, dof = chi_square(*first_two_tokens(KEYS, 1.0, drafter=drafter, rule=sampling_verify, top_k=0),
                           np.outer(P[0], P[1]))
    assert dof == 24 and stat < CHI2_999[dof], stat


def test_point_mass_draft_with_temperature_and_top_k():
    # Round 1 drafts token 4, which top-k removes (p = 0): it must always be rejected.
    drafter = point_drafts([[4, 1], [1, 0]])
    first, second = first_two_tokens(KEYS, 0.7, drafter=drafter, rule=sampling_verify, top_k=3)
    stat, dof = chi_square(first, second, np.outer(filtered(P[0], 0.7, 3), filtered(P[1], 0.7, 3)))
    assert dof == 8 and stat < CHI2_999[dof], stat


def test_sampled_draft_with_ragged_lengths_preserves_the_target_distribution():
    # A non-degenerate q (as a draft model would give), far from p, and draft lengths 0..2.
    q = [[0.05, 0.05, 0.1, 0.4, 0.4], [0.6, 0.1, 0.1, 0.1, 0.1], [0.2, 0.2, 0.2, 0.2, 0.2]]
    first, second = first_two_tokens(KEYS, 1.0, drafter=sampled_drafts(q), rule=sampling_verify, top_k=0,
                                     random_len=True)
    stat, dof = chi_square(first, second, np.outer(P[0], P[1]))
    assert stat < CHI2_999[dof], stat


def test_the_test_catches_a_wrong_rule():
    drafter = point_drafts([[0, 1], [1, 3]])
    stat, dof = chi_square(*first_two_tokens(KEYS, 1.0, drafter=drafter, rule=wrong_verify, top_k=0),
                           np.outer(P[0], P[1]))
    # The wrong rule emits token 0 first with probability 0.35 + 0.65 * 0.35 = 0.58, not 0.35.
    assert stat > 20 * CHI2_999[dof], stat


# ------------------------------------------------------------------------------------ token trees
# Three candidates under the root (tokens 0, 1, 3), two under the first (1, 2), one under the
# second (1). Block row 0 is position 0 (law P[0]); node j's row is position depth_j (P[depth_j]).
TREE_PARENTS = np.array([-1, -1, -1, 0, 0, 1], np.int32)
TREE_ROWS = np.array([0, 1, 1, 1, 2, 2, 2])  # position of each block row
Q_BY_DEPTH = np.array([[0.05, 0.3, 0.05, 0.3, 0.3], [0.6, 0.1, 0.1, 0.1, 0.1]], np.float32)


def point_tree(tokens):
    """Deterministic tree: the same tokens every round (q = None), all nodes real."""
    return lambda key: (jnp.asarray(tokens, jnp.int32), None, jnp.array([len(TREE_PARENTS)]))


def sampled_tree(key):
    """Each node's token drawn independently from its depth's q (siblings i.i.d.), ragged lengths."""
    kt, kl = jax.random.split(key)
    q_kv = jnp.asarray(Q_BY_DEPTH)[TREE_ROWS[1:] - 1]
    tokens_k = jax.random.categorical(kt, jnp.log(q_kv), axis=-1).astype(jnp.int32)
    return tokens_k, q_kv[None], jax.random.randint(kl, (1,), 0, len(TREE_PARENTS) + 1)


@functools.partial(jax.jit, static_argnames=("drafter", "rule", "top_k"))
def tree_first_two_tokens(keys, temperature, *, drafter, rule, top_k):
    parents = jnp.asarray(TREE_PARENTS)[None]

    def one(key):
        k1, k2, kd1, kd2 = jax.random.split(key, 4)
        tok_k, q, n = drafter(kd1)
        acc1, tok1, _ = rule(LOGITS[None, TREE_ROWS], tok_k[None], parents, n, k1, temperature, top_k, 1.0, q)
        tok_k, q, n = drafter(kd2)  # round 2 starts at position 1 when round 1 emitted one token
        _, tok2, _ = rule(LOGITS[None, TREE_ROWS + 1], tok_k[None], parents, n, k2, temperature, top_k, 1.0, q)
        return tok1[0, 0], jnp.where(acc1[0] >= 1, tok1[0, 1], tok2[0, 0])

    return jax.vmap(one)(keys)


def wrong_tree_verify(logits_btv, draft_bk, parent_bk, len_b, key, temperature, top_k, top_p, q_probs_bkv=None):
    """A plausible bug: after a rejected sibling, the next one is accepted with p(x), not with the
    renormalised p'(x) = p(x) / (1 - rejected mass). Batch of one, point-mass candidates."""
    p_tv = target_probs(logits_btv, temperature, top_k, top_p)[0]
    k, v = draft_bk.shape[1], p_tv.shape[-1]
    key_u, key_c = jax.random.split(key)
    u_k = jax.random.uniform(key_u, (k,))
    cur, acc, keep_v, out_t = jnp.int32(-1), jnp.int32(0), jnp.ones(v), jnp.zeros(k + 1, jnp.int32)
    for j in range(k):
        tok, par = draft_bk[0, j], parent_bk[0, j]
        test = (par == cur) & (j < len_b[0])
        accept = test & (u_k[j] < p_tv[par + 1, tok] * keep_v[tok])
        out_t = out_t.at[acc].set(jnp.where(accept, tok, out_t[acc]))
        keep_v = jnp.where(accept, jnp.ones(v), jnp.where(test, keep_v.at[tok].set(0.0), keep_v))
        cur, acc = jnp.where(accept, j, cur), acc + accept.astype(jnp.int32)
    last = jax.random.categorical(key_c, jnp.log(p_tv[cur + 1] * keep_v))
    return acc[None], out_t.at[acc].set(last)[None], None


def test_tree_point_mass_candidates_preserve_the_target_distribution():
    first, second = tree_first_two_tokens(KEYS, 1.0, drafter=point_tree([0, 1, 3, 1, 2, 1]), rule=tree_sampling_verify,
                                          top_k=0)
    stat, dof = chi_square(first, second, np.outer(P[0], P[1]))
    assert dof == 24 and stat < CHI2_999[dof], stat


def test_tree_point_mass_candidates_with_duplicates_temperature_and_top_k():
    # Token 4 is outside the top 3 (never accepted); token 0 is proposed twice under the root.
    drafter = point_tree([4, 0, 0, 1, 0, 3])
    first, second = tree_first_two_tokens(KEYS, 0.7, drafter=drafter, rule=tree_sampling_verify, top_k=3)
    stat, dof = chi_square(first, second, np.outer(filtered(P[0], 0.7, 3), filtered(P[1], 0.7, 3)))
    assert dof == 8 and stat < CHI2_999[dof], stat


def test_tree_sampled_candidates_with_ragged_sizes_preserve_the_target_distribution():
    first, second = tree_first_two_tokens(KEYS, 1.0, drafter=sampled_tree, rule=tree_sampling_verify, top_k=0)
    stat, dof = chi_square(first, second, np.outer(P[0], P[1]))
    assert dof == 24 and stat < CHI2_999[dof], stat


def test_the_tree_test_catches_a_rule_that_does_not_renormalise():
    first, second = tree_first_two_tokens(KEYS, 1.0, drafter=point_tree([0, 1, 3, 1, 2, 1]), rule=wrong_tree_verify,
                                          top_k=0)
    stat, dof = chi_square(first, second, np.outer(P[0], P[1]))
    # Token 1 comes first with probability 0.65 * 0.25 = 0.1625 instead of 0.25, token 2 with 0.31, not 0.2.
    assert stat > 20 * CHI2_999[dof], stat
    assert abs(np.mean(np.asarray(first) == 1) - 0.1625) < 0.01


def test_tree_sampling_on_a_chain_with_top_k_1_is_greedy():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(32, 5, 6)), jnp.float32)
    draft = jnp.where(jnp.asarray(rng.random((32, 4)) < 0.7), jnp.argmax(logits[:, :4], -1), 0).astype(jnp.int32)
    parents = jnp.broadcast_to(jnp.arange(-1, 3), (32, 4))
    g_acc, g_tok, g_path = jax.jit(tree_greedy_verify)(jnp.argmax(logits, -1), draft, parents, jnp.full((32,), 4))
    acc, tok, path = jax.jit(tree_sampling_verify, static_argnums=6)(logits, draft, parents, jnp.full((32,), 4),
                                                                     jax.random.key(3), 1.0, 1, 1.0)
    np.testing.assert_array_equal(acc, g_acc)
    np.testing.assert_array_equal(path, g_path)
    for i, a in enumerate(np.asarray(acc)):
        assert tok[i, :a + 1].tolist() == g_tok[i, :a + 1].tolist()
