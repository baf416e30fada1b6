"""Two JAX processes (4 CPU devices each, gloo collectives) decode and train like one process.

Each test starts this file as a script in two processes that `specjax.distributed.initialize`
connects through a coordinator on localhost (a free port). Each process prints a JSON report as
its last line: the results on meshes of all 8 devices, and its own single-process reference on
one of its devices (the 8-device single-process mesh equals one device: tests/decode/test_mesh.py,
tests/train/test_sharded.py). The mesh spans both processes two ways: 'data' across processes
(each holds half the rows), and 'model' across processes (devices interleaved: every weight is
split between them, so each layer's reductions cross processes).

A hang (a collective one process never joins) fails at the launch timeout; the processes are
killed in every case, and die with the test process (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
# Slow tier: every test starts two processes that each compile (~30-60 s per launch).
pytestmark = pytest.mark.slow
N_PROCESSES, LOCAL_DEVICES = 2, 4
PROMPTS = ["abcabcabcabc", "hello world hello world", "x", "the cat the cat the cat the",
           "qq", "zzzzzzzzzzzzzzzzzzzzzz", "ab", "mnopmnopmnop"]
# (data, model, device order): 'data' over the processes (default order: process 0's devices first),
# or 'model' over them (devices interleaved, so each model group holds devices of both processes).
MESHES = {"data_across": (4, 2, "default"), "model_across": (2, 4, "interleaved")}
TRAIN_MESHES = {"fsdp_8": (8, 1, "default"), "fsdp_4_tp_2": (4, 2, "interleaved")}
# Seconds for all processes of one launch. Measured (2 cores shared with other jobs, load average 19):
# decode 419 s, train 377 s; their CPU time was ~100 s each (~1-2 min on 2 idle cores).
LAUNCH_TIMEOUT = 600
STACK_DUMP_EVERY = 150


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: SIGKILL when the test process dies (pytest-timeout's thread method ends the session
    with os._exit, skipping `launch`'s cleanup)."""
    if sys.platform == "linux":
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _env(devices: int, **extra: str) -> dict:
    path = os.pathsep.join(str(p) for p in (ROOT, ROOT / "tests", ROOT / "tests" / "train"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    flags = env.get("XLA_FLAGS", "")
    return dict(env, JAX_PLATFORMS="cpu", PYTHONPATH=path,
                XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={devices}".strip(), **extra)


def _tails(logs: list[Path], head: int = 2500, tail: int = 1500) -> str:
    """Every process's log without gloo's connection lines, its start and its end: when one process fails,
    the error that started it is often early (a traceback before JAX's minutes-long shutdown barrier
    fills the end), and the other's log says where it waits (the stacks `_watchdog` dumped)."""
    out = []
    for i, log in enumerate(logs):
        text = "\n".join(line for line in log.read_text(errors="replace").splitlines() if not line.startswith("[Gloo]"))
        shown = text if len(text) <= head + tail else f"{text[:head]}\n[...]\n{text[-tail:]}"
        out.append(f"--- process {i}\n{shown}")
    return "\n".join(out)


def _watchdog() -> None:
    """In a worker: every STACK_DUMP_EVERY seconds, the stacks of all its threads into its log, so a
    process stuck where no error is raised (a barrier, a lock) shows where."""
    import faulthandler

    faulthandler.dump_traceback_later(STACK_DUMP_EVERY, repeat=True)


def launch(mode: str, out_dir: Path, processes: int, timeout: float) -> list[dict]:
    """Runs this file as `processes` connected processes of LOCAL_DEVICES CPU devices; their reports.

    Every process is killed when the first one fails or the time is up, so a hang fails here.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    address = f"127.0.0.1:{_free_port()}"
    envs = [_env(LOCAL_DEVICES, JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES=str(processes),
                 JAX_PROCESS_ID=str(i)) for i in range(processes)]
    logs = [out_dir / f"{mode}-{processes}p-{i}.log" for i in range(processes)]
    procs = []
    try:
        for env, log in zip(envs, logs, strict=True):
            with open(log, "w") as f:
                procs.append(subprocess.Popen([sys.executable, __file__, mode, str(out_dir)], env=env, cwd=ROOT,
                                              stdout=f, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]
            assert not failed, f"process {failed[0]} failed:\n{_tails(logs)}"
            assert time.monotonic() < deadline, (
                f"{mode}: {processes} process(es) still running after {timeout:.0f} s (a hang?):\n{_tails(logs)}")
            time.sleep(0.2)
        for i, p in enumerate(procs):
            assert p.returncode == 0, f"process {i} failed:\n{_tails(logs)}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return [json.loads(log.read_text().strip().splitlines()[-1]) for log in logs]


@pytest.fixture(scope="module")
def decode_reports(tmp_path_factory) -> list[dict]:
    return launch("decode", tmp_path_factory.mktemp("decode"), N_PROCESSES, timeout=LAUNCH_TIMEOUT)


@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_two_processes_decode_like_one_process(decode_reports):
    for i, r in enumerate(decode_reports):
        assert (r["process"], r["processes"], r["devices"], r["local_devices"]) == (i, 2, 8, 4)
        ref = r["one_device"]
        for name, run in r["meshes"].items():
            assert run["plain"] == ref["plain"], (i, name)
            assert run["spec"] == ref["plain"], (i, name)  # greedy speculative decoding is lossless
        assert r["meshes"]["data_across"]["sampled"] == ref["sampled"], i  # T=1: the same key, the same draws
        assert r["spec_tau"] > 1.0  # drafts were accepted: the verify path ran across the processes
    assert decode_reports[0]["one_device"] == decode_reports[1]["one_device"]


@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_the_meshes_span_both_processes(decode_reports):
    spans = decode_reports[0]["spans"]
    # A mesh row is one model-parallel group (one copy of the weights, one slice of the batch).
    # data_across: each group inside one process, the batch split between the processes.
    assert spans["data_across"] == {"rows": [[0], [0], [1], [1]], "columns": [[0, 1], [0, 1]]}
    # model_across: each group spans both processes, so every weight is split between them.
    assert spans["model_across"] == {"rows": [[0, 1], [0, 1]], "columns": [[0], [1], [0], [1]]}


@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_decode_cli_distributed_true_joins_the_processes_and_process_0_writes(tmp_path):
    reports = launch("cli", tmp_path, N_PROCESSES, timeout=LAUNCH_TIMEOUT)
    assert [r["exit_code"] for r in reports] == [0, 0]
    assert [(r["process"], r["processes"]) for r in reports] == [(0, 2), (1, 2)]  # joined by the CLI
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [row["tokens"] for row in rows[:-1]] == reports[0]["one_device"]
    logs = [(tmp_path / f"cli-2p-{i}.log").read_text() for i in range(N_PROCESSES)]
    assert logs[0].count("--- [") == len(PROMPTS) and "--- [" not in logs[1]  # only process 0 prints


@pytest.mark.timeout(LAUNCH_TIMEOUT + 60)
def test_two_processes_train_step_like_one_process(tmp_path):
    reports = launch("train", tmp_path, N_PROCESSES, timeout=LAUNCH_TIMEOUT)
    for i, r in enumerate(reports):
        for name in TRAIN_MESHES:
            run = r[name]
            assert run["devices"] == 8 and run["split_params"] > 0, (i, name, run)  # FSDP over 'data'
            assert abs(run["loss"] - r["ref_loss"]) < 1e-5 * abs(r["ref_loss"]), (i, name, run)
            # Adam's first step is ~lr * sign(g) (lr 3e-3): reduction-order noise may move a near-zero
            # gradient's update, so parameters agree to 3% of lr (as in tests/train/test_sharded.py).
            assert run["max_diff"] < 1e-4, (i, name, run)
            assert run["n_arrays"] == r["ref_arrays"], (i, name, run)
        assert r["spans"]["fsdp_4_tp_2"]["rows"] == [[0, 1]] * 4  # the 'model' split crosses processes


# ----------------------------------------------------------------------------- the worker (subprocess)


def _mesh(data: int, model: int, order: str):
    import jax

    from specjax.models.sharding import make_mesh

    devices = jax.devices()
    if order == "interleaved":  # d0 of process 0, d0 of process 1, d1 of process 0, ...
        half = len(devices) // 2
        devices = [d for pair in zip(devices[:half], devices[half:], strict=True) for d in pair]
    return make_mesh(data, model, devices=devices)


def _spans(mesh) -> dict:
    """Processes holding the devices of each row ('data' index) and each column ('model' index) of the mesh."""
    procs = lambda devices: sorted({d.process_index for d in devices})
    return {"rows": [procs(row) for row in mesh.devices], "columns": [procs(col) for col in mesh.devices.T]}


def _decode_worker(out_dir: Path) -> dict:
    from conftest import ByteTokenizer, tiny_config
    from flax import nnx

    from specjax.decode import GenerateConfig, Generator, SamplingConfig, SpecConfig, SpeculativeGenerator
    from specjax.models import Transformer

    model = Transformer(tiny_config(n_kv_heads=4), rngs=nnx.Rngs(0))  # the same weights in every process
    tok = ByteTokenizer()
    greedy = GenerateConfig(max_new_tokens=16, batch_size=8)
    hot = GenerateConfig(max_new_tokens=16, batch_size=8, sampling=SamplingConfig(temperature=1.0, seed=3))
    tokens = lambda out: [c.tokens for c in out[0]]
    report: dict = {"meshes": {}, "spans": {}}
    for name, (data, size, order) in MESHES.items():
        mesh = _mesh(data, size, order)
        spec = SpeculativeGenerator(model, tok, mesh=mesh).generate(PROMPTS, greedy, SpecConfig(k=3, adaptive=False))
        plain = Generator(model, tok, mesh=mesh)
        run = report["meshes"][name] = {"plain": tokens(plain.generate(PROMPTS, greedy)), "spec": tokens(spec)}
        if name == "data_across":
            run["sampled"] = tokens(plain.generate(PROMPTS, hot))
            report["spec_tau"] = spec[1].tau
        report["spans"][name] = _spans(mesh)
    # The reference: this process alone, on one of its devices (no collective).
    one = Generator(model, tok)
    report["one_device"] = {"plain": tokens(one.generate(PROMPTS, greedy)),
                            "sampled": tokens(one.generate(PROMPTS, hot))}
    return report


def _cli_worker(out_dir: Path) -> dict:
    """`python -m specjax.decode distributed=true ...` (its `run`) on the tiny model, the mesh over both processes."""
    from conftest import ByteTokenizer, tiny_config
    from flax import nnx

    import specjax.models.loading
    from specjax.decode.cli import DecodeOptions, run
    from specjax.decode.generate import GenerateConfig, Generator
    from specjax.models.transformer import Transformer

    built = []  # the model is built when the CLI loads it: after it joined the processes (JAX is untouched before)

    def load_model(*args, **kwargs):
        built.append(Transformer(tiny_config(n_kv_heads=4), rngs=nnx.Rngs(0)))
        return built[0], ByteTokenizer()

    specjax.models.loading.load_model = load_model
    prompts = out_dir / f"prompts-{os.getpid()}.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    code = run(DecodeOptions.from_flat(
        prompts_file=str(prompts), batch_size=8, max_new_tokens=16, mesh_data=4, mesh_model=2, distributed=True,
        spec="ngram", spec_k=3, compare_plain=False, quiet=True, output=str(out_dir / "out.jsonl")))
    ref = Generator(built[0], ByteTokenizer()).generate(PROMPTS, GenerateConfig(max_new_tokens=16, batch_size=8))[0]
    return {"exit_code": code, "one_device": [c.tokens for c in ref]}


@pytest.mark.timeout(LAUNCH_TIMEOUT + 120)
def test_train_cli_distributed_true_logs_like_one_process_and_writes_once(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "train"))
    from tiny_runs import tiny_run

    from specjax.train.config import MeshConfig
    from specjax.train.trainer import train

    reports = launch("train_cli", tmp_path, N_PROCESSES, timeout=LAUNCH_TIMEOUT)
    assert [r["exit_code"] for r in reports] == [0, 0]
    assert [(r["process"], r["processes"], r["devices"]) for r in reports] == [(0, 2, 8), (1, 2, 8)]
    run_dir = tmp_path / "run"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]  # written once, by process 0
    assert (run_dir / "ckpt" / "3").is_dir()
    logs = [(tmp_path / f"train_cli-2p-{i}.log").read_text() for i in range(N_PROCESSES)]
    assert "done: 3 steps" in logs[0] and "done:" not in logs[1]
    # The same run in this process on one device: the same losses (FSDP over 8 devices of two processes
    # only reorders the reductions).
    ref = train(tiny_run(tmp_path / "ref", "draft", steps=3, mesh=MeshConfig(1, 1)))
    ref_loss = [h["loss"] for h in ref.history if "loss" in h]
    np.testing.assert_allclose([r["loss"] for r in rows], ref_loss, rtol=1e-4)


def _train_cli_worker(out_dir: Path) -> dict:
    from tiny_runs import tiny_run

    from specjax.train.cli import run
    from specjax.train.config import MeshConfig, to_dict

    cfg = tiny_run(out_dir / "run", "draft", steps=3, mesh=MeshConfig(8, 1))
    return {"exit_code": run({**to_dict(cfg), "distributed": True})}


def _train_step(cfg, task, batch, mesh) -> tuple[list[np.ndarray], float, int, int]:
    """One sharded train step on `mesh`: (its parameters and optimizer state on the host, loss, number of
    parameters split over 'data', devices holding the parameters)."""
    import dataclasses

    import jax

    from specjax.models.sharding import DATA, to_host
    from specjax.train.config import MeshConfig
    from specjax.train.trainer import compile_run, step_batch_sharding

    run = dataclasses.replace(cfg, mesh=MeshConfig(mesh.shape[DATA], mesh.shape["model"]))
    state, frozen, state_sh, step_fn, _ = compile_run(run, task, mesh)
    new, metrics = step_fn(state, frozen, jax.device_put(batch, step_batch_sharding(mesh)))
    split = sum(DATA in s.spec for s in jax.tree.leaves(state_sh.params, is_leaf=lambda x: hasattr(x, "spec")))
    devices = max(len(x.sharding.device_set) for x in jax.tree.leaves(new.params))
    return to_host(jax.tree.leaves((new.params, new.opt_state))), float(to_host(metrics["loss"])), split, devices


def _train_worker(out_dir: Path) -> dict:
    import jax
    from tiny_runs import tiny_run  # tests/train (on the workers' PYTHONPATH)

    from specjax.models.sharding import make_mesh
    from specjax.train.trainer import prepare

    cfg = tiny_run(out_dir / f"run-{jax.process_index()}", "draft")
    _, rows, _, task = prepare(cfg)  # synthetic data and a seeded model: the same in every process
    batch = {k: v[:8].reshape(1, 8, *v.shape[1:]) for k, v in rows.arrays().items()}
    # The reference: this process alone, on one of its devices (no collective).
    ref, ref_loss, _, _ = _train_step(cfg, task, batch, make_mesh(1, 1, devices=jax.local_devices()))
    report = {"ref_loss": ref_loss, "ref_arrays": len(ref), "spans": {}}
    for name, (data, size, order) in TRAIN_MESHES.items():
        mesh = _mesh(data, size, order)
        leaves, loss, split, devices = _train_step(cfg, task, batch, mesh)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(leaves, ref, strict=True))
        report[name] = {"loss": loss, "max_diff": diff, "split_params": split, "devices": devices,
                        "n_arrays": len(leaves)}
        report["spans"][name] = _spans(mesh)
    return report


if __name__ == "__main__":
    _watchdog()
    if sys.argv[1] not in ("cli", "train_cli"):  # the CLIs join the processes themselves (distributed=true)
        from specjax.distributed import initialize

        initialize()
    import jax

    workers = {"decode": _decode_worker, "cli": _cli_worker, "train": _train_worker, "train_cli": _train_cli_worker}
    result = workers[sys.argv[1]](Path(sys.argv[2]))
    result.update(process=jax.process_index(), processes=jax.process_count(), devices=len(jax.devices()),
                  local_devices=len(jax.local_devices()))
    print(json.dumps(result))
