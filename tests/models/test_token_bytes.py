"""Token bytes saved with a tokenizer (`token_bytes.npz`): read back instead of computed, ignored when damaged."""

from __future__ import annotations

import numpy as np
import pytest
from test_tokenizer import fields, gguf_path, real_model, tok  # noqa: F401  (module fixtures)

import specjax.models.tokenizer as tokenizer_module
from specjax.models.token_bytes import FILE, read_token_bytes, write_token_bytes
from specjax.models.tokenizer import Tokenizer


@real_model
def test_a_saved_tokenizer_reads_its_token_bytes_back(tok, tmp_path, monkeypatch):  # noqa: F811
    want = tok.token_bytes()
    tok.save(tmp_path)
    assert (tmp_path / FILE).is_file()
    monkeypatch.setattr(tokenizer_module, "vocabulary_bytes", lambda *a: pytest.fail("computed, not read"))
    assert Tokenizer.load(tmp_path).token_bytes() == want


@real_model
@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "missing", "other vocabulary"])
def test_damaged_or_foreign_token_bytes_are_computed_instead(tok, tmp_path, damage):  # noqa: F811
    want = tok.token_bytes()
    tok.save(tmp_path)
    path = tmp_path / FILE
    data = bytearray(path.read_bytes())
    if damage == "flipped byte":  # inside the blob: only the digest tells
        at = data.index(b"\xe2\x96\x81" * 2) if b"\xe2\x96\x81" * 2 in data else len(data) // 2
        data[at] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "missing":
        path.unlink()
    else:
        write_token_bytes(path, want[:-1])
    assert read_token_bytes(path, tok.vocab_size) is None
    assert Tokenizer.load(tmp_path).token_bytes() == want


def test_round_trip_of_arbitrary_bytes(tmp_path):
    rng = np.random.default_rng(0)
    table = [b"", b"\x00", "é".encode()] + [rng.bytes(int(n)) for n in rng.integers(0, 9, 300)]
    write_token_bytes(tmp_path / FILE, table)
    assert read_token_bytes(tmp_path / FILE, len(table)) == table
    assert read_token_bytes(tmp_path / FILE, len(table) + 1) is None
