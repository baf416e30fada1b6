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
source, the jaxlib version, the compiler and the CPU. Where that fails (no compiler, no AVX-512, not
x86-64) the XLA path is used and :func:`unavailable_reason` says why; ``SPECJAX_NATIVE_KERNELS=0``
turns the kernels off. Only the CPU backend profile uses them (`BackendProfile.native_max_rows`);
accelerators keep plain fused XLA.
"""

from __future__ import annotations

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

from specjax.models.artifacts import cache_root, ensure_dir

__all__ = ["ENV", "SOURCE", "applies", "available", "block_quant_product", "target_name", "unavailable_reason"]

ENV = "SPECJAX_NATIVE_KERNELS"
SOURCE = Path(__file__).with_name("csrc") / "block_quant_gemm.cc"
_SYMBOL = "SpecjaxBlockQuantGemm"
_LIBRARY = "libspecjax_block_quant_gemm.so"
# No FMA contraction: w = q·s − b must round twice, as the XLA path does (bit-identical weights).
_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-std=c++17", "-shared", "-fPIC", "-w")
_BUILD_TIMEOUT_S = 300


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX") or "c++")


def _cpu_flags() -> str:
    """The CPU's feature flags (Linux), part of the cache key: -march=native code is for this CPU only."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _key(compiler: str) -> str:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    parts = (SOURCE.read_bytes(), jax.lib.__version__.encode(), version.encode(), " ".join(_FLAGS).encode(),
             _cpu_flags().encode())
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def _build(folder: Path, compiler: str) -> None:
    command = [compiler, *_FLAGS, "-I", jax.ffi.include_dir(), str(SOURCE), "-o", str(folder / _LIBRARY)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if "error" in ln] or done.stderr.splitlines() or ["?"]
        raise OSError(f"{Path(compiler).name} failed: {lines[0].strip()}")


@functools.cache
def _load() -> tuple[str | None, str | None]:
    """(registered target name, None) or (None, why the kernels are not available)."""
    if os.environ.get(ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return None, f"{ENV}={os.environ[ENV]}"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"the kernels are x86-64 AVX-512 code; this machine is {platform.machine()}"
    compiler = _compiler()
    if compiler is None:
        return None, f"no C++ compiler ({os.environ.get('CXX') or 'c++'}) on PATH"
    try:
        key = _key(compiler)
        folder = ensure_dir(cache_root() / "native" / f"block_quant_gemm-{key}",
                            lambda tmp: _build(tmp, compiler), "native kernel library")
        library = ctypes.cdll.LoadLibrary(str(folder / _LIBRARY))
    except (OSError, subprocess.SubprocessError) as err:
        return None, str(err)
    name = f"specjax_block_quant_gemm_{key}"
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, _SYMBOL)), platform="cpu")
    return name, None


def available() -> bool:
    """Whether the native kernels are built and registered (builds them on first call)."""
    return _load()[0] is not None


def unavailable_reason() -> str | None:
    """Why the native kernels are not used (None when they are)."""
    return _load()[1]


def target_name() -> str:
    """The FFI target the products call (raises when unavailable)."""
    name, why = _load()
    if name is None:
        raise RuntimeError(f"specjax's native kernels are unavailable: {why}")
    return name


def applies(packed, rows: int, max_rows: int) -> bool:
    """Whether `block_quant_product` takes this matrix for `rows` rows of x (and the kernels are available).

    The kernel takes int8 or 4-bit values with a float32 scale per block of a multiple of 16 columns
    (4-bit: the low half of the columns in whole blocks); bfloat16 matrices and other shapes use XLA.
    """
    if not 0 < rows <= max_rows or packed.scale is None:
        return False
    values = packed.values
    _, width = packed.shape
    block = width // packed.n_blocks
    shape_ok = (width // 2) % block == 0 if values.dtype == jnp.uint8 else values.dtype == jnp.int8
    return shape_ok and block % 16 == 0 and available()


def block_quant_product(packed, x_mi: jax.Array) -> jax.Array:
    """x [m, in] @ Wᵀ → float32 [m, out] for a BlockQuant W, through the native kernel (see `applies`)."""
    out, width = packed.shape
    offset = packed.offset[...] if packed.offset is not None else jnp.zeros((out, 0), jnp.float32)
    call = jax.ffi.ffi_call(target_name(), jax.ShapeDtypeStruct((x_mi.shape[0], out), jnp.float32))
    return call(x_mi.astype(jnp.float32).reshape(-1, width), packed.values[...], packed.scale[...], offset)
