"""Reading jsonl files with errors that name the file, line and column (prompts, corpora)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path


def jsonl_rows(path: Path, error: type[Exception]) -> Iterator[tuple[int, object]]:
    """Yields (line number, parsed value) for each non-blank line of a jsonl file.

    Splits on "\\n" only (not str.splitlines): JSON strings may hold U+2028, which splitlines() breaks on.

    Raises:
      error: "FILE:LINE:COLUMN: invalid JSON (reason)" for a line that does not parse.
    """
    with Path(path).open(encoding="utf-8", newline="\n") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{path}:{n}:{e.colno}: invalid JSON ({e.msg})") from None
