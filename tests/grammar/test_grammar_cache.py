"""Compiled grammar tables on disk: one checksummed folder per key, rebuilt when damaged, nothing left by a failure."""

from __future__ import annotations

import numpy as np
import pytest

from specjax.grammar import GrammarError, compile_grammar

GRAMMAR = 'start: "a" ("+" "a")*\n'


class ListTokenizer:
    eos_ids = (1,)
    pieces = [b"", b"", b"a", b"+", b"a+", b"b"]

    def token_bytes(self) -> list[bytes]:
        return list(self.pieces)


TOK = ListTokenizer()


def host(tables) -> dict[str, np.ndarray]:
    return {k: np.asarray(getattr(tables, k)) for k in ("trans_sb", "accept_s", "mask_rw", "row_s")}


@pytest.fixture
def grammar_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
    return tmp_path / "grammar"


def entries(folder):
    return [p for p in folder.iterdir() if p.is_dir()]


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_damaged_tables_are_rebuilt_with_one_warning(grammar_cache, capsys, damage):
    expected = host(compile_grammar(GRAMMAR, TOK))
    (entry,) = entries(grammar_cache)
    tables = entry / "tables.npz"
    data = bytearray(tables.read_bytes())
    if damage == "truncate":  # was: a traceback on every start
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0xFF
    tables.write_bytes(bytes(data))
    capsys.readouterr()
    again = host(compile_grammar(GRAMMAR, TOK))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: the cached grammar tables of the grammar with start rule")
    assert f"{entry} is unusable: tables.npz" in err
    for k, v in expected.items():
        np.testing.assert_array_equal(again[k], v)


def test_second_compile_reads_the_cache(grammar_cache, monkeypatch):
    compile_grammar(GRAMMAR, TOK)
    monkeypatch.setattr("specjax.grammar.compiler.load_lark", lambda *a: pytest.fail("tables should come from disk"))
    compile_grammar(GRAMMAR, TOK)
    assert len(entries(grammar_cache)) == 1


def test_a_refused_grammar_leaves_nothing(grammar_cache):
    with pytest.raises(GrammarError):
        compile_grammar('start: "a" undefined_rule\n', TOK)
    assert not entries(grammar_cache)
    assert not [p for p in grammar_cache.iterdir() if ".tmp" in p.name]
