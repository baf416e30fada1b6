"""HF transformers reference for the real Qwen GGUF, run as a subprocess so its memory is freed on exit.

    python tests/models/qwen_hf_reference.py GGUF_PATH JOB.json OUT_DIR

JOB.json: {"conversations": [[messages...], ...], "texts": [...], "steps": 64}. Writes, per conversation i,
prompt_i.npy (chat-templated ids from HF's tokenizer), logits_i.npy (float32 [T, V]) and greedy_i.npy
(`steps` greedy ids, EOS not special-cased), and texts.json (HF's ids of each text, specials parsed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers


def main(gguf_path: str, job_file: str, out_dir: str) -> None:
    path, out = Path(gguf_path), Path(out_dir)
    job = json.loads(Path(job_file).read_text())
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = [tok(t, add_special_tokens=False).input_ids for t in job["texts"]]
    (out / "texts.json").write_text(json.dumps(ids))
    if not job["conversations"]:
        return
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager").eval()
    for i, messages in enumerate(job["conversations"]):
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = tok(prompt, add_special_tokens=False).input_ids
        np.save(out / f"prompt_{i}.npy", np.asarray(prompt_ids, np.int32))
        with torch.no_grad():
            result = model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
            np.save(out / f"logits_{i}.npy", result.logits[0].float().numpy())
            cache, nxt, greedy = result.past_key_values, int(result.logits[0, -1].argmax()), []
            for _ in range(job["steps"]):
                greedy.append(nxt)
                result = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True)
                cache, nxt = result.past_key_values, int(result.logits[0, -1].argmax())
        np.save(out / f"greedy_{i}.npy", np.asarray(greedy, np.int32))
        print(f"conversation {i}: {len(prompt_ids)} prompt tokens", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
