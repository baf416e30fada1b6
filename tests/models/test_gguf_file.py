"""`gguf_file.read_gguf` reads what `gguf.GGUFReader` reads: every metadata value type, tensors of float,
integer and quantized types at any alignment, the real models' files; a damaged file raises ValueError."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from specjax.models.gguf_file import read_gguf


def assert_same_as_gguf(path: Path) -> None:
    """Fields (names, order, contents), tensors (names, types, shapes, dtypes, every byte) equal GGUFReader's."""
    mine, ref = read_gguf(path), gguf.GGUFReader(str(path))
    assert list(mine.fields) == list(ref.fields)
    for name, field in ref.fields.items():
        assert mine.fields[name].contents() == field.contents(), name
    assert [t.name for t in mine.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(mine.tensors, ref.tensors, strict=True):
        assert a.tensor_type == b.tensor_type and list(a.shape) == list(b.shape), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        np.testing.assert_array_equal(a.data, b.data, err_msg=a.name)


def write_every_kind(path: Path, alignment: int | None = None) -> Path:
    """A GGUF with each metadata value type and tensors of five types."""
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -3)
    w.add_uint16("t.u16", 60_000)
    w.add_int16("t.i16", -30_000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo, 世界")
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 1e-300)
    w.add_array("t.strings", ["a", "", "ü", "<0x0A>"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.bools", [True, False, True])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal(7).astype(np.float16))
    w.add_tensor("i32", np.arange(6, dtype=np.int32).reshape(2, 3))
    q8 = rng.standard_normal((4, 64)).astype(np.float32)
    w.add_tensor("q8", gguf.quants.quantize(q8, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    # gguf cannot quantize to Q4_K; two rows of one 256-value block each (144 bytes) as they may come.
    w.add_tensor("q4k", rng.integers(0, 256, (2, 144), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_every_value_type_and_tensor_type_reads_as_the_gguf_package_reads_it(tmp_path, alignment):
    path = write_every_kind(tmp_path / "every.gguf", alignment)
    assert_same_as_gguf(path)
    f = read_gguf(path)
    assert f.fields["t.str"].contents() == "héllo, 世界" and f.fields["t.u64"].contents() == 2**63 + 5
    assert f.fields["t.strings"].contents() == ["a", "", "ü", "<0x0A>"]
    # Read-only plain views of the file (a memmap subclass made numpy's slicing in gguf's dequantization slow).
    assert all(type(t.data) is np.ndarray and not t.data.flags.writeable for t in f.tensors)
    strings = f.fields["t.strings"].contents()
    strings.append("changed")  # a caller's copy: the field keeps its value
    assert f.fields["t.strings"].contents() == ["a", "", "ü", "<0x0A>"]


def test_a_damaged_file_raises_value_error(tmp_path):
    """Cut anywhere (the header, the metadata, the tensor infos, the data) or with a wrong magic or version:
    a ValueError, which `open_gguf` turns into one ModelFileError line."""
    import struct

    raw = write_every_kind(tmp_path / "every.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    for end in (3, 10, 30, 200, 700, len(raw) - 1):
        cut.write_bytes(raw[:end])
        with pytest.raises(ValueError):
            read_gguf(cut)
    cut.write_bytes(b"GGUX" + raw[4:])
    with pytest.raises(ValueError, match="magic"):
        read_gguf(cut)
    cut.write_bytes(raw[:4] + struct.pack("<I", 1) + raw[8:])
    with pytest.raises(ValueError, match="version 1"):
        read_gguf(cut)


@pytest.mark.real_model
def test_the_embedded_gemma_gguf_reads_as_the_gguf_package_reads_it(real_model_path):
    assert_same_as_gguf(real_model_path)


@pytest.mark.slow
def test_the_qwen_gguf_reads_as_the_gguf_package_reads_it():
    from qwen_model import qwen_gguf_or_skip

    assert_same_as_gguf(qwen_gguf_or_skip())
