"""Draft training: draft models (KD), Medusa-1 heads and EAGLE heads for speculative decoding.

Entry points: `python -m specjax.train +experiment=NAME` (Hydra, configs/), or from Python
`specjax.train.trainer.train(TrainConfig(...))`; `specjax.models.draft_artifacts.load_draft_checkpoint(run_dir)`
loads a trained module for decoding. docs/training.md describes the pipeline.
"""
