"""tau of the trained EAGLE head on the run's 8 dev prompts (T=0), next to an untrained head and n-gram lookup.

Needs the `heads` branch's EagleDrafter (not in the train branch): it was run from a read-only export,
`git archive heads | tar -x -C /tmp/heads_src` plus this branch's specjax/train and models/sharding.py,
as `PYTHONPATH=/tmp/heads_src python tau.py eagle|random|ngram`. Output: tau.txt.
"""
import sys
import time

from specjax.decode import EagleDrafter, GenerateConfig, SpecConfig, SpeculativeGenerator
from specjax.models import DraftVocab, load_draft_checkpoint, load_model
from specjax.train.data import split_dev
from specjax.train.distill_data import read_prompts

model, tok = load_model()
ck = load_draft_checkpoint("/tmp/trainruns/eagle_short")
prompts = read_prompts(tuple("/work/shared/data/prompts/" + f for f in ("alpaca_eval.jsonl", "gsm8k_train.jsonl")))
_, dev = split_dev(prompts, 8, 1234)
cfg = GenerateConfig(max_new_tokens=48, batch_size=8, chat=True)
which = sys.argv[1]
if which in ("eagle", "random"):
    from flax import nnx

    from specjax.models.eagle import EagleConfig, EagleHead
    head = ck.module if which == "eagle" else EagleHead(EagleConfig.from_target(model.cfg), rngs=nnx.Rngs(0))
    drafter, params = EagleDrafter.build(head, model, DraftVocab(ck.vocab_ids, model.cfg.vocab_size), depth=4, top_k=4)
    gen, spec = SpeculativeGenerator(model, tok, drafter=drafter, draft_params=params), SpecConfig(k=10, adaptive=False)
else:
    gen, spec = SpeculativeGenerator(model, tok), SpecConfig(k=4, adaptive=False)
t = time.time()
_, stats = gen.generate(dev, cfg, spec)
print(which, stats.line(), f"wall {time.time()-t:.0f}s", flush=True)
