"""What model-based chain drafters share: a partial forward, the draft head, token choice, the k-step loop.

A model drafter (`layer_skip.py`, `draft_model.py`) proposes k tokens by k sequential one-token
forwards of a cheap network (static shapes: a `lax.scan`). At each step it turns the network's
hidden state into a token:

  * greedy decoding (T = 0): the argmax of the draft logits; q is not needed (greedy verification
    compares tokens), so the draft is deterministic;
  * sampling: the draft logits are filtered exactly like the target's (`sampling.filter_logits`
    with the loop's temperature / top-k / top-p) and the token is sampled from that q, which is
    reported over the FULL target vocabulary — zero outside a reduced draft vocabulary — so
    `verify.sampling_verify` stays lossless.

A reduced draft vocabulary (FR-Spec / EAGLE-3) scores only N kept target ids (`draft_vocab.HeadTable`): on
Gemma 3 the 262,144-row head is most of a draft step's cost. Confidence-based adaptive length: a
draft is cut at its first position whose top draft probability is below a threshold.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decode.backend import BackendProfile
from specjax.decode.errors import GenerationError
from specjax.decode.sampling import filter_logits, sample_weights
from specjax.decode.spec.drafters.base import Draft, DraftSampling
from specjax.decode.spec.trees import confident_length
from specjax.models.draft_vocab import DraftVocab, DraftVocabError, HeadTable
from specjax.models.kv_cache import attention_masks, causal_block_mask
from specjax.models.reductions import max_argmax

# Salt for the draft's PRNG stream: `jax.random.fold_in(key, i)` equals `split(key)[i]` for small i,
# and the loop splits its key in two per round, so a small constant would reuse verification's key.
_DRAFT_SALT = 0x5EED_D12A


def reduced_head(model, ids_n) -> HeadTable:
    """The draft head over the kept target ids `ids_n` (sorted, unique): rows of `model`'s output head.

    Raises:
      GenerationError: ids that are not a sorted, unique, non-empty list inside the vocabulary.
    """
    table_vd = model.head_table()
    try:
        vocab = ids_n if isinstance(ids_n, DraftVocab) else DraftVocab(np.asarray(ids_n), model.cfg.vocab_size)
        return vocab.head(table_vd, model.cfg.final_logit_softcap)
    except DraftVocabError as e:
        raise GenerationError(f"reduced draft vocabulary: {e}") from None


def forward_layers(model, layers, kv_k, kv_v, tokens_bt, positions_bt, start_b):
    """Runs the given decoder blocks of `model` (in order) over a block of tokens, then its final norm.

    Args:
      model: a `Transformer`.
      layers: indices of the blocks to run (static).
      kv_k, kv_v: one cache array per listed block (`KVCache` layouts: keys [B, S, kv_heads, head_dim],
        values [B, kv_heads, head_dim, S]); slot s holds position s.
      tokens_bt, positions_bt: the block's tokens and positions; start_b: its first slot per row.

    Returns:
      (final-normed hidden states [B, T, D], new kv_k, new kv_v).
    """
    b, t = tokens_bt.shape
    window = model.cfg.sliding_window if "local" in model.cfg.layer_kinds else None
    block_mask_btt = jnp.broadcast_to(causal_block_mask(t), (b, t, t))
    masks = attention_masks(positions_bt, start_b, kv_k[0].shape[1], block_mask_btt, window)
    x_btd, (new_k, new_v), _ = model.run_blocks(model.embed_tokens(tokens_bt), positions_bt, masks, (kv_k, kv_v),
                                                start_b, layers)
    return model.final_norm(x_btd), new_k, new_v


def head_logits(model, head: HeadTable | None, hidden_bd: jax.Array, steps: jax.Array,
                profile: BackendProfile) -> jax.Array:
    """Draft logits [B, N] over the reduced vocabulary, or [B, V] through the model's own head."""
    if head is not None:
        return head.logits(hidden_bd)
    # As in the plain loop, on CPU: the fence keeps the final norm out of the one-row int8 head's fused
    # product, and `live` keeps a float32 copy of that head from being hoisted out of the loop (quant.py).
    return model.logits(profile.head_input(hidden_bd[:, None], steps), live=profile.live(steps))[:, 0]


def choose(logits_bn, ids_n, vocab_size: int, ctx: DraftSampling, key):
    """One draft token per row from draft logits over N candidates.

    Returns:
      (target ids [B], q over the full vocabulary [B, V] or None when greedy, top draft probability [B]).
    """
    if ctx.sampling.greedy:
        max_b, idx_b = max_argmax(logits_bn)
        conf_b = 1.0 / jnp.sum(jnp.exp(logits_bn - max_b[:, None]), axis=-1)
        q_bv = None
    else:
        n = logits_bn.shape[-1]
        # top-k over the kept ids: the target keeps k of all V; ids outside the draft vocabulary have q = 0
        # anyway, so keeping the k best kept ids (all of them when k > N) is the same filter.
        x_bn = filter_logits(logits_bn, ctx.temperature, min(ctx.sampling.top_k, n), ctx.top_p)
        q_bn = jax.nn.softmax(x_bn, axis=-1)
        idx_b = sample_weights(key, q_bn)  # q itself: no second exp over the draft vocabulary
        conf_b = jnp.max(q_bn, axis=-1)
        if ids_n is None:
            q_bv = q_bn
        else:
            q_bv = jnp.zeros((logits_bn.shape[0], vocab_size), jnp.float32).at[:, ids_n].set(q_bn)
    tok_b = idx_b if ids_n is None else jnp.take(ids_n, idx_b)
    return tok_b.astype(jnp.int32), q_bv, conf_b


def draft_chain(model, head: HeadTable | None, hidden_bd, carry, step, state, k: int, threshold: float):
    """k draft tokens: pick from hidden_bd, feed the pick to `step`, repeat (k - 1 forwards).

    Args:
      model: the network whose head drafts (when `head` is None) — the target or the draft model.
      head: a reduced draft head, or None for the model's full head.
      hidden_bd: final-normed hidden state at position pos_b (it predicts draft token 1).
      carry: the drafter's caches, threaded through `step`.
      step: (tokens_b, positions_b, carry) -> (hidden_bd, carry): one one-token forward.
      state: the loop's `DraftView` (position, PRNG key, sampling options).
      k: draft length (static); threshold: confidence cut (0 = always k).

    Returns:
      (Draft, carry after the k - 1 forwards).
    """
    ctx = state.sampling
    key = jax.random.fold_in(state.key, _DRAFT_SALT)
    ids_n = None if head is None else head.ids_n
    vocab = model.cfg.vocab_size

    def pick(i, h_bd):
        logits_bn = head_logits(model, head, h_bd, state.steps + i, state.profile)
        return choose(logits_bn, ids_n, vocab, ctx, jax.random.fold_in(key, i))

    def body(c, i):
        h_bd, inner = c
        tok_b, q_bv, conf_b = pick(i, h_bd)
        h_bd, inner = step(tok_b, state.pos_b + 1 + i, inner)
        return (h_bd, inner), (tok_b, q_bv, conf_b)

    (hidden_bd, carry), (tok_kb, q_kbv, conf_kb) = jax.lax.scan(body, (hidden_bd, carry), jnp.arange(k - 1))
    tok_b, q_bv, conf_b = pick(k - 1, hidden_bd)
    tokens_bk = jnp.concatenate([tok_kb.T, tok_b[:, None]], axis=1)
    conf_bk = jnp.concatenate([conf_kb.T, conf_b[:, None]], axis=1)
    q_bkv = None if q_bv is None else jnp.concatenate([jnp.swapaxes(q_kbv, 0, 1), q_bv[:, None]], axis=1)
    # The draft's own top probability per position (not the running product): stop where it first drops.
    len_b = (confident_length(conf_bk, threshold, cumulative=False) if threshold > 0
             else jnp.full(state.pos_b.shape, k, jnp.int32))
    return Draft(tokens_bk=tokens_bk, len_b=len_b, q_probs_bkv=q_bkv), carry
