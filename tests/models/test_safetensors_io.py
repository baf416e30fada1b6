"""The cache's safetensors files: written one array at a time (`SafetensorsWriter`), read as views of one memory
map, and a read pass's pages handed back (`release_pages`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from specjax.models.safetensors_io import ALIGN, SafetensorsWriter, read_safetensors, release_pages


def _offsets(path: Path) -> dict[str, int]:
    """Where each array's data start in the file (bytes from its beginning)."""
    import json

    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return {k: 8 + n + v["data_offsets"][0] for k, v in header.items()}


def test_arrays_added_one_at_a_time_make_a_valid_aligned_file(tmp_path):
    """Arrays added as they come (some sizes not multiples of 64 bytes, some keys declared and never added):
    safetensors itself reads the file back, every array whose size is a multiple of 64 bytes starts 64-byte
    aligned, and the metadata is kept."""
    path = tmp_path / "x.safetensors"
    arrays = {"odd": np.arange(7, dtype=np.float32), "big": np.arange(4096, dtype=np.int8).reshape(64, 64),
              "scalar": np.float32(3.5) * np.ones((), np.float32), "wide": np.ones((3, 64), np.float32),
              "empty": np.zeros((0, 5), np.float16)}
    with SafetensorsWriter(path, [*arrays, "never added"], metadata={"weights": "q4"}) as f:
        for key, a in arrays.items():
            f.add(key, a)
    got = load_file(str(path))
    assert got.keys() == arrays.keys()
    for key, a in arrays.items():
        np.testing.assert_array_equal(got[key], a)
        np.testing.assert_array_equal(read_safetensors(path)[key], a)
    starts = _offsets(path)
    assert all(starts[k] % ALIGN == 0 for k, a in arrays.items() if a.nbytes % ALIGN == 0)
    from safetensors import safe_open

    with safe_open(str(path), "np") as f:
        assert f.metadata() == {"weights": "q4"}


def test_a_failed_or_wrong_write_leaves_no_file(tmp_path):
    """An error inside the `with` block leaves neither the file nor its temporary; a key not declared, or added
    twice, is a ValueError; a discarded write leaves nothing either."""
    path = tmp_path / "x.safetensors"
    with pytest.raises(RuntimeError), SafetensorsWriter(path, ["a", "b"]) as f:
        f.add("a", np.ones(64, np.float32))
        raise RuntimeError("the producer failed")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="not declared"), SafetensorsWriter(path, ["a"]) as f:
        f.add("c", np.ones(3))
    with pytest.raises(ValueError, match="added twice"), SafetensorsWriter(path, ["a"]) as f:
        f.add("a", np.ones(3))
        f.add("a", np.ones(3))
    with SafetensorsWriter(path, ["a"]) as f:  # what the caller found nothing worth writing
        f.add("a", np.ones(64))
        f.discard()
    assert list(tmp_path.iterdir()) == []


def _resident_kb(path: Path) -> int:
    """Resident kB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside, target = 0, False, str(path.resolve())
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            inside = len(head) == 6 and head[5] == target
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


def test_released_pages_leave_the_process_and_keep_their_contents(tmp_path):
    """`release_pages` drops a read pass's pages from this process's resident memory; reading the views again
    gives the same data (from the file); arrays that are not memory maps are left alone."""
    path = tmp_path / "x.safetensors"
    data = {"a": np.arange(1 << 20, dtype=np.float32), "b": np.arange(1 << 18, dtype=np.int32)}
    with SafetensorsWriter(path, data) as f:
        for key, a in data.items():
            f.add(key, a)
    views = read_safetensors(path)
    sums = {k: int(v.astype(np.int64).sum()) for k, v in views.items()}  # every page read
    before = _resident_kb(path)
    assert before >= 4 * 1024
    private = np.memmap(path, np.uint8, mode="c")
    private[:8] = 7
    release_pages([np.ones(8), views["a"][:0], private])  # not a map; an empty view; a written private map
    assert (private[:8] == 7).all()
    release_pages(views.values())
    assert _resident_kb(path) < before / 4
    assert {k: int(v.astype(np.int64).sum()) for k, v in views.items()} == sums
