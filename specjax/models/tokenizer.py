"""Text ↔ token ids, on top of the Rust `tokenizers` library.

A GGUF stores its tokenizer as ``tokenizer.ggml.*`` metadata. :meth:`Tokenizer.from_gguf_fields` rebuilds
it as a ``tokenizers.Tokenizer`` the way HF transformers does (``transformers/integrations/gguf``, the
tests' reference), with one exception: Gemma's user-defined space runs are matched whole, longest first,
as in SentencePiece and llama.cpp (transformers splits 32+ spaces differently: 40 as 16 + 24, not 31 + 9).

Special-token semantics (same as transformers' default): control tokens such as ``<start_of_turn>``
written literally in the text ARE encoded as their single special id, so a chat prompt can be built as
text. Pass ``parse_special=False`` to :meth:`Tokenizer.encode` for untrusted text; they are then
spelled out with ordinary pieces, as llama.cpp's default ``parse_special=false`` does. User-defined
tokens (runs of newlines or tabs, html tags) are always matched whole, special or not.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as _Backend
from tokenizers.models import BPE

from specjax.models.token_bytes import FILE as TOKEN_BYTES_FILE
from specjax.models.token_bytes import SP_SPACE as _SP_SPACE
from specjax.models.token_bytes import gpt2_byte_chars, read_token_bytes, vocabulary_bytes, write_token_bytes

__all__ = ["Tokenizer", "TokenizerError", "read_tokenizer_config"]

# llama.cpp's `tokenizer.ggml.token_type` values (1 normal, 2 unknown, 5 unused, 6 byte need no handling).
CONTROL, USER_DEFINED = 3, 4

_EXTRAS_FILE = "specjax_tokenizer.json"
_EXTRAS_VERSION = 1

# Split regexes for byte-level vocabularies, by `tokenizer.ggml.pre` (as in transformers and llama.cpp):
# Llama 3 groups digits by up to three, Qwen2 splits every digit.
_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}DIGITS"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT, _QWEN2_SPLIT = _SPLIT.replace("DIGITS", "{1,3}"), _SPLIT.replace("DIGITS", "")
_BYTE_LEVEL_SPLITS = {"default": None, "gpt2": None,  # None: GPT-2's regex, built into ByteLevel
                      "llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
                      "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}

# Chat formats: (turn start, turn end) markers that identify them in a vocabulary.
_CHAT_MARKERS = {"gemma": ("<start_of_turn>", "<end_of_turn>"), "chatml": ("<|im_start|>", "<|im_end|>")}


class TokenizerError(ValueError):
    """A tokenizer that cannot be built or loaded, or a request it cannot serve."""


class Tokenizer:
    """Encodes text to token ids and back, plus the special ids and the chat format of a model.

    Thread-safe. Build one with :meth:`from_gguf_fields`, :meth:`from_file` or :meth:`load`.

    Args:
      backend: the HF ``tokenizers.Tokenizer`` doing the work.
      bos_id: beginning-of-sequence id, or None if the model has none.
      eos_ids: ids that end generation (the first is the tokenizer's EOS).
      pad_id: padding id, or None for "use the first EOS".
      add_bos: whether :meth:`encode` prepends BOS by default.
      chat_format: "gemma", "chatml" or None (no known template); detected from the vocabulary if omitted.
      chat_template: the model's own Jinja chat template (a GGUF's ``tokenizer.chat_template``); when given,
        :meth:`apply_chat_template` renders it, as HF transformers does, instead of the built-in format.
      vocab_size: the number of ids when the caller knows it (a saved tokenizer's record); None counts them.
    """

    def __init__(self, backend: _Backend, *, bos_id: int | None, eos_ids: Sequence[int], pad_id: int | None,
                 add_bos: bool, chat_format: str | None = "detect", chat_template: str | None = None,
                 vocab_size: int | None = None):
        if not eos_ids:
            raise TokenizerError("a tokenizer needs at least one EOS id")
        if add_bos and bos_id is None:
            raise TokenizerError("add_bos is set but the tokenizer has no BOS token")
        self._backend, self._token_bytes, self._saved_in = backend, None, None
        self._lock = threading.Lock()  # guards the backend's shared `encode_special_tokens` switch
        self._bos_id, self._pad_id, self._add_bos = bos_id, pad_id, bool(add_bos)
        if chat_format == "detect":
            chat_format = next((name for name, marks in _CHAT_MARKERS.items()
                                if all(backend.token_to_id(m) is not None for m in marks)), None)
        if chat_format is not None and chat_format not in _CHAT_MARKERS:
            raise TokenizerError(f"unknown chat format {chat_format!r}; known: {sorted(_CHAT_MARKERS)}")
        self._chat_format, self._chat_template = chat_format, chat_template
        eos = list(dict.fromkeys(int(i) for i in eos_ids))
        if chat_format is not None:  # a chat model ends its turn with the turn-end marker, not with EOS
            end_of_turn = backend.token_to_id(_CHAT_MARKERS[chat_format][1])
            eos += [end_of_turn] if end_of_turn not in (None, *eos) else []
        self._eos_ids = tuple(eos)
        # Not get_vocab_size(): a vocabulary with a duplicated piece has fewer entries than ids. (The dict costs
        # 0.25 s for Gemma's 262k pieces: `save` records the result and `load` passes it back.)
        self._vocab_size = vocab_size if vocab_size is not None else (
            max(backend.get_vocab(with_added_tokens=True).values(), default=-1) + 1)

    @classmethod
    def from_gguf_fields(cls, tokens: Sequence[str], scores: Sequence[float] | None,
                         token_types: Sequence[int] | None, bos_id: int | None, eos_id: int,
                         unk_id: int | None, pad_id: int | None,
                         add_bos: bool, add_space_prefix: bool, model: str, *, pre: str = "default",
                         merges: Sequence[str] | None = None, chat_template: str | None = None) -> Tokenizer:
        """Builds the tokenizer a GGUF file describes, from its ``tokenizer.ggml.*`` metadata (~2 s for 262k).

        Args:
          tokens: ``tokenizer.ggml.tokens``, one piece per id.
          scores: ``tokenizer.ggml.scores`` (same length; byte-level vocabularies may have none).
          token_types: ``tokenizer.ggml.token_type`` (same length; None: all normal).
          bos_id, eos_id, unk_id, pad_id: ``tokenizer.ggml.{bos,eos,unknown,padding}_token_id``; None if
            absent, except EOS which is required.
          add_bos: ``tokenizer.ggml.add_bos_token``.
          add_space_prefix: ``tokenizer.ggml.add_space_prefix`` (SentencePiece's dummy prefix).
          model: ``tokenizer.ggml.model``: "llama" (SentencePiece BPE) or "gpt2" (byte-level BPE).
          pre: ``tokenizer.ggml.pre``, the split regex of a byte-level vocabulary.
          merges: ``tokenizer.ggml.merges`` ("left right" strings); required for "gpt2".
          chat_template: ``tokenizer.chat_template`` (Jinja), or None for the built-in format.

        Raises:
          TokenizerError: an unsupported ``model`` or ``pre``, or inconsistent fields.
        """
        if eos_id is None:
            raise TokenizerError("the GGUF names no EOS token (tokenizer.ggml.eos_token_id)")
        tokens, eos_id, scores = [str(t) for t in tokens], int(eos_id), [] if scores is None else scores
        types = [1] * len(tokens) if token_types is None else [int(t) for t in token_types]
        bos_id, unk_id, pad_id = (None if i is None else int(i) for i in (bos_id, unk_id, pad_id))
        if len(types) != len(tokens) or (model == "llama" and len(scores) != len(tokens)):
            raise TokenizerError(f"GGUF tokenizer fields disagree in length: {len(tokens)} tokens, "
                                 f"{len(scores)} scores, {len(types)} token types")
        for name, i in [("bos", bos_id), ("eos", eos_id), ("unk", unk_id), ("pad", pad_id)]:
            if i is not None and not 0 <= i < len(tokens):
                raise TokenizerError(f"{name} id {i} is outside the vocabulary ({len(tokens)} tokens)")
        if model == "llama":
            gemma = "<start_of_turn>" in set(tokens)  # Gemma 1-3 vocabularies need Gemma's handling
            backend, pieces = _sentencepiece_backend(tokens, [float(s) for s in scores], types, unk_id,
                                                     add_space_prefix, gemma)
        elif model == "gpt2":
            if merges is None:
                raise TokenizerError("a 'gpt2' (byte-level BPE) GGUF tokenizer needs tokenizer.ggml.merges")
            backend, pieces = _byte_level_backend(tokens, [str(m) for m in merges], pre)
        else:
            raise TokenizerError(f"unsupported tokenizer.ggml.model {model!r}; supported: "
                                 "'llama' (SentencePiece BPE) and 'gpt2' (byte-level BPE)")
        # As in transformers: named ids and CONTROL tokens are special (matched whole, skipped in decode);
        # USER_DEFINED ones are matched whole but are text. Respelled pieces would not match the raw text.
        special = {i for i in (bos_id, eos_id, unk_id, pad_id) if i is not None}
        special |= {i for i, t in enumerate(types) if t == CONTROL}
        backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                    for i in sorted(special) if tokens[i] == pieces[i]])
        backend.add_tokens([AddedToken(t, special=False, normalized=False)
                            for t, p, k in zip(tokens, pieces, types, strict=True)
                            if k == USER_DEFINED and t == p])
        if add_bos and bos_id is not None:
            bos = tokens[bos_id]  # the post-processor only matters to users of the saved tokenizer.json
            backend.post_processor = processors.TemplateProcessing(
                single=[f"{bos}:0", "$A:0"], pair=[f"{bos}:0", "$A:0", f"{bos}:1", "$B:1"],
                special_tokens=[(bos, bos_id)])
        return cls(backend, bos_id=bos_id, eos_ids=[eos_id], pad_id=pad_id,
                   add_bos=bool(add_bos and bos_id is not None), chat_template=chat_template)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Tokenizer:
        """Loads an HF ``tokenizer.json`` (or a folder holding one).

        BOS, EOS, padding, ``add_bos_token`` and the chat template come from a ``tokenizer_config.json``
        (or ``chat_template.jinja``) next to it when present (see :func:`read_tokenizer_config`);
        otherwise BOS/add_bos are read off the post-processor and EOS is guessed from well-known names.

        Raises:
          FileNotFoundError: no tokenizer.json at ``path``.
          TokenizerError: the file is not a valid tokenizer, or its EOS cannot be determined.
        """
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer.json at {file}")
        try:
            backend = _Backend.from_file(str(file))
        except Exception as e:  # the Rust side raises plain Exceptions
            raise TokenizerError(f"cannot read tokenizer {file}: {e}") from e
        config = read_tokenizer_config(file.parent)
        piece_id = lambda key: None if key not in config else backend.token_to_id(config[key])
        prefix = backend.encode("", add_special_tokens=True).ids  # what the post-processor adds
        bos_id = piece_id("bos_token")
        bos_id = prefix[0] if bos_id is None and prefix else bos_id
        add_bos = config.get("add_bos_token", bos_id is not None and prefix[:1] == [bos_id])
        eos_id = piece_id("eos_token")
        if eos_id is None:
            eos_id = next((i for p in ("<eos>", "</s>", "<|endoftext|>", "<|im_end|>", "<|end_of_text|>")
                           if (i := backend.token_to_id(p)) is not None), None)
        if eos_id is None:
            raise TokenizerError(f"cannot tell the EOS token of {file}: tokenizer_config.json names none")
        pad_id = piece_id("pad_token")
        jinja = file.parent / "chat_template.jinja"  # where transformers >= 4.43 saves it
        template = config.get("chat_template") or (jinja.read_text(encoding="utf-8") if jinja.is_file() else None)
        return cls(backend, bos_id=bos_id, eos_ids=[eos_id], pad_id=pad_id, add_bos=bool(add_bos),
                   chat_template=template)

    def save(self, path: str | os.PathLike) -> None:
        """Writes ``tokenizer.json`` and the extra fields (``specjax_tokenizer.json``) into folder ``path``.

        Files are written under a temporary name, then renamed: a crash never leaves a torn cache entry.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        extras = {"version": _EXTRAS_VERSION, "bos_id": self._bos_id, "eos_ids": list(self._eos_ids),
                  "pad_id": self._pad_id, "add_bos": self._add_bos, "chat_format": self._chat_format,
                  "chat_template": self._chat_template, "vocab_size": self._vocab_size}
        for name, text in [("tokenizer.json", self._backend.to_str()), (_EXTRAS_FILE, json.dumps(extras))]:
            tmp = path / f".{name}.{os.getpid()}.tmp"
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path / name)
        # An optimization: a vocabulary whose bytes cannot be spelled (a lone surrogate) simply has none saved.
        with contextlib.suppress(UnicodeEncodeError):
            write_token_bytes(path / TOKEN_BYTES_FILE, self.token_bytes())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        """Loads a tokenizer written by :meth:`save` from folder ``path``.

        Raises:
          FileNotFoundError: one of the two files is missing.
          TokenizerError: the files are unreadable or from an incompatible version.
        """
        path = Path(path)
        if missing := [n for n in ("tokenizer.json", _EXTRAS_FILE) if not (path / n).is_file()]:
            raise FileNotFoundError(f"no saved tokenizer at {path}: {missing} missing")
        try:
            extras = json.loads((path / _EXTRAS_FILE).read_text(encoding="utf-8"))
            backend = _Backend.from_file(str(path / "tokenizer.json"))
        except Exception as e:
            raise TokenizerError(f"cannot read the saved tokenizer at {path}: {e}") from e
        if (version := extras.get("version")) != _EXTRAS_VERSION:
            raise TokenizerError(f"saved tokenizer at {path} has version {version!r}, not {_EXTRAS_VERSION}")
        tok = cls(backend, bos_id=extras["bos_id"], eos_ids=extras["eos_ids"], pad_id=extras["pad_id"],
                  add_bos=extras["add_bos"], chat_format=extras["chat_format"],
                  chat_template=extras.get("chat_template"),  # absent from files of older versions
                  vocab_size=extras.get("vocab_size"))  # likewise: then counted
        tok._saved_in = path  # its token bytes too, where saved (older folders: computed)
        return tok

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._vocab_size

    @property
    def bos_id(self) -> int | None:
        """Beginning-of-sequence id (None if the model has none)."""
        return self._bos_id

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Ids that end generation: the EOS id, then the chat turn-end marker (Gemma: ``<end_of_turn>``)."""
        return self._eos_ids

    @property
    def pad_id(self) -> int:
        """Padding id; the first EOS id when the model defines none."""
        return self._eos_ids[0] if self._pad_id is None else self._pad_id

    @property
    def add_bos(self) -> bool:
        """Whether :meth:`encode` prepends BOS by default."""
        return self._add_bos

    @property
    def chat_format(self) -> str | None:
        """"gemma", "chatml" or None."""
        return self._chat_format

    @property
    def chat_template(self) -> str | None:
        """The model's Jinja chat template, or None (the built-in format of :attr:`chat_format` is used)."""
        return self._chat_template

    @property
    def backend(self) -> _Backend:
        """The underlying ``tokenizers.Tokenizer`` (do not toggle its settings)."""
        return self._backend

    def encode(self, text: str, add_bos: bool | None = None, *, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``.

        Args:
          text: the text.
          add_bos: prepend BOS; None means the tokenizer's default (:attr:`add_bos`).
          parse_special: match special tokens written in the text (e.g. ``<end_of_turn>``) as their
            ids; False spells them out with ordinary pieces, for untrusted text.
        """
        return self.encode_batch([text], add_bos, parse_special=parse_special)[0]

    def encode_batch(self, texts: Sequence[str], add_bos: bool | None = None, *,
                     parse_special: bool = True) -> list[list[int]]:
        """:meth:`encode` of each text (in parallel, in Rust)."""
        if isinstance(texts, str):
            raise TypeError("encode_batch takes a sequence of texts, not a single string")
        add_bos = self._add_bos if add_bos is None else add_bos
        if add_bos and self._bos_id is None:
            raise TokenizerError("this tokenizer has no BOS token to add")
        with self._lock:
            self._backend.encode_special_tokens = not parse_special
            try:
                # BOS is added here rather than by the post-processor, so `add_bos` can differ per call.
                encodings = self._backend.encode_batch(list(texts), add_special_tokens=False)
            finally:
                self._backend.encode_special_tokens = False
        head = [self._bos_id] if add_bos else []
        return [head + e.ids for e in encodings]

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Text of ``ids`` (any integer sequence, e.g. a numpy array).

        Args:
          ids: token ids.
          skip_special: drop special tokens (BOS, EOS, ``<start_of_turn>`` ...) from the text.

        Raises:
          TokenizerError: an id outside the vocabulary.
        """
        ids = [int(i) for i in ids]
        if bad := [i for i in ids if not 0 <= i < self.vocab_size]:
            raise TokenizerError(f"ids {bad[:8]} are outside the vocabulary (size {self.vocab_size})")
        return self._backend.decode(ids, skip_special_tokens=skip_special)

    def id_to_piece(self, i: int) -> str:
        """The vocabulary piece of id ``i`` (SentencePiece spelling: '▁' for space, ``<0x0A>`` for bytes)."""
        piece = self._backend.id_to_token(int(i)) if 0 <= int(i) < self.vocab_size else None
        if piece is None:
            raise TokenizerError(f"id {i} is outside the vocabulary (size {self.vocab_size})")
        return piece

    def token_bytes(self) -> list[bytes]:
        """The bytes each id adds to decoded text (b"" for special tokens), e.g. to match stop strings.

        SentencePiece pieces read '▁' as a space and ``<0xNN>`` as one byte; byte-level pieces map back
        through GPT-2's byte alphabet. Computed on first use (~0.2 s for 262k ids), then cached.
        """
        if self._token_bytes is None:  # a saved tokenizer's file first (`token_bytes`: 0.5 s less for Gemma)
            saved = self._saved_in and read_token_bytes(self._saved_in / TOKEN_BYTES_FILE, self.vocab_size)
            self._token_bytes = saved or vocabulary_bytes(self._backend, self.vocab_size)
        return list(self._token_bytes)

    def piece_to_id(self, piece: str) -> int:
        """The id of vocabulary piece ``piece``.

        Raises:
          KeyError: not a piece of the vocabulary.
        """
        i = self._backend.token_to_id(piece)
        if i is None:
            raise KeyError(f"{piece!r} is not in the vocabulary")
        return i

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True) -> str:
        """Renders a conversation as prompt text (without BOS: :meth:`encode` adds it).

        A tokenizer holding the model's Jinja template (:attr:`chat_template`) renders it as HF transformers
        does (Qwen2.5's adds its default system prompt when the conversation has none); otherwise the
        built-in Gemma or ChatML format is used (`specjax.models.chat_template.render_builtin`).

        Args:
          messages: ``{"role": ..., "content": str | [{"type": "text", "text": str}, ...]}`` dicts.
          add_generation_prompt: end with the opening of the model's turn.

        Raises:
          TokenizerError: no known template for this tokenizer, or an ill-formed conversation.
        """
        from specjax.models.chat_template import ChatTemplateError, render_builtin, render_chat_template

        if self._chat_template is None and self._chat_format is None:
            raise TokenizerError("no chat template is known for this tokenizer (neither Gemma turn markers "
                                 "nor ChatML's <|im_start|>/<|im_end|> are in its vocabulary)")
        piece = lambda i: None if i is None else self._backend.id_to_token(i)
        bos = piece(self._bos_id)
        try:
            if self._chat_template is None:
                return render_builtin(self._chat_format, messages, add_generation_prompt)
            text = render_chat_template(self._chat_template, messages, add_generation_prompt,
                                        bos_token=bos, eos_token=piece(self._eos_ids[0]))
        except ChatTemplateError as e:
            raise TokenizerError(str(e)) from None
        # Templates that write BOS themselves (Gemma's) would get a second one from encode().
        return text[len(bos):] if self._add_bos and bos and text.startswith(bos) else text


def read_tokenizer_config(folder: str | os.PathLike) -> dict[str, Any]:
    """The ``bos_token``, ``eos_token``, ``pad_token``, ``add_bos_token`` and ``chat_template`` of a
    ``tokenizer_config.json``.

    Token values are returned as piece strings (HF also writes them as ``{"content": ...}`` dicts).
    Missing keys are left out; a missing file gives ``{}``.
    """
    file = Path(folder) / "tokenizer_config.json"
    if not file.is_file():
        return {}
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise TokenizerError(f"cannot read {file}: {e}") from e
    out: dict[str, Any] = {}
    for key in ("bos_token", "eos_token", "pad_token"):
        value = config.get(key)
        if isinstance(value := value.get("content") if isinstance(value, dict) else value, str):
            out[key] = value
    if isinstance(config.get("add_bos_token"), bool):
        out["add_bos_token"] = config["add_bos_token"]
    if isinstance(config.get("chat_template"), str):
        out["chat_template"] = config["chat_template"]
    return out


def _sentencepiece_backend(tokens: list[str], scores: list[float], types: list[int], unk_id: int | None,
                           add_space_prefix: bool, gemma: bool) -> tuple[_Backend, list[str]]:
    """SentencePiece BPE with byte fallback; returns the backend and the pieces as respelled for it."""
    pieces = tokens
    if gemma:
        # Gemma's GGUF spells its space-run tokens with real spaces, but spaces reach the BPE model as '▁',
        # so they are respelled (as transformers does; the merges below then match transformers').
        present = set(tokens)
        pieces = [_SP_SPACE * len(t) if t and not t.strip(" ") and _SP_SPACE * len(t) not in present else t
                  for t in tokens]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = _merges(pieces, vocab, None if gemma else scores)
    backend = _Backend(BPE(vocab=vocab, merges=merges, unk_token=None if unk_id is None else pieces[unk_id],
                           fuse_unk=True, byte_fallback=True, dropout=None))
    decode_steps = [decoders.Replace(_SP_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        # transformers' Gemma: spaces become '▁' everywhere and the text is one BPE "word".
        backend.normalizer = normalizers.Replace(" ", _SP_SPACE)
        # SentencePiece and llama.cpp match user-defined space runs whole, longest first, before BPE;
        # transformers leaves them to the merges (40 spaces: 16 + 24, not 31 + 9). We follow SentencePiece.
        backend.add_tokens([AddedToken(p, special=False, normalized=True)
                            for t, p, k in zip(tokens, pieces, types, strict=True)
                            if t != p and k == USER_DEFINED])
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=_SP_SPACE, prepend_scheme="first" if add_space_prefix else "never", split=False)
        if add_space_prefix:  # the dummy prefix space is not part of the text
            decode_steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(decode_steps)
    return backend, pieces


def _merges(pieces: list[str], vocab: dict[str, int], scores: list[float] | None) -> list[tuple[str, str]]:
    """BPE merges recovered from a SentencePiece vocabulary, best first.

    SentencePiece BPE joins the adjacent pair whose concatenation is the best-ranked piece, so each split
    ``(left, right)`` of a piece, both halves in the vocabulary, is a merge ranked like the piece: by score,
    or (``scores`` None, Gemma) by position, as Gemma scores its space runs -1000, which would rank their
    merges last. Longer left halves come first. This is transformers' ``generate_merges`` order.
    """
    merges = []
    for i, piece in enumerate(pieces):
        if vocab[piece] != i:  # a duplicate piece: only its last id is reachable
            continue
        merges += [(piece[:k], piece[k:]) for k in range(len(piece) - 1, 0, -1)
                   if piece[:k] in vocab and piece[k:] in vocab]
    if scores is not None:  # stable: ties on score and lengths keep file order, as in transformers
        rank = {p: s for p, s in zip(pieces, scores, strict=True)}
        merges.sort(key=lambda m: (-rank[m[0] + m[1]], -len(m[0]), -len(m[1])))
    return merges


def _byte_level_backend(tokens: list[str], merges: list[str], pre: str) -> tuple[_Backend, list[str]]:
    """GPT-2 style byte-level BPE with the split regex named by ``pre``."""
    if pre not in _BYTE_LEVEL_SPLITS:
        raise TokenizerError(f"unsupported tokenizer.ggml.pre {pre!r} for a byte-level vocabulary; "
                             f"supported: {sorted(_BYTE_LEVEL_SPLITS)}")
    # llama.cpp stores added tokens as raw text; the BPE model wants every piece in GPT-2's byte alphabet.
    spell = gpt2_byte_chars()
    alphabet = set(spell.values())
    pieces = [t if set(t) <= alphabet else "".join(spell[b] for b in t.encode()) for t in tokens]
    vocab = {p: i for i, p in enumerate(pieces)}
    pairs = [tuple(m.split(" ")) for m in merges]
    if bad := next((m for m, p in zip(merges, pairs, strict=True) if len(p) != 2), None):
        raise TokenizerError(f"malformed GGUF merge {bad!r}: expected 'left right'")
    backend = _Backend(BPE(vocab=vocab, merges=pairs, dropout=None, fuse_unk=False))
    split = _BYTE_LEVEL_SPLITS[pre]
    backend.pre_tokenizer = (pre_tokenizers.ByteLevel(add_prefix_space=False) if split is None else
                             pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), "isolated"),
                                                      pre_tokenizers.ByteLevel(False, use_regex=False)]))
    backend.decoder = decoders.ByteLevel()
    return backend, pieces
