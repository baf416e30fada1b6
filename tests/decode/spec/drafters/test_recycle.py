"""Token Recycling: the successor table's updates alone, the template, drafting, and greedy equality.

Batch 8 (ragged, EOS inside accepted blocks) is in test_batch8_equality; the sampling proof in
test_token_tree_sampling; the real model in test_token_trees_real.
"""

import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ByteTokenizer

from specjax.decode import GenerateConfig, Generator, SamplingConfig, SpecConfig, SpeculativeGenerator
from specjax.decode.spec.drafters.base import Observation
from specjax.decode.spec.drafters.recycle import (
    EMPTY,
    RecycleDrafter,
    RecycleState,
    empty_table,
    expand,
    insert_committed,
    insert_successor,
    seed_from_prompts,
    template,
    update_table,
)
from specjax.decode.spec.trees import StaticTree, TreeError

E = EMPTY


def test_update_replaces_the_rows_of_the_counted_tokens_only():
    table = jnp.asarray(np.arange(18).reshape(6, 3), jnp.int32)
    tokens = jnp.array([[2, 4, 1], [5, 0, 3]])
    top = jnp.array([[[9, 8, 7], [6, 5, 4], [3, 2, 1]], [[1, 1, 1], [2, 2, 2], [3, 3, 3]]])
    out = np.asarray(update_table(table, tokens, top, jnp.array([2, 0])))  # row 0: two tokens; row 1: none
    want = np.arange(18).reshape(6, 3)
    want[2], want[4] = [9, 8, 7], [6, 5, 4]
    np.testing.assert_array_equal(out, want)


def test_insert_moves_a_listed_token_to_the_front_and_pushes_out_the_last():
    table = jnp.asarray([[3, 5, E], [1, 2, 3], [E, E, E]], jnp.int32)
    prev, nxt = jnp.array([0, 1, 2, 0]), jnp.array([5, 4, 7, 9])
    valid = jnp.array([True, True, True, False])
    out = np.asarray(insert_successor(table, prev, nxt, valid))
    # Row 0: 5 moves up (no repeat); row 1: 4 is new, 3 falls off; row 2: first entry; the invalid pair is ignored.
    assert out.tolist() == [[5, 3, E], [4, 1, 2], [7, E, E]]


def test_insert_committed_chains_the_pairs_of_a_round():
    table = empty_table(6, 2)
    # Row 0 committed 3 tokens after token 0: pairs 0→1, 1→2, 2→1; row 1 committed 1 (5→4) of a padded block.
    out = insert_committed(table, jnp.array([0, 5]), jnp.array([[1, 2, 1], [4, 3, 3]]), jnp.array([3, 1]))
    assert np.asarray(out).tolist() == [[1, E], [2, E], [1, E], [E, E], [E, E], [4, E]]


def test_prompts_seed_rank_0_and_the_latest_pair_wins():
    tokens = jnp.array([[1, 2, 1, 3, 0, 0], [4, 1, 0, 0, 0, 0]])  # row 1 is 2 tokens long: 4→1 only
    out = np.asarray(seed_from_prompts(empty_table(6, 2), tokens, jnp.array([4, 2])))
    assert out[:, 0].tolist() == [E, 3, 1, E, 1, E] and (out[:, 1] == E).all()


def test_template_is_best_first_and_prefix_closed():
    t = template(8, 3)
    assert t.size == 8 and t.paths[:3] == ((0,), (1,), (0, 0))
    assert all(len(p) == 1 or p[:-1] in t.paths for p in t.paths)
    assert max(max(p) for p in t.paths) < 3 and template(1, 1).paths == ((0,),)
    assert template(4, 1).paths == ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0))  # width 1: a chain
    with pytest.raises(TreeError):
        template(9, 1)  # one rank and 8 levels hold 8 nodes


def test_expand_walks_the_table_breadth_first_and_drops_empty_entries():
    tree = StaticTree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    table = jnp.asarray([[1, 2], [3, E], [4, 5], [0, 1], [E, E], [E, E]], jnp.int32)
    tokens, valid = expand(table, jnp.array([0, 4]), tree)
    # Root 0: (0,)=1, (1,)=2, (0,0)=table[1,0]=3, (0,1)=table[1,1] empty, (1,0)=table[2,0]=4,
    # (0,0,0)=table[3,0]=0. Root 4 has no successors: nothing is valid.
    assert np.asarray(tokens)[0].tolist()[:3] == [1, 2, 3] and np.asarray(tokens)[0, 4] == 4
    assert np.asarray(valid).tolist() == [[True, True, True, False, True, True], [False] * 6]


def _view(table, last_b):
    return types.SimpleNamespace(draft_state=RecycleState(table_vr=table, last_b=last_b), last_b=last_b)


def test_propose_compacts_the_tree_and_observe_learns_from_blocks_and_plain_rounds():
    drafter = RecycleDrafter(StaticTree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]), width=2)
    table = jnp.asarray([[1, 2], [3, E], [4, 5], [0, 1], [E, E], [E, E]], jnp.int32)
    draft, _ = drafter.propose(None, (), _view(table, jnp.array([0, 4])), 6)
    assert np.asarray(draft.len_b).tolist() == [5, 0]
    # The empty (0, 1) node is gone: nodes 1, 2, 3, 4, 0 with parents root, root, node 0, node 1, node 2.
    assert np.asarray(draft.tokens_bk)[0, :5].tolist() == [1, 2, 3, 4, 0]
    assert np.asarray(draft.parent_bk)[0, :5].tolist() == [-1, -1, 0, 1, 2]
    state = RecycleState(table_vr=table, last_b=jnp.array([0, 4]))
    # A speculative round: row 0 verified the block [0, 1, 2] (the target ranked [2, 5] after 1), row 1
    # finished (block length 0); row 0 committed 1 then 2.
    obs = Observation(tokens_bt=jnp.array([[1, 2], [0, 0]]), hidden_btd=jnp.zeros((2, 2, 1)), n_b=jnp.array([2, 0]),
                      pos_b=jnp.array([3, 3]), block_bt=jnp.array([[0, 1, 2], [4, 4, 4]]),
                      block_top_btr=jnp.array([[[1, 2], [2, 5], [0, 3]], [[5, 5]] * 3]), block_len_b=jnp.array([3, 0]))
    state = drafter.observe(None, (), state, obs)
    assert np.asarray(state.table_vr).tolist() == [[1, 2], [2, 5], [0, 3], [0, 1], [E, E], [E, E]]
    assert np.asarray(state.last_b).tolist() == [2, 4]
    # A plain round: row 1 committed 5 after 4 (its entry fills), row 0 committed 3 after 2 (moved to the front).
    obs = Observation(tokens_bt=jnp.array([[3], [5]]), hidden_btd=jnp.zeros((2, 1, 1)), n_b=jnp.array([1, 1]),
                      pos_b=jnp.array([5, 3]))
    state = drafter.observe(None, (), state, obs)
    assert np.asarray(state.table_vr)[[2, 4]].tolist() == [[3, 0], [5, E]]
    assert np.asarray(state.last_b).tolist() == [3, 5]


def test_top_tokens_is_the_top_k_of_the_logits(tiny_model):
    hidden = jax.random.normal(jax.random.key(0), (2, 3, tiny_model.cfg.d_model))
    want = jax.lax.top_k(tiny_model.logits(hidden), 4)[1]
    np.testing.assert_array_equal(tiny_model.top_tokens(hidden, 4), want)


@pytest.mark.parametrize("adaptive", [False, True], ids=["every_round", "adaptive"])
def test_greedy_equals_plain_greedy_batch1(tiny_model, adaptive):
    """Batch 1 on the random tiny model (its text repeats, so recycled successors get accepted); with the
    adaptive policy plain rounds mix in (and teach the table through `insert_committed`)."""
    prompts = ["abcabcabcabc", "the cat the cat"]
    cfg = GenerateConfig(max_new_tokens=24, batch_size=1, ignore_eos=True)
    ref, _ = Generator(tiny_model, ByteTokenizer()).generate(prompts, cfg)
    spec = SpecConfig(k=8, method="recycle", recycle_width=4, adaptive=adaptive, min_best_gain=0,
                      min_expected_accept=3.0)
    out, stats = SpeculativeGenerator(tiny_model, ByteTokenizer()).generate(prompts, cfg, spec)
    assert [o.tokens for o in out] == [r.tokens for r in ref]
    assert stats.tau > 1.5, stats.line()
    assert (0 < stats.plain_rate < 1) if adaptive else stats.plain_rate == 0, stats.line()


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
def test_top_r_of_a_batch_is_no_sort_of_the_vocabulary(tiny_model, temperature):
    """The block's top-r at batch > 1 ([B, k+1, V] logits) stays XLA's top-k kernel: a 3-D top-k inside the
    program became a full sort of every row (9.4 s per round at batch 8 on Gemma's 262,144 ids, not 0.8 s)."""
    sampling = SamplingConfig(temperature=temperature)
    cfg = GenerateConfig(max_new_tokens=4, batch_size=4, ignore_eos=True, sampling=sampling)
    gen = SpeculativeGenerator(tiny_model, ByteTokenizer())
    gen.generate(["abcabc", "the cat", "x", "hello"], cfg, SpecConfig(k=8, method="recycle", adaptive=False))
    (program,) = gen._programs.values()
    vocab = tiny_model.cfg.vocab_size
    sorts = re.findall(r"= \(?([a-z0-9]+\[[0-9,]*\])[^=]* sort\(", program.as_text())
    assert sorts and not [s for s in sorts if s.endswith(f",{vocab}]")], sorts
