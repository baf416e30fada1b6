"""The decode command's options: one structured config, every default taken from the library's dataclasses.

`python -m specjax.decode` registers `DecodeOptions` with Hydra's ConfigStore as the schema of
configs/decode.yaml, so this module is the single source of the defaults: each field's default is
read from the dataclass that uses it (`GenerateConfig`, `SamplingConfig`, `GrammarSpec`, `SpecConfig`,
`Adaptive`), and the YAML keeps only Hydra's settings. Speculation is nested like the training config:

    spec: {method, k, adaptive: {enabled, probe_every, ...}, drafter: {max_ngram, layers, draft_model, ...}}

The flat spellings of earlier releases (`spec=ngram spec_k=8 draft_model=...`) stay valid: `FLAT_ALIASES`
maps them to the nested keys (`flat_overrides` for command lines, `DecodeOptions.from_flat` for Python).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specjax.decode.generate import GenerateConfig
from specjax.decode.grammar_spec import GrammarSpec
from specjax.decode.sampling import SamplingConfig
from specjax.decode.spec.config import SpecConfig
from specjax.decode.spec.policy import Adaptive

_GEN, _SAMPLING, _SPEC, _ADAPT = GenerateConfig(), SamplingConfig(), SpecConfig(), Adaptive()
_GRAMMAR = {f.name: f.default for f in dataclasses.fields(GrammarSpec)}


def _list_field():
    return dataclasses.field(default_factory=list)


@dataclasses.dataclass
class AdaptiveOptions:
    """spec.adaptive: when to speculate (`policy.Adaptive` documents each field; enabled=false speculates
    every round)."""

    enabled: bool = _SPEC.adaptive
    min_expected_accept: float | None = _ADAPT.min_expected_accept  # None: the backend's floor
    ema_weight: float = _ADAPT.ema_weight
    probe_every: int = _ADAPT.probe_every
    max_probe_every: int = _ADAPT.max_probe_every
    verify_cost: float | None = _ADAPT.verify_cost
    min_best_gain: float = _ADAPT.min_best_gain
    cheap_max_gap: int = _ADAPT.cheap_max_gap


@dataclasses.dataclass
class DrafterOptions:
    """spec.drafter: the drafter's options (`SpecConfig` documents each). layer_list, when not empty,
    replaces layers (layer skip's early exit after N layers) with these layer indices."""

    max_ngram: int = _SPEC.max_ngram
    min_ngram: int = _SPEC.min_ngram
    layers: int = _SPEC.layers
    layer_list: list[int] = _list_field()
    confidence: float = _SPEC.confidence
    draft_model: str | None = _SPEC.draft_model
    draft_checkpoint: str | None = _SPEC.draft_checkpoint
    eagle_depth: int = _SPEC.eagle_depth
    eagle_top_k: int = _SPEC.eagle_top_k
    lookup_branches: int = _SPEC.lookup_branches
    lookup_depth: int = _SPEC.lookup_depth
    recycle_width: int = _SPEC.recycle_width
    draft_vocab: int = _SPEC.draft_vocab
    draft_vocab_corpus: str | None = _SPEC.draft_vocab_corpus


@dataclasses.dataclass
class SpecOptions:
    """spec: speculative decoding. method: none | ngram | lookup | recycle | layerskip | draft | medusa | eagle."""

    method: str = "none"
    k: int = _SPEC.k
    adaptive: AdaptiveOptions = dataclasses.field(default_factory=AdaptiveOptions)
    drafter: DrafterOptions = dataclasses.field(default_factory=DrafterOptions)

    def config(self) -> SpecConfig | None:
        """The library's `SpecConfig`, or None for plain decoding (method none)."""
        if self.method == "none":
            return None
        a, d = self.adaptive, self.drafter
        return SpecConfig(
            k=self.k, method=self.method, adaptive=a.enabled, min_expected_accept=a.min_expected_accept,
            ema_weight=float(a.ema_weight), probe_every=a.probe_every, max_probe_every=a.max_probe_every,
            verify_cost=a.verify_cost, min_best_gain=float(a.min_best_gain), cheap_max_gap=a.cheap_max_gap,
            max_ngram=d.max_ngram,
            min_ngram=d.min_ngram, layers=tuple(d.layer_list) or d.layers, confidence=float(d.confidence),
            draft_model=d.draft_model, draft_checkpoint=d.draft_checkpoint, eagle_depth=d.eagle_depth,
            eagle_top_k=d.eagle_top_k, draft_vocab=d.draft_vocab, draft_vocab_corpus=d.draft_vocab_corpus,
            lookup_branches=d.lookup_branches, lookup_depth=d.lookup_depth, recycle_width=d.recycle_width)


@dataclasses.dataclass
class DecodeOptions:
    """Options of `python -m specjax.decode` (`--help` describes each)."""

    model: str | None = None  # None: the embedded Gemma 3 270M; or a .gguf file / Hugging Face directory
    dtype: str = "float32"
    weights: str = "auto"  # auto | float32 | bfloat16 | int8 | q4: matrices kept low-precision, dequantized in-graph
    activations: str = "auto"  # auto | float32 | int8: int8 / q4 matrices times int8 activations (CPU kernels)
    prompt: str | None = None
    prompt_file: str | None = None  # the whole file (- = standard input) as one prompt
    prompts_file: str | None = None
    limit: int | None = None
    chat: bool = _GEN.chat
    max_new_tokens: int = _GEN.max_new_tokens
    batch_size: int = _GEN.batch_size
    temperature: float = _SAMPLING.temperature
    top_k: int = _SAMPLING.top_k
    top_p: float = _SAMPLING.top_p
    seed: int = _SAMPLING.seed
    stop: list[str] = _list_field()
    spec: SpecOptions = dataclasses.field(default_factory=SpecOptions)
    compare_plain: bool = True
    mesh_data: int = 1
    mesh_model: int = 1
    distributed: bool = False  # one process per host: join the others first (docs/multihost.md)
    output: str | None = None
    quiet: bool = False
    grammar: str | None = None
    json_schema: str | None = None
    regex: str | None = None
    grammar_start: str = _GRAMMAR["start"]
    grammar_max_depth: int = _GRAMMAR["max_depth"]
    json_whitespace: str = _GRAMMAR["whitespace"]
    json_max_whitespace: int = _GRAMMAR["max_whitespace"]
    json_strict_objects: bool = _GRAMMAR["strict_objects"]
    json_max_repeat: int | None = _GRAMMAR["max_repeat"]
    json_max_digits: int | None = _GRAMMAR["max_digits"]
    json_unknown_formats: str = _GRAMMAR["unknown_formats"]
    json_unenforced: list[str] = dataclasses.field(default_factory=lambda: list(_GRAMMAR["unenforced"]))
    grammar_max_states: int = _GRAMMAR["max_states"]
    grammar_timeout: float | None = _GRAMMAR["timeout"]
    grammar_max_ignore: int | None = _GRAMMAR["max_ignore"]
    grammar_close: bool = _GEN.close_grammar  # end every constrained row complete within max_new_tokens

    @classmethod
    def from_flat(cls, **flat: Any) -> DecodeOptions:
        """Options from keyword arguments in the flat spelling (`spec="ngram", spec_k=8`, `FLAT_ALIASES`) plus
        the top-level fields; what Python callers and tests use instead of building the nested dataclasses."""
        nested: dict[str, Any] = {}
        for key, value in flat.items():
            path = FLAT_ALIASES.get(key, key).split(".")
            node = nested
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = value
        spec = nested.pop("spec", {})
        adaptive, drafter = spec.pop("adaptive", {}), spec.pop("drafter", {})
        return cls(**nested, spec=SpecOptions(**spec, adaptive=AdaptiveOptions(**adaptive),
                                              drafter=DrafterOptions(**drafter)))


# Flat (pre-nesting) option names → their nested keys. `spec=NAME` selects the method.
FLAT_ALIASES = {
    "spec": "spec.method", "spec_k": "spec.k",
    **{f"spec_{n}": f"spec.adaptive.{n}" for n in ("probe_every", "max_probe_every", "verify_cost",
                                                  "min_best_gain", "min_expected_accept", "ema_weight",
                                                  "cheap_max_gap")},
    "spec_adaptive": "spec.adaptive.enabled",
    **{f"spec_{n}": f"spec.drafter.{n}" for n in ("max_ngram", "min_ngram", "layers", "layer_list", "confidence")},
    **{n: f"spec.drafter.{n}" for n in ("draft_model", "draft_checkpoint", "eagle_depth", "eagle_top_k",
                                        "draft_vocab", "draft_vocab_corpus", "lookup_branches", "lookup_depth",
                                        "recycle_width")},
}


def flat_overrides(args: list[str]) -> list[str]:
    """Command-line overrides with the flat spellings rewritten to nested keys (`spec_k=8` → `spec.k=8`,
    `spec=ngram` → `spec.method=ngram`); Hydra's own arguments and nested keys pass unchanged."""
    out = []
    for arg in args:
        prefix = arg[:2] if arg.startswith("++") else arg[:1] if arg[:1] in "+~" else ""
        key, eq, value = arg[len(prefix):].partition("=")
        if key in FLAT_ALIASES and (eq or prefix == "~"):
            arg = f"{prefix}{FLAT_ALIASES[key]}{eq}{value}"
        out.append(arg)
    return out
