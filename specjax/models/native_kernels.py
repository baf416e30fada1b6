"""Native matrix products for low-precision weights on XLA:CPU: an XLA FFI custom call, built on first use.

XLA:CPU runs a `BlockQuant` product at a third of the memory bandwidth or less: converting 4-bit or
int8 values to float32 is ALU work its loop fusions vectorize poorly, and for more than one row it
converts whole blocks into memory before a GEMM (docs/performance.md). `csrc/block_quant_gemm.cc`
does the product in one pass over the weights with AVX-512: 4-bit values through a 16-entry table
per scale block, each weight byte read once for up to 4 rows of x and shared by 4 output rows'
accumulators, the output rows split over XLA's intra-op thread pool. The weights it forms are
bit-identical to the XLA path's (the same float32 multiply and subtract); only the order of each
dot product's additions differs.

The library is compiled on first use with the system's C++ compiler (``$CXX``, else ``c++``;
``-O3 -march=native -ffp-contract=off``, ~2 s) against JAX's FFI headers and kept in specjax's cache, keyed by the
source, the jaxlib version, the compiler, its flags and the CPU. Where that fails (no compiler, no AVX-512 for
this kernel, not x86-64) the XLA path is used and :func:`unavailable_reason` says why; ``SPECJAX_NATIVE_KERNELS=0``
turns the kernels off. Only the CPU backend profile uses them (`BackendProfile.native_max_rows`);
accelerators keep plain fused XLA.

A second kernel, ``csrc/int8_activation_gemm.cc``, serves `activations=int8` (`int8_activations.py`): x is
quantized to int8 per row and block, the block sums are integer dot products (vpdpbusd), on matrices re-laid
out in tiles of 16 output rows. A third library, ``csrc/fixed_order.cc``, holds attention and RMS norm with
every sum in one fixed order (the same result for a row in a one-token step, a verification block or a
prefill), which int8 activations need for greedy speculative decoding to keep plain decoding's tokens. These
two are written on ``csrc/simd16.h``'s 16 lanes: AVX-512 (F, BW, VNNI) where the CPU has it, else AVX2 + FMA (+ F16C),
with the same bits either way (``SPECJAX_NATIVE_ISA=avx2`` builds the AVX2 form on an AVX-512 machine). All are
built the same way; ``kind`` ("float32", "int8", "attention" or "rms_norm") names which kernel.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.models.artifacts import cache_root, ensure_dir

__all__ = ["ENV", "INT8_PATH", "ISA_ENV", "KERNELS", "SOURCE", "applies", "available", "block_quant_product",
           "fixed_order_attention", "fixed_order_rms_norm", "int8_path_available", "int8_path_expected",
           "int8_path_pending", "target_name", "unavailable_reason"]

ENV = "SPECJAX_NATIVE_KERNELS"
# "avx2": build without AVX-512 (-mno-avx512f) where the CPU has it, for tests and benchmarks of the AVX2 form.
ISA_ENV = "SPECJAX_NATIVE_ISA"
# kind -> (source file stem, exported handler symbol)
KERNELS = {"float32": ("block_quant_gemm", "SpecjaxBlockQuantGemm"),
           "int8": ("int8_activation_gemm", "SpecjaxInt8ActivationGemm"),
           "attention": ("fixed_order", "SpecjaxFixedOrderAttention"),
           "rms_norm": ("fixed_order", "SpecjaxFixedOrderRmsNorm")}
# The kernels `activations=int8` runs on (AVX2 + FMA or AVX-512 VNNI); the float32 one needs AVX-512.
INT8_PATH = ("int8", "attention", "rms_norm")
_CPU_NEEDS = {"float32": ("avx512f", "avx512bw")}  # /proc/cpuinfo flags; the others: AVX2, FMA and F16C
SOURCE = Path(__file__).with_name("csrc") / "block_quant_gemm.cc"
# No FMA contraction: w = q·s − b must round twice, as the XLA path does (bit-identical weights).
_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-std=c++17", "-shared", "-fPIC", "-w")
_BUILD_TIMEOUT_S = 300
_REGISTERED: dict[str, ctypes.CDLL] = {}  # FFI target name -> its library (a cache_clear of _load keeps them)
# The int8 path's libraries building in the background (`int8_path_expected`), and whether such a build failed in
# this process (then they are not expected again).
_PENDING: dict[str, concurrent.futures.Future] = {}
_FAILED: set[str] = set()


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX") or "c++")


def _cpuinfo_flags() -> str | None:
    """The CPU's feature flags from /proc/cpuinfo (Linux), or None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_flags() -> str:
    """The CPU's feature flags (or its name), part of the cache key: -march=native code is for this CPU only."""
    return _cpuinfo_flags() or platform.processor()


def _isa() -> str:
    isa = os.environ.get(ISA_ENV, "native").strip().lower()
    if isa not in ("native", "avx2"):
        raise OSError(f"{ISA_ENV}={isa!r}: expected 'native' or 'avx2'")
    return isa


def _flags() -> tuple[str, ...]:
    """The compiler flags: `_FLAGS`, and -mno-avx512f when `ISA_ENV` asks for the AVX2 form."""
    return _FLAGS + (("-mno-avx512f",) if _isa() == "avx2" else ())


def _cpu_lacks(kind: str) -> str | None:
    """Why this CPU cannot run kernel `kind`, known without compiling (None: the build decides). An AVX2 CPU
    would otherwise compile the AVX-512-only float32 kernel, and fail, at every start."""
    needs = _CPU_NEEDS.get(kind, ("avx2", "fma", "f16c"))
    if "avx512f" in needs and _isa() == "avx2":
        return f"{ISA_ENV}=avx2 builds no AVX-512 code, and the {kind} kernel is AVX-512 only"
    listed = _cpuinfo_flags()
    missing = [] if listed is None else [f for f in needs if f not in listed.split()]
    return f"the {kind} kernel needs {' and '.join(needs)}; this CPU lacks {', '.join(missing)}" if missing else None


def _source(kind: str) -> Path:
    return Path(__file__).with_name("csrc") / f"{KERNELS[kind][0]}.cc"


@functools.cache  # asked once per process, not once per kernel and call
def _compiler_version(compiler: str) -> str:
    return subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout


def _key(compiler: str, kind: str) -> str:
    version = _compiler_version(compiler)
    headers = b"".join(h.read_bytes() for h in sorted(_source(kind).parent.glob("*.h")))
    parts = (_source(kind).read_bytes() + headers, jax.lib.__version__.encode(), version.encode(),
             " ".join(_flags()).encode(), _cpu_flags().encode())
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def _library(kind: str) -> str:
    return f"libspecjax_{KERNELS[kind][0]}.so"


def _build(folder: Path, compiler: str, kind: str) -> None:
    command = [compiler, *_flags(), "-I", jax.ffi.include_dir(), str(_source(kind)), "-o", str(folder / _library(kind))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if "error" in ln] or done.stderr.splitlines() or ["?"]
        raise OSError(f"{Path(compiler).name} failed: {lines[0].strip()}")


def _built(compiler: str, kind: str, key: str) -> Path:
    """The cache folder holding kernel `kind`'s library, built there first if it is not (under a lock)."""
    return ensure_dir(_folder(kind, key), lambda tmp: _build(tmp, compiler, kind), "native kernel library")


def _folder(kind: str, key: str) -> Path:
    """The cache folder of kernel `kind`'s library built under `key`."""
    return cache_root() / "native" / f"{KERNELS[kind][0]}-{key}"


def _toolchain(kind: str) -> tuple[str | None, str | None]:
    """(the compiler, None), or (None, why kernel `kind` cannot be built here): `ENV`, the machine, the CPU's
    instructions (`ISA_ENV`), a compiler on PATH."""
    if os.environ.get(ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return None, f"{ENV}={os.environ[ENV]}"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"the kernels are x86-64 code (AVX2 or AVX-512); this machine is {platform.machine()}"
    try:
        if lacks := _cpu_lacks(kind):
            return None, lacks
    except OSError as err:  # a bad ISA_ENV value
        return None, str(err)
    compiler = _compiler()
    if compiler is None:
        return None, f"no C++ compiler ({os.environ.get('CXX') or 'c++'}) on PATH"
    return compiler, None


def _build_side_by_side(kinds: tuple[str, ...]) -> None:
    """Builds the libraries of `kinds` that are not built yet, in parallel compiler processes (a first start:
    6 s instead of 10 s on two cores). Failures are left for `_load` to report; nothing is registered here."""
    def build(kind: str) -> None:
        compiler, why = _toolchain(kind)
        if why is None:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                _built(compiler, kind, _key(compiler, kind))

    with concurrent.futures.ThreadPoolExecutor(len(kinds)) as pool:
        list(pool.map(build, kinds))


@functools.cache
def _load(kind: str = "float32") -> tuple[str | None, str | None]:
    """(registered target name, None) or (None, why kernel `kind` is not available); reads `ENV` and `ISA_ENV`
    once per process (tests clear the cache)."""
    compiler, why = _toolchain(kind)
    if why is not None:
        return None, why
    try:
        key = _key(compiler, kind)
        symbol = KERNELS[kind][1]
        name = f"specjax_{symbol}_{key}"
        if name in _REGISTERED:  # registered once per process: XLA refuses a second library under the same name
            return name, None
        library = ctypes.cdll.LoadLibrary(str(_built(compiler, kind, key) / _library(kind)))
    except (OSError, subprocess.SubprocessError) as err:
        return None, str(err)
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
    _REGISTERED[name] = library  # kept loaded for the process
    return name, None


def available(kind: str = "float32") -> bool:
    """Whether native kernel `kind` is built and registered (builds it on first call)."""
    return _load(kind)[0] is not None


def int8_path_available() -> bool:
    """Whether every kernel of the int8-activation path (`INT8_PATH`) is available (building their libraries side
    by side first when one is missing; waiting for the build `int8_path_expected` started, if any)."""
    pending = _PENDING.pop("int8", None)
    if pending is not None:
        pending.result()
    _build_side_by_side(INT8_PATH)
    ok = all(available(k) for k in INT8_PATH)
    if pending is not None and not ok:  # expected, and it failed: not expected again in this process
        _FAILED.add("int8")
    return ok


def int8_path_expected() -> bool:
    """`int8_path_available` without waiting for a first build: where every kernel of the path has a toolchain but
    a library is not built yet, their build starts in the background and the answer is True (a first start then
    converts the model while the compilers run: Qwen's first start 6 s shorter on two cores). The caller must
    confirm with `int8_path_available` before the kernels run (`int8_path_pending` says whether it must)."""
    if "int8" in _PENDING:
        return True
    if "int8" in _FAILED:
        return False
    if not all(_is_built(k) for k in INT8_PATH) and all(_toolchain(k)[1] is None for k in INT8_PATH):
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="specjax-native-build")
        _PENDING["int8"] = pool.submit(_build_side_by_side, INT8_PATH)
        pool.shutdown(wait=False)
        return True
    return int8_path_available()


def int8_path_pending() -> bool:
    """Whether a background build of the int8 path (`int8_path_expected`) has not been waited for yet."""
    return "int8" in _PENDING


def _is_built(kind: str) -> bool:
    """Whether kernel `kind`'s library is in the cache already (False where it cannot be built)."""
    compiler, why = _toolchain(kind)
    if why is not None:
        return False
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return (_folder(kind, _key(compiler, kind)) / _library(kind)).is_file()
    return False


def unavailable_reason(kind: str = "float32") -> str | None:
    """Why native kernel `kind` is not used (None when it is)."""
    return _load(kind)[1]


def target_name(kind: str = "float32") -> str:
    """The FFI target of kernel `kind` (raises when unavailable)."""
    name, why = _load(kind)
    if name is None:
        raise RuntimeError(f"specjax's native {kind} kernel is unavailable: {why}")
    return name


def applies(packed, rows: int, max_rows: int) -> bool:
    """Whether `block_quant_product` takes this matrix for `rows` rows of x (and the kernels are available).

    The kernel takes int8 or 4-bit values with a float32 scale per block of a multiple of 16 columns
    (4-bit: the low half of the columns in whole blocks); bfloat16 matrices and other shapes use XLA.
    """
    if getattr(packed, "tiled", False):  # laid out for the int8 kernel: every product goes there
        return rows > 0
    if not 0 < rows <= max_rows or packed.scale is None:
        return False
    values = packed.values
    _, width = packed.shape
    block = width // packed.n_blocks
    shape_ok = (width // 2) % block == 0 if values.dtype == jnp.uint8 else values.dtype == jnp.int8
    return shape_ok and block % 16 == 0 and available()


def block_quant_product(packed, x_mi: jax.Array) -> jax.Array:
    """x [m, in] @ Wᵀ → float32 [m, out] for a BlockQuant W, through the native kernel (see `applies`): the
    int8 activation kernel for matrices `int8_activations.tile_model` laid out for it, else the float32 one."""
    out, width = packed.shape
    scale = packed.scale[...]
    empty = jnp.zeros((out, 0), scale.dtype)
    offset = packed.offset[...] if packed.offset is not None else empty
    x = x_mi.astype(jnp.float32).reshape(-1, width)
    if not getattr(packed, "tiled", False):
        call = jax.ffi.ffi_call(target_name("float32"), jax.ShapeDtypeStruct((x.shape[0], out), jnp.float32))
        return call(x, packed.values[...], scale, offset)
    # The int8 kernel also takes the compact scales' super-scales (int8_activations.tile_arrays).
    supers = [jnp.zeros((out, 0), jnp.float32) if a is None else a[...] for a in (packed.scale_super,
                                                                                   packed.offset_super)]
    call = jax.ffi.ffi_call(target_name("int8"), jax.ShapeDtypeStruct((x.shape[0], out), jnp.float32))
    return call(x, packed.values[...], scale, supers[0], offset, supers[1])


def fixed_order_attention(q_btnh: jax.Array, keys_bskh: jax.Array, values_bkhs: jax.Array, k_btkh: jax.Array,
                          v_btkh: jax.Array, start_b: jax.Array, visible_bts: jax.Array) -> jax.Array:
    """Softmax attention of T queries per row whose sums run in one fixed order (``csrc/fixed_order.cc``).

    Args:
      q_btnh: scaled, rotated queries float32 [B, T, N, H].
      keys_bskh, values_bkhs: the cache before this block's write (values transposed, as `kv_cache` keeps them).
      k_btkh, v_btkh: the block's own keys and values [B, T, KV, H]; slot start_b + j holds entry j.
      start_b: the block's first slot per row (int32 [B]).
      visible_bts: which slots each query sees (`kv_cache.attention_masks` for the cache after the write).

    Returns:
      float32 [B, T, N, H]; a query's result depends only on the keys and values it sees, in slot order.
    """
    call = jax.ffi.ffi_call(target_name("attention"), jax.ShapeDtypeStruct(q_btnh.shape, jnp.float32))
    f32 = [a.astype(jnp.float32) for a in (q_btnh, keys_bskh, values_bkhs, k_btkh, v_btkh)]
    return call(*f32, start_b.astype(jnp.int32), visible_bts.astype(jnp.bool_))


def fixed_order_rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMS norm over the last axis, float32, its sum of squares in one fixed order (``csrc/fixed_order.cc``):
    a row's result does not depend on the shape of the call."""
    d = x.shape[-1]
    call = jax.ffi.ffi_call(target_name("rms_norm"), jax.ShapeDtypeStruct((x.size // d, d), jnp.float32))
    y = call(x.astype(jnp.float32).reshape(-1, d), scale.astype(jnp.float32), eps=np.float32(eps))
    return y.reshape(x.shape)
