"""`activations=int8`: the int8 kernel (csrc/int8_activation_gemm.cc) and its tiled matrices (`int8_activations`).

The kernel must compute exactly the documented arithmetic (x quantized per row and block, integer block
sums, float32 combination) for every layout it takes; a row's result must not depend on how many rows
the call has (speculative verification gives each row what a one-row step gives it: greedy speculative
output equals plain greedy); the tiled layout must keep lookups and dequantization exact; refusals are
one clear line.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ByteTokenizer, tiny_config
from flax import nnx
from test_native_kernels import LAYOUTS, _matrix, cpu_builds

from specjax.models import native_kernels, transformer, weight_formats
from specjax.models.config import ConfigError
from specjax.models.int8_activations import TiledBlockQuant, check, resolve, tile_model
from specjax.models.quant import BlockQuant, _get


def _buildable() -> bool:
    """x86-64 with AVX2 and FMA (AVX-512 VNNI CPUs have them too) and a C++ compiler."""
    return cpu_builds("avx2", "fma", "f16c")


needs_kernel = pytest.mark.skipif(not native_kernels.available("int8"),
                                  reason=f"int8 kernel unavailable: {native_kernels.unavailable_reason('int8')}")


def _reference(packed: BlockQuant, x: np.ndarray) -> np.ndarray:
    """The documented arithmetic in float64: x8 = rint(float32(x · float32(127 / amax))) per block of 32
    (or the matrix's smaller blocks), y = Σ_b sx_b · (scale_b · Σ q x8 − offset_b · Σ x8)."""
    w_int = np.asarray(_integers(packed), np.float64)  # [out, in] integers
    out, width = w_int.shape
    nb = packed.n_blocks
    block = min(width // nb, 32)
    scale = np.repeat(np.asarray(packed.scale[...], np.float64), width // nb // block, axis=1)
    offset = None if packed.offset is None else np.repeat(np.asarray(packed.offset[...], np.float64),
                                                          width // nb // block, axis=1)
    xb = x.astype(np.float32).reshape(x.shape[0], -1, block)
    amax = np.abs(xb).max(axis=2, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    x8 = np.rint(xb * inv).astype(np.float64)  # [m, nbk, block]
    sx = (amax[..., 0] / np.float32(127)).astype(np.float64)
    dots = np.einsum("mkb,okb->mok", x8, w_int.reshape(out, -1, block))
    t = dots * scale[None]
    if offset is not None:
        t = t - offset[None] * x8.sum(axis=2)[:, None, :]
    return (t * sx[:, None, :]).sum(axis=2)


def _integers(packed: BlockQuant) -> np.ndarray:
    values = np.asarray(packed.values[...])
    if values.dtype == np.uint8:
        return np.concatenate([values & 15, values >> 4], axis=1).astype(np.int32)
    return values.astype(np.int32)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_tiles_keep_lookups_and_dequantization_exact(layout):
    packed = _matrix(layout, 48, 128)
    tiled = TiledBlockQuant.from_block_quant(packed)
    assert tiled.values.shape == packed.values.shape and tiled.values.dtype == packed.values.dtype
    assert not np.array_equal(np.asarray(tiled.values[...]), np.asarray(packed.values[...]))
    np.testing.assert_array_equal(np.asarray(tiled.dequantized()), np.asarray(packed.dequantized()))
    ids = jnp.array([[0, 47, 16], [15, 17, 31]])
    np.testing.assert_array_equal(np.asarray(tiled.rows(ids)), np.asarray(packed.rows(ids)))
    np.testing.assert_array_equal(np.asarray(jax.jit(tiled.rows)(ids)), np.asarray(jax.jit(packed.rows)(ids)))


@needs_kernel
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("rows", [1, 3, 8, 11])
def test_the_kernel_computes_the_documented_arithmetic(layout, rows):
    packed = _matrix(layout, 64, 256, seed=rows)
    x = np.random.default_rng(rows).standard_normal((rows, 256)).astype(np.float32)
    x[0, :32] = 0.0  # an all-zero block: scale 0, no division by zero
    got = np.asarray(native_kernels.block_quant_product(TiledBlockQuant.from_block_quant(packed), jnp.asarray(x)))
    want = _reference(packed, x)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    exact = x @ np.asarray(packed.dequantized()).T  # and it is a close product of the matrix itself
    assert np.abs(got - exact).max() <= 0.02 * np.abs(exact).max()


@needs_kernel
@pytest.mark.parametrize("layout", ["q4+offset", "int8/16"])
def test_a_rows_result_does_not_depend_on_the_other_rows(layout):
    """Bit for bit, every row count 1–17 (the kernel's register tiles take 8 rows, then 1–7)."""
    tiled = TiledBlockQuant.from_block_quant(_matrix(layout, 32, 192, seed=3))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((17, 192)).astype(np.float32))
    alone = np.concatenate([np.asarray(native_kernels.block_quant_product(tiled, x[i:i + 1])) for i in range(17)])
    for m in (2, 5, 8, 9, 16, 17):
        np.testing.assert_array_equal(np.asarray(native_kernels.block_quant_product(tiled, x[:m])), alone[:m])


def test_shapes_the_kernel_cannot_take_are_refused_in_one_line_and_left_as_they_are():
    with pytest.raises(ConfigError, match="cannot take a 40 x 128 matrix"):
        TiledBlockQuant.from_block_quant(_matrix("q4", 40, 128))
    model = transformer.Transformer(tiny_config(d_model=64, n_heads=4, head_dim=16, ffn_dim=120), rngs=nnx.Rngs(5))
    weight_formats.pack_model(model, "q4")
    assert tile_model(model) > 0  # the 120-row gate / up maps stay row-major, the rest is tiled
    kinds = {type(lin.packed).__name__ for name, lin in weight_formats.iter_linears(model) if ".mlp.up" in name}
    assert kinds == {"BlockQuant"} and isinstance(model.head_quant, TiledBlockQuant)


def test_the_option_is_checked_against_the_format():
    with pytest.raises(ConfigError, match="not one of auto, float32, int8"):
        check("int4", "q4")
    with pytest.raises(ConfigError, match="needs weights=int8 or q4"):
        check("int8", "float32")
    with pytest.raises(ConfigError, match="needs dtype=float32"):
        resolve("int8", "q4", "bfloat16")
    check("float32", "float32")


def test_auto_is_int8_exactly_where_the_kernels_take_the_format():
    kernels = all(native_kernels.available(k) for k in ("int8", "attention", "rms_norm"))
    assert resolve("auto", "q4") == resolve("auto", "int8") == ("int8" if kernels else "float32")
    assert resolve("auto", "float32") == resolve("auto", "bfloat16") == resolve("auto", "q4", "bfloat16") == "float32"
    assert resolve("float32", "q4") == "float32"


def test_the_kernel_builds_where_the_cpu_allows_it():
    """On an AVX2 or AVX-512 machine with a compiler (this project's CI) it must build, not quietly fall back."""
    if _buildable():
        assert native_kernels.available("int8"), native_kernels.unavailable_reason("int8")
    else:
        with pytest.raises(ConfigError, match="int8 CPU kernel"):
            check("int8", "q4")


@needs_kernel
@pytest.mark.parametrize("fmt", ["q4", "int8"])
def test_speculative_greedy_equals_plain_greedy_with_int8_activations(fmt):
    """Verification runs k + 1 rows through the kernel, plain decoding one: the same tokens, batch 1 and 2."""
    from specjax.decode import GenerateConfig, Generator, SpecConfig, SpeculativeGenerator

    model = transformer.Transformer(tiny_config(d_model=64, n_heads=4, head_dim=16, ffn_dim=128), rngs=nnx.Rngs(5))
    weight_formats.pack_model(model, fmt)
    tile_model(model)
    assert isinstance(model.head_quant, TiledBlockQuant) and model.head_quant is model.embed_packed
    assert all(isinstance(lin.packed, TiledBlockQuant) for _, lin in weight_formats.iter_linears(model))
    prompts = ["abcabcabcabc", "hello hello", "the cat the cat"]
    for batch in (1, 2):
        cfg = GenerateConfig(max_new_tokens=16, batch_size=batch, ignore_eos=True)
        ref, _ = Generator(model, ByteTokenizer()).generate(prompts, cfg)
        spec = SpeculativeGenerator(model, ByteTokenizer())
        out, stats = spec.generate(prompts, cfg, SpecConfig(k=4, adaptive=False))
        assert [o.tokens for o in out] == [r.tokens for r in ref]
        assert stats.tau > 1.0  # drafts were verified, several rows per call


@needs_kernel
def test_a_second_load_from_another_cache_reuses_the_registered_kernel(monkeypatch, tmp_path):
    """XLA refuses a second library under a registered target name: after `_load.cache_clear()` and with another
    cache folder (tests do both) the kernel registered first is used, not built and registered again."""
    name = native_kernels.target_name("int8")
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    native_kernels._load.cache_clear()
    try:
        assert native_kernels.target_name("int8") == name
        tiled = TiledBlockQuant.from_block_quant(_matrix("q4", 16, 64))
        x = jnp.ones((2, 64), jnp.float32)
        assert np.isfinite(np.asarray(native_kernels.block_quant_product(tiled, x))).all()
    finally:
        native_kernels._load.cache_clear()


def _same_bits_as_the_full_form(tiled: TiledBlockQuant, full: TiledBlockQuant, packed: BlockQuant, rows: int):
    """Products (against the float32-scale form), dequantization and lookups (against the row-major matrix)."""
    x = jnp.asarray(np.random.default_rng(rows).standard_normal((rows, packed.shape[1])).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(native_kernels.block_quant_product(tiled, x)),
                                  np.asarray(native_kernels.block_quant_product(full, x)))
    np.testing.assert_array_equal(np.asarray(tiled.dequantized()), np.asarray(packed.dequantized()))
    ids = jnp.array([0, packed.shape[0] - 1, 16, 31])
    np.testing.assert_array_equal(np.asarray(jax.jit(tiled.rows)(ids)), np.asarray(packed.rows(ids)))


# ------------------------------------------------------------------ compact scales (GGUF K-quants)
@needs_kernel
@pytest.mark.parametrize("layout", ["q4_k", "q6_k"])
@pytest.mark.parametrize("rows", [1, 9])
def test_k_quant_scales_are_kept_compact_with_the_full_forms_bits(layout, rows):
    """int8 sub-scales × float32 super-scales form the very float32 scales: products, dequantization and lookups
    equal the full form's bit for bit, in fewer bytes."""
    packed = _matrix(layout, 48, 512, seed=rows)
    compact, full = TiledBlockQuant.from_block_quant(packed), TiledBlockQuant.from_block_quant(packed, compact=False)
    assert compact.compact and not full.compact and compact.scale.dtype == jnp.int8
    assert compact.scale_super.dtype == jnp.float16  # GGUF's d: a float16
    assert compact.scale_super.shape == (48, 512 // 256) and (compact.offset is None) == (packed.offset is None)
    nbytes = lambda t: sum(a.nbytes for a in jax.tree.leaves(nnx.state(t)))
    assert nbytes(compact) <= nbytes(full) - 2 * packed.scale.nbytes // 3
    _same_bits_as_the_full_form(compact, full, packed, rows)


@needs_kernel
def test_compact_scales_whose_factor_is_not_a_float16_keep_float32_super_scales():
    """A quantizer whose per-256 factor is not a float16 (14 significant bits here): still compact, with float32
    super-scales, and the same bits as the full form."""
    rng = np.random.default_rng(5)
    out, width = 32, 512
    c = rng.integers(0, 64, (out, width // 32)).astype(np.float32)
    c[:, ::8] = 63  # llama.cpp's rule: each 256 columns' largest integer is 63
    d = ((8193 + rng.integers(0, 2000, (out, width // 256))) * 2.0**-24).astype(np.float32)
    packed = BlockQuant(rng.integers(0, 256, (out, width // 2), dtype=np.uint8), c * np.repeat(d, 8, axis=1))
    compact = TiledBlockQuant.from_block_quant(packed)
    assert compact.compact and compact.scale_super.dtype == jnp.float32
    _same_bits_as_the_full_form(compact, TiledBlockQuant.from_block_quant(packed, compact=False), packed, 3)


@needs_kernel
@pytest.mark.parametrize("layout", ["q8_0", "q4_1"])
@pytest.mark.parametrize("rows", [1, 9])
def test_float16_scales_are_kept_as_float16_with_the_full_forms_bits(layout, rows):
    """Scales (and offsets) that are each a float16 and share no factor (Q8_0, Q4_1) are stored as float16: the
    same products, dequantization and lookups as the float32 form, bit for bit, in half the scale bytes. Scales
    that are not all float16 stay float32."""
    packed = _matrix(layout, 48, 512, seed=rows)
    half, full = TiledBlockQuant.from_block_quant(packed), TiledBlockQuant.from_block_quant(packed, compact=False)
    assert not half.compact and half.scale.dtype == jnp.float16 and full.scale.dtype == jnp.float32
    assert (half.offset is None) == (packed.offset is None)
    assert half.offset is None or half.offset.dtype == jnp.float16
    _same_bits_as_the_full_form(half, full, packed, rows)
    off_by_one = BlockQuant(packed.values[...], packed.scale[...].at[3, 2].multiply(1 + 2**-20), _get(packed.offset))
    assert TiledBlockQuant.from_block_quant(off_by_one).scale.dtype == jnp.float32


@needs_kernel
def test_a_k_quant_gguf_loads_compact_and_decodes_as_the_full_form(tmp_path, monkeypatch):
    """The tiny qwen2 file holds real Q4_K / Q6_K blocks (and Q8_0): every K-quant matrix is tiled compact, and
    the logits equal those of the same model tiled with float32 scales."""
    from conftest import full_logits
    from tiny_gguf import Tiny, write_tiny_gguf

    from specjax.models import loading

    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf", Tiny())
    net, _ = loading.load_model(str(path), weights="q4", activations="int8")
    forms = {name: getattr(lin.packed, "compact", None) for name, lin in weight_formats.iter_linears(net)}
    # Q4_K q / gate and Q6_K v / down of each layer (the 270-row head is not in 16-row tiles)
    assert sorted(n.split(".", 2)[-1].removesuffix(".w") for n, c in forms.items() if c) == sorted(
        ["attn.q", "attn.v", "mlp.gate", "mlp.down"] * 2), forms
    full, _ = loading.load_model(str(path), weights="q4", activations="float32")
    tile_model(full, compact=False)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 260, (2, 8)), jnp.int32)
    np.testing.assert_array_equal(full_logits(net, tokens), full_logits(full, tokens))


@needs_kernel
def test_the_int8_layout_is_cached_and_a_damaged_copy_is_laid_out_again(tmp_path, monkeypatch, capsys):
    """The first int8 load lays the matrices out and saves them next to the packed weights; the next load takes
    them from there (no layout work: a Qwen start 2.3 s shorter) with the same arrays and logits, as the file's own
    pages (mapped, not copied: both loads); a damaged file is reported in one warning line and replaced."""
    from conftest import full_logits
    from tiny_gguf import Tiny, write_tiny_gguf

    from specjax.decode.generate import GenerateConfig, Generator
    from specjax.models import int8_activations, loading

    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf", Tiny())
    loading.load_model(str(path), weights="q4", activations="float32")  # the packed folder, no layout yet
    (folder,) = (tmp_path / "cache").glob("gguf-packed-*-q4")
    (folder / "tiled-0.safetensors").write_bytes(b"an older layout version")
    lines: list[str] = []
    first, _ = loading.load_model(str(path), weights="q4", activations="int8", progress=lines.append)
    assert "laying out matrices for int8 activations" in lines
    (saved,) = folder.glob("tiled-*.safetensors")  # the older version's file is gone

    def no_layout(*args, **kwargs):
        raise AssertionError("laid out again")

    with monkeypatch.context() as m:
        m.setattr(int8_activations.TiledBlockQuant, "from_block_quant", no_layout)
        lines.clear()
        second, tok = loading.load_model(str(path), weights="q4", activations="int8", progress=lines.append)
    assert not any("laying out" in line for line in lines), lines
    # The file (laid out file to file) holds what laying out the loaded model in memory gives.
    in_memory, _ = loading.load_model(str(path), weights="q4", activations="float32")
    assert int8_activations.tile_model(in_memory) > 0
    a = weight_formats.packed_matrices(first)
    for other in (second, in_memory):
        b = weight_formats.packed_matrices(other)
        assert a.keys() == b.keys() and any(isinstance(m, TiledBlockQuant) for m in b.values())
        for name in a:
            assert type(a[name]) is type(b[name]), name
            for x, y in zip(jax.tree.leaves(nnx.state(a[name])), jax.tree.leaves(nnx.state(b[name])), strict=True):
                assert x.dtype == y.dtype
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=name)
    # Both loads take the matrices as the file's pages (the first after writing it); decoding keeps them there.
    Generator(second, tok).generate(["ab"], GenerateConfig(max_new_tokens=2))
    for model in (first, second):
        tiles = [m for m in weight_formats.packed_matrices(model).values() if isinstance(m, TiledBlockQuant)]
        assert tiles and all(_in_mapping(m.values[...], saved) for m in tiles)
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 260, (2, 8)), jnp.int32)
    want = full_logits(first, tokens)
    np.testing.assert_array_equal(full_logits(second, tokens), want)

    # Damage comes as a new file (as a crash can leave one: ours are renamed into place), not as the mapped
    # file cut short under the two models above, whose next read of a lost page would be a SIGBUS.
    cut = saved.with_name("cut")
    cut.write_bytes(saved.read_bytes()[:100])
    cut.replace(saved)
    capsys.readouterr()
    third, _ = loading.load_model(str(path), weights="q4", activations="int8")
    err = capsys.readouterr().err
    assert err.count("warning: the cached int8 layout") == 1 and "laying out again" in err, err
    np.testing.assert_array_equal(full_logits(third, tokens), want)
    assert saved.stat().st_size > 100  # replaced by a whole file


def test_a_format_the_kernel_cannot_take_is_not_laid_out_into_a_file(tmp_path, monkeypatch):
    """`packed_cache.lay_out` over bfloat16 matrices (the kernel takes none): nothing written, no file left."""
    from tiny_gguf import Tiny, write_tiny_gguf

    from specjax.models import loading, packed_cache

    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path / "cache"))
    path, _ = write_tiny_gguf(tmp_path / "tiny.gguf", Tiny())
    loading.load_model(str(path), weights="bfloat16", activations="float32")
    (folder,) = (tmp_path / "cache").glob("gguf-packed-*-bfloat16")
    before = sorted(p.name for p in folder.iterdir())
    assert packed_cache.lay_out(folder / "weights.safetensors", folder / "tiled.safetensors") == 0
    assert sorted(p.name for p in folder.iterdir()) == before


def _in_mapping(a: jax.Array, path) -> bool:
    """Whether array `a`'s buffer lies in this process's memory map of file `path` (/proc/self/maps)."""
    ptr, target = a.unsafe_buffer_pointer(), str(path.resolve())
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].strip() == target:
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= ptr and ptr + a.nbytes <= hi:
                return True
    return False
