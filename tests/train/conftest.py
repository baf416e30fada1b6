"""Fixtures of the training tests."""

from __future__ import annotations

import pytest
from tiny_runs import tiny_run


@pytest.fixture
def tiny_train_config(tmp_path):
    return lambda kind="draft", **changes: tiny_run(tmp_path / "run", kind, **changes)
