"""Medusa drafter pieces that need no compiled loop: trees from head accuracies, hooks, errors."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from specjax.decode import Observation, Prefill
from specjax.decode.spec.drafters.medusa import MedusaDrafter, MedusaDrafterError, tree_from_accuracies
from specjax.decode.spec.trees import MEDUSA_63, StaticTree, TreeError
from specjax.models import MedusaConfig, MedusaHeads


def _expected_accepted(tree: StaticTree, acc):
    return sum(np.prod([acc[d, r] for d, r in enumerate(p)]) for p in tree.paths)


def test_tree_from_accuracies_is_optimal_on_small_cases():
    acc = np.array([[0.6, 0.2, 0.1], [0.5, 0.2, 0.1], [0.4, 0.1, 0.05]])
    tree = tree_from_accuracies(acc, 5)
    # Best-first: (0,) .6, (0,0) .3, (1,) .2, (0,0,0) .12, (0,1) .12 (tie: first pushed wins).
    assert set(tree.paths) == {(0,), (0, 0), (1,), (0, 0, 0), (0, 1)}
    # Brute force over all prefix-closed 5-node subsets of depth <= 3, ranks <= 2.
    import itertools
    nodes = [p for d in (1, 2, 3) for p in itertools.product(range(3), repeat=d)]
    best = 0.0
    for subset in itertools.combinations(nodes, 5):
        s = set(subset)
        if all(len(p) == 1 or p[:-1] in s for p in s):
            best = max(best, _expected_accepted(StaticTree.from_paths(subset), acc))
    assert _expected_accepted(tree, acc) == pytest.approx(best)


def test_tree_from_accuracies_errors():
    with pytest.raises(TreeError, match="at most 2 nodes"):
        tree_from_accuracies(np.array([[0.5, 0.1]]), 3)
    with pytest.raises(TreeError, match="table of probabilities"):
        tree_from_accuracies(np.array([1.5]), 1)


def test_hooks_track_the_feature_before_the_last_committed_token():
    heads = MedusaHeads(MedusaConfig(d_model=4, n_heads=4))
    drafter, _ = MedusaDrafter.build(heads, None, StaticTree.from_paths(MEDUSA_63))
    hidden = jnp.arange(2 * 3 * 4, dtype=jnp.float32).reshape(2, 3, 4)
    pre = Prefill(tokens_bt=jnp.zeros((2, 3), jnp.int32), len_b=jnp.array([3, 2]), hidden_btd=hidden,
                  first_b=jnp.zeros((2,), jnp.int32), num_slots=8)
    ds = drafter.init(None, None, pre)
    np.testing.assert_array_equal(ds.feat_bd, hidden[jnp.arange(2), jnp.array([2, 1])])
    obs = Observation(tokens_bt=jnp.zeros((2, 3), jnp.int32), hidden_btd=-hidden, n_b=jnp.array([2, 0]),
                      pos_b=jnp.array([3, 2]))
    ds2 = drafter.observe(None, None, ds, obs)
    np.testing.assert_array_equal(ds2.feat_bd[0], -hidden[0, 1])  # the state that predicted token 2 of 2
    np.testing.assert_array_equal(ds2.feat_bd[1], ds.feat_bd[1])  # finished row: unchanged


def test_settings_errors():
    heads = MedusaHeads(MedusaConfig(d_model=4, n_heads=2), rngs=nnx.Rngs(0))
    with pytest.raises(MedusaDrafterError, match="4 deep but there are only 2 Medusa heads"):
        MedusaDrafter.build(heads, None, StaticTree.from_paths(MEDUSA_63))
    drafter, _ = MedusaDrafter.build(heads, None, StaticTree.chain(2))
    with pytest.raises(MedusaDrafterError, match="k=3 must equal the Medusa tree's node count 2"):
        drafter.propose(None, None, None, 3)
