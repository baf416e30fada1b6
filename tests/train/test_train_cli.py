"""`python -m specjax.train` as a user runs it (a subprocess): problems found before anything loads,
one `error:` line and exit code 2, nothing written."""

import os
import subprocess
import sys
from pathlib import Path

from tiny_runs import tiny_run

from specjax.train.trainer import train

ROOT = Path(__file__).resolve().parents[2]


def train_cli(*args, timeout=240):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's specjax, whatever the cwd
    r = subprocess.run([sys.executable, "-m", "specjax.train", *args], capture_output=True, text=True,
                       timeout=timeout, env=env)
    return r.returncode, r.stderr


def assert_one_error_line(code: int, err: str, message: str) -> None:
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err and "Traceback" not in err, err


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_resuming_a_run_of_another_kind_is_refused_before_loading(tmp_path):
    run = tmp_path / "run"
    train(tiny_run(run, kind="draft", save_every=3))
    before = tree(run)
    tiny = ["task.target=null", "task.target_arch.preset=tiny", "data.source=synthetic", f"out_dir={run}"]
    code, err = train_cli(*tiny, "task.kind=medusa")
    assert_one_error_line(code, err, f"out_dir='{run}' holds a 'draft' run (checkpoint at step 6); this run is "
                                     "task.kind='medusa': set another out_dir= or resume=false")
    code, err = train_cli(*tiny, "task.kind=draft", "task.draft_arch.n_layers=2")
    assert_one_error_line(code, err, "whose task settings differ from this run's (task.draft_arch)")
    assert tree(run) == before  # nothing restored, nothing written


def test_missing_data_file_is_reported_before_loading_the_target(tmp_path):
    out = tmp_path / "run"
    # The default target is the embedded Gemma: the check comes first, so this exits in seconds.
    code, err = train_cli("data.source=text", f"data.path={tmp_path / 'missing.txt'}", f"out_dir={out}", timeout=120)
    assert_one_error_line(code, err, f"data.path='{tmp_path / 'missing.txt'}': no such file")
    code, err = train_cli(f"data.prompts=[{tmp_path / 'missing.jsonl'}]", f"out_dir={out}", timeout=120)
    assert_one_error_line(code, err, f"data.prompts: no such file '{tmp_path / 'missing.jsonl'}'")
    assert not out.exists()  # no empty run directory left behind


def test_unknown_and_mistyped_options_are_one_line():
    code, err = train_cli("optim.lrr=1e-3", timeout=120)
    assert_one_error_line(code, err, "unknown option 'optim.lrr' (did you mean 'optim.lr'?)")
    code, err = train_cli("lr=1e-3", timeout=120)
    assert_one_error_line(code, err, "unknown option 'lr' (did you mean 'optim.lr'?)")
    code, err = train_cli("optim.lr=fast", timeout=120)
    assert_one_error_line(code, err, "optim.lr=fast: Value 'fast' of type 'str' could not be converted to Float")
