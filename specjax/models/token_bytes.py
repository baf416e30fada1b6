"""The bytes each token id adds to decoded text, computed from the vocabulary or read back from a saved tokenizer.

Grammars (`specjax.grammar.compiler.vocabulary_of`) and stop strings (`decode.generate`) need every id's bytes:
SentencePiece pieces read '▁' as a space and ``<0xNN>`` as one byte, byte-level pieces map back through GPT-2's
byte alphabet, special tokens add nothing. For Gemma's 262,144 ids that is 0.5 s of Python on every start that
uses either, so `Tokenizer.save` stores them (``token_bytes.npz``: lengths, the bytes end to end, and a SHA-256 of
both) and a saved tokenizer reads them back in milliseconds. A file that is missing, unreadable, of another
vocabulary size or whose digest does not match is ignored (the bytes are computed as before).
"""

from __future__ import annotations

import hashlib
import os
import re
import zipfile
from pathlib import Path

import numpy as np

__all__ = ["FILE", "SP_SPACE", "gpt2_byte_chars", "piece_bytes", "read_token_bytes", "vocabulary_bytes",
           "write_token_bytes"]

FILE = "token_bytes.npz"
SP_SPACE = "\u2581"  # SentencePiece's visible space
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def gpt2_byte_chars() -> dict[int, str]:
    """GPT-2's byte alphabet: printable latin-1 bytes spell themselves, the others chr(256 + n)."""
    keep = [b for b in range(256) if b != 32 and chr(b).isprintable()]
    others = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + n) for n, b in enumerate(others)}}


def piece_bytes(piece: str | None, sentencepiece: bool, unspell: dict[str, int]) -> bytes:
    """The bytes of one vocabulary piece (`unspell`: GPT-2's alphabet, character → byte)."""
    if piece is None:  # an id without a piece (a duplicated piece's lower id)
        return b""
    if sentencepiece:
        byte = _BYTE_PIECE.fullmatch(piece)
        return bytes([int(byte[1], 16)]) if byte else piece.replace(SP_SPACE, " ").encode()
    return bytes(unspell[c] for c in piece) if set(piece) <= unspell.keys() else piece.encode()


def vocabulary_bytes(backend, vocab_size: int) -> list[bytes]:
    """Every id's bytes from an HF `tokenizers.Tokenizer` (b"" for special added tokens)."""
    added = backend.get_added_tokens_decoder()
    sentencepiece = getattr(backend.model, "byte_fallback", False)
    unspell = {c: b for b, c in gpt2_byte_chars().items()}
    return [b"" if i in added and added[i].special else piece_bytes(backend.id_to_token(i), sentencepiece, unspell)
            for i in range(vocab_size)]


def _digest(lengths: np.ndarray, blob: np.ndarray) -> np.ndarray:
    h = hashlib.sha256(lengths.astype("<i4").tobytes())
    h.update(blob.tobytes())
    return np.frombuffer(h.digest(), np.uint8)


def write_token_bytes(path: str | os.PathLike, token_bytes: list[bytes]) -> None:
    """Writes `token_bytes` to `path` (a temporary file renamed into place)."""
    path = Path(path)
    lengths = np.array([len(b) for b in token_bytes], np.int32)
    blob = np.frombuffer(b"".join(token_bytes), np.uint8)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, lengths=lengths, blob=blob, digest=_digest(lengths, blob))
    os.replace(tmp, path)


def read_token_bytes(path: str | os.PathLike, vocab_size: int) -> list[bytes] | None:
    """The token bytes saved at `path`, or None: no such file, unreadable, another vocabulary size, or damaged."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            lengths, blob, digest = npz["lengths"], npz["blob"], npz["digest"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
        return None
    if len(lengths) != vocab_size or lengths.min(initial=0) < 0 or int(lengths.sum()) != len(blob) \
            or not np.array_equal(digest, _digest(lengths, blob)):
        return None
    data, ends = blob.tobytes(), np.cumsum(lengths).tolist()
    return [data[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
