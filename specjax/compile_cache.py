"""Compiled programs that survive the process: JAX's persistent compilation cache under specjax's cache.

`python -m specjax.decode` and `python -m specjax.train` turn it on before anything compiles; library
users call :func:`enable_compile_cache` once at start-up. A second process with the same shapes then
loads each decode program from disk (tenths of a second) instead of compiling it (3-30 s on CPU).

JAX never writes a program holding a host callback to the cache (its executable would call into the
process that compiled it), so while the cache is on the decode loops leave out their first-token clock
(`specjax.decode.loop.FirstTokenClock`): time to first token is then not measured.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

__all__ = ["ENV", "active", "compile_cache_dir", "drop_damaged_entries", "enable_compile_cache",
           "persistent_cache_hits"]

ENV = "SPECJAX_COMPILE_CACHE"
_OFF = ("0", "off", "false", "no", "none")
_ON = ("", "1", "on", "true", "yes")
_HITS = [0]  # programs this process loaded from the persistent cache
_LISTENING = [False]


def compile_cache_dir(setting: str | os.PathLike | bool | None = None) -> Path | None:
    """Where compiled programs go: None (off), a folder, or by default ``<specjax cache>/xla``.

    Args:
      setting: False / "0" / "off" turn the cache off, True / "1" / "" ask for the default folder,
        anything else is a folder; None reads ``$SPECJAX_COMPILE_CACHE``.
    """
    if setting is None:
        setting = os.environ.get(ENV, "")
    if isinstance(setting, bool):
        setting = "1" if setting else "0"
    text = str(setting).strip()
    if text.lower() in _OFF:
        return None
    if text.lower() in _ON:
        from specjax.models.artifacts import cache_root

        return cache_root() / "xla"
    return Path(text).expanduser()


def enable_compile_cache(setting: str | os.PathLike | bool | None = None) -> Path | None:
    """Turns on JAX's persistent compilation cache for this process (call before compiling anything).

    Every program is written, however fast it compiled (JAX's default skips those under 1 s, which
    would leave a small model's decode programs out).

    Args:
      setting: see :func:`compile_cache_dir` (None: ``$SPECJAX_COMPILE_CACHE``, default on).

    Returns:
      The cache folder, or None when the setting turns the cache off.
    """
    import jax

    folder = compile_cache_dir(setting)
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    drop_damaged_entries(folder)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _listen()
    return folder


def drop_damaged_entries(folder: Path) -> list[Path]:
    """Deletes compile-cache entries that do not decompress; returns them.

    JAX writes an entry in place (not under a temporary name) and never replaces one: an entry cut short
    by a killed process would warn and recompile on every start. Only entries written since the last
    check are read (a stamp file's mtime), ~1 ms per 0.5 MB entry.
    """
    try:
        from jax._src.compilation_cache import decompress_executable
    except ImportError:  # another JAX layout: leave the entries to JAX
        return []
    stamp, dropped = folder / ".checked", []
    since = stamp.stat().st_mtime_ns if stamp.exists() else -1
    started = time.time_ns()
    for entry in folder.glob("*-cache"):
        try:
            if entry.stat().st_mtime_ns >= since:
                decompress_executable(entry.read_bytes())
        except FileNotFoundError:
            continue
        except Exception:  # zlib / zstd raise their own error types
            entry.unlink(missing_ok=True)
            dropped.append(entry)
    if dropped:
        from specjax.models.artifacts import warn

        warn(f"removed {len(dropped)} damaged compiled program(s) from {folder} (compiled again when needed)")
    with contextlib.suppress(OSError):
        stamp.touch()
        os.utime(stamp, ns=(started, started))  # entries written while checking are checked next time
    return dropped


def _listen() -> None:
    if not _LISTENING[0]:
        import jax

        _LISTENING[0] = True
        jax.monitoring.register_event_listener(_count_hits)


def _count_hits(event: str, **_) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        _HITS[0] += 1


def persistent_cache_hits() -> int:
    """How many compilations this process has served from the persistent cache (counted from the first
    call of this function or of :func:`enable_compile_cache`)."""
    _listen()
    return _HITS[0]


def active() -> bool:
    """Whether compiled programs are written to a persistent cache (by :func:`enable_compile_cache` or
    by the user's own JAX configuration)."""
    import jax

    return bool(jax.config.jax_compilation_cache_dir) and bool(jax.config.jax_enable_compilation_cache)
