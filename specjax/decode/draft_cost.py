"""What a costly drafter's k-token draft costs, in plain target steps, for the adaptive policy.

A speculative round pays the verify forward (`spec_rounds.estimated_verify_cost`) plus the draft. A
network drafter's draft is not free next to the target: a layer-skip draft step runs N of the
target's layers and its 262,144-row head, which alone is ~60% of a Gemma 3 270M step. The policy
(`spec_rounds.Adaptive.bar`) adds this estimate to the verify cost, so that a drafter speculates only
when its expected accepted tokens pay for both.

The model: decoding one token is memory-bound, so a forward costs about the parameters it reads. A
draft step that reads P parameters costs STEP_FIXED + (1 - STEP_FIXED) * P / P_target of a plain step,
where STEP_FIXED is the per-step overhead that does not shrink with the network (dispatch, sampling,
cache update; measured, see docs/performance.md "draft cost"). Drafters declare their per-round cost
with a `draft_cost(model, draft_params, k)` method built from `step_fraction`; a costly drafter that
declares none is charged `UNDECLARED_STEP` per draft token.
"""

from __future__ import annotations

import jax

from specjax.decode.drafters import is_cheap

STEP_FIXED = 0.1
UNDECLARED_STEP = 0.5


def layer_params(cfg) -> int:
    """Parameters of one decoder block of a model config (attention projections + gated MLP)."""
    d, h = cfg.d_model, cfg.head_dim
    attention = d * h * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)  # q and o, k and v
    return attention + 3 * d * cfg.ffn_dim


def target_params(cfg) -> int:
    """Parameters a plain target step reads: every block and the vocabulary-wide head."""
    return cfg.n_layers * layer_params(cfg) + cfg.vocab_size * cfg.d_model


def step_fraction(target_cfg, params_read: int) -> float:
    """Cost of a draft forward that reads `params_read` parameters, as a fraction of a target step."""
    return STEP_FIXED + (1.0 - STEP_FIXED) * params_read / target_params(target_cfg)


def param_count(tree) -> int:
    """Parameters in a pytree of arrays (a head module's weights)."""
    return sum(x.size for x in jax.tree.leaves(tree))


def head_rows(table, vocab_size: int) -> int:
    """Rows of the head a draft step multiplies: those of a reduced `draft_vocab.HeadTable`, else the
    target's whole vocabulary (table None)."""
    return vocab_size if table is None else int(table.table_nd.shape[0])


def max_accept(drafter, k: int) -> int:
    """The most draft tokens one round can accept: k for a chain, the depth for a token tree (a drafter
    declares it with a `max_accept(k)` method; undeclared: k)."""
    declared = getattr(drafter, "max_accept", None)
    return k if declared is None else min(k, int(declared(k)))


def draft_cost(drafter, model, draft_params, k: int) -> float:
    """A round's draft cost in plain target steps: 0 for a cheap drafter, else the drafter's estimate."""
    if is_cheap(drafter):
        return 0.0
    declared = getattr(drafter, "draft_cost", None)
    if declared is None:
        return UNDECLARED_STEP * k
    return float(declared(model, draft_params, k))
