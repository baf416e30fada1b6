"""Backend profiles: the XLA:CPU workarounds of the decode programs, chosen once per backend.

The decode loops carry three tricks that exist for XLA:CPU only (docs/performance.md, `quant.py`):

* the exact int8 copy of a quantised head (`quant.py`), read by one-row products: XLA:CPU fuses its
  conversion into the product; other backends read the float32 table (`Generator` drops the copy);
* the loop counter passed as `live` to that one-row int8 head, a no-op XLA cannot prove, so that
  loop-invariant code motion does not hoist a float32 copy of the head out of the loop;
* an `optimization_barrier` before the head, so the final norm stays out of the head's fused product;
* `IN_PLACE_COMPILER_OPTIONS` (XLA:CPU's copy insertion with region analysis: the donated KV cache
  is updated in place inside the while loops);
* the first-token clock as a `lax.cond` on the loop counter inside the loop body (one program, no
  second copy of the body).

On GPU / TPU they are noise or worse (a barrier blocks fusions, a flag another backend does not
know), so the accelerator profile uses plain fused ops, and peels the first token's iteration out
of the loop for the clock instead of branching every token. Tokens are the same either way: every
trick is a no-op on values (`tests/decode/test_backend.py` runs both profiles on CPU).
"""

from __future__ import annotations

import dataclasses

import jax

from specjax.models.kv_cache import IN_PLACE_COMPILER_OPTIONS


@dataclasses.dataclass(frozen=True)
class BackendProfile:
    """How the decode programs are built for one backend (static: part of every program's key).

    Attributes:
      name: "cpu" or "accelerator".
      int8_head: keep the model's int8 head copy for one-row products (else the float32 table).
      live_counter: pass the loop counter to the head as `live` (see the module doc).
      head_barrier: an optimization barrier between the final norm and the head.
      first_token_cond: mark the first-token clock with a `lax.cond` inside the loop (CPU) instead of
        running the first iteration outside the loop (accelerators).
      compiler_options: XLA compiler options of the jitted programs, as sorted (name, value) pairs.
    """

    name: str
    int8_head: bool
    live_counter: bool
    head_barrier: bool
    first_token_cond: bool
    compiler_options: tuple[tuple[str, object], ...] = ()

    def live(self, steps: jax.Array) -> jax.Array | None:
        """The `live` argument of `Transformer.logits` / `greedy_tokens` inside a loop."""
        return steps if self.live_counter else None

    def head_input(self, hidden: jax.Array) -> jax.Array:
        """The hidden states as the head should see them (behind a barrier on CPU)."""
        return jax.lax.optimization_barrier(hidden) if self.head_barrier else hidden

    @property
    def options(self) -> dict:
        """compiler_options as the dict `jax.jit` takes."""
        return dict(self.compiler_options)


CPU = BackendProfile("cpu", int8_head=True, live_counter=True, head_barrier=True, first_token_cond=True,
                     compiler_options=tuple(sorted(IN_PLACE_COMPILER_OPTIONS.items())))
ACCELERATOR = BackendProfile("accelerator", int8_head=False, live_counter=False, head_barrier=False,
                             first_token_cond=False)


def profile_for(backend: str | None = None) -> BackendProfile:
    """The profile of `backend` (default: `jax.default_backend()`): CPU's, or the accelerators' one."""
    return CPU if (backend or jax.default_backend()) == "cpu" else ACCELERATOR


class DecodeProgram:
    """A decode program (`loop.generate_program`, `spec.program.speculative_program`) jitted per profile.

    The function takes a static keyword `profile`; calling or lowering the program jits it with that
    profile's compiler options (once per profile) and the KV cache argument donated.
    """

    def __init__(self, fn, static_argnames: tuple[str, ...]):
        self.__wrapped__ = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.static_argnames = (*static_argnames, "profile")
        self._jits: dict[BackendProfile, object] = {}

    def jit(self, profile: BackendProfile):
        """The jitted program for `profile`."""
        if profile not in self._jits:
            self._jits[profile] = jax.jit(self.__wrapped__, static_argnames=self.static_argnames,
                                          donate_argnames=("cache",), compiler_options=profile.options or None)
        return self._jits[profile]

    def __call__(self, *args, profile: BackendProfile | None = None, **kwargs):
        profile = profile or profile_for()
        return self.jit(profile)(*args, profile=profile, **kwargs)

    def lower(self, *args, profile: BackendProfile | None = None, **kwargs):
        profile = profile or profile_for()
        return self.jit(profile).lower(*args, profile=profile, **kwargs)


def decode_program(*static_argnames: str):
    """Decorator: the function as a `DecodeProgram` with these static arguments (plus `profile`)."""
    return lambda fn: DecodeProgram(fn, static_argnames)
