"""Public entry point: Lark grammar text + tokenizer → :class:`GrammarTables` (device arrays), cached on disk."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from specjax.grammar import _deadline
from specjax.grammar.automaton import INITIAL, build_automaton
from specjax.grammar.errors import GrammarError
from specjax.grammar.frontend import load_lark
from specjax.grammar.runtime import GrammarTables
from specjax.grammar.tables import Vocabulary, mask_rows
from specjax.models import artifacts

__all__ = ["GrammarOptions", "compile_grammar", "vocabulary_of"]

_CACHE_VERSION = "2"  # 2: a checksummed folder per key
_TABLES = "tables.npz"
_SOURCES = ("automaton.py", "frontend.py", "terminals.py", "_counted.py", "_dfa.py", "tables.py", "_vocab_trie.py",
            "_bodies.py", "compiler.py")


def _code_version() -> str:
    """A hash of the compiler's own source: tables cached by an older compiler are never reused."""
    digest = hashlib.sha256(_CACHE_VERSION.encode())
    for name in _SOURCES:
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class GrammarOptions:
    """How a grammar is compiled.

    Attributes:
      start: the start rule, as lark's own ``start=`` (python.lark's are ``file_input``, ``single_input`` and
        ``eval_input``); part of the disk-cache key. A grammar without it is refused with its top-level rules named.
      max_depth: nesting bound D: a symbol may be pending at most D times (or its count in one alternative,
        if larger), i.e. D levels of each bracket kind (JSON: D nested objects and, independently, D nested
        arrays); deeper nesting is masked out. Iteration (left/right recursion) is never bounded. The
        automaton grows about 3.6x per level for JSON (see docs/grammar.md).
      max_states: refuse grammars whose subset construction passes this many states.
      timeout: refuse a grammar whose cold compile (terminals, automaton, mask tables) passes this many seconds
        of CPU time (the compiling thread's, so a loaded machine does not change the outcome), with a message
        naming the phase; None: no limit. Tables loaded from the disk cache are never limited. Not part of the
        cache key.
      max_ignore: at most this many bytes per ``%ignore``'d lexeme (whitespace, comments), and at most 3 such
        lexemes between two terminals; None (default): unbounded. Unbounded whitespace lets a model loop on it
        until the length limit, but the bound costs states: each position in a bounded run is state in every
        context where ignored text may appear (the SQL subset at max_depth 3: 5,192 states unbounded, 71,154
        with 16 bytes).
      leading_ignore: allow ``%ignore``'d text before the first terminal, as lark does. Off by default, as in
        llguidance: a model then cannot open its output with whitespace it loops on (the real-model SQL test
        wrote 96 tokens of newlines and spaces before any keyword), and it costs no states.
      cache: read and write compiled tables under ``cache_root()/grammar``.
      eos_ids: ids allowed exactly in accepting states; None: the tokenizer's ``eos_ids``.
    """

    start: str = "start"
    max_depth: int = 3
    max_states: int = 200_000
    timeout: float | None = 10.0
    max_ignore: int | None = None
    leading_ignore: bool = False
    cache: bool = True
    eos_ids: tuple[int, ...] | None = None

    def __post_init__(self):
        if not isinstance(self.start, str) or not self.start:
            raise GrammarError(f"start must be the name of a rule of the grammar, got {self.start!r}")
        if self.max_depth < 1:
            raise GrammarError(f"max_depth must be at least 1, got {self.max_depth}")
        if self.max_states < 2:
            raise GrammarError(f"max_states must be at least 2, got {self.max_states}")
        if self.max_ignore is not None and (not isinstance(self.max_ignore, int) or self.max_ignore < 1):
            raise GrammarError(f"max_ignore must be a positive number of bytes or None, got {self.max_ignore!r}")
        if self.timeout is not None and not (isinstance(self.timeout, int | float) and self.timeout > 0):
            raise GrammarError(f"timeout must be a positive number of seconds or None, got {self.timeout!r}")


_VOCABS: dict[tuple, tuple[object, Vocabulary, str]] = {}  # (id(tokenizer), eos) → ...


def vocabulary_of(tokenizer, eos_ids: tuple[int, ...] | None = None) -> tuple[Vocabulary, str]:
    """The tokenizer's :class:`Vocabulary` and an identity hash of it (bytes of every token + EOS ids)."""
    eos = tuple(eos_ids if eos_ids is not None else getattr(tokenizer, "eos_ids", ()))
    if not eos:
        raise GrammarError("no EOS id: the tokenizer has no eos_ids, so pass GrammarOptions(eos_ids=...)")
    key = (id(tokenizer), eos)
    hit = _VOCABS.get(key)
    if hit is not None and hit[0] is tokenizer:
        return hit[1], hit[2]
    token_bytes = tokenizer.token_bytes()
    if bad := [i for i in eos if not 0 <= i < len(token_bytes)]:
        raise GrammarError(f"eos ids {bad} are outside the vocabulary ({len(token_bytes)} tokens)")
    digest = hashlib.sha256(repr(eos).encode())
    digest.update(np.array([len(b) for b in token_bytes], np.int32).tobytes())
    digest.update(b"".join(token_bytes))
    vocab = Vocabulary(token_bytes, eos)
    _VOCABS[key] = (tokenizer, vocab, digest.hexdigest())
    return vocab, digest.hexdigest()


def compile_grammar(lark_text: str, tokenizer, options: GrammarOptions | None = None) -> GrammarTables:
    """Compiles a Lark grammar against a tokenizer's vocabulary into device tables.

    Args:
      lark_text: Lark grammar source (lark's own syntax, ``%import common`` included).
      tokenizer: anything with ``token_bytes()`` (and ``eos_ids`` unless ``options.eos_ids`` is given).
      options: see :class:`GrammarOptions`.

    Returns:
      Tables whose state 0 is the dead state and ``initial_state`` the start; use them with
      :func:`specjax.grammar.runtime.mask_logits` and :func:`specjax.grammar.runtime.advance`.

    Raises:
      GrammarError: the grammar is invalid, unsupported, empty, or too large (see the message).
    """
    options = options or GrammarOptions()
    vocab, vocab_hash = vocabulary_of(tokenizer, options.eos_ids)
    settings = dataclasses.asdict(options) | {"cache": None, "timeout": None}  # neither changes the tables
    key = hashlib.sha256(json.dumps([_code_version(), lark_text, settings,
                                     vocab_hash]).encode()).hexdigest()[:32]
    if not options.cache:
        return _to_device(_build_tables(lark_text, options, vocab), vocab)
    # One folder per key (artifacts.ensure_dir): written atomically under a lock, checksummed, rebuilt when damaged.
    folder = artifacts.ensure_dir(_cache_dir() / key, lambda tmp: np.savez(tmp / _TABLES, **_build_tables(
        lark_text, options, vocab)), f"grammar tables of {_describe(lark_text, options.start)}")
    with np.load(folder / _TABLES) as npz:
        host = {name: npz[name] for name in npz.files}
    return _to_device(host, vocab)


def _build_tables(lark_text: str, options: GrammarOptions, vocab: Vocabulary) -> dict[str, np.ndarray]:
    t0 = time.perf_counter()
    with _deadline.deadline(options.timeout):
        cfg = load_lark(lark_text, options.start)
        _deadline.phase("automaton")
        auto = build_automaton(cfg, options.max_depth, options.max_states, _describe(lark_text, options.start),
                               options.max_ignore, options.leading_ignore)
        _deadline.phase("mask table")
        rows, row_of_state = mask_rows(auto, vocab)
    return {"trans_sb": auto.trans_sb, "accept_s": auto.accept_s, "mask_rw": rows, "row_s": row_of_state,
            "stats": np.array([auto.raw_states, int(auto.truncated), (time.perf_counter() - t0) * 1e6], np.int64)}


def _describe(lark_text: str, start: str) -> str:
    """Names a grammar in error messages: its start rule's definition line (grammars have no other name)."""
    lines = [ln.strip() for ln in lark_text.splitlines()]
    line = next((ln for ln in lines if ln.lstrip("?!").startswith(f"{start}:")), "")
    if len(line) > 60:
        line = line[:57] + "..."
    return f"the grammar with start rule {start!r} ({line!r})" if line else f"the grammar (start rule {start!r})"


def _cache_dir() -> Path:
    root = artifacts.cache_root() / "grammar"
    artifacts.sweep(root)
    return root


def _to_device(host: dict[str, np.ndarray], vocab: Vocabulary) -> GrammarTables:
    raw_states, truncated, _ = (int(x) for x in host["stats"])
    return GrammarTables(
        trans_sb=jnp.asarray(host["trans_sb"], jnp.int32), accept_s=jnp.asarray(host["accept_s"]),
        mask_rw=jnp.asarray(host["mask_rw"], jnp.uint32), row_s=jnp.asarray(host["row_s"], jnp.int32),
        bytes_vl=jnp.asarray(vocab.bytes_vl), length_v=jnp.asarray(vocab.length_v),
        kind_v=jnp.asarray(vocab.kind_v), vocab_size=vocab.size, initial_state=INITIAL,
        raw_states=raw_states, truncated=bool(truncated))
