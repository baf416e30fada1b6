"""Sampling stays lossless with the training-free token trees: chi-square tests as in test_verify.

The scheme of test_verify's tree tests (fixed target laws P[position] over 5 tokens, two chained rounds
per PRNG key, the empirical joint of the first two emitted tokens against P[0] ⊗ P[1]), with the trees
drafted by the real drafters — and round 2 drafted from what round 1 left behind, as in the loop:

  * Token Recycling: round 1 expands a template from token 2 through a hand-seeded table; the table
    is then updated from the target's top-3 at every block row (`update_table`, as `rounds.spec_round`
    does), and round 2 expands from the token round 1 committed.
  * Lookup trees: round 1 drafts from a history in which the tail occurred with three continuations;
    round 2 from that history plus the committed token.

So round 2's tree depends on round 1's outcome, i.e. on the target's coins — which is allowed (a draft
may depend on the committed text) and is exactly what the loop does. Block row i sits at position
pos + depth; the laws past position 3 are P[3] (deeper rows cannot change the first two tokens). Each
test also shows that the statistic catches `wrong_tree_verify` (no renormalisation after a rejected
sibling) on the same trees.
"""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_verify import CHI2_999, KEYS, LOGITS, P, chi_square, wrong_tree_verify

from specjax.decode.spec import trees as tree_lib
from specjax.decode.spec.drafters.lookup_tree import lookup_tree_propose
from specjax.decode.spec.drafters.recycle import EMPTY, RecycleDrafter, RecycleState, update_table
from specjax.decode.spec.trees import StaticTree
from specjax.decode.spec.verify import tree_sampling_verify

K = 6
TOP = jax.lax.top_k(LOGITS, 3)[1].astype(jnp.int32)  # the target's top-3 at each position (prefix-free laws)


def _rows(parent_k, start):
    """Target logits of the block [root, nodes…] of a round starting at position `start`."""
    depth_k = tree_lib.depths(tree_lib.ancestor_mask(parent_k[None]))[0]
    pos_t = jnp.minimum(start + jnp.concatenate([jnp.zeros((1,), jnp.int32), depth_k]), LOGITS.shape[0] - 1)
    return LOGITS[pos_t], pos_t


def recycle_rounds():
    """(draft(state, root) -> (tokens, parents, len), learn(state, block, pos_t) -> state, state0)."""
    # Three candidates under the root (ranks 0-2), two under the first: renormalisation after a rejected
    # sibling matters (a best-first template of 6 nodes would have two).
    drafter = RecycleDrafter(StaticTree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)]), width=3)
    table = jnp.full((5, 3), EMPTY, jnp.int32).at[2].set(jnp.array([0, 1, 3])).at[0].set(jnp.array([1, 2, EMPTY]))

    def draft(table, root):
        view = types.SimpleNamespace(draft_state=RecycleState(table, root[None]), last_b=root[None])
        d, _ = drafter.propose(None, (), view, K)
        return d.tokens_bk[0], d.parent_bk[0], d.len_b

    def learn(table, block_t, pos_t, n):
        return update_table(table, block_t[None], TOP[pos_t][None], n[None] + 1)

    return draft, learn, table


def lookup_rounds():
    hist = jnp.asarray([4, 0, 3, 1, 4, 0, 1, 2, 4, 0, 4, 0] + [0] * 4, jnp.int32)  # "4 0" → 3 / 1 / 4

    def draft(state, root):
        h, n = state
        d = lookup_tree_propose(h[None], n[None], K, branches=3, depth=2)
        return d.tokens_bk[0], d.parent_bk[0], d.len_b

    def learn(state, block_t, pos_t, n):
        return state

    return draft, learn, (hist, jnp.int32(12))


def _commit(state, tok, kind):
    """Round 2's drafter state: the lookup history grows by the committed token; the table is kept."""
    if kind == "lookup":
        h, n = state
        return h.at[n].set(tok), n + 1
    return state


@functools.partial(jax.jit, static_argnames=("kind", "rule"))
def first_two_tokens(keys, *, kind, rule):
    draft, learn, state0 = recycle_rounds() if kind == "recycle" else lookup_rounds()
    root0 = jnp.int32(2 if kind == "recycle" else 0)

    def one(key):
        k1, k2 = jax.random.split(key)
        tok_k, par_k, n = draft(state0, root0)
        logits, pos_t = _rows(par_k, 0)
        acc1, tok1, _ = rule(logits[None], tok_k[None], par_k[None], n, k1, 1.0, 0, 1.0, None)
        state = learn(state0, jnp.concatenate([root0[None], tok_k]), pos_t, n[0])
        state = _commit(state, tok1[0, 0], kind)
        tok_k, par_k, n = draft(state, tok1[0, 0])  # round 2 starts at position 1 after one token
        logits, _ = _rows(par_k, 1)
        _, tok2, _ = rule(logits[None], tok_k[None], par_k[None], n, k2, 1.0, 0, 1.0, None)
        return tok1[0, 0], jnp.where(acc1[0] >= 1, tok1[0, 1], tok2[0, 0])

    return jax.vmap(one)(keys)


@pytest.mark.parametrize("kind", ["recycle", "lookup"])
def test_drafted_trees_preserve_the_target_distribution(kind):
    first, second = first_two_tokens(KEYS, kind=kind, rule=tree_sampling_verify)
    stat, dof = chi_square(first, second, np.outer(P[0], P[1]))
    assert dof == 24 and stat < CHI2_999[dof], stat
    # The trees were real: the first token often came from an accepted node (not only the correction).
    wrong_first, wrong_second = first_two_tokens(KEYS, kind=kind, rule=wrong_tree_verify)
    wrong, _ = chi_square(wrong_first, wrong_second, np.outer(P[0], P[1]))
    assert wrong > 5 * CHI2_999[dof], wrong


@pytest.mark.parametrize("kind", ["recycle", "lookup"])
def test_the_drafts_are_trees_with_siblings(kind):
    """What the statistical test drafts: several candidates under the root, so renormalisation matters."""
    draft, _, state0 = recycle_rounds() if kind == "recycle" else lookup_rounds()
    tok_k, par_k, n = draft(state0, jnp.int32(2 if kind == "recycle" else 0))
    real = np.asarray(par_k)[: int(n[0])]
    assert int(n[0]) >= 4 and (real == -1).sum() >= 3, (np.asarray(tok_k), real)
