"""Token trees: structure helpers against Python oracles, tree forward == chain forward, compaction."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from specjax.decode.spec import trees as tree_lib
from specjax.decode.spec.trees import MEDUSA_63, StaticTree, TreeError, confident_length
from specjax.decode.spec.verify import greedy_verify, tree_greedy_verify
from specjax.models.kv_cache import KVCache, move_slots


def random_parents(rng, k):
    """A random topologically ordered tree: node j's parent is uniform in -1 … j-1."""
    return np.array([rng.integers(-1, j) for j in range(k)], np.int32)


def oracle_ancestors(parents):
    """ancestors-or-self sets and depths by walking up the parent pointers."""
    k = len(parents)
    anc, depth = np.zeros((k, k), bool), np.zeros(k, np.int32)
    for j in range(k):
        i = j
        while i >= 0:
            anc[j, i] = True
            depth[j] += 1
            i = parents[i]
    return anc, depth


def test_masks_depths_positions_match_the_oracle():
    rng = np.random.default_rng(0)
    for k in (1, 2, 5, 9, 17):
        parents_bk = np.stack([random_parents(rng, k) for _ in range(3)])
        anc_bkk = np.asarray(tree_lib.ancestor_mask(jnp.asarray(parents_bk)))
        depth_bk = np.asarray(tree_lib.depths(jnp.asarray(anc_bkk)))
        mask_btt = np.asarray(tree_lib.block_mask(jnp.asarray(anc_bkk)))
        pos_b = np.array([3, 0, 11], np.int32)
        positions_bt = np.asarray(tree_lib.block_positions(jnp.asarray(pos_b), jnp.asarray(depth_bk)))
        for b in range(3):
            want_anc, want_depth = oracle_ancestors(parents_bk[b])
            np.testing.assert_array_equal(anc_bkk[b], want_anc)
            np.testing.assert_array_equal(depth_bk[b], want_depth)
            # The block: root row sees only itself; node rows see the root and their ancestors-or-self.
            want_mask = np.zeros((k + 1, k + 1), bool)
            want_mask[:, 0] = True
            want_mask[1:, 1:] = want_anc
            np.testing.assert_array_equal(mask_btt[b], want_mask)
            np.testing.assert_array_equal(positions_bt[b], pos_b[b] + np.concatenate([[0], want_depth]))


def test_a_chain_is_the_causal_block():
    parents = jnp.asarray(StaticTree.chain(6).parent_bk(2))
    anc = tree_lib.ancestor_mask(parents)
    np.testing.assert_array_equal(np.asarray(tree_lib.block_mask(anc))[0], np.tril(np.ones((7, 7), bool)))
    assert np.asarray(tree_lib.depths(anc))[1].tolist() == [1, 2, 3, 4, 5, 6]


def test_malformed_in_graph_parents_cannot_form_cycles():
    # Parent indices >= j (not topological) are clipped to j - 1; below -1 to the root.
    anc = tree_lib.ancestor_mask(jnp.array([[3, 7, -5]]))
    assert np.asarray(tree_lib.depths(anc)).tolist() == [[1, 2, 1]]


def test_static_tree_from_paths():
    tree = StaticTree.from_paths([(1,), (0, 0), (0,), (1, 0), (0, 0, 2), (0, 1)])
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 2))
    assert tree.parents.tolist() == [-1, -1, 0, 0, 1, 2]
    assert tree.depths.tolist() == [1, 1, 2, 2, 2, 3]
    assert tree.ranks.tolist() == [0, 1, 0, 1, 0, 2]
    assert tree.max_depth == 3 and tree.max_rank == 3 and tree.size == 6
    # gather: node j takes the ranks[j]-th candidate of level depths[j].
    topk_bdr = jnp.arange(2 * 3 * 3).reshape(2, 3, 3)
    assert np.asarray(tree.gather(topk_bdr))[1].tolist() == [9, 10, 12, 13, 12, 17]
    assert np.asarray(tree.parent_bk(2)).shape == (2, 6)
    assert hash(tree) == hash(StaticTree.from_paths(list(tree.paths)))  # usable as a static jit argument


def test_medusa_tree():
    tree = StaticTree.from_paths(MEDUSA_63)
    assert tree.size == 63 and tree.max_depth == 4 and tree.max_rank == 10
    anc, depth = oracle_ancestors(tree.parents)
    np.testing.assert_array_equal(depth, tree.depths)
    assert StaticTree.chain(3).paths == ((0,), (0, 0), (0, 0, 0))


def test_static_tree_from_accuracies_is_the_best_tree_by_brute_force():
    acc = [[0.7, 0.2, 0.1], [0.6, 0.25, 0.1], [0.5, 0.3, 0.1]]
    all_paths = [p for d in range(1, 4) for p in np.ndindex(*(3,) * d)]
    value = {p: float(np.prod([acc[d][r] for d, r in enumerate(p)])) for p in all_paths}
    for size in (1, 4, 9):
        tree = StaticTree.from_accuracies(acc, size)
        assert tree.size == size
        # The best possible: the top `size` node values (any such set is closed under parents).
        best = sorted(value.values(), reverse=True)[:size]
        assert sum(value[p] for p in tree.paths) == pytest.approx(sum(best))
    assert StaticTree.from_accuracies(acc, 4).paths == ((0,), (1,), (0, 0), (0, 0, 0))
    with pytest.raises(TreeError, match="tree size 40 must be in 1..39"):
        StaticTree.from_accuracies(acc, 40)
    with pytest.raises(TreeError, match=r"lie in \[0, 1\]"):
        StaticTree.from_accuracies([[1.5]], 1)
    with pytest.raises(TreeError, match="equal-length rows"):
        StaticTree.from_accuracies([[0.5, 0.2], [0.5]], 2)


@pytest.mark.parametrize("paths, message", [
    ([(0,), (1, 0)], r"tree path \(1, 0\) has no parent: its prefix \(1,\)"),
    ([(0,), (0,)], r"duplicate tree path \(0,\)"),
    ([(0,), ()], "empty path"),
    ([(0, -1)], "negative rank"),
    ([], "at least one path"),
])
def test_bad_static_trees(paths, message):
    with pytest.raises(TreeError, match=message):
        StaticTree.from_paths(paths)


def test_confident_length():
    conf = jnp.array([[0.9, 0.9, 0.9, 0.9], [0.5, 0.99, 0.99, 0.99], [0.9, 0.4, 0.9, 0.9], [0.1, 1, 1, 1]])
    # cumulative: 0.9, 0.81, 0.729, 0.656 | 0.5, … | 0.9, 0.36, … | 0.1
    assert confident_length(conf, 0.7).tolist() == [3, 0, 1, 0]
    assert confident_length(conf, 0.45, cumulative=False).tolist() == [4, 4, 1, 0]
    assert confident_length(conf, 0.45, cumulative=False, max_len_b=jnp.array([2, 4, 4, 4])).tolist() == [2, 4, 1, 0]
    assert jax.jit(confident_length)(conf, 0.0).tolist() == [4, 4, 4, 4]  # traced threshold


def test_move_slots_matches_the_oracle():
    rng = np.random.default_rng(1)
    b, s, layers = 3, 12, 2
    cache = KVCache(k=tuple(jnp.asarray(rng.normal(size=(b, s, 2, 4)), jnp.float32) for _ in range(layers)),
                    v=tuple(jnp.asarray(rng.normal(size=(b, 2, 4, s)), jnp.float32) for _ in range(layers)))
    # Row 0: a path compaction with overlap (slot 5 <- 7 while 7 <- 9); row 1: nothing; row 2: one drop.
    src = np.array([[4, 7, 9], [0, 0, 0], [3, 10, 11]], np.int32)
    dst = np.array([[4, 5, 7], [s, s, s], [2, s, 3]], np.int32)
    out = move_slots(cache, jnp.asarray(src), jnp.asarray(dst))
    for before, after in zip(np.asarray(cache.slot_major()), np.asarray(out.slot_major()), strict=True):
        want = before.copy()
        for r in range(b):
            moved = {int(d): before[r, sl] for sl, d in zip(src[r], dst[r], strict=True) if d < s}
            for d, val in moved.items():  # all reads happen before the writes
                want[r, d] = val
        np.testing.assert_array_equal(after, want)


# --------------------------------------------------------------------------- greedy tree verification
def test_tree_greedy_cases():
    # Tree: 0 and 1 under the root, 2 and 3 under 0, 4 under 1, 5 under 4.
    parents = jnp.array([[-1, -1, 0, 0, 1, 4]] * 4)
    # Target argmax by block row (0 = root, 1 + j = node j).
    argmax = [[5, 1, 3, 2, 6, 4, 7]] * 4
    tokens = jnp.array([
        [5, 5, 2, 1, 3, 4],  # 0 and 1 match; 0 -> 3 (depth 2) and 1 -> 4 -> 5 (depth 3) match: the deeper wins
        [1, 5, 6, 1, 3, 4],  # only node 1: then 4 (row 2: 3) matches, then 5 (row 5: 4) matches: depth 3
        [5, 1, 7, 1, 0, 0],  # node 0, then node 3 (row 1: 1): depth 2 via node 3
        [5, 5, 1, 0, 3, 4],  # both 0 (-> 2) and 1 (-> 4 -> 5) match; but len 4 cuts node 4 and 5
    ])
    len_b = jnp.array([6, 6, 6, 4])
    acc, tok, path = jax.jit(tree_greedy_verify)(jnp.asarray(argmax, jnp.int32), tokens, parents, len_b)
    assert acc.tolist() == [3, 3, 2, 2]
    assert path[:, :3].tolist() == [[1, 4, 5], [1, 4, 5], [0, 3, -1], [0, 2, -1]]
    # Emitted: the argmax along rows [0, 1 + path…].
    assert [tok[i, :a + 1].tolist() for i, a in enumerate(acc.tolist())] == [
        [5, 3, 4, 7], [5, 3, 4, 7], [5, 1, 6], [5, 1, 2]]


def test_tree_greedy_ties_take_the_lowest_index_and_nothing_valid_emits_the_target():
    parents = jnp.array([[-1, -1, -1], [-1, -1, -1]])
    tokens = jnp.array([[1, 2, 2], [2, 2, 2]])
    target = jnp.asarray([[2, 0, 4, 6, 7]] * 2, jnp.int32)
    acc, tok, path = jax.jit(tree_greedy_verify)(target, tokens, parents, jnp.array([3, 0]))
    assert acc.tolist() == [1, 0] and path[:, 0].tolist() == [1, -1]
    assert tok[0, :2].tolist() == [2, 4] and tok[1, 0] == 2


def test_tree_greedy_on_a_chain_equals_chain_greedy():
    rng = np.random.default_rng(2)
    k, v = 5, 4
    logits = jnp.asarray(rng.normal(size=(64, k + 1, v)), jnp.float32)
    # Mostly the argmax, sometimes not: accepted prefixes of every length.
    draft = jnp.where(jnp.asarray(rng.random((64, k)) < 0.8), jnp.argmax(logits[:, :k], -1),
                      jnp.asarray(rng.integers(0, v, (64, k)))).astype(jnp.int32)
    len_b = jnp.asarray(rng.integers(0, k + 1, 64), jnp.int32)
    target = jnp.argmax(logits, -1).astype(jnp.int32)
    acc_c, tok_c = greedy_verify(target, draft, len_b)
    acc_t, tok_t, path = jax.jit(tree_greedy_verify)(target, draft, StaticTree.chain(k).parent_bk(64), len_b)
    np.testing.assert_array_equal(acc_c, acc_t)
    for i, a in enumerate(np.asarray(acc_c)):
        assert tok_c[i, :a + 1].tolist() == tok_t[i, :a + 1].tolist()
        assert path[i, :a].tolist() == list(range(a))
    assert int(acc_c.max()) >= 3


# --------------------------------------------------------------------------- the tiny model
@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, tokens_bt, positions_bt, cache, start_b, mask_btt):
    model = nnx.merge(graphdef, state)
    hidden_btd, cache = model(tokens_bt, positions_bt, cache, start_b, mask_btt)
    return model.logits(hidden_btd), cache


def test_tree_forward_equals_chain_forward_along_every_path(tiny_model):
    """One tree forward gives, at every node, the chain forward's logits along the node's path
    (through depth 6 > the local window 4), and compaction leaves the cache as the chain's."""
    graphdef, state = nnx.split(tiny_model)
    rng = np.random.default_rng(3)
    prompt = jnp.asarray(rng.integers(3, 64, (1, 7)), jnp.int32)
    parents = np.array([-1, -1, 0, 0, 2, 4, 5, 6, 1], np.int32)  # a depth-6 spine plus side branches
    tokens = jnp.asarray(rng.integers(3, 64, (1, len(parents))), jnp.int32)
    k, slots = len(parents), 24
    pos = prompt.shape[1] - 1
    causal = lambda t: jnp.tril(jnp.ones((1, t, t), bool))
    _, cache0 = _forward(graphdef, state, prompt[:, :-1], jnp.arange(pos)[None], tiny_model.init_cache(1, slots),
                         jnp.zeros(1, jnp.int32), causal(pos))
    anc = tree_lib.ancestor_mask(jnp.asarray(parents)[None])
    depth = tree_lib.depths(anc)
    block = jnp.concatenate([prompt[:, -1:], tokens], axis=1)
    start = jnp.array([pos], jnp.int32)
    logits_tree, cache_tree = _forward(graphdef, state, block, tree_lib.block_positions(start, depth), cache0, start,
                                       tree_lib.block_mask(anc))
    anc_np, depth_np = oracle_ancestors(parents)
    leaves = [j for j in range(k) if j not in parents]
    for leaf in leaves:
        path = [i for i in range(k) if anc_np[leaf, i]]  # ancestors in index order = root-to-leaf order
        d = len(path)
        chain = jnp.concatenate([prompt[:, -1:], tokens[:, path]], axis=1)
        logits_chain, cache_chain = _forward(graphdef, state, chain, pos + jnp.arange(d + 1)[None], cache0, start,
                                             causal(d + 1))
        rows = [0] + [1 + i for i in path]
        np.testing.assert_allclose(logits_tree[0, rows], logits_chain[0], rtol=1e-5, atol=1e-5)
        # Compact the path (src slot pos + 1 + node -> pos + 1 + depth index); slots pos… now match the chain.
        moved = move_slots(cache_tree, jnp.asarray([[pos + 1 + i for i in path]]), pos + 1 + jnp.arange(d)[None])
        for got, want in zip(np.asarray(moved.slot_major()), np.asarray(cache_chain.slot_major()), strict=True):
            np.testing.assert_allclose(got[0, :pos + 1 + d], want[0, :pos + 1 + d], rtol=1e-5, atol=1e-6)
    assert max(depth_np) == 6 and len(leaves) == 3


def test_compact_keeps_valid_nodes_in_order_drops_orphans_pads_and_truncates():
    tokens = jnp.array([[10, 11, 12, 13, 14]])
    parents = jnp.array([[-1, 0, -1, 1, 2]])  # 3 is under 1, which is invalid: 3 goes too
    valid = jnp.array([[True, False, True, True, True]])
    tok, par, n = tree_lib.compact(tokens, parents, valid, 7)  # k > n: two padding slots
    assert n.tolist() == [3] and tok[0, :3].tolist() == [10, 12, 14] and par[0, :3].tolist() == [-1, -1, 1]
    assert tok.shape == (1, 7) and par.shape == (1, 7)
    tok, par, n = tree_lib.compact(tokens, parents, valid, 2)  # truncated: a prefix of a topological order
    assert n.tolist() == [2] and tok[0].tolist() == [10, 12] and par[0].tolist() == [-1, -1]
