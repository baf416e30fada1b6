"""Lazy re-exports for the package `__init__` modules: `from specjax.decode import Generator` works, but
importing the package imports nothing heavy (JAX, Flax) until a name is used — `python -m specjax.decode
--help` and the grammar compiler stay fast."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for a package whose public `name` lives in module `exports[name]`
    (relative to `package`)."""

    def getattr_(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)

    def dir_() -> list[str]:
        return sorted(exports)

    return getattr_, dir_
