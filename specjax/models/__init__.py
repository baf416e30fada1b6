"""Models: the Gemma-style `Transformer` (Flax NNX), its loaders (GGUF, Hugging Face), tokenizer, KV
cache, sharding rules, draft heads (Medusa, EAGLE) and the trained-draft artifact format. The public
names below are imported lazily."""

from specjax._lazy import lazy_exports

_EXPORTS = {
    "ConfigError": "config", "ModelConfig": "config",
    "DraftCheckpoint": "draft_artifacts", "DraftCheckpointError": "draft_artifacts",
    "load_draft_checkpoint": "draft_artifacts",
    "DraftVocab": "draft_vocab", "HeadTable": "draft_vocab",
    "EagleConfig": "eagle", "EagleHead": "eagle",
    "KVCache": "kv_cache",
    "DEFAULT_MODEL": "loading", "load_model": "loading",
    "MedusaConfig": "medusa", "MedusaHeads": "medusa",
    "LOGICAL_RULES": "sharding", "ShardingError": "sharding", "make_mesh": "sharding",
    "Tokenizer": "tokenizer", "TokenizerError": "tokenizer",
    "Transformer": "transformer",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
