"""The command-line edge shared by `python -m specjax.decode` and `python -m specjax.train`.

Every bad option ends as ONE `error: ...` line on stderr and exit code 2, whatever raised it: Hydra's
override parser, OmegaConf's type checks against the structured schema, or specjax's own checks.
Hydra's `@hydra.main` prints multi-line reports (and exits 1), so the commands compose their configs
with Hydra's compose API through `compose_options`, which turns those reports into `UsageError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import sys
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

EXIT_USAGE = 2  # bad options or input files (argparse's convention)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C


class UsageError(ValueError):
    """A bad command line: the message is the whole `error:` line."""


def schema_keys(cls: type, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, type) of every leaf field of dataclass `cls`, nested dataclasses flattened."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        nested = tp if dataclasses.is_dataclass(tp) else (inner[0] if len(inner) == 1 else None)
        if nested is not None and dataclasses.is_dataclass(nested):
            yield from schema_keys(nested, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", tp


def did_you_mean(key: str, known: Sequence[str]) -> str:
    """' (did you mean 'x'?)' for the closest known key (by name or by last dotted part), or ''."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if not close:  # `lr=` for `optim.lr`: match the last part
        tails = {k.rsplit(".", 1)[-1]: k for k in known}
        close = [tails[t] for t in difflib.get_close_matches(key.rsplit(".", 1)[-1], list(tails), n=1, cutoff=0.75)]
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_key_error(key: str, known: Sequence[str], command: str) -> UsageError:
    return UsageError(f"unknown option {key!r}{did_you_mean(key, known)}; `python -m {command} --help` lists them")


_NOISE = ("object_type", "full_key", "Error merging override", "reference_type", "To append", "Set the environment",
          "See https://hydra.cc")


def one_line(exc: BaseException) -> str:
    """The informative lines of a Hydra / OmegaConf exception and its causes, joined on one line."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:  # the cause holds the reason ("Key 'x' not in ...")
        seen.add(id(exc))
        text = str(exc).split("Config search path")[0]
        for ln in (ln.strip() for ln in text.splitlines()):
            if ln and not ln.startswith(_NOISE) and set(ln) != {"^"}:
                parts.append(ln)
        exc = exc.__cause__
    return " ".join(dict.fromkeys(parts)) or "invalid configuration"


def _full_key(exc: BaseException) -> str | None:
    while exc is not None:
        m = re.search(r"full_key: (\S+)", str(exc))
        if m:
            return m.group(1)
        exc = exc.__cause__
    return None


def _check_parse(overrides: Sequence[str]) -> None:
    """Parses each override alone, so that a syntax error names the argument it is in."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for arg in overrides:
        try:
            parser.parse_overrides([arg])
        except HydraException as e:
            reason = one_line(e).replace(f"{arg}", "").strip(" :") or "invalid syntax"
            raise UsageError(f"cannot parse {arg!r}: {reason} (quote values with spaces, commas, brackets or "
                             "quotes, or see --help for the options that take free text)") from None


def _leaf_keys(node: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaf_keys(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1]


def compose_options(config_dir: Path, config_name: str, overrides: Sequence[str], schema: type, schema_name: str,
                    command: str) -> Any:
    """Composes `config_name` with `overrides`, type-checked against the structured `schema`.

    Returns:
      The composed OmegaConf DictConfig (without Hydra's own node).

    Raises:
      UsageError: an override that does not parse, names an unknown key or has the wrong type.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    known = [k for k, _ in schema_keys(schema)]
    _check_parse(overrides)
    ConfigStore.instance().store(name=schema_name, node=schema)
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            cfg = compose(config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        key = _full_key(e)
        if key is not None and re.search(r"not in|not in struct|Could not override", one_line(e)):
            raise unknown_key_error(key, known, command) from None
        given = next((o for o in overrides if key and o.lstrip("+~").split("=", 1)[0] == key), None)
        raise UsageError(f"{given or key or config_name}: {one_line(e)}" if (given or key) else one_line(e)) from None
    # `+key=value` adds keys the schema lacks without complaint: refuse them here.
    extra = [k for k in _leaf_keys(OmegaConf.to_container(cfg, resolve=False)) if k not in known and k]
    extra = [k for k in extra if not any(k.startswith(p + ".") for p in known)]
    if extra:
        raise unknown_key_error(extra[0], known, command)
    return cfg


def check_finite(options: Any, prefix: str = "") -> None:
    """Raises UsageError for a float option that is inf or nan (no option means either)."""
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if dataclasses.is_dataclass(value):
            check_finite(value, f"{prefix}{f.name}.")
        elif isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{prefix}{f.name}={value}: must be a finite number")


def config_missing(path: Path) -> bool:
    """Prints the one error line when a command's YAML is absent (specjax installed without its configs/)."""
    if path.is_file():
        return False
    print(f"error: {path} not found; install specjax from its source tree (pip install -e .)", file=sys.stderr)
    return True


def run_command(body: Callable[[], int]) -> int:
    """Runs a command's body: UsageError → one line and exit 2; Ctrl-C → one line and exit 130."""
    try:
        return body()
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
