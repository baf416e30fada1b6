"""Training configuration: frozen dataclasses the library takes (Hydra builds them in `__main__`).

Every section is a plain dataclass so a Python user can write
``TrainConfig(task=TaskConfig(kind="eagle"), optim=OptimConfig(lr=1e-3))`` without Hydra; the
structured-config registration in `schema.py` gives the YAML files the same types.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specjax.models.config import increasing_layers


class TrainConfigError(ValueError):
    """An option that the trainer cannot use; the message names the option."""


KINDS = ("draft", "medusa", "eagle")
SOURCES = ("self_distill", "text", "jsonl", "synthetic")


@dataclasses.dataclass(frozen=True)
class ArchConfig:
    """A model shape: a named preset plus optional overrides of single fields.

    Attributes:
      preset: "gemma3_270m", "gemma3_1b", "gemma3_12b", "qwen2.5_coder_1.5b" or "tiny" (see `presets.py`).
      n_layers, d_model, ffn_dim, n_heads, n_kv_heads, head_dim, vocab_size: overrides (None keeps
        the preset's value).
    """

    preset: str = "gemma3_270m"
    n_layers: int | None = None
    d_model: int | None = None
    ffn_dim: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int | None = None


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """What is trained against which target.

    Attributes:
      kind: "draft" (a small draft model distilled from the target), "medusa" (Medusa-1 heads on
        the frozen target) or "eagle" (an EAGLE head on the frozen target's features).
      target: the target / teacher model: "gemma3-270m", a .gguf file or a Hugging Face
        directory; None builds a randomly initialised target of shape `target_arch` (tests and
        abstract checks, where no weights exist).
      target_arch: shape of the random target when `target` is None.
      draft_arch: shape of the draft model (kind="draft").
      init_layers: target layers copied into the draft's blocks (kind="draft", same widths); empty
        keeps the random initialisation.
      init_embed: copy the target's embedding table into the draft (same d_model).
      freeze_embed: do not train the draft's embedding table (saves 2/3 of optimizer memory on a
        262k vocabulary).
      medusa_heads: number of Medusa heads (kind="medusa").
      eagle_layers: kind="eagle": EAGLE-3 feature fusion, the target blocks whose outputs the head reads
        at committed positions (EAGLE-3 taps blocks 2, L/2 and L-3: [2, 9, 15] on Gemma 3 270M's 18
        layers, [2, 14, 25] on Qwen2.5 1.5B's 28); empty: the final-normed features (EAGLE-1/2).
      draft_vocab: reduced draft vocabulary size of the heads (kind="medusa" or "eagle"): the most
        frequent target ids of the training continuations (EOS ids kept); 0 keeps the full vocabulary.
    """

    kind: str = "draft"
    target: str | None = "gemma3-270m"
    target_arch: ArchConfig = ArchConfig()
    draft_arch: ArchConfig = ArchConfig(n_layers=2)
    init_layers: tuple[int, ...] = ()
    init_embed: bool = True
    freeze_embed: bool = True
    medusa_heads: int = 4
    eagle_layers: tuple[int, ...] = ()
    draft_vocab: int = 0


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Loss weights.

    Attributes:
      kd_temperature: temperature of teacher and student distributions in the KL term.
      kd_weight: weight of T² · KL(teacher ‖ student); the hard-label CE gets 1 - kd_weight.
      medusa_decay: head k (1-based) has weight medusa_decay ** (k - 1).
      eagle_feature_weight: weight of the smooth-L1 feature regression.
      eagle_ce_weight: weight of the CE through the frozen head.
      eagle_ttt_steps: training-time test (EAGLE-3): the head is unrolled this many steps over its own
        predicted features (`eagle_ttt.py`); 1 = teacher forcing only. A step costs about this many
        times a 1-step one.
      eagle_ttt_decay: unrolled step j's loss weighs eagle_ttt_decay ** j (EAGLE-3: 0.8).
      logit_chunk: rows per chunk when computing vocabulary logits (bounds memory on 262k vocab).
      top_k: k of the reported top-k accuracy.
    """

    kd_temperature: float = 0.7
    kd_weight: float = 0.3
    medusa_decay: float = 0.8
    eagle_feature_weight: float = 1.0
    eagle_ce_weight: float = 0.1
    eagle_ttt_steps: int = 1
    eagle_ttt_decay: float = 0.8
    logit_chunk: int = 256
    top_k: int = 5


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with linear warmup and cosine decay, global-norm clipping, gradient accumulation."""

    lr: float = 3e-4
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.95
    clip_norm: float = 1.0
    accum_steps: int = 1


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where training rows come from.

    Attributes:
      source: "self_distill" (the target writes continuations of `prompts`), "text" (a plain
        text file, blank-line separated documents), "jsonl" (field `text_field` of each line) or
        "synthetic" (random tokens; tests and abstract checks only).
      prompts: prompt files (jsonl with a `prompt` field) for self-distillation.
      num_prompts: prompts used for training (after the dev split is taken out).
      dev_prompts: the first `dev_prompts` prompts (after a seeded shuffle) form the dev split.
      max_new_tokens: length of each generated continuation.
      gen_batch_size: rows per generation batch.
      chat: wrap prompts in the target's chat template.
      path: corpus file for "text" / "jsonl".
      text_field: jsonl field holding the text.
      dev_fraction: share of corpus rows kept as the dev split ("text" / "jsonl").
      cache_dir: where generated data is cached (default: ~/.cache/specjax/distill).
      seed: shuffling seed of the split (fixed: the dev split never changes with the run seed).
      feature_cache: head tasks (medusa, eagle) compute the frozen target's features of every packed
        train / dev row once, store them on disk and train from them (a step then runs only the heads
        and their losses); ignored for kind="draft", whose teacher logits are too wide to store.
      feature_dir: where feature caches live (default: ~/.cache/specjax/features).
    """

    source: str = "self_distill"
    prompts: tuple[str, ...] = ("../shared/data/prompts/alpaca_eval.jsonl",)
    num_prompts: int = 256
    dev_prompts: int = 32
    max_new_tokens: int = 128
    gen_batch_size: int = 16
    chat: bool = True
    path: str | None = None
    text_field: str = "text"
    dev_fraction: float = 0.05
    cache_dir: str | None = None
    seed: int = 1234
    feature_cache: bool = True
    feature_dir: str | None = None


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh ('data', 'model'); data=-1 takes every device not used by 'model'."""

    data: int = -1
    model: int = 1


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The whole run.

    Attributes:
      steps: optimizer steps.
      batch_size: rows per optimizer step (split into `optim.accum_steps` micro-batches).
      seq_len: tokens per row.
      seed: initialisation, shuffling and dropout seed.
      compute_dtype: "float32" or "bfloat16" (parameters and optimizer state stay float32).
      out_dir: checkpoints, metrics.jsonl and TensorBoard events.
      log_every, eval_every, save_every: in optimizer steps (0 disables eval / periodic saves).
      eval_batches: dev batches per evaluation (0 = the whole dev split).
      keep: checkpoints kept (the best one by dev loss is kept apart).
      resume: continue from the latest checkpoint in out_dir when there is one.
      progress: show a progress bar.
      tensorboard: also write TensorBoard events (tensorboardX).
      tau_every: every this many steps (and at the last step), speculative generation with the
        current parameters as the drafter on the first `tau_prompts` dev prompts (greedy,
        `tau_new_tokens` tokens) logs tau (tokens per target forward, bonus token included) and the
        acceptance by draft depth; 0 = off.
      tau_prompts, tau_new_tokens: the size of that evaluation.
      tau_k: tokens drafted per round (a chain for kind="draft", tree nodes for medusa / eagle);
        0 = 4 for a draft model, 10 for head drafters.
    """

    task: TaskConfig = TaskConfig()
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    data: DataConfig = DataConfig()
    mesh: MeshConfig = MeshConfig()
    steps: int = 100
    batch_size: int = 8
    seq_len: int = 256
    seed: int = 0
    compute_dtype: str = "float32"
    out_dir: str = "runs/train"
    log_every: int = 10
    eval_every: int = 50
    save_every: int = 50
    eval_batches: int = 0
    keep: int = 2
    resume: bool = True
    progress: bool = True
    tensorboard: bool = True
    tau_every: int = 0
    tau_prompts: int = 8
    tau_new_tokens: int = 48
    tau_k: int = 0

    def __post_init__(self) -> None:
        validate(self)


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise TrainConfigError(message)


def validate(cfg: TrainConfig) -> None:
    """Checks cross-field constraints; raises TrainConfigError naming the option."""
    t, o, d = cfg.task, cfg.optim, cfg.data
    _need(t.kind in KINDS, f"task.kind={t.kind!r} is not one of {list(KINDS)}")
    _need(d.source in SOURCES, f"data.source={d.source!r} is not one of {list(SOURCES)}")
    _need(cfg.compute_dtype in ("float32", "bfloat16"),
          f"compute_dtype={cfg.compute_dtype!r} is not one of ['float32', 'bfloat16']")
    _need(cfg.steps >= 1, f"steps must be >= 1, got {cfg.steps}")
    _need(cfg.seq_len >= 2, f"seq_len must be >= 2, got {cfg.seq_len}")
    _need(o.accum_steps >= 1, f"optim.accum_steps must be >= 1, got {o.accum_steps}")
    _need(cfg.batch_size >= 1 and cfg.batch_size % o.accum_steps == 0,
          f"batch_size={cfg.batch_size} must be a positive multiple of optim.accum_steps={o.accum_steps}")
    _need(o.lr > 0, f"optim.lr must be > 0, got {o.lr}")
    _need(o.warmup_steps >= 0, f"optim.warmup_steps must be >= 0, got {o.warmup_steps}")
    _need(0.0 <= cfg.loss.kd_weight <= 1.0, f"loss.kd_weight must be in [0, 1], got {cfg.loss.kd_weight}")
    _need(cfg.loss.kd_temperature > 0, f"loss.kd_temperature must be > 0, got {cfg.loss.kd_temperature}")
    _need(increasing_layers(t.eagle_layers),
          f"task.eagle_layers must be increasing layer indices >= 0, got {list(t.eagle_layers)}")
    _need(1 <= cfg.loss.eagle_ttt_steps <= 16,
          f"loss.eagle_ttt_steps must be in [1, 16], got {cfg.loss.eagle_ttt_steps}")
    _need(0.0 <= cfg.loss.eagle_ttt_decay <= 1.0,
          f"loss.eagle_ttt_decay must be in [0, 1], got {cfg.loss.eagle_ttt_decay}")
    _need(cfg.loss.logit_chunk >= 2, f"loss.logit_chunk must be >= 2, got {cfg.loss.logit_chunk}")
    _need(t.medusa_heads >= 1, f"task.medusa_heads must be >= 1, got {t.medusa_heads}")
    _need(t.draft_vocab >= 0, f"task.draft_vocab must be >= 0, got {t.draft_vocab}")
    _need(cfg.keep >= 1, f"keep must be >= 1, got {cfg.keep}")
    _need(cfg.tau_every >= 0, f"tau_every must be >= 0 (0 = off), got {cfg.tau_every}")
    _need(cfg.tau_prompts >= 1, f"tau_prompts must be >= 1, got {cfg.tau_prompts}")
    _need(cfg.tau_new_tokens >= 2, f"tau_new_tokens must be >= 2, got {cfg.tau_new_tokens}")
    _need(cfg.tau_k >= 0, f"tau_k must be >= 0 (0 = the method's default), got {cfg.tau_k}")
    if d.source in ("text", "jsonl"):
        _need(bool(d.path), f"data.source={d.source!r} needs data.path")


def to_dict(cfg: Any) -> dict:
    """JSON-ready dict of a config (stored next to every checkpoint)."""
    return dataclasses.asdict(cfg)


def from_dict(raw: dict) -> TrainConfig:
    """Rebuilds a TrainConfig from `to_dict`'s output (lists become tuples)."""

    def build(cls, values: dict):
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in values:
                continue
            v = values[f.name]
            sub = f.default if dataclasses.is_dataclass(f.default) else None
            if sub is not None and isinstance(v, dict):
                v = build(type(sub), v)
            elif isinstance(v, list):
                v = tuple(v)
            kwargs[f.name] = v
        return cls(**kwargs)

    return build(TrainConfig, raw)
