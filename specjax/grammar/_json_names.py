"""propertyNames of the JSON Schema compiler: the key language it allows, applied to extra keys.

A listed property whose name ``propertyNames`` refuses can only be absent (``ObjectEmitter._named_members``).
Extra keys ("any other key", or a patternProperties region) are intersected with the key language here: a
``pattern``, a ``format``, length bounds or an ``enum``/``const`` of strings, all over the decoded characters of
the key, as validators read them. Any other key constraint is refused, naming the option that avoids it.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

from specjax.grammar import _charsets as cs
from specjax.grammar import _dfa
from specjax.grammar import _json_schema_logic as logic
from specjax.grammar import regex as rx
from specjax.grammar._json_formats import FORMATS, SPEC_FORMATS
from specjax.grammar._json_schema_logic import SchemaError
from specjax.grammar.terminals import ByteDFA, regex_dfa, trie_dfa

_KEY_KEYWORDS = frozenset({"type", "pattern", "minLength", "maxLength", "format", "enum", "const"})


@dataclass(frozen=True)
class KeyFilter:
    """The keys propertyNames allows: full-match regexes over decoded characters, with lo <= length <= hi."""

    regexes: tuple[str, ...] = ()
    lo: int = 0
    hi: int | None = None


NO_KEYS = KeyFilter((), 1, 0)


def literal_regex(text: str) -> str:
    """A regex (over decoded characters) matching exactly ``text``."""
    return "".join(cs.class_text(cs.of_chars(ch)) for ch in text) or "(?:)"


def other_key_dfa(names: tuple[str, ...]) -> ByteDFA:
    """The byte DFA of a JSON string (canonical encoding, quotes included) whose value is none of ``names``.

    The difference of every canonical string and the trie of the names' encodings: milliseconds, where the
    regex the compiler writes for the same language (``ObjectEmitter._key_not_in``) took interegular up to 1.7 s
    per object. A name that has no UTF-8 encoding (a lone surrogate) is no canonical string to take out.
    """
    encoded = []
    for name in names:
        with contextlib.suppress(UnicodeEncodeError):
            encoded.append(('"' + "".join(map(cs.json_encode_char, name)) + '"').encode("utf-8"))
    return _dfa.difference(_any_json_string(), trie_dfa(encoded))


@functools.cache
def _any_json_string() -> ByteDFA:
    return regex_dfa('"' + cs.json_class_text(cs.ANY) + '*"')


def key_filter(compiler, names, path: str) -> KeyFilter | None:
    """The filter of a (flattened) propertyNames schema; None when it allows every key (or when a constraint that
    is not compiled is left unenforced: ``JsonSchemaOptions.unenforced``)."""
    try:
        return _key_filter(compiler, names, path)
    except SchemaError as e:
        if e.keyword == "propertyNames" and compiler.leave_unenforced(e):
            return None
        raise


def _key_filter(compiler, names, path: str) -> KeyFilter | None:
    if names is True or names == {}:
        return None
    if names is False:
        return NO_KEYS
    where = f"{path}/propertyNames"
    other = {k for k in names if k not in logic.ANNOTATIONS and (k in logic.SUPPORTED or k in logic.REFUSED)}
    if other - _KEY_KEYWORDS:
        raise SchemaError("propertyNames", path, f"the key constraint {sorted(other - _KEY_KEYWORDS)[0]!r} is not "
                                                 "compiled for extra keys (pass strict_objects, or set "
                                                 "additionalProperties false)")
    if "string" not in logic.type_set(names, where):
        return NO_KEYS
    if "enum" in names or "const" in names:
        values = names["enum"] if "enum" in names else [names["const"]]
        keys = [v for v in values if isinstance(v, str) and logic.value_ok(v, {**names, "type": "string"}, where)]
        return KeyFilter(("|".join(f"(?:{literal_regex(k)})" for k in keys),)) if keys else NO_KEYS
    regexes = []
    if "pattern" in names:
        try:
            regexes.append(rx.translate(names["pattern"], cs.class_text, search=True))
        except rx.RegexError as e:
            raise SchemaError("propertyNames", where, str(e)) from None
    fmt = names.get("format")
    if fmt in FORMATS:
        regexes.append(FORMATS[fmt])
    elif fmt in SPEC_FORMATS and compiler.options.unknown_formats == "refuse":
        raise SchemaError("propertyNames", where, f"format {fmt!r} has no exact grammar; pass "
                                                  "unknown_formats='ignore' or strict_objects")
    lo, hi = names.get("minLength", 0), names.get("maxLength")
    for kw, v in (("minLength", lo), ("maxLength", hi)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise SchemaError(kw, where, f"must be a non-negative integer, got {v!r}")
    return KeyFilter(tuple(regexes), lo, hi)
