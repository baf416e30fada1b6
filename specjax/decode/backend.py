"""Decode programs jitted per backend profile (`models/backend_profile.py` holds the profiles).

The profiles are re-exported here: decode code and its tests take `BackendProfile`, `CPU`,
`ACCELERATOR` and `profile_for` from this module.
"""

from __future__ import annotations

import jax

from specjax.models.backend_profile import ACCELERATOR, CPU, BackendProfile, profile_for

__all__ = ["ACCELERATOR", "CPU", "BackendProfile", "DecodeProgram", "decode_program", "profile_for"]


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
