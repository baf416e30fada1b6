"""Self-speculative drafting by layer skipping: the target's own layers, fewer of them, no training.

The draft network is a subset of the target's decoder blocks followed by the target's final norm
and head (optionally a reduced head, `draft_chain.VocabHead`). Each round it runs k one-token
forwards: the row's last committed token at pos_b, then its own drafts d_1 … d_{k-1}.

KV cache: the draft reads the TARGET's cache for its kept layers and writes its drafted tokens'
keys/values at slots pos_b … pos_b + k - 1 of a private copy of those layers (the interface
returns no cache, and the verification forward overwrites the same slots in the real one anyway).
  * Early exit (layers 0 … N-1): a kept layer's input at a committed position is exactly what the
    target computed there, so the target's cache holds exactly the keys/values the draft needs —
    the draft is the N-layer model, with nothing recomputed.
  * Any other subset (e.g. skipping middle layers): the target's cache entries were computed from
    the full stack's hidden states, not the draft's, so reading them is an approximation. It only
    changes which tokens are drafted — verification by the full target keeps the output exact.

The copy costs 2 × len(layers) × B × S × kv_heads × head_dim values per round (Gemma 3 270M, one
row of 256 slots: 0.5 MB per layer), small next to one read of the head.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from specjax.decode.errors import GenerationError
from specjax.decode.spec import cost
from specjax.decode.spec.drafters.base import Draft, StatelessDrafter
from specjax.decode.spec.drafters.chain import draft_chain, forward_layers, reduced_head
from specjax.models.draft_vocab import HeadTable

__all__ = ["LayerSkipDrafter", "reduced_head"]


@dataclasses.dataclass(frozen=True)
class LayerSkipDrafter(StatelessDrafter):
    """Drafts with the target's blocks `layers` (in order) + its final norm and head.

    draft_params: a `draft_vocab.HeadTable` for a reduced draft vocabulary (`draft_chain.reduced_head`),
    or () for the target's full head.

    Attributes:
      layers: indices of the kept blocks, strictly increasing (e.g. (0, 1, 2, 3) = early exit after 4).
      threshold: adaptive draft length: a draft stops at its first position whose top draft
        probability is below this (0 = always k tokens).
    """

    cheap: ClassVar[bool] = False  # k forwards through the kept layers and the head

    layers: tuple[int, ...]
    threshold: float = 0.0

    def __post_init__(self) -> None:
        layers = tuple(int(i) for i in self.layers)
        if not layers or any(i < 0 for i in layers) or list(layers) != sorted(set(layers)):
            raise GenerationError(f"layer-skip layers must be non-empty, >= 0 and strictly increasing, got {layers}")
        if not 0.0 <= self.threshold < 1.0:
            raise GenerationError(f"draft confidence threshold must be in [0, 1), got {self.threshold!r}")
        object.__setattr__(self, "layers", layers)

    @classmethod
    def early_exit(cls, n: int, threshold: float = 0.0) -> LayerSkipDrafter:
        """The first n layers."""
        if n < 1:
            raise GenerationError(f"layer-skip needs at least one layer, got {n}")
        return cls(tuple(range(n)), threshold)

    def check(self, model) -> None:
        """Raises GenerationError when the layers do not exist in `model`."""
        n = model.cfg.n_layers
        if self.layers[-1] >= n:
            raise GenerationError(f"layer-skip layers {self.layers} exceed the target's {n} layers (0 … {n - 1})")

    def draft_cost(self, model, draft_params, k: int) -> float:
        """k steps through the kept layers and the (reduced or full) head, in target steps (`draft_cost`)."""
        head = draft_params if isinstance(draft_params, HeadTable) else None
        read = cost.blocks_bytes(model, self.layers) + cost.head_bytes(model, head)
        return k * cost.step_fraction(model, read)

    def propose(self, model, draft_params, state, k: int) -> tuple[Draft, Any]:
        self.check(model)
        head = draft_params if isinstance(draft_params, HeadTable) else None
        kv_k = tuple(state.cache.k[i] for i in self.layers)
        kv_v = tuple(state.cache.v[i] for i in self.layers)

        def step(tok_b, pos_b, kv):
            hidden_b1d, k_new, v_new = forward_layers(model, self.layers, *kv, tok_b[:, None], pos_b[:, None], pos_b)
            return hidden_b1d[:, 0], (k_new, v_new)

        # The row's last token (at pos_b, not yet in the cache) gives the state predicting draft 1.
        hidden_bd, kv = step(state.last_b, state.pos_b, (kv_k, kv_v))
        draft, _ = draft_chain(model, head, hidden_bd, kv, step, state, k, self.threshold)
        return draft, state.draft_state
