"""Where the decode command's completions go: stdout, and output= as jsonl, batch by batch.

The output file is checked before anything is generated, and every batch is written (and flushed)
as soon as it finishes, so a failure or a Ctrl-C late in a long run keeps the finished rows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import IO

from specjax.decode.generate import Completion
from specjax.decode.prompts import OptionError


def check_writable(path: str) -> None:
    """Raises OptionError unless `path` can be written: its folder exists and is writable, it is not a folder.

    An existing file is left as it is (opened for appending, not truncated); a file created by the
    check is removed again.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        raise OptionError(f"output={path!r}: is a directory")
    if not p.parent.is_dir():
        raise OptionError(f"output={path!r}: no such directory {str(p.parent)!r}")
    existed = p.exists()
    try:
        with open(p, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise OptionError(f"output={path!r}: cannot write ({e.strerror})") from None
    if not existed:
        os.unlink(p)


@contextlib.contextmanager
def deferred_interrupt():
    """Holds back SIGINT (Ctrl-C) inside the block and raises KeyboardInterrupt after it, if one came."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda *a: caught.append(a))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


class SoftInterrupt:
    """A first Ctrl-C inside the block only sets `requested`; the run stops at its next `check`, between
    batches. A second Ctrl-C raises KeyboardInterrupt at once.

    Why: a KeyboardInterrupt raised wherever Python happens to be can land inside a finalizer (a JAX array's
    ``__del__`` runs between every device call), where Python prints "Exception ignored" and drops it: the
    run then carries on to its end (seen under load: a 50,000-prompt run ignored its Ctrl-C). A flag checked
    at known points cannot be lost.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def __enter__(self) -> SoftInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _on_sigint(self, *_) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def check(self, *_) -> None:
        """Raises KeyboardInterrupt if a Ctrl-C came (arguments ignored: usable as an on_batch callback)."""
        if self.requested:
            raise KeyboardInterrupt


class CompletionWriter:
    """Prints each finished batch to stdout and writes it to the output file (jsonl, one row a completion).

    Args:
      output: the jsonl file (None: stdout only); checked by the constructor.
      total: prompts in the run (headers "--- [i] ..." are printed when there are several).
      chat: print only the completion (True) or prompt + completion (False).
      stdout: where text goes (tests pass a buffer).
    """

    def __init__(self, output: str | None, total: int, chat: bool, stdout: IO[str] | None = None):
        if output:
            check_writable(output)
        self.output = output
        self.total = total
        self.chat = chat
        self.written = 0
        self._stdout = stdout
        self._file: IO[str] | None = None

    def __enter__(self) -> CompletionWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def batch(self, completions: list[Completion]) -> None:
        """Writes a finished batch (called by `Generator.generate(on_batch=...)`); a Ctrl-C meanwhile waits
        until the batch is written to both stdout and the file, so the two always hold the same rows."""
        with deferred_interrupt():
            self._write(completions)

    def _write(self, completions: list[Completion]) -> None:
        out = self._stdout or sys.stdout
        for c in completions:
            if self.total > 1:
                out.write(f"--- [{self.written}] {c.prompt[:70]!r} ({c.finish_reason})\n")
            out.write((c.text if self.chat else c.prompt + c.text) + "\n")
            if c.violation:  # a JSON Schema keyword left unenforced (json_unenforced) was broken
                print(f"warning: completion {self.written} breaks the schema where it is not enforced "
                      f"(json_unenforced): {c.violation}", file=sys.stderr)
            self.written += 1
        out.flush()
        if self.output:
            if self._file is None:
                self._file = open(Path(self.output).expanduser(), "w", encoding="utf-8")  # noqa: SIM115 - kept open across batches
            for c in completions:
                self._file.write(json.dumps(dataclasses.asdict(c)) + "\n")
            self._file.flush()

    def finish(self, stats) -> None:
        """Writes the stats row after the last completion and closes the file."""
        if self.output:
            if self._file is None:
                self._file = open(Path(self.output).expanduser(), "w", encoding="utf-8")  # noqa: SIM115
            self._file.write(json.dumps({"stats": dataclasses.asdict(stats)}) + "\n")
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def where(self) -> str:
        """'stdout' or 'stdout and FILE', for messages."""
        return f"stdout and {self.output}" if self.output else "stdout"
