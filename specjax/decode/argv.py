"""Free text on the decode command line, taken out of argv before Hydra parses it.

Hydra's override grammar gives meaning to `,` `'` `"` `[` `{` `:` `=` `$` and whitespace, so a prompt
like `What's 2+2?` or a regex like `[0-9]{4}` fails to parse. The rule here, which `--help` and the
README state: an option whose value is text (every `str` field of the options: prompt=, regex=, file
paths, ...) takes everything after its first `=` verbatim. One pair of matching quotes around the whole
value is removed (`'prompt="Hello, world"'`, Hydra's quoting, still works); a value of exactly `null` is
left to Hydra (unset). `stop=` takes one string with backslash escapes (`\\n`, `\\t`, `\\uXXXX`) or a
list (JSON, Python or bare `[END,###]`) of such strings: `'stop=["\\n\\n","###"]'` stops at a blank line.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

from specjax.cli_errors import UsageError, schema_keys

_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|[ntr0\\'\"])")
_SIMPLE = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", "'": "'", '"': '"'}


def unescape(text: str) -> str:
    r"""Replaces \n \t \r \0 \\ \' \" \xHH \uHHHH; any other backslash stays as it is."""
    def sub(m: re.Match) -> str:
        code = m.group(1)
        return chr(int(code[1:], 16)) if code[0] in "ux" else _SIMPLE[code]

    return _ESCAPE.sub(sub, text)


def strip_quotes(value: str) -> str:
    """`"text"` or `'text'` → `text` (one matching pair around the whole value, as Hydra quoted it)."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _literal_list(value: str) -> Any:
    """A `[...]` value parsed as JSON, else as a Python literal, else as bare comma-separated items
    (Hydra's `[END,###]`), each with escapes decoded."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            if not value.endswith("]"):
                return None
            return [unescape(strip_quotes(item.strip())) for item in value[1:-1].split(",")]


def parse_stop(value: str, key: str = "stop") -> list[str]:
    """stop= (or another list-of-strings option, `key`) as a list of strings: a JSON (or Python, or bare) list of
    strings, or one string; escapes decoded."""
    value = value.strip()
    if not value:
        return []
    if value.startswith("["):
        items = _literal_list(value)  # JSON and Python literals decode their own escapes
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise UsageError(f"{key}={value}: expected one string or a list of quoted strings, e.g. "
                             "'stop=[\"\\n\\n\",\"###\"]'")
    else:
        items = [unescape(strip_quotes(value))]
    if any(s == "" for s in items):
        raise UsageError(f"{key}={value}: an item cannot be empty")
    return items


def _is_str(tp: Any) -> bool:
    """str, `str | None` or Optional[str]."""
    return tp is str or (typing.get_origin(tp) in (typing.Union, types.UnionType)
                         and set(typing.get_args(tp)) == {str, type(None)})


def _is_str_list(tp: Any) -> bool:
    return typing.get_origin(tp) in (list, tuple) and typing.get_args(tp)[:1] == (str,)


def text_keys(schema: type) -> tuple[set[str], set[str]]:
    """(keys of str options, keys of list-of-str options) of the options dataclass `schema`."""
    keys = list(schema_keys(schema))
    return {k for k, tp in keys if _is_str(tp)}, {k for k, tp in keys if _is_str_list(tp)}


def check_utf8(key: str, value: str) -> str:
    """Refuses text that was not valid UTF-8 on the command line (Python keeps the bytes as surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = value[e.start].encode("utf-8", "surrogateescape")
        raise UsageError(f"{key}=: not valid UTF-8 (byte 0x{bad.hex()} at character {e.start})") from None
    return value


def split_free_text(args: Sequence[str], schema: type) -> tuple[list[str], dict[str, Any]]:
    """Splits argv into Hydra overrides and free-text values {key: str or list[str]}."""
    strings, lists = text_keys(schema)
    overrides, free = [], {}
    for arg in args:
        key, eq, value = arg.partition("=")
        if eq and key in strings and value != "null":
            free[key] = check_utf8(key, strip_quotes(value))
        elif eq and key in lists:
            free[key] = [check_utf8(key, s) for s in parse_stop(value, key)]
        else:
            overrides.append(check_utf8(key or arg, arg))
    return overrides, free


def with_free_text(options: Any, free: dict[str, Any]) -> Any:
    """`options` (a dataclass, frozen or not) with the free-text values set at their dotted keys."""
    for key, value in free.items():
        options = _replace_at(options, key.split("."), value)
    return options


def _replace_at(obj: Any, path: list[str], value: Any) -> Any:
    head, *rest = path
    new = value if not rest else _replace_at(getattr(obj, head), rest, value)
    return dataclasses.replace(obj, **{head: new})
