"""Cache entries (`specjax.models.artifacts`): atomic, locked, verified, rebuilt when damaged, temporaries swept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from specjax.models import artifacts


def build_into(log: Path, content: bytes = b"x" * 3000 + b"tail"):
    """A build function writing two files and logging each call (to count builds)."""

    def build(folder: Path) -> None:
        with open(log, "a") as f:
            f.write("built\n")
        (folder / "data.bin").write_bytes(content)
        (folder / "sub").mkdir()
        (folder / "sub" / "meta.json").write_text('{"a": 1}')

    return build


def builds(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_checksum_sees_one_changed_byte_anywhere(tmp_path):
    path = tmp_path / "f"
    data = bytearray(os.urandom(3 * (1 << 20) + 13))  # three full blocks, a partial one, a byte tail
    path.write_bytes(data)
    base = artifacts.checksum(path)
    assert artifacts.checksum(path) == base
    for where in (0, 1 << 20, len(data) - 5, len(data) - 1):
        changed = bytearray(data)
        changed[where] ^= 1
        path.write_bytes(changed)
        assert artifacts.checksum(path) != base, where
    path.write_bytes(data[:-1])
    assert artifacts.checksum(path) != base
    path.write_bytes(b"")
    assert artifacts.checksum(path) != base


def test_checksum_does_not_depend_on_the_chunks_it_reads(tmp_path, monkeypatch):
    """The file is summed a chunk of pages at a time (each handed back after: a 6.2 GB file stayed resident):
    the same value whatever the chunk, as the whole file summed at once gives (a cached folder's manifest
    stays valid)."""
    import hashlib

    import numpy as np

    data = os.urandom(5 * (1 << 20) + 13)
    path = tmp_path / "f"
    path.write_bytes(data)
    words = np.frombuffer(data, np.uint64, count=len(data) // 8)
    full = len(words) - len(words) % artifacts._BLOCK_WORDS
    want = hashlib.blake2b(len(data).to_bytes(8, "little"), digest_size=16)
    want.update(words[:full].reshape(-1, artifacts._BLOCK_WORDS).sum(axis=1, dtype=np.uint64).tobytes())
    want.update(words[full:].sum(dtype=np.uint64).tobytes())
    want.update(data[len(data) - len(data) % 8:])
    for chunk in (1, 2, 3, 64):
        monkeypatch.setattr(artifacts, "_CHUNK_WORDS", chunk * artifacts._BLOCK_WORDS)
        assert artifacts.checksum(path) == want.hexdigest(), chunk


def test_entry_is_built_once_with_a_manifest(tmp_path):
    log, target = tmp_path / "log", tmp_path / "cache" / "entry"
    assert artifacts.ensure_dir(target, build_into(log), "test entry") == target
    assert artifacts.ensure_dir(target, build_into(log), "test entry") == target
    assert builds(log) == 1
    manifest = json.loads((target / artifacts.MANIFEST).read_text())
    assert set(manifest["files"]) == {"data.bin", "sub/meta.json"}
    assert manifest["files"]["data.bin"]["size"] == 3004
    assert artifacts.verify(target) is None
    assert sorted(p.name for p in target.parent.iterdir()) == [".entry.lock", "entry"]


def damage_truncate(folder: Path) -> None:
    path = folder / "data.bin"
    path.write_bytes(path.read_bytes()[:100])


def damage_garbage(folder: Path) -> None:  # same size: only the checksum sees it
    path = folder / "data.bin"
    data = bytearray(path.read_bytes())
    data[1000:1016] = os.urandom(16)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("damage", "phrase"), [
    (damage_truncate, "data.bin has 100 bytes instead of 3,004 (truncated or overwritten)"),
    (damage_garbage, "data.bin does not match its checksum (damaged)"),
    (lambda f: (f / "sub" / "meta.json").unlink(), "sub/meta.json is missing"),
    (lambda f: (f / artifacts.MANIFEST).unlink(), "it has no manifest"),
    (lambda f: (f / artifacts.MANIFEST).write_text("{trunc"), "its manifest is unreadable"),
])
def test_damaged_entry_is_rebuilt_with_one_warning(tmp_path, capsys, damage, phrase):
    log, target = tmp_path / "log", tmp_path / "entry"
    artifacts.ensure_dir(target, build_into(log), "test entry")
    damage(target)
    assert phrase in artifacts.verify(target)
    artifacts.ensure_dir(target, build_into(log), "test entry")
    assert builds(log) == 2 and artifacts.verify(target) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"warning: the cached test entry at {target} is unusable: ")
    assert phrase in err and err.rstrip().endswith("rebuilding it")


def test_a_failing_build_leaves_nothing(tmp_path):
    target = tmp_path / "entry"

    def build(folder: Path) -> None:
        (folder / "half").write_bytes(b"...")
        raise ValueError("bad source")

    with pytest.raises(ValueError, match="bad source"):
        artifacts.ensure_dir(target, build, "test entry")
    assert [p.name for p in tmp_path.iterdir()] == [".entry.lock"]


def test_leftovers_of_a_killed_builder_are_removed_by_the_next_build(tmp_path):
    target = tmp_path / "entry"
    for name in (".entry.tmp999999", ".entry.trash999999"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights").write_bytes(b"partial")
    artifacts.ensure_dir(target, build_into(tmp_path / "log"), "test entry")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".entry.lock", "entry", "log"]


def test_sweep_removes_only_what_no_live_builder_owns(tmp_path):
    dead = 2**22 + 12345  # above pid_max's default: no such process
    for name in (f".a.tmp{dead}", f".b.trash{os.getpid()}", f"c.tmp{dead}", f"k.{dead}.tmp.npz"):
        (tmp_path / name).mkdir() if "npz" not in name else (tmp_path / name).write_bytes(b"zip")
    live = tmp_path / f"d.tmp{os.getpid()}"  # an older specjax's builder (no lock) still running: kept
    live.mkdir()
    old = tmp_path / f"e.tmp{os.getpid()}"  # ... unless its folder is older than six hours
    old.mkdir()
    os.utime(old, (time.time() - 7 * 3600,) * 2)
    building = tmp_path / f".f.tmp{os.getpid()}"  # a live builder holds f's lock: kept
    building.mkdir()
    (tmp_path / "entry").mkdir()
    with artifacts.lock(tmp_path / "f"):
        removed = artifacts.sweep(tmp_path)
    assert sorted(p.name for p in removed) == sorted([f".a.tmp{dead}", f".b.trash{os.getpid()}", f"c.tmp{dead}",
                                                      f"k.{dead}.tmp.npz", old.name])
    assert live.exists() and building.exists() and (tmp_path / "entry").exists()


def test_lock_is_exclusive_between_open_files(tmp_path):
    with artifacts.lock(tmp_path / "x") as held:
        assert held
        with artifacts.lock(tmp_path / "x", blocking=False) as second:
            assert not second
    with artifacts.lock(tmp_path / "x", blocking=False) as again:
        assert again


CONCURRENT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from specjax.models import artifacts
    target, log, start = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
    def build(folder):
        with open(log, "a") as f:
            f.write("built\\n")
        time.sleep(1.0)  # both processes are inside ensure_dir while this one builds
        (folder / "data.bin").write_bytes(b"payload" * 1000)
    time.sleep(max(0.0, start - time.time()))
    artifacts.ensure_dir(target, build, "test entry")
    print((target / "data.bin").read_bytes()[:7].decode())
""")


def test_two_processes_on_an_empty_cache_both_succeed_and_build_once(tmp_path):
    script, log, target = tmp_path / "race.py", tmp_path / "log", tmp_path / "cache" / "entry"
    script.write_text(CONCURRENT)
    start = time.time() + 4.0  # after both interpreters have imported numpy
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    procs = [subprocess.Popen([sys.executable, str(script), str(target), str(log), str(start)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert [out.strip() for out, _ in results] == ["payload", "payload"]
    assert builds(log) == 1
    assert sorted(p.name for p in target.parent.iterdir()) == [".entry.lock", "entry"]


def test_ensure_file_rewrites_a_file_that_fails_its_check(tmp_path, capsys):
    target, writes = tmp_path / "model.bin", []

    def write(tmp: Path) -> None:
        writes.append(tmp.name)
        tmp.write_bytes(b"good")

    def check(path: Path) -> str | None:
        return None if path.read_bytes() == b"good" else "wrong content"

    artifacts.ensure_file(target, write, check, "test file")
    artifacts.ensure_file(target, write, check, "test file")
    assert len(writes) == 1
    target.write_bytes(b"bad!")
    artifacts.ensure_file(target, write, check, "test file")
    assert target.read_bytes() == b"good" and len(writes) == 2
    assert "test file at" in capsys.readouterr().err
    with pytest.raises(OSError, match="just written .* is unusable: wrong content"):
        artifacts.ensure_file(tmp_path / "other.bin", lambda tmp: tmp.write_bytes(b"bad"), check, "test file")
    assert not list(tmp_path.glob(".other.bin.tmp*"))
