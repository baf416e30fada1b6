"""Decoding: plain batched generation (`Generator`) and speculative decoding (`SpeculativeGenerator`).

Plain decoding is the modules of this package (`generate.py` the host driver, `loop.py` the jitted
program, `sampling.py`, `stops.py`, `constrain.py` + `grammar_spec.py` for grammars, `mesh.py`,
`backend.py`); speculation is the `spec/` add-on (config, program, rounds, policy, verify, trees,
driver, and one module per drafter in `spec/drafters/`). The public names below are imported lazily.

Example:
  >>> from specjax.decode import GenerateConfig, SpecConfig, SpeculativeGenerator
  >>> gen = SpeculativeGenerator(model, tokenizer)
  >>> completions, stats = gen.generate(["Hello"], GenerateConfig(max_new_tokens=32), SpecConfig(k=4))
"""

from specjax._lazy import lazy_exports

_EXPORTS = {
    "BackendProfile": "backend", "profile_for": "backend",
    "GenerationError": "errors",
    "Completion": "generate", "GenerateConfig": "generate", "Generator": "generate", "Stats": "generate",
    "GrammarSpec": "grammar_spec", "GrammarSpecError": "grammar_spec",
    "generate_program": "loop",
    "MeshPlan": "mesh",
    "SamplingConfig": "sampling", "SamplingError": "sampling",
    "SpecConfig": "spec.config", "SpecStats": "spec.driver", "SpeculativeGenerator": "spec.driver",
    "Adaptive": "spec.policy", "speculative_program": "spec.program",
    "Draft": "spec.drafters.base", "Drafter": "spec.drafters.base", "Observation": "spec.drafters.base",
    "Prefill": "spec.drafters.base",
    "NgramDrafter": "spec.drafters.ngram", "LayerSkipDrafter": "spec.drafters.layer_skip",
    "LookupTreeDrafter": "spec.drafters.lookup_tree", "RecycleDrafter": "spec.drafters.recycle",
    "DraftModelDrafter": "spec.drafters.draft_model", "MedusaDrafter": "spec.drafters.medusa",
    "EagleDrafter": "spec.drafters.eagle", "build_drafter": "spec.drafters.registry",
    "StaticTree": "spec.trees",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
