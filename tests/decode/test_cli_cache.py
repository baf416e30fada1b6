"""What the decode command shows of the caches: a warm compile cache compiles nothing, a damaged conversion is
rebuilt with one warning, a damaged model file is one `error:` line and exit 2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from specjax.compile_cache import ENV, active, compile_cache_dir, enable_compile_cache
from specjax.decode.cli import DecodeOptions, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from test_gguf_loader import gguf_tensors, tiny_weights, write_gguf  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny_gguf(tmp_path) -> Path:
    return write_gguf(tmp_path / "tiny.gguf", tensors=gguf_tensors(tiny_weights()))


def decode(cache: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != ENV}  # default: on, under SPECJAX_CACHE
    full_env.update(SPECJAX_CACHE=str(cache), PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", **env)
    return subprocess.run([sys.executable, "-m", "specjax.decode", *args], capture_output=True, text=True,
                          timeout=600, env=full_env, cwd=REPO)


def stats_line(stderr: str) -> str:
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith("stats: ")]
    return line


def programs(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("jit_generate_program-*"))


def test_second_start_loads_the_decode_program_instead_of_compiling(tmp_path, tiny_gguf):
    cache, args = tmp_path / "cache", (f"model={tiny_gguf}", "prompt=hello", "max_new_tokens=6")
    first = decode(cache, *args)
    assert first.returncode == 0, first.stderr
    assert re.search(r"compiling 1 program\(s\) [0-9.]+ s\)", stats_line(first.stderr))
    written = programs(cache / "xla")
    assert len(written) == 1  # JAX writes nothing for a program with a host callback: the clock must be out

    second = decode(cache, *args)
    assert second.returncode == 0, second.stderr
    line = stats_line(second.stderr)
    assert "compiling" not in line and re.search(r"loading 1 from the compile cache [0-9.]+ s\)", line), line
    assert "loaded from the compile cache in" in second.stderr
    assert programs(cache / "xla") == written
    assert second.stdout == first.stdout  # the same greedy text
    assert "TTFT not timed" in line  # said, not a made-up number


def test_compile_cache_setting():
    assert compile_cache_dir("0") is None and compile_cache_dir(False) is None and compile_cache_dir("off") is None
    assert compile_cache_dir("") == compile_cache_dir(True) == compile_cache_dir("1")
    assert compile_cache_dir(True).name == "xla"
    assert compile_cache_dir("~/somewhere") == Path.home() / "somewhere"


def test_enable_compile_cache_points_jax_at_the_folder(tmp_path, monkeypatch):
    before = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
    monkeypatch.setenv(ENV, str(tmp_path / "xla"))
    try:
        assert enable_compile_cache() == tmp_path / "xla" and (tmp_path / "xla").is_dir()
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla") and active()
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0  # small programs are kept too
        assert enable_compile_cache("0") is None
    finally:  # this process's other tests keep their first-token clock
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
    assert not active()


def test_damaged_weights_are_rebuilt_not_decoded(tmp_path, tiny_gguf, monkeypatch, capsys):
    """Was: garbage inside weights.safetensors gave exit 0 and empty text (the float32 conversion's cache)."""
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    opts = DecodeOptions(model=str(tiny_gguf), prompt="hello", max_new_tokens=6, quiet=True, weights="float32")
    assert run(opts) == 0
    expected = capsys.readouterr().out
    (weights,) = (tmp_path / "cache").glob("gguf-*/weights.safetensors")
    data = bytearray(weights.read_bytes())
    data[len(data) // 2:len(data) // 2 + 4096] = np.random.default_rng(0).bytes(4096)
    weights.write_bytes(bytes(data))
    assert run(opts) == 0
    out, err = capsys.readouterr()
    assert out == expected
    assert len([ln for ln in err.splitlines() if ln.startswith("warning: ")]) == 1
    assert "weights.safetensors does not match its checksum (damaged); rebuilding it" in err


@pytest.mark.parametrize("weights", ["auto", "float32", "int8", "q4"])
def test_damaged_model_file_is_one_error_line(tmp_path, tiny_gguf, monkeypatch, capsys, weights):
    """Every conversion (float32's, and the packed formats', which auto picks for GGUF files) refuses garbage."""
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    tiny_gguf.write_bytes(tiny_gguf.read_bytes()[:-20_000] + np.random.default_rng(0).bytes(20_000))
    assert run(DecodeOptions(model=str(tiny_gguf), prompt="hello", max_new_tokens=6, quiet=True, weights=weights)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tiny_gguf}: tensor ") and err.count("\n") == 1
    assert "the file is damaged; replace it" in err and "Traceback" not in err


def test_compile_cache_entries_cut_short_are_dropped_once(tmp_path, capsys, monkeypatch):
    """JAX writes entries in place and never replaces one: a cut-short entry warned and recompiled every start."""
    from jax._src import compilation_cache as jax_cache

    from specjax import compile_cache

    payload = jax_cache.compress_executable(os.urandom(20_000))
    good, cut = tmp_path / "jit_f-1-cache", tmp_path / "jit_g-2-cache"
    good.write_bytes(payload)
    cut.write_bytes(payload[: len(payload) // 2])
    assert compile_cache.drop_damaged_entries(tmp_path) == [cut]
    assert good.exists() and not cut.exists()
    err = capsys.readouterr().err
    assert err == f"warning: removed 1 damaged compiled program(s) from {tmp_path} (compiled again when needed)\n"
    monkeypatch.setattr(jax_cache, "decompress_executable", lambda b: pytest.fail("checked entries are not re-read"))
    assert compile_cache.drop_damaged_entries(tmp_path) == []

