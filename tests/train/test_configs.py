"""Experiment configs compose, type-check, pass their abstract check; the CLI reports bad options in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specjax.train.__main__ import CONFIG_DIR, main
from specjax.train.config import TrainConfig

EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
# 270M recipes use 4-row batches: on 8 devices their abstract check runs on a 4-way data axis.
MESH_OVERRIDES = {"distill_1b": []}


def compose(*overrides: str) -> tuple[TrainConfig, object]:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from specjax.train.cli import command_schema, config_from_container

    ConfigStore.instance().store(name="train_schema", node=command_schema())
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra_compose("train", overrides=list(overrides))
    return config_from_container(OmegaConf.to_container(cfg, resolve=True))


def test_all_experiments_exist():
    assert EXPERIMENTS == ["distill_1b", "distill_gemma3_270m", "eagle3_gemma3_270m", "eagle3_qwen2.5_coder_1.5b",
                           "eagle_gemma3_270m", "medusa_gemma3_270m"]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_header_states_command_runtime_metric(name):
    cfg, opts = compose(f"+experiment={name}")
    assert isinstance(cfg, TrainConfig) and not opts.check
    assert cfg.out_dir == f"runs/{name}"
    header = (CONFIG_DIR / "experiment" / f"{name}.yaml").read_text().split("\ntask:")[0]
    assert "# @package _global_" in header
    for word in ("Command:", "Runtime:", "Metric:", f"+experiment={name}"):
        assert word in header, (name, word)


def test_seed_recipe_loss_weights():
    cfg, _ = compose("+experiment=distill_gemma3_270m")
    assert (cfg.loss.kd_temperature, cfg.loss.kd_weight) == (0.7, 0.3)


_ABSTRACT = """
import json, sys
from specjax.train.abstract import abstract_check
from specjax.train.config import from_dict
out = {}
for name, raw in json.loads(sys.argv[1]).items():
    out[name] = abstract_check(from_dict(raw), lower=sys.argv[2] == "lower").__dict__
print(json.dumps(out))
"""


def _abstract_reports(lower: bool) -> dict:
    from specjax.train.config import to_dict

    cfgs = {n: to_dict(compose(f"+experiment={n}", *MESH_OVERRIDES.get(n, ["mesh.data=4"]))[0]) for n in EXPERIMENTS}
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _ABSTRACT, json.dumps(cfgs), "lower" if lower else "shape"],
                          env=env, capture_output=True, text=True, timeout=900, cwd=os.getcwd())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_reports(reports: dict) -> None:
    assert set(reports) == set(EXPERIMENTS)
    big = reports["distill_1b"]
    assert big["mesh"] == {"data": 8, "model": 1}
    assert 0.9e9 < big["trainable_params"] < 1.1e9 and big["frozen_params"] > 10e9
    # FSDP: per-device train state (params + 2 Adam moments, float32) is ~1/8 of the total.
    total = big["trainable_params"] * 4 * 3
    assert big["state_bytes_per_device"] < total / 6
    for name in EXPERIMENTS:
        assert "loss" in reports[name]["metrics"] and "grad_norm" in reports[name]["metrics"]


@pytest.mark.slow  # a subprocess on 8 forced devices (~30 s); its lowering sibling is slow too
def test_every_experiment_passes_abstract_check_on_8_devices():
    _check_reports(_abstract_reports(lower=False))


@pytest.mark.slow
def test_every_experiment_lowers_with_its_shardings_on_8_devices():
    _check_reports(_abstract_reports(lower=True))


def test_distill_1b_runs_two_steps_with_tiny_override(tmp_path, capsys):
    header = (CONFIG_DIR / "experiment" / "distill_1b.yaml").read_text()
    documented = header.split("tiny target, synthetic data):\n#   ")[1].split("\ntask:")[0]
    args = documented.replace("\\\n#    ", " ").split()[3:]  # drop "python -m specjax.train"
    args = [a if not a.startswith("out_dir=") else f"out_dir={tmp_path}" for a in args]
    args += ["progress=false", "log_every=1"]
    assert main(args) == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2]
    assert (Path(tmp_path) / "best").is_dir()


@pytest.mark.parametrize(("args", "message"), [
    (["stepz=3"], "unknown option 'stepz' (did you mean 'steps'?)"),
    (["steps=abc"], "could not be converted to Integer"),
    (["+experiment=nope"], "Could not find 'experiment/nope'"),
    (["task.kind=foo"], "task.kind='foo' is not one of"),
    (["optim.accum_steps=3", "batch_size=8"], "batch_size=8 must be a positive multiple of optim.accum_steps=3"),
    (["task.target=null", "data.source=text"], "data.source='text' needs data.path"),
    (["task.kind=eagle", "task.eagle_layers=[9,2]"], "task.eagle_layers must be increasing layer indices"),
])
def test_bad_option_is_one_error_line(capsys, args, message):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err and "Traceback" not in err


def test_eagle_layers_the_target_lacks_are_one_error_line_before_any_data(tmp_path, capsys):
    args = ["task.kind=eagle", "task.target=null", "task.target_arch.preset=tiny", "data.source=synthetic",
            "task.eagle_layers=[1,5]", "progress=false", f"out_dir={tmp_path / 'run'}",
            f"data.feature_dir={tmp_path / 'features'}"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: fuse_layers [5] are outside the target's 2 layers"
    assert not (tmp_path / "features").exists()
