"""Decoding on a device mesh (8 forced CPU devices) gives the single-device tokens, without recompiling.

The test process has one CPU device, and XLA fixes the device count at start-up, so the checks
run in ONE subprocess (this file run as a script) with
XLA_FLAGS=--xla_force_host_platform_device_count=8; it prints a JSON report that the tests
below read. Forced CPU devices share the machine's cores, so nothing here measures a speedup.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Slow tier: the 8-device subprocess compiles a plain and a speculative program per mesh (~85 s).
pytestmark = pytest.mark.slow
MESHES = ((8, 1), (4, 2), (2, 4))
# Ragged lengths (1 to 27 bytes) and repeated phrases, so the n-gram drafter gets accepted drafts.
TINY_PROMPTS = ["abcabcabcabc", "hello world hello world", "x", "the cat the cat the cat the",
                "qq", "zzzzzzzzzzzzzzzzzzzzzz", "ab", "mnopmnopmnop"]
REAL_PROMPTS = ["The capital of France is", "Write a haiku about the sea.",
                "Repeat exactly: red, green, blue, red, green, blue, red, green,", "1, 2, 3, 4, 5,",
                "Photosynthesis is the process by which", "def fibonacci(n):",
                "Q: What is the boiling point of water?\nA:", "Once upon a time"]


def run_worker(mode: str, timeout: float) -> dict:
    """Runs this file as a script on 8 forced CPU devices; returns its JSON report."""
    flags = os.environ.get("XLA_FLAGS", "")
    spec_tests = ROOT / "tests" / "decode" / "spec"
    path = os.pathsep.join(str(p) for p in (ROOT, ROOT / "tests", ROOT / "tests" / "decode", spec_tests,
                                            spec_tests / "drafters"))
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=path,
               XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count=8".strip())
    proc = subprocess.run([sys.executable, __file__, mode], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tiny_report() -> dict:
    return run_worker("tiny", timeout=600)


def test_mesh_tokens_equal_single_device(tiny_report):
    assert tiny_report["devices"] == 8
    for name in ("8x1", "4x2", "2x4"):
        run = tiny_report["meshes"][name]
        assert run["plain"] == tiny_report["ref_plain"], name
        assert run["spec"] == tiny_report["ref_spec"], name
    assert tiny_report["ref_spec"] == tiny_report["ref_plain"]  # greedy speculative is lossless
    assert tiny_report["spec_tau"] > 1.0  # drafts were accepted, so the verify path ran on the mesh


def test_mesh_does_not_recompile_same_shapes(tiny_report):
    for name, run in tiny_report["meshes"].items():
        assert run["programs_first"] == [1, 1], name  # one plain and one speculative program
        assert run["programs_second"] == [0, 0], name
        assert run["backend_compiles_second"] == 0, name  # nothing at all compiled by XLA on the 2nd calls


def test_params_and_cache_are_sharded_by_the_rules(tiny_report):
    placed = tiny_report["placement_2x4"]
    assert placed["q"] == ["None", "model"] and placed["q_shard"] == [32, 8]  # 4 heads x 8 over model=4
    assert placed["down"] == ["model", "None"] and placed["down_shard"] == [16, 32]
    assert placed["embed"] == ["model", "None"] and placed["embed_shard"] == [16, 32]
    assert placed["norm"] == ["None"] and placed["norm_shard"] == [32]
    assert placed["cache"] == ["data", "None", "model", "None"] and placed["cache_shard"][0] == 4
    assert placed["cache_shard"][2] == 1  # 4 kv heads over model=4
    assert placed["prompt"] == ["data"]
    # Pure data parallelism: devices exchange a few token ids and the loop's "all done" flag, never
    # weights or activations (no floating-point collective at all).
    collectives = tiny_report["collectives_8x1"]
    assert collectives and not any(f in c for c in collectives for f in ("f16", "f32", "f64")), collectives


def test_partial_batch_sampling_and_replicated_kv(tiny_report):
    assert tiny_report["padded"]["rows"] == 8  # batch 6 padded to a multiple of data=4
    assert tiny_report["padded"]["tokens"] == tiny_report["padded"]["ref"]
    assert tiny_report["sampled"]["tokens"] == tiny_report["sampled"]["ref"]  # T=1: same key, same draws
    assert tiny_report["kv_replicated"]["tokens"] == tiny_report["kv_replicated"]["ref"]


def test_drafter_params_replicated_and_draft_state_split_like_the_batch(tiny_report):
    run = tiny_report["stateful_drafter"]
    assert run["tokens"] == tiny_report["ref_plain"]
    assert run["draft_params_devices"] == 8 and run["draft_params_spec"] == []
    assert run["state_spec"] == ["data"] and run["state"] == run["ref_state"]


def test_mesh_errors_are_clear(tiny_report):
    errors = tiny_report["errors"]
    assert errors["mesh_3"].startswith("mesh data=3 x model=1 needs 3 devices, which does not divide the 8")
    assert errors["kv_heads"].startswith("blocks.0.attn.k.w (32, 16): 2 kv heads cannot be split over mesh axis "
                                         "'model' of size 4")
    assert "with_rules(kv_heads=None)" in errors["kv_heads"]
    assert errors["axes"].startswith("the decode mesh needs axes 'data' and 'model'")


@pytest.mark.real_model
def test_real_model_mesh_greedy_equals_single_device():
    report = run_worker("real", timeout=1800)
    print(json.dumps(report["timing"]))
    assert report["2x4"] == report["1dev"]
    assert report["second_call_programs"] == 0


def test_tree_drafters_on_a_mesh_equal_plain_single_device():
    report = run_worker("heads", timeout=900)
    for which in ("medusa", "eagle"):
        assert report[which] == report["ref"], which
    assert report["medusa_tau"] > 1.0  # tree drafts were accepted on the mesh


# ----------------------------------------------------------------------------- the worker (subprocess)


def _progress(msg: str) -> None:
    import resource

    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"[worker] {msg} (peak RSS {peak_gb:.1f} GB)", file=sys.stderr, flush=True)


def _tokens(completions) -> list[list[int]]:
    return [c.tokens for c in completions]


class _CompileCounter:
    """Counts XLA backend compilations (any jit, device_put helper, ...) while active."""

    def __init__(self) -> None:
        import jax

        self.count, self.active = 0, False
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **kwargs) -> None:
        if self.active and event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


def _counting_drafter():
    """An n-gram drafter with weights and a per-row state (interface v2): the state counts each
    row's committed tokens, starting from the prompt length plus the sum of its weights."""
    import jax.numpy as jnp

    from specjax.decode.spec.drafters.ngram import NgramDrafter

    class CountingDrafter(NgramDrafter):
        def init(self, model, draft_params, prefill):
            return prefill.len_b.astype(jnp.int32) + jnp.sum(draft_params["start"])

        def observe(self, model, draft_params, draft_state, obs):
            return draft_state + obs.n_b

    return CountingDrafter()


def _final_state(gen, cfg, spec):
    """Re-runs a generator's compiled speculative program to read its final loop state."""
    ids = gen.encode(TINY_PROMPTS, False)
    _, args, _ = gen._batch_inputs(ids, cfg, None, 0, extra_slots=spec.k)
    return next(iter(gen._programs.values()))(*args, gen.draft_params)


def _spec_of(x) -> list[str]:
    return [str(e) for e in x.sharding.spec]


def _tiny_worker() -> dict:
    import re

    import jax
    from conftest import ByteTokenizer, tiny_config
    from flax import nnx

    from specjax.decode.generate import GenerateConfig, Generator
    from specjax.decode.mesh import MeshPlan
    from specjax.decode.sampling import SamplingConfig
    from specjax.decode.spec.config import SpecConfig
    from specjax.decode.spec.driver import SpeculativeGenerator
    from specjax.models import sharding as sh
    from specjax.models.transformer import Transformer

    model = Transformer(tiny_config(n_kv_heads=4), rngs=nnx.Rngs(0))
    tok, counter = ByteTokenizer(), _CompileCounter()
    cfg, spec = GenerateConfig(max_new_tokens=16, batch_size=8), SpecConfig(k=3, adaptive=False)
    ref_spec, spec_stats = SpeculativeGenerator(model, tok).generate(TINY_PROMPTS, cfg, spec)
    report = {"devices": len(jax.devices()), "ref_plain": _tokens(Generator(model, tok).generate(TINY_PROMPTS, cfg)[0]),
              "ref_spec": _tokens(ref_spec), "spec_tau": spec_stats.tau, "meshes": {}}
    for data, size in MESHES:
        mesh = sh.make_mesh(data, size)
        plain, specg = Generator(model, tok, mesh=mesh), SpeculativeGenerator(model, tok, mesh=mesh)
        run = {"plain": _tokens(plain.generate(TINY_PROMPTS, cfg)[0]),
               "spec": _tokens(specg.generate(TINY_PROMPTS, cfg, spec)[0])}
        run["programs_first"] = [len(plain._programs), len(specg._programs)]
        counter.active, counter.count = True, 0
        again = [plain.generate(TINY_PROMPTS, cfg)[1], specg.generate(TINY_PROMPTS, cfg, spec)[1]]
        counter.active = False
        run["programs_second"] = [s.compiled for s in again]
        run["backend_compiles_second"] = counter.count
        report["meshes"][f"{data}x{size}"] = run
        if (data, size) == (2, 4):
            layer = plain.params["blocks"][0]
            placed = {"q": layer["attn"]["q"]["w"], "down": layer["mlp"]["down"]["w"],
                      "embed": plain.params["embed"], "norm": plain.params["final_norm"]["scale"],
                      "cache": plain._cache.k[0]}
            report["placement_2x4"] = {k: _spec_of(v) for k, v in placed.items()}
            report["placement_2x4"].update({f"{k}_shard": list(v.addressable_shards[0].data.shape)
                                            for k, v in placed.items()})
            _, args, _ = plain._batch_inputs([[2, 5]], cfg, None, 0)
            report["placement_2x4"]["prompt"] = _spec_of(args[2].prompt_bt)
        if (data, size) == (8, 1):
            hlo = next(iter(plain._programs.values())).as_text()
            report["collectives_8x1"] = sorted(set(re.findall(
                r"= (\S+) (?:all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter)(?:-start)?\(", hlo)))

    mesh42 = sh.make_mesh(4, 2)
    six = GenerateConfig(max_new_tokens=16, batch_size=6)
    padded = Generator(model, tok, mesh=mesh42)
    report["padded"] = {"tokens": _tokens(padded.generate(TINY_PROMPTS[:6], six)[0]),
                        "ref": _tokens(Generator(model, tok).generate(TINY_PROMPTS[:6], six)[0]),
                        "rows": padded._cache.k[0].shape[0]}
    hot = GenerateConfig(max_new_tokens=16, batch_size=8, sampling=SamplingConfig(temperature=1.0, seed=3))
    report["sampled"] = {"tokens": _tokens(Generator(model, tok, mesh=mesh42).generate(TINY_PROMPTS, hot)[0]),
                         "ref": _tokens(Generator(model, tok).generate(TINY_PROMPTS, hot)[0])}
    gqa = Transformer(tiny_config(), rngs=nnx.Rngs(1))  # 2 kv heads
    mesh24 = sh.make_mesh(2, 4)
    report["kv_replicated"] = {
        "tokens": _tokens(Generator(gqa, tok, mesh=mesh24, rules=sh.with_rules(kv_heads=None)).generate(
            TINY_PROMPTS, cfg)[0]),
        "ref": _tokens(Generator(gqa, tok).generate(TINY_PROMPTS, cfg)[0])}
    import jax.numpy as jnp
    import numpy as np

    drafted = {}
    for name, mesh in (("mesh", mesh42), ("ref", None)):
        gen = SpeculativeGenerator(model, tok, drafter=_counting_drafter(), draft_params={"start": jnp.arange(3)},
                                   mesh=mesh)
        drafted[name] = (_tokens(gen.generate(TINY_PROMPTS, cfg, spec)[0]), _final_state(gen, cfg, spec), gen)
    state, gen = drafted["mesh"][1], drafted["mesh"][2]
    report["stateful_drafter"] = {
        "tokens": drafted["mesh"][0], "state": np.asarray(state.draft).tolist(),
        "ref_state": np.asarray(drafted["ref"][1].draft).tolist(), "state_spec": _spec_of(state.draft),
        "draft_params_devices": len(gen.draft_params["start"].sharding.device_set),
        "draft_params_spec": _spec_of(gen.draft_params["start"])}
    errors = {}
    for name, make in (("mesh_3", lambda: sh.make_mesh(3, 1)), ("kv_heads", lambda: Generator(gqa, tok, mesh=mesh24)),
                       ("axes", lambda: MeshPlan(jax.make_mesh((8,), ("batch",)), gqa.cfg))):
        try:
            make()
        except sh.ShardingError as e:
            errors[name] = str(e)
    report["errors"] = errors
    return report


def _real_worker() -> dict:
    """Gemma 3 270M (float32), batch 8 greedy: one device vs the (2, 4) mesh (data-parallel rows,
    weights split four ways), each timed after its compilation, back to back in one process.

    Memory decides the layout: every 'data' replica holds a full copy of the weights (1.1 GB in
    float32, on forced CPU devices too), so data=8 needs ~9 GB for weights alone and (4, 2) ~4.4 GB;
    both were killed for memory on the shared 23 GB test machine (bfloat16 did not help: XLA:CPU
    materialises float32 copies for its products). Generators are freed one after another.
    """
    import gc

    from specjax.decode.generate import GenerateConfig, Generator
    from specjax.models import sharding as sh
    from specjax.models.loading import load_model

    cfg = GenerateConfig(max_new_tokens=32, batch_size=8, ignore_eos=True)
    kv_replicated = sh.with_rules(kv_heads=None)  # Gemma 3 270M has one kv head
    report, timing = {}, {}
    for shape in (None, (2, 4)):
        name = "1dev" if shape is None else f"{shape[0]}x{shape[1]}"
        model, tok = load_model(None)  # ~3 s from the conversion cache
        gen = (Generator(model, tok) if shape is None else
               Generator(model, tok, mesh=sh.make_mesh(*shape), rules=kv_replicated))
        del model  # a mesh generator holds only its placed copy
        report[name] = _tokens(gen.generate(REAL_PROMPTS, cfg)[0])  # compiles
        _progress(f"{name}: compiled and ran")
        t0 = time.perf_counter()
        _, stats = gen.generate(REAL_PROMPTS, cfg)
        timing[name] = {"tok_s": round(stats.tokens_per_s, 2), "wall_s": round(time.perf_counter() - t0, 2),
                        "ms_per_step": round(stats.ms_per_token, 1), "compiled": stats.compiled}
        _progress(f"{name}: {timing[name]}, same tokens as one device: {report[name] == report['1dev']}")
        del gen
        gc.collect()
    report["second_call_programs"] = sum(t["compiled"] for t in timing.values())
    report["timing"] = timing
    return report


def _heads_worker() -> dict:
    """Medusa (static tree) and EAGLE (dynamic tree, adaptive) drafters with random heads on (4, 2)."""
    from conftest import tiny_config
    from flax import nnx
    from test_head_drafters import PROMPTS8, TOK, _eagle, _medusa

    from specjax.decode.generate import GenerateConfig, Generator
    from specjax.decode.spec.config import SpecConfig
    from specjax.decode.spec.driver import SpeculativeGenerator
    from specjax.models import sharding as sh
    from specjax.models.transformer import Transformer

    model = Transformer(tiny_config(), rngs=nnx.Rngs(0))
    cfg = GenerateConfig(max_new_tokens=12, batch_size=8, ignore_eos=True)
    report = {"ref": _tokens(Generator(model, TOK).generate(PROMPTS8, cfg)[0])}
    mesh = sh.make_mesh(4, 2)
    for which in ("medusa", "eagle"):
        drafter, params = _medusa(model) if which == "medusa" else _eagle(model, min_path_prob=0.02)
        k = drafter.tree.size if which == "medusa" else 6
        gen = SpeculativeGenerator(model, TOK, drafter=drafter, draft_params=params, mesh=mesh)
        out, stats = gen.generate(PROMPTS8, cfg, SpecConfig(k=k, adaptive=which == "eagle", min_best_gain=0))
        report[which], report[f"{which}_tau"] = _tokens(out), stats.tau
    return report


if __name__ == "__main__":
    workers = {"tiny": _tiny_worker, "real": _real_worker, "heads": _heads_worker}
    result = workers[sys.argv[1]]()
    print(json.dumps(result))
