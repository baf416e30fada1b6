"""The real Qwen2.5-Coder-1.5B-Instruct GGUF for slow tests, or a skip with the reason (CI installs no `qwen` extra)."""

from __future__ import annotations

from pathlib import Path

import pytest


def qwen_gguf_or_skip() -> Path:
    """The assembled GGUF of the `qwen` extra (`specjax.models.registry`); skips the test when the extra is absent."""
    from specjax.models import registry
    from specjax.models.gguf_loader import ModelFileError

    try:
        registry.part_paths(registry.QWEN_CODER)
    except ModelFileError as e:
        pytest.skip(f"the qwen extra is not installed ({e})")
    return registry.resolve(registry.QWEN_CODER.name)
