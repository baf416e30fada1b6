"""What the decode command reads: prompts (prompt=, prompt_file=, stdin, prompts_file=) and input files.

Every problem is an `OptionError` naming the option and the file, raised before the model loads.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specjax.jsonl import jsonl_rows

DEFAULT_PROMPT = "The three most important ideas in computer science are"
STDIN = "-"


class OptionError(ValueError):
    """A decode option that is missing, malformed or contradictory."""


def read_text(option: str, path: str) -> str:
    """The UTF-8 text of file `path` given as `option=` (`-`: standard input).

    Raises:
      OptionError: no such file, not a file, unreadable, or not valid UTF-8 (names the byte offset).
    """
    if path == STDIN:
        data = sys.stdin.buffer.read()
        where = "standard input"
    else:
        p = Path(path).expanduser()
        if not p.is_file():
            raise OptionError(f"{option}={path!r}: no such file")
        try:
            data = p.read_bytes()
        except OSError as e:
            raise OptionError(f"{option}={path!r}: cannot read ({e.strerror})") from None
        where = str(p)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise OptionError(f"{option}={path!r}: {where} is not valid UTF-8 (byte 0x{data[e.start]:02x} on line "
                          f"{line}, offset {e.start})") from None


def check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise OptionError(f"limit={limit}: must be a positive integer (or null for every prompt)")


def read_prompts(path: str, limit: int | None) -> list[str]:
    """Prompts from a jsonl file with a "prompt" field (../shared/data/prompts format)."""
    check_limit(limit)
    read_text("prompts_file", path)  # existence and UTF-8, with the option's name
    p = Path(path).expanduser()
    prompts = []
    for n, row in jsonl_rows(p, OptionError):
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise OptionError(f"{p}:{n}: expected an object with a string field \"prompt\"")
        prompts.append(row["prompt"])
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise OptionError(f"{p}: no prompts found")
    return prompts


def prompt_from_file(path: str) -> str:
    """The whole file (or standard input) as one prompt, less one final newline (editors add it)."""
    text = read_text("prompt_file", path)
    text = text[:-1] if text.endswith("\n") else text
    text = text[:-1] if text.endswith("\r") else text
    if not text:
        raise OptionError(f"prompt_file={path!r}: the prompt is empty")
    return text


def collect_prompts(prompt: str | None, prompt_file: str | None, prompts_file: str | None,
                    limit: int | None) -> list[str]:
    """The prompts of one run: at most one of prompt=, prompt_file=, prompts_file= (default: an example)."""
    given = [k for k, v in (("prompt", prompt), ("prompt_file", prompt_file), ("prompts_file", prompts_file))
             if v is not None]
    if len(given) > 1:
        raise OptionError(f"give one of prompt=, prompt_file= or prompts_file=, not {' and '.join(given)}")
    if limit is not None and prompts_file is None:
        raise OptionError("limit= applies to prompts_file= only")
    if prompts_file is not None:
        return read_prompts(prompts_file, limit)
    if prompt_file is not None:
        return [prompt_from_file(prompt_file)]
    return [DEFAULT_PROMPT if prompt is None else str(prompt)]


def check_grammar_inputs(grammar: str | None, json_schema: str | None, regex: str | None) -> None:
    """Refuses an empty regex and grammar / schema files that are unreadable, empty or not UTF-8."""
    if regex is not None and not str(regex).strip():
        raise OptionError("regex='': the pattern is empty (an empty output needs no constraint)")
    for option, path in (("grammar", grammar), ("json_schema", json_schema)):
        if path is not None and not read_text(option, str(path)).strip():
            raise OptionError(f"{option}={path!r}: the file is empty")
