"""Drafters: the `Drafter` protocol (`base.py`) and one module per method; `registry.build_drafter`
builds one from a `SpecConfig`."""

from specjax._lazy import lazy_exports

_EXPORTS = {
    "Draft": "base", "Drafter": "base", "DraftSampling": "base", "DraftView": "base", "Observation": "base",
    "Prefill": "base", "StatelessDrafter": "base", "is_cheap": "base",
    "NgramDrafter": "ngram", "LayerSkipDrafter": "layer_skip", "DraftModelDrafter": "draft_model",
    "MedusaDrafter": "medusa", "EagleDrafter": "eagle",
    "METHODS": "registry", "build_drafter": "registry", "check_spec": "registry",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
