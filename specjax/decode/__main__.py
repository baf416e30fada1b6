"""`python -m specjax.decode key=value …` — Hydra composes the options, specjax.decode.cli runs them.

Free-text options (prompt=, stop=, regex=, file paths: every text field) are taken out of argv before
Hydra sees them (`specjax.decode.argv`), so any text passes without Hydra's quoting rules. Hydra's
compose API (not `@hydra.main`) is used so that a bad option ends with ONE `error:` line and exit
code 2 (`specjax.cli_errors`), and Ctrl-C with one line and exit code 130.
"""

from __future__ import annotations

import sys
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
COMMAND = "specjax.decode"


def help_text() -> str:
    """decode.yaml's `hydra.help.template` with the current values ($CONFIG), as `@hydra.main` rendered it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from specjax.decode.options import DecodeOptions

    ConfigStore.instance().store(name="decode_schema", node=DecodeOptions)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("decode", return_hydra_config=True)
    template = cfg.hydra.help.template
    values = OmegaConf.to_yaml({k: v for k, v in OmegaConf.to_container(cfg).items() if k != "hydra"})
    return template.replace("$CONFIG", values)


def parse(args: list[str]):
    """DecodeOptions of a command line.

    Raises:
      UsageError: an unknown key, a wrong type, text that is not UTF-8, a value that does not parse.
    """
    from omegaconf import OmegaConf

    from specjax.cli_errors import UsageError, check_finite, compose_options
    from specjax.decode.argv import split_free_text, with_free_text
    from specjax.decode.options import DecodeOptions, flat_overrides

    nested = flat_overrides(args)  # spec_k=8 → spec.k=8, one for one
    try:
        overrides, free = split_free_text(nested, DecodeOptions)
        cfg = compose_options(CONFIG_DIR, "decode", overrides, DecodeOptions, "decode_schema", COMMAND)
    except UsageError as e:  # name the arguments as the user typed them
        message = str(e)
        for typed, rewritten in zip(args, nested, strict=True):
            if typed != rewritten:
                message = message.replace(rewritten, typed)
        raise UsageError(message) from None
    opts = with_free_text(OmegaConf.to_object(cfg), free)
    check_finite(opts)
    return opts


def main(argv: list[str] | None = None) -> int:
    from specjax.cli_errors import config_missing, run_command

    args = sys.argv[1:] if argv is None else argv
    if config_missing(CONFIG_DIR / "decode.yaml"):
        return 2

    def body() -> int:
        if any(a in ("-h", "--help", "help") for a in args):
            print(help_text())
            return 0
        from specjax.decode.cli import run

        return run(parse(args))

    return run_command(body)


def exit_now(code: int) -> None:
    """Ends the process with `code` once the exit handlers ran and stdout / stderr are flushed, without the
    interpreter's teardown of the model, the programs and XLA's client (0.4–0.6 s of a 5–6 s run, measured
    2026-12-07). Everything the command writes is closed by then (`CompletionWriter` closes its file, every
    cache file is renamed into place); only this process's exit, never a library's, calls it."""
    import atexit
    import contextlib
    import os

    atexit._run_exitfuncs()  # logging's flush, JAX's shutdown: what a normal exit runs first
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`): nothing more can reach it
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    from specjax.compile_cache import enable_compile_cache

    # At the process's edge, not in main(): tests call main() in a process whose other programs keep their clock.
    enable_compile_cache()  # $SPECJAX_COMPILE_CACHE: 0 turns it off, a folder moves it; default <cache>/xla
    exit_now(main())
