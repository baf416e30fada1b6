"""specjax's native CPU kernel for low-precision products (`native_kernels`, csrc/block_quant_gemm.cc).

It must give the XLA path's products to float32 rounding for every layout it accepts (4-bit pairs or
int8, with or without offsets, per block or per channel), every tile of its loops (1-5 and 9 rows of x,
output rows that are not a multiple of 4), and bit-identical weights; where it cannot be built the XLA
path is used and the reason is one line. Decoding with it gives the XLA path's tokens.
"""

from __future__ import annotations

import dataclasses
import platform
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ByteTokenizer, tiny_config
from flax import nnx

from specjax.models import backend_profile, native_kernels, transformer, weight_formats
from specjax.models.quant import BlockQuant

LAYOUTS = {  # name: (values dtype, columns per scale block, offset, K-quant scales)
    "q4+offset": (np.uint8, 32, True, False),
    "q4": (np.uint8, 32, False, False),
    "int8/16": (np.int8, 16, False, False),
    "int8/32+offset": (np.int8, 32, True, False),
    "int8/channel": (np.int8, None, False, False),
    "q4_k": (np.uint8, 32, True, True),  # GGUF Q4_K: a float16 per 256 columns times 0..63 per block
    "q6_k": (np.int8, 16, False, True),  # GGUF Q6_K: -32..31, a float16 per 256 columns times -128..127 per block
    "q8_0": (np.int8, 32, False, "f16"),  # GGUF Q8_0 / Q5_0: a float16 scale per 32 columns
    "q4_1": (np.uint8, 32, True, "f16"),  # GGUF Q4_1: float16 scale and min per 32 columns
}


def _k_quant_scales(rng, out: int, width: int, block: int, low: int, high: int) -> np.ndarray:
    """float32 d · c per block: d a float16 per 256 columns, c an integer in [low, high] (exact products), and as
    llama.cpp makes them, the largest |c| of each 256 columns exactly max(|low|, |high|)."""
    d = rng.uniform(1e-4, 2e-3, (out, -(-width // 256))).astype(np.float16).astype(np.float32)
    if low < 0:  # Q6_K's d may be negative
        d *= rng.choice([-1, 1], d.shape)
    c = rng.integers(low, high + 1, (out, width // block))
    per = max(1, 256 // block)
    c[:, ::per] = low if -low > high else high
    return (d[:, np.arange(width // block) * block // 256] * c).astype(np.float32)


def _matrix(layout: str, out: int, width: int, seed: int = 0) -> BlockQuant:
    dtype, block, with_offset, k_quant = LAYOUTS[layout]
    rng = np.random.default_rng(seed)
    nb = 1 if block is None else width // block
    if dtype == np.uint8:
        values = rng.integers(0, 256, (out, width // 2), dtype=np.uint8)
    elif k_quant is True:  # Q6_K: 6-bit integers
        values = rng.integers(-32, 32, (out, width), dtype=np.int8)
    else:
        values = rng.integers(-128, 128, (out, width), dtype=np.int16).astype(np.int8)
    if k_quant is True:
        low, high = (-128, 127) if dtype == np.int8 else (0, 63)  # Q6_K's int8 scales, Q4_K's 6-bit ones
        scale = _k_quant_scales(rng, out, width, block, low, high)
        offset = _k_quant_scales(rng, out, width, block, 0, 63) if with_offset else None
        return BlockQuant(values, scale, offset)
    scale = rng.uniform(1e-3, 2e-2, (out, nb)).astype(np.float32)
    offset = rng.uniform(-0.1, 0.1, (out, nb)).astype(np.float32) if with_offset else None
    if k_quant == "f16":  # each one a float16, as GGUF stores them
        scale, offset = (None if a is None else a.astype(np.float16).astype(np.float32) for a in (scale, offset))
    return BlockQuant(values, scale, offset)


def cpu_builds(*flags: str) -> bool:
    """Whether this machine can build a kernel needing these /proc/cpuinfo flags: x86-64, each flag, a C++ compiler."""
    try:
        listed = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return (platform.machine() == "x86_64" and all(f" {flag}" in listed for flag in flags)
            and native_kernels._compiler() is not None)


def _expects_native() -> bool:
    """Whether this machine can build the float32 kernel: AVX-512 F and BW."""
    return cpu_builds("avx512f", "avx512bw")


def test_the_kernels_build_where_the_cpu_allows_it():
    """On an AVX-512 machine with a compiler (this project's CI) the kernels must build, not quietly fall back."""
    if _expects_native():
        assert native_kernels.available(), native_kernels.unavailable_reason()
        assert native_kernels.unavailable_reason() is None
    else:
        assert not native_kernels.available() and native_kernels.unavailable_reason()


needs_native = pytest.mark.skipif(not _expects_native(), reason="no AVX-512 or no C++ compiler: the XLA path only")


@needs_native
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_products_match_the_dequantized_matrix(layout, rows):
    packed = _matrix(layout, 36, 128)  # 36 output rows: tiles of 4 and 2, single rows and several chunks
    assert native_kernels.applies(packed, rows, 32)
    x = jax.random.normal(jax.random.key(rows), (rows, 128))
    got = np.asarray(jax.jit(native_kernels.block_quant_product, static_argnums=0)(packed, x))
    want = np.asarray(x, np.float64) @ np.asarray(packed.dequantized(), np.float64).T
    assert got.shape == (rows, 36) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@needs_native
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_kernel_forms_the_same_float32_weights(layout):
    """x = a unit row picks one column of W: the kernel's weight must equal the dequantized one bit for bit."""
    packed = _matrix(layout, 20, 64, seed=3)
    w = np.asarray(packed.dequantized())
    for j in (0, 17, 31, 32, 63):  # both nibble halves of a 4-bit pair
        x = jnp.zeros((1, 64), jnp.float32).at[0, j].set(1.0)
        np.testing.assert_array_equal(np.asarray(native_kernels.block_quant_product(packed, x))[0], w[:, j])


def test_layouts_the_kernel_does_not_take_go_to_xla():
    bf16 = BlockQuant(np.zeros((8, 64), jnp.bfloat16))
    narrow = BlockQuant(np.zeros((8, 64), np.int8), np.ones((8, 8), np.float32))  # blocks of 8 columns
    q4_split = BlockQuant(np.zeros((8, 48), np.uint8), np.ones((8, 3), np.float32))  # a block across the halves
    for packed in (bf16, narrow, q4_split):
        assert not native_kernels.applies(packed, 1, 32)
    ok = _matrix("q4", 8, 64)
    assert not native_kernels.applies(ok, 33, 32) and not native_kernels.applies(ok, 1, 0)


@pytest.mark.parametrize(("env", "cxx", "why"), [("0", None, "SPECJAX_NATIVE_KERNELS=0"),
                                                ("", "/nonexistent/c++", "no C++ compiler")])
def test_without_the_kernels_the_reason_is_one_line(monkeypatch, env, cxx, why):
    monkeypatch.setenv(native_kernels.ENV, env)
    if cxx:
        monkeypatch.setenv("CXX", cxx)
    native_kernels._load.cache_clear()
    try:
        assert not native_kernels.available()
        reason = native_kernels.unavailable_reason()
        assert why in reason and "\n" not in reason
        assert not native_kernels.applies(_matrix("q4", 8, 64), 1, 32)
        with pytest.raises(RuntimeError, match=re.escape(why)):
            native_kernels.target_name()
    finally:
        native_kernels._load.cache_clear()


def test_a_failing_compiler_falls_back_with_its_first_error_line(monkeypatch, tmp_path):
    script = tmp_path / "broken-c++"
    script.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo broken 1.0; exit 0; }\n"
                      "echo 'x.cc:1: error: nope' >&2\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setenv("CXX", str(script))
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(native_kernels.ENV, raising=False)
    native_kernels._load.cache_clear()
    try:
        if platform.machine() != "x86_64":
            assert not native_kernels.available()
            return
        assert not native_kernels.available()
        assert native_kernels.unavailable_reason() == "broken-c++ failed: x.cc:1: error: nope"
        assert not any((tmp_path / "cache" / "native").glob("block_quant_gemm-*"))  # nothing half-built kept
    finally:
        native_kernels._load.cache_clear()


def _slow_fake_compiler(monkeypatch, tmp_path):
    """A fake `$CXX` on an AVX2 x86-64 machine: each compile logs "start", sleeps 2 s, logs "end" and writes an
    empty "library" (which does not load); returns the log's path."""
    log = tmp_path / "log"
    script = tmp_path / "c++"
    script.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && {{ echo fake 2.0; exit 0; }}\n"
                      f"echo start >> {log}\nsleep 2\necho end >> {log}\n"
                      "while [ $# -gt 0 ]; do [ \"$1\" = -o ] && echo x > \"$2\"; shift; done\nexit 0\n")
    script.chmod(0o755)
    monkeypatch.setenv("CXX", str(script))
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(native_kernels, "_cpuinfo_flags", lambda: "fpu avx avx2 fma f16c")
    return log


def test_the_int8_path_builds_its_libraries_side_by_side(monkeypatch, tmp_path):
    """A first start compiles the int8 path's two libraries (int8 product, fixed-order reductions) in parallel
    compiler processes; with the kernels turned off nothing is compiled."""
    log = _slow_fake_compiler(monkeypatch, tmp_path)
    try:
        monkeypatch.setenv(native_kernels.ENV, "0")
        native_kernels._load.cache_clear()
        assert not native_kernels.int8_path_available() and not log.exists()
        monkeypatch.delenv(native_kernels.ENV)
        native_kernels._load.cache_clear()
        assert not native_kernels.int8_path_available()  # the fake libraries do not load
        assert log.read_text().split() == ["start", "start", "end", "end"]  # both compiles ran at once
        assert len([p for p in (tmp_path / "cache" / "native").iterdir() if p.is_dir()]) == 2
    finally:
        native_kernels._load.cache_clear()


def test_the_int8_path_can_build_in_the_background(monkeypatch, tmp_path):
    """`int8_path_expected` starts the build and answers at once (a first start converts the model meanwhile);
    `int8_path_available` waits for it; once such a build failed, nothing is expected or started again."""
    import time

    log = _slow_fake_compiler(monkeypatch, tmp_path)
    monkeypatch.setattr(native_kernels, "_PENDING", {})
    monkeypatch.setattr(native_kernels, "_FAILED", set())
    try:
        native_kernels._load.cache_clear()
        t0 = time.perf_counter()
        assert native_kernels.int8_path_expected() and native_kernels.int8_path_pending()
        assert time.perf_counter() - t0 < 1.5  # the compilers run on (2 s each)
        assert native_kernels.int8_path_expected()  # one build, not two
        assert not native_kernels.int8_path_available()  # waited: the fake libraries do not load
        assert log.read_text().split() == ["start", "start", "end", "end"]
        assert not native_kernels.int8_path_pending() and not native_kernels.int8_path_expected()
        assert log.read_text().split() == ["start", "start", "end", "end"]  # nothing built again
    finally:
        native_kernels._load.cache_clear()


def test_a_cpu_without_the_instructions_is_refused_before_any_compile(monkeypatch, tmp_path):
    """An AVX2 CPU skips the AVX-512-only float32 kernel without compiling it (it would fail at every start) and
    builds the int8 path; an older CPU skips both. The reason names the missing flags."""
    marker = tmp_path / "compiled"
    script = tmp_path / "c++"
    script.write_text(f"#!/bin/sh\n[ \"$1\" = --version ] && {{ echo fake 1.0; exit 0; }}\ntouch {marker}\nexit 1\n")
    script.chmod(0o755)
    monkeypatch.setenv("CXX", str(script))
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(native_kernels.ENV, raising=False)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    try:
        for flags, refused in (("fpu sse2 avx avx2 fma", ("float32",)), ("fpu sse2 avx", ("float32", "int8"))):
            monkeypatch.setattr(native_kernels, "_cpuinfo_flags", lambda flags=flags: flags)
            for kind in refused:
                native_kernels._load.cache_clear()
                assert not native_kernels.available(kind)
                assert "this CPU lacks" in native_kernels.unavailable_reason(kind)
            assert not marker.exists()
        monkeypatch.setenv(native_kernels.ISA_ENV, "avx2")
        monkeypatch.setattr(native_kernels, "_cpuinfo_flags", lambda: "fpu avx2 fma avx512f avx512bw")
        native_kernels._load.cache_clear()
        assert "AVX-512 only" in native_kernels.unavailable_reason("float32") and not marker.exists()
    finally:
        native_kernels._load.cache_clear()


@needs_native
@pytest.mark.parametrize("fmt", ["q4", "int8"])
def test_decoding_with_the_kernels_gives_the_xla_paths_tokens(monkeypatch, fmt):
    """A packed model whose every matrix the kernel takes (d_model 64): greedy tokens, batch 1 and 2,
    with the kernel and with the profile's XLA path."""
    from specjax.decode import GenerateConfig, Generator

    model = transformer.Transformer(tiny_config(d_model=64, n_heads=4, head_dim=16, ffn_dim=128), rngs=nnx.Rngs(5))
    weight_formats.pack_model(model, fmt)
    assert native_kernels.applies(model.head_quant, 1, 32)
    prompts = ["abcabcabc", "hello hello", "xyz"]
    traced = []  # products traced through the kernel
    product = native_kernels.block_quant_product
    monkeypatch.setattr(native_kernels, "block_quant_product", lambda *a: traced.append(1) or product(*a))
    got = {}
    for name, max_rows in (("native", 32), ("xla", 0)):
        prof = dataclasses.replace(backend_profile.CPU, native_max_rows=max_rows)
        for module in (backend_profile, weight_formats, transformer):
            monkeypatch.setattr(module, "profile_for", lambda backend=None, prof=prof: prof)
        traced.clear()
        for batch in (1, 2):
            cfg = GenerateConfig(max_new_tokens=16, batch_size=batch, ignore_eos=True)
            outs = Generator(model, ByteTokenizer(), profile=prof).generate(prompts, cfg)[0]
            got[name, batch] = [o.tokens for o in outs]
        assert bool(traced) == (name == "native")
    assert got["native", 1] == got["xla", 1] == got["native", 2] == got["xla", 2]
