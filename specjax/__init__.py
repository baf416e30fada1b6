"""specjax: fast LLM inference in JAX/Flax NNX (speculative and grammar-constrained decoding, draft training)."""

from specjax.compile_cache import enable_compile_cache

__all__ = ["enable_compile_cache"]
