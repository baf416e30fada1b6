"""The train command's logic, free of Hydra: schema for the ConfigStore, config dict → run → exit code.

`python -m specjax.train` (see `__main__.py`) composes configs/train.yaml plus an experiment with
Hydra's compose API and calls `run`. The library's configs are frozen dataclasses; OmegaConf needs
mutable ones with concrete types, so `schema` derives that mirror (tuples become lists) and
`config_from_container` turns the composed result back into a validated `TrainConfig`.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from typing import Any, Optional

from specjax.distributed import DistributedError, initialize, is_primary
from specjax.models.config import ConfigError
from specjax.models.gguf_loader import ModelFileError
from specjax.models.sharding import ShardingError
from specjax.train.config import TrainConfig, TrainConfigError, from_dict

# Errors that come from the user's options or files, reported as one `error:` line.
USER_ERRORS = (TrainConfigError, ConfigError, ModelFileError, ShardingError, FileNotFoundError, DistributedError)


@dataclasses.dataclass(frozen=True)
class CommandOptions:
    """Options of the command itself (not of the run).

    Attributes:
      check: only run the abstract check (`abstract.abstract_check`): shapes, shardings and one
        traced step on the current devices; nothing is allocated or trained.
      distributed: this process is one of a multi-process job (one per host: TPU slice, GPU
        cluster): join the others first (`specjax.distributed.initialize`, docs/multihost.md); the
        mesh then spans every process's devices and process 0 alone writes metrics.
    """

    check: bool = False
    distributed: bool = False


def _schema_type(tp):
    """A type OmegaConf accepts: `X | None` → Optional[X], tuple[X, ...] → list[X], dataclasses mirrored."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in args if a is not type(None)]
        return Optional[_schema_type(inner[0])]  # noqa: UP045 - OmegaConf needs typing.Optional
    if origin is tuple:
        return list[_schema_type(args[0])]
    if dataclasses.is_dataclass(tp):
        return schema(tp)
    return tp


def _schema_default(value):
    if dataclasses.is_dataclass(value):
        mirror = schema(type(value))
        kwargs = {f.name: _schema_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return dataclasses.field(default_factory=lambda: mirror(**kwargs))
    if isinstance(value, tuple):
        return dataclasses.field(default_factory=lambda: list(value))
    return dataclasses.field(default=value)


def _schema_value(value):
    if dataclasses.is_dataclass(value):
        return schema(type(value))(**{f.name: _schema_value(getattr(value, f.name)) for f in dataclasses.fields(value)})
    return list(value) if isinstance(value, tuple) else value


_SCHEMAS: dict[type, type] = {}


def schema(cls: type) -> type:
    """A mutable dataclass mirroring frozen dataclass `cls` with OmegaConf-compatible field types."""
    if cls not in _SCHEMAS:
        hints = typing.get_type_hints(cls)
        fields = [(f.name, _schema_type(hints[f.name]), _schema_default(f.default)) for f in dataclasses.fields(cls)]
        _SCHEMAS[cls] = dataclasses.make_dataclass(cls.__name__ + "Schema", fields)
    return _SCHEMAS[cls]


def command_schema() -> type:
    """Schema of the whole command: the TrainConfig fields plus `CommandOptions`."""
    fields = [(f.name, f.type, f) for f in dataclasses.fields(schema(TrainConfig))]
    fields += [(f.name, f.type, f) for f in dataclasses.fields(schema(CommandOptions))]
    return dataclasses.make_dataclass("TrainCommandSchema", [(n, t, dataclasses.field(
        default=f.default, default_factory=f.default_factory)) for n, t, f in fields])


def config_from_container(raw: dict[str, Any]) -> tuple[TrainConfig, CommandOptions]:
    """(TrainConfig, CommandOptions) of a composed config dict; raises TrainConfigError on bad values."""
    raw = dict(raw)
    opts = CommandOptions(**{f.name: raw.pop(f.name) for f in dataclasses.fields(CommandOptions) if f.name in raw})
    return from_dict(raw), opts


def run(raw: dict[str, Any]) -> int:
    """Runs the command on a composed config; returns the exit code (2 for bad options or files)."""
    try:
        cfg, opts = config_from_container(raw)
        if opts.distributed:
            initialize()  # before any other JAX call
        if opts.check:
            from specjax.train.abstract import abstract_check

            print(abstract_check(cfg).line())
            return 0
        from specjax.train.preflight import preflight
        from specjax.train.trainer import TrainingDiverged, train

        preflight(cfg)  # before the target loads or the run directory is created
        try:
            result = train(cfg)
        except TrainingDiverged as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if opts.distributed and not is_primary():
        return 0
    dev = " ".join(f"{k}={v:.4g}" for k, v in result.dev.items())
    print(f"done: {cfg.steps} steps of {cfg.task.kind}; dev {dev}; checkpoints in {result.out_dir}", file=sys.stderr)
    return 0
