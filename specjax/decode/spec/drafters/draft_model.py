"""A separate draft model sharing the target's tokenizer: any specjax `Transformer`, its own KV cache.

The drafter is static (it holds the draft model's graphdef); the draft's weights travel as
`DraftModelParams`, a jit argument, and its KV cache is the loop's `draft_state`:

  * init: the draft model prefills the prompts into its own cache (slot s holds position s, as in
    the target's cache; right-padding lands beyond each row's length and is overwritten later),
    then the first generated token at the prompt's length;
  * observe: after every round, speculative or plain, the committed tokens are fed as one block
    (positions pos_b + 1 …), so the draft cache always holds the whole committed text — also after
    a run of plain rounds in which `propose` never ran (adaptive drafting of a costly drafter);
  * propose: the draft re-feeds the row's last token (position pos_b; the same slot rewritten with
    the same position, for the hidden state that predicts draft 1), then drafts k tokens with
    k - 1 one-token forwards.

Slots of rejected drafts (and the block positions past a row's committed tokens) hold stale keys
and values at positions the row has not committed; the masks never show them and later writes,
by position, overwrite them — no rollback copies.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx, struct

from specjax.decode.errors import GenerationError
from specjax.decode.spec import cost
from specjax.decode.spec.drafters.base import Draft, Observation, Prefill
from specjax.decode.spec.drafters.chain import draft_chain, forward_layers, reduced_head
from specjax.models.draft_vocab import HeadTable
from specjax.models.kv_cache import KVCache
from specjax.models.params import build_model, model_weights
from specjax.models.transformer import Transformer


@struct.dataclass
class DraftModelParams:
    """draft_params of `DraftModelDrafter`: the draft model's nnx state and an optional reduced head."""

    state: Any
    head: HeadTable | None = None


@dataclasses.dataclass(frozen=True)
class DraftModelDrafter:
    """Drafts with a separate (smaller) `Transformer` over the target's vocabulary.

    Build it with `DraftModelDrafter.create(draft_model, target_model, vocab_ids=None)`, which checks
    the vocabularies and returns (drafter, draft_params).

    Attributes:
      graphdef: the draft model's nnx graphdef (static).
      threshold: adaptive draft length (see `LayerSkipDrafter`); 0 = always k tokens.
    """

    cheap: ClassVar[bool] = False  # k forwards of the draft model

    graphdef: Any
    threshold: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold < 1.0:
            raise GenerationError(f"draft confidence threshold must be in [0, 1), got {self.threshold!r}")

    @classmethod
    def create(cls, draft: Transformer, target: Transformer, vocab_ids=None,
               threshold: float = 0.0) -> tuple[DraftModelDrafter, DraftModelParams]:
        """(drafter, draft_params) for `draft` proposing to `target`.

        Args:
          draft, target: the two models; they must share the vocabulary (same tokenizer).
          vocab_ids: optional reduced draft vocabulary (a `DraftVocab`, or sorted kept target ids).
          threshold: draft confidence threshold (0 = off).

        Raises:
          GenerationError: the vocabularies differ, or bad ids.
        """
        dv, tv = draft.cfg.vocab_size, target.cfg.vocab_size
        if dv != tv:
            raise GenerationError(f"the draft model's vocabulary ({dv} tokens) differs from the target's ({tv}): "
                                  "a draft model must share the target's tokenizer")
        head = None if vocab_ids is None else reduced_head(draft, vocab_ids)
        graphdef, state = nnx.split(draft)
        return cls(graphdef, threshold), DraftModelParams(state=state, head=head)

    def _model(self, draft_params: DraftModelParams) -> Transformer:
        return nnx.merge(self.graphdef, draft_params.state)

    def init(self, model, draft_params: DraftModelParams, prefill: Prefill) -> KVCache:
        draft = self._model(draft_params)
        b, t = prefill.tokens_bt.shape
        positions_bt = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        _, cache = draft(prefill.tokens_bt, positions_bt, draft.init_cache(b, prefill.num_slots),
                         jnp.zeros((b,), jnp.int32))
        return self._feed(draft, cache, prefill.first_b[:, None], prefill.len_b)

    def draft_cost(self, model, draft_params: DraftModelParams, k: int) -> float:
        """k steps of the draft model (its blocks and head), in target steps (`draft_cost`)."""
        draft = self._model(draft_params)
        read = cost.blocks_bytes(draft) + cost.head_bytes(draft, draft_params.head)
        return k * cost.step_fraction(model, read)

    def propose(self, model, draft_params: DraftModelParams, state, k: int) -> tuple[Draft, KVCache]:
        draft = self._model(draft_params)
        cache: KVCache = state.draft_state
        layers = tuple(range(draft.cfg.n_layers))

        def step(tok_b, pos_b, kv):
            hidden_b1d, k_new, v_new = forward_layers(draft, layers, *kv, tok_b[:, None], pos_b[:, None], pos_b)
            return hidden_b1d[:, 0], (k_new, v_new)

        hidden_bd, kv = step(state.last_b, state.pos_b, (cache.k, cache.v))
        drafted, (kv_k, kv_v) = draft_chain(draft, draft_params.head, hidden_bd, kv, step, state, k, self.threshold)
        return drafted, KVCache(k=kv_k, v=kv_v)

    def observe(self, model, draft_params, draft_state: KVCache, obs: Observation) -> KVCache:
        """Writes the round's committed tokens (all T block positions; those past n_b are overwritten later)."""
        # A live row's block ends inside the cache (pos_b + T < slots); only a finished row (n_b = 0,
        # its cache never read again) can reach past the end, so its start is capped to keep the
        # write in bounds (the cache update would clamp it anyway).
        start_b = jnp.minimum(obs.pos_b + 1, draft_state.num_slots - obs.tokens_bt.shape[1])
        return self._feed(self._model(draft_params), draft_state, obs.tokens_bt, start_b)

    @staticmethod
    def _feed(draft: Transformer, cache: KVCache, tokens_bt: jax.Array, start_b: jax.Array) -> KVCache:
        """The draft cache with tokens_bt[b] written at positions (= slots) start_b[b], start_b[b] + 1, …"""
        positions_bt = start_b[:, None] + jnp.arange(tokens_bt.shape[1], dtype=jnp.int32)[None, :]
        _, kv_k, kv_v = forward_layers(draft, tuple(range(draft.cfg.n_layers)), cache.k, cache.v, tokens_bt,
                                       positions_bt, start_b)
        return KVCache(k=kv_k, v=kv_v)


def slice_model(model: Transformer, layers) -> Transformer:
    """A new `Transformer` made of `model`'s blocks `layers` (+ its embedding, final norm and head).

    A cheap stand-in for a trained draft model in tests and benchmarks (e.g. the first 2 of Gemma
    3 270M's 18 layers). It shares the target's int8 head copy when there is one.
    """
    layers = tuple(int(i) for i in layers)
    if not layers or min(layers) < 0 or max(layers) >= model.cfg.n_layers:
        raise GenerationError(f"slice layers {layers} must lie in 0 … {model.cfg.n_layers - 1}")
    cfg = model.cfg.replace(n_layers=len(layers), layer_kinds=tuple(model.cfg.layer_kinds[i] for i in layers))
    weights = {}
    for name, w in model_weights(model).items():
        if name.startswith("blocks."):
            _, idx, rest = name.split(".", 2)
            if int(idx) in layers:
                weights[f"blocks.{layers.index(int(idx))}.{rest}"] = w
        else:
            weights[name] = w
    sliced = build_model(cfg, weights, model.dtype, source=f"slice {layers} of the model")
    sliced.head_quant = model.head_quant
    return sliced


def load_draft_model(path: str, target: Transformer, dtype: str = "float32") -> Transformer:
    """Loads a draft model (GGUF file, Hugging Face directory, or `gemma3-270m`) and checks its vocabulary."""
    from specjax.models.loading import load_model

    draft, _ = load_model(path, dtype)
    if draft.cfg.vocab_size != target.cfg.vocab_size:
        raise GenerationError(f"draft_model={path!r} has a {draft.cfg.vocab_size}-token vocabulary but the target has "
                              f"{target.cfg.vocab_size}: a draft model must share the target's tokenizer")
    jax.block_until_ready(nnx.state(draft))
    return draft
