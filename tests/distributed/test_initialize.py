"""`specjax.distributed`: the job layout read from the environment, and its errors (one line, exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specjax.decode.cli import DecodeOptions, run
from specjax.distributed import DistributedError, is_primary, process_args

ROOT = Path(__file__).resolve().parents[2]


def test_the_three_variables_become_initialize_arguments():
    env = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:8476", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert process_args(env) == {"coordinator_address": "10.0.0.1:8476", "num_processes": 4, "process_id": 3}


def test_unset_values_are_left_to_jax_cluster_detection():
    assert process_args({}) == {}
    assert process_args({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": ""}) == {"coordinator_address": "h:1"}


@pytest.mark.parametrize(("env", "message"), [
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two"}, "JAX_NUM_PROCESSES='two' is not an integer"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"},
     "JAX_PROCESS_ID=2 must be in [0, JAX_NUM_PROCESSES=2)"),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "0"}, "JAX_NUM_PROCESSES=0 must be at least 1"),
    ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}, "JAX_COORDINATOR_ADDRESS (host:port of process 0) is not"),
])
def test_malformed_layouts_are_refused(env, message):
    with pytest.raises(DistributedError) as e:
        process_args(env)
    assert message in str(e.value)


def test_cli_reports_a_bad_layout_in_one_line(monkeypatch, capsys):
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "127.0.0.1:1")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("JAX_PROCESS_ID", "-1")
    assert run(DecodeOptions(distributed=True, quiet=True, prompt="abc")) == 2
    err = capsys.readouterr().err
    assert err == "error: JAX_PROCESS_ID=-1 must be in [0, JAX_NUM_PROCESSES=2)\n"


def test_no_layout_and_no_launcher_is_a_clear_error():
    # A fresh process: JAX refuses to initialise after its backend started (this test process's has).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "SLURM_", "OMPI_", "TPU_", "KUBERNETES_"))}
    code = "from specjax.distributed import initialize\ntry:\n    initialize()\nexcept Exception as e:\n" \
           "    print(type(e).__name__, e)"
    out = subprocess.run([sys.executable, "-c", code], env=dict(env, JAX_PLATFORMS="cpu"), cwd=ROOT,
                         capture_output=True, text=True, timeout=120).stdout
    assert out.startswith("DistributedError coordinator_address should be defined. Set JAX_COORDINATOR_ADDRESS"), out


def test_a_single_process_is_the_primary():
    assert is_primary()
