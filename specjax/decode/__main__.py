"""`python -m specjax.decode key=value …` — Hydra parses options, specjax.decode.cli runs them."""

from __future__ import annotations

import sys
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def main() -> None:
    if not (CONFIG_DIR / "decode.yaml").is_file():
        sys.exit(f"error: {CONFIG_DIR}/decode.yaml not found; install specjax from its source tree "
                 "(pip install -e .)")
    import hydra
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from specjax.decode.cli import run
    from specjax.decode.options import DecodeOptions, flat_overrides

    # The structured schema type-checks the YAML and every key=value override.
    ConfigStore.instance().store(name="decode_schema", node=DecodeOptions)

    @hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="decode")
    def app(cfg) -> None:
        opts = OmegaConf.to_object(cfg)  # the DecodeOptions dataclass (nested SpecOptions included)
        code = run(opts)
        if code:
            sys.exit(code)

    sys.argv[1:] = flat_overrides(sys.argv[1:])  # spec=ngram spec_k=8 → spec.method=ngram spec.k=8
    from specjax.compile_cache import enable_compile_cache

    enable_compile_cache()  # $SPECJAX_COMPILE_CACHE: 0 turns it off, a folder moves it; default <cache>/xla
    app()


if __name__ == "__main__":
    main()
