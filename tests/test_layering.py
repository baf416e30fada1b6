"""Imports point one way: models <- grammar <- decode <- train (checked on the source, no import needed)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specjax"
# What each layer may not import (the layers above it).
FORBIDDEN = {"models": ("decode", "grammar", "train"), "grammar": ("decode", "train"), "decode": ("train",)}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(layer):
    bad = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for module in imported_modules(path):
            if any(module == f"specjax.{up}" or module.startswith(f"specjax.{up}.") for up in FORBIDDEN[layer]):
                bad.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert not bad, "\n".join(bad)
