"""Shared fixtures: tiny random models for unit tests, the real Gemma 3 270M for parity."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from hypothesis import HealthCheck, settings

from specjax.models import ModelConfig, Transformer

# Speculation's test modules share oracles across their folders (tests/decode/spec/test_speculative.py,
# tests/decode/spec/drafters/test_head_drafters.py): both folders are importable whatever the collection order.
SHARED_TEST_DIRS = [Path(__file__).parent / "decode" / "spec", Path(__file__).parent / "decode" / "spec" / "drafters"]
sys.path[:0] = [str(d) for d in SHARED_TEST_DIRS if str(d) not in sys.path]

# Hypothesis in CI (CI=true, set by CI services and .ci/run): the same examples on every run
# (derandomize, no example database carried between runs), so the suite cannot flake or slow down
# at random; an example that runs past the deadline fails with its inputs printed. The load-dependent
# too_slow health check is off (the per-test timeout in pyproject.toml bounds every test). Locally
# the default profile keeps searching new random examples; HYPOTHESIS_PROFILE=ci reproduces CI.
settings.register_profile("ci", derandomize=True, database=None, deadline=timedelta(seconds=60), print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
_in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if _in_ci else "default"))


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run only shard I of N of the selected tests (whole files, packed by the durations "
                          "in .ci/slow_durations.json: tests/shards.py)")


GIB_PER_WORKER = 6  # estimated peak RSS of a worker: real Gemma in float32 + HF's reference copy (not measured)


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (addopts): one worker per core, but no more than memory holds, at GIB_PER_WORKER each: on a
    many-core machine a worker per core would load the real models dozens of times over."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): cores only
        return cores
    return max(1, min(cores, int(memory_gib // GIB_PER_WORKER)))


class _StderrTerminal:
    """The part of pytest's terminal writer that pytest-timeout's report uses, writing to the process's
    own stderr: an xdist worker's terminal writer goes to its stdout, which xdist does not show."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid

    def sep(self, char: str, title: str = "") -> None:
        if title == "Timeout":
            title = f"Timeout: {self.nodeid}"
        sys.__stderr__.write(f"{char * 30} {title} {char * 30}\n")

    def write(self, text: str) -> None:
        sys.__stderr__.write(text)

    def flush(self) -> None:
        sys.__stderr__.flush()


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """In an xdist worker, the thread method's report (captured output, every thread's stack) goes to stderr,
    where the run's log shows it; xdist then reports the test as failed with the worker's crash. Elsewhere
    pytest-timeout's own timer runs."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or settings.method != "thread":
        return None
    import threading
    from types import SimpleNamespace

    import pytest_timeout

    config = SimpleNamespace(get_terminal_writer=lambda: _StderrTerminal(item.nodeid),
                             pluginmanager=item.config.pluginmanager)
    timer = threading.Timer(settings.timeout, pytest_timeout.timeout_timer, (SimpleNamespace(config=config), settings))
    timer.name = f"pytest_timeout {item.nodeid}"

    def cancel():
        timer.cancel()
        timer.join()

    item.cancel_timeout = cancel  # pytest-timeout's pytest_timeout_cancel_timer calls it
    timer.start()
    return True


def pytest_collection_modifyitems(config, items):
    """--shard I/N: keeps the tests of the files packed into shard I (`tests/shards.py`)."""
    text = config.getoption("--shard")
    if not text:
        return
    import shards

    try:
        i, n = shards.parse_shard(text)
    except shards.ShardError as e:
        raise pytest.UsageError(str(e)) from None
    root = Path(config.rootpath)
    files = [Path(item.path).relative_to(root).as_posix() for item in items]
    where = shards.assign(files, n, shards.measured())
    kept = [item for item, f in zip(items, files, strict=True) if where[f] == i]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Frees every module's compiled programs when it ends: each maps ~900 memory regions on XLA:CPU, and a
    session that keeps them all passes Linux's default 65,530 (`Generator.release_programs`)."""
    yield
    jax.clear_caches()


@pytest.fixture(autouse=True, scope="session")
def _one_gguf_parse_per_file():
    """Parses each GGUF file once per session: gguf-py's `GGUFReader` takes 10-18 s on the embedded model
    (it wraps each of the 262,144 token strings in numpy views), and specjax's loader, the quantisation
    tests and HF transformers (twice for a model, once for a tokenizer) would otherwise each parse it
    again. A reader is read-only; a file that changes (size or mtime) is parsed afresh."""
    import gguf

    original, readers = gguf.GGUFReader, {}

    def shared_reader(path, mode="r"):
        if mode != "r":
            return original(path, mode)
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = shared_reader
    yield
    gguf.GGUFReader = original


# Jitted calls for reference computations in tests: run eagerly, every op of a forward compiles on its own
# (100-350 small XLA compilations per test, most of its time); jitted, each shape compiles once.
@nnx.jit
def forward(model, tokens_bt, positions_bt, cache=None, start_b=None):
    """`model(tokens_bt, positions_bt, cache, start_b)`, jitted: (hidden [B, T, D], cache)."""
    return model(tokens_bt, positions_bt, cache, start_b)


@nnx.jit
def logits_of(model, hidden_btd):
    """`model.logits(hidden_btd)`, jitted."""
    return model.logits(hidden_btd)


def full_logits(model, tokens_bt):
    """Uncached logits [B, T, V] of every position, jitted."""
    b, t = tokens_bt.shape
    return logits_of(model, forward(model, tokens_bt, jnp.broadcast_to(jnp.arange(t), (b, t)))[0])


def tiny_config(**changes) -> ModelConfig:
    """A Gemma-3-shaped model small enough for exhaustive oracles (window 4 matters)."""
    base = ModelConfig(
        family="gemma3", vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8,
        ffn_dim=64, layer_kinds=("local", "local", "global"), sliding_window=4, rope_base_global=1e6,
        qk_norm=True, sandwich_norms=True, activation="gelu_tanh", embed_scale=True,
        query_scale=0.25, max_seq_len=512, bos_id=2, eos_ids=(1,), pad_id=0,
    )
    return base.replace(**changes)


class ByteTokenizer:
    """Test tokenizer: id = 3 + byte value % 61, so every id maps to one known byte."""

    vocab = 64

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return ([2] if add_bos else []) + [3 + b % 61 for b in text.encode()]

    def token_bytes(self) -> list[bytes]:
        return [b"", b"", b""] + [bytes([97 + (i % 26)]) for i in range(61)]

    def decode(self, ids) -> str:
        return b"".join(self.token_bytes()[i] for i in ids).decode()

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<model>"


@pytest.fixture(scope="session")
def tiny_model() -> Transformer:
    return Transformer(tiny_config(), rngs=nnx.Rngs(0))


@pytest.fixture
def byte_tokenizer() -> ByteTokenizer:
    return ByteTokenizer()


# ------------------------------------------------------------------------- real Gemma 3 270M (session)
# Loaded once per session and shared by every real-model test module; tests using them are marked
# `real_model`. HF transformers reads the very same GGUF file (its own dequantization and tokenizer
# code), so it is an independent reference for logits, tokens and greedy continuations.


@pytest.fixture(scope="session")
def real_model_path():
    from specjax.models.loading import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def _real_model_and_tokenizer():
    from specjax.models.loading import load_model

    return load_model(None)  # ~6 s from ~/.cache/specjax; ~20 s the first time


@pytest.fixture(scope="session")
def real_model(_real_model_and_tokenizer) -> Transformer:
    return _real_model_and_tokenizer[0]


@pytest.fixture(scope="session")
def real_tokenizer(_real_model_and_tokenizer):
    return _real_model_and_tokenizer[1]


@pytest.fixture(scope="session")
def hf_gemma_tokenizer(real_model_path):
    """HF transformers' tokenizer as its own code reads it from the embedded GGUF (~30 s on 2 cores), saved
    once in specjax's cache (`artifacts.ensure_dir`: atomic, under a lock, verified) and loaded from there
    (~8 s), so parallel workers and later runs do not convert it again. The folder's name carries the GGUF's
    SHA-256 (remembered by `artifacts.file_sha256`, as the model's own cache entries are keyed) and the
    transformers version: another file or release converts afresh."""
    transformers = pytest.importorskip("transformers")
    from specjax.models import artifacts

    key = f"{artifacts.file_sha256(real_model_path)[:16]}-transformers-{transformers.__version__}"

    def convert(folder: Path) -> None:
        transformers.AutoTokenizer.from_pretrained(str(real_model_path.parent),
                                                   gguf_file=real_model_path.name).save_pretrained(folder)

    folder = artifacts.ensure_dir(artifacts.cache_root() / "test-references" / f"hf-tokenizer-{key}", convert,
                                  "HF reference tokenizer")
    return transformers.AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="session")
def hf_reference(real_model_path, hf_gemma_tokenizer):
    """(transformers model, transformers tokenizer) read from the embedded GGUF (the model: ~25 s on 2 cores).

    float32 weights and eager attention: the reference computes the textbook way, with no fused
    kernels and no low-precision dequantized copy.
    """
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder, name = str(real_model_path.parent), real_model_path.name
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager").eval()
    return model, hf_gemma_tokenizer


@pytest.fixture
def tiny_train_config(tmp_path):
    """A tiny training run's config factory (tests/train; one conftest for the whole suite, since every
    conftest.py is imported under the same module name and a second one would shadow this file)."""
    from tiny_runs import tiny_run  # tests/train/tiny_runs.py: that folder is on sys.path for its tests

    return lambda kind="draft", **changes: tiny_run(tmp_path / "run", kind, **changes)
