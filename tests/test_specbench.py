"""experiments/specbench (the Spec-Bench-style reproduction run) and benchmarks/spec_harness.py.

The aggregation is checked on hand-made rows with known answers; the run itself end to end on the tiny
random model (tests/tiny_hf.py) and a two-category prompt folder: rows for every setting, greedy rows
equal to plain, a rerun that skips what is done, the report's table and plot, and one-line errors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_hf import write_tiny_hf_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import spec_harness  # noqa: E402


def row(ids, cat, setup, wall, decode=None, tau=1.0, rounds=10, same=True, T=0.0, batch=1):
    return {"target": "m", "T": T, "batch": batch, "ids": ids, "category": cat, "setup": setup, "wall_s": wall,
            "decode_s": wall / 2 if decode is None else decode, "tokens": 20, "rounds": rounds, "tau": tau,
            "plain_rate": 0.5, "mean_draft": 1.0, "same": same, "note": ""}


def test_summarize_sums_times_per_category_and_weights_tau_by_rounds():
    rows = [row(["a"], "x", "plain", 10.0), row(["a"], "x", "ngram", 5.0, tau=3.0, rounds=10),
            row(["b"], "y", "plain", 4.0), row(["b"], "y", "ngram", 4.0, tau=1.0, rounds=30, same=False),
            row(["c"], "y", "ngram", 1.0)]  # no plain row for unit c: it does not count
    cats = spec_harness.summarize(rows)[("m", 0.0, 1)]
    assert list(cats) == ["x", "y", "all"]
    assert cats["x"]["ngram"]["speedup"] == pytest.approx(2.0)
    assert cats["y"]["ngram"]["speedup"] == pytest.approx(1.0)
    assert cats["all"]["ngram"]["speedup"] == pytest.approx(14.0 / 9.0)  # ratio of sums, not mean of ratios
    assert cats["all"]["ngram"]["tau"] == pytest.approx((3.0 * 10 + 1.0 * 30) / 40)
    assert cats["all"]["ngram"]["n"] == 2
    assert cats["x"]["ngram"]["same"] is True and cats["all"]["ngram"]["same"] is False
    text = spec_harness.table(cats)
    assert "| x | 1 | 2.00× (2.00×) | 3.00 | 50% |" in text
    assert "| all | 2 | 1.56× (1.56×) (differs) | 1.50 | 50% |" in text


def test_settings_stay_apart_and_worst_is_the_lowest_whole_set_speedup():
    rows = [row(["a"], "x", "plain", 10.0), row(["a"], "x", "ngram", 5.0), row(["a"], "x", "recycle", 8.0),
            row(["a"], "x", "plain", 10.0, T=1.0, same=None), row(["a"], "x", "ngram", 12.5, T=1.0, same=None)]
    summary = spec_harness.summarize(rows)
    assert set(summary) == {("m", 0.0, 1), ("m", 1.0, 1)}
    assert summary[("m", 1.0, 1)]["all"]["ngram"]["same"] is None
    speed, label = spec_harness.worst(summary)
    assert speed == pytest.approx(0.8) and label == "m T=1 batch 1 ngram"


def test_units_group_consecutive_prompts_and_name_mixed_batches():
    prompts = [{"id": str(i), "category": "x" if i < 2 else "y", "prompt": "p"} for i in range(5)]
    groups = list(spec_harness.units(prompts, 2))
    assert [[p["id"] for p in g] for g in groups] == [["0", "1"], ["2", "3"], ["4"]]
    assert [spec_harness.unit_category(g) for g in groups] == ["x", "y", "y"]
    assert spec_harness.unit_category(prompts[1:3]) == spec_harness.MIXED


def test_parse_setup_reads_json_values():
    name, cfg = spec_harness.parse_setup("recycle:8:adaptive=0:probe_every=4")
    assert name == "recycle:8:adaptive=0:probe_every=4"
    assert (cfg.method, cfg.k, cfg.adaptive, cfg.probe_every) == ("recycle", 8, False, 4)


class FakeGen:
    """A generator whose calls take the next of `walls` seconds and log their order in `calls`."""

    def __init__(self, name, walls, calls, tokens=(1, 2)):
        self.name, self.walls, self.calls, self.tokens = name, list(walls), calls, tokens

    def generate(self, texts, cfg, spec=None):
        self.calls.append(self.name)
        wall = self.walls.pop(0)
        stats = SimpleNamespace(compiled=0, wall_s=wall, decode_s=wall / 2, new_tokens=2, rounds=2, tau=1.0,
                                plain_rate=1.0, mean_draft_len=0.0, note="")
        return [SimpleNamespace(tokens=self.tokens)], stats


def test_repetitions_rotate_the_order_and_keep_the_median():
    calls = []
    plain = FakeGen("plain", [3.0, 1.0, 2.0], calls)
    gens = {"a": FakeGen("a", [5.0, 9.0, 4.0], calls), "b": FakeGen("b", [7.0, 6.0, 8.0], calls, tokens=(1, 3))}
    setups = {"a": spec_harness.SpecConfig(k=2), "b": spec_harness.SpecConfig(k=2)}
    cfg = spec_harness.generate_config(2, 1, 0.0)
    rows = list(spec_harness.measure_unit(plain, gens, setups, [{"id": "x", "category": "c", "prompt": "p"}], cfg,
                                          {"T": 0.0, "batch": 1}, reps=3))
    assert calls == ["plain", "a", "b", "a", "b", "plain", "b", "plain", "a"]
    assert [(r["setup"], r["wall_s"], r["reps"]) for r in rows] == [("plain", 2.0, 3), ("a", 5.0, 3), ("b", 7.0, 3)]
    assert [r["same"] for r in rows] == [True, True, False]  # b's tokens differ from plain's


@pytest.fixture(scope="module")
def bench_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("specbench")
    prompts = base / "prompts"
    prompts.mkdir()
    spec = [{"id": f"s{i}", "category": cat, "prompt": f"Say {cat} number {i}, then repeat it."}
            for i, cat in enumerate(["writing", "writing", "coding"])]
    (prompts / "specbench_dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in spec))
    (prompts / "humaneval_dev.jsonl").write_text(json.dumps({"id": "h0", "prompt": "def add(a, b):\n"}) + "\n")
    return base, prompts, write_tiny_hf_model(base / "tiny")


def script(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "specbench" / name), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.slow  # two experiment scripts as subprocesses, each compiling (~45 s)
def test_run_then_report_end_to_end(bench_dirs):
    base, prompts, tiny = bench_dirs
    out = base / "res.jsonl"
    args = ["--target", str(tiny), "--prompts", str(prompts), "--per-category", "1", "--humaneval", "1",
            "--limit", "3", "--setups", "ngram:2", "--temps", "0,1", "--batch", "2", "--new-tokens", "6",
            "--out", str(out)]
    r = script("run.py", *args)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # prompts s0 (writing), s2 (coding), h0 → units [s0, s2] and [h0]; ×2 temperatures; ×2 setups
    assert len(rows) == 2 * 2 * 2
    assert {r["setup"] for r in rows} == {"plain", "ngram:2"}
    assert all(r["same"] is True for r in rows if r["T"] == 0)  # greedy speculation is plain greedy
    assert all(r["same"] is None for r in rows if r["T"] == 1)
    assert all(r["tokens"] == 6 * len(r["ids"]) for r in rows)
    assert "Worst whole-set speedup" in r.stdout

    again = script("run.py", *args)  # everything is measured: nothing runs, nothing is appended
    assert again.returncode == 0, again.stderr[-2000:]
    assert len(out.read_text().splitlines()) == len(rows)

    md, png = base / "table.md", base / "speedup.png"
    rep = script("report.py", str(out), "--md", str(md), "--png", str(png))
    assert rep.returncode == 0, rep.stderr
    text = md.read_text()
    assert "T=0, batch 2" in text and "T=1, batch 2" in text
    assert "| mixed | 1 |" in text and "| humaneval | 1 |" in text and "| all | 2 |" in text
    assert "Worst whole-set speedup" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (["--setups", "ngram:two"], "error: bad --setups, --batch or --temps"),
    (["--setups", "ngram:4:no_such_option=1"], "error: bad --setups, --batch or --temps"),
    (["--limit", "0", "--per-category", "0", "--humaneval", "0"], "error: no prompts selected"),
    (["--reps", "0"], "error: --reps must be >= 1, got 0"),
    (["--target", "/nonexistent/model.gguf"], "error:"),
])
def test_bad_options_are_one_error_line(bench_dirs, args, message):
    base, prompts, tiny = bench_dirs
    r = script("run.py", "--target", str(tiny), "--prompts", str(prompts), "--out", str(base / "bad.jsonl"), *args)
    assert r.returncode == 2 and r.stderr.startswith(message) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (base / "bad.jsonl").exists()


def test_a_malformed_prompt_file_is_one_error_line_naming_the_folder(bench_dirs, tmp_path):
    base, prompts, tiny = bench_dirs
    bad = tmp_path / "prompts"
    bad.mkdir()
    (bad / "specbench_dev.jsonl").write_text((prompts / "specbench_dev.jsonl").read_text() + "\n\n")
    (bad / "humaneval_dev.jsonl").write_text("{not json\n")
    r = script("run.py", "--target", str(tiny), "--prompts", str(bad), "--out", str(base / "bad.jsonl"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: cannot read the prompt sets in {bad}: JSONDecodeError"), r.stderr


def test_report_errors(tmp_path):
    r = script("report.py", str(tmp_path / "missing.jsonl"))
    assert r.returncode == 2 and r.stderr.startswith("error: no such result file")
    (tmp_path / "empty.jsonl").write_text("")
    r = script("report.py", str(tmp_path / "empty.jsonl"))
    assert r.returncode == 2 and r.stderr.startswith("error: the result files hold no rows")


# --------------------------------------------------------------------------- project.py
def test_projection_costs_rounds_at_the_accelerators_measured_prices(tmp_path):
    """projected steps = rounds x (plain share x p + speculative share x c); plain takes a step per token."""
    sys.path.insert(0, str(ROOT / "experiments" / "specbench"))
    import project

    costs = tmp_path / "costs.jsonl"
    costs.write_text("".join(json.dumps(r) + "\n" for r in [
        {"target": "m", "weight_bytes": 1},  # the config line of accelerator.py
        {"target": "m", "T": 0.0, "batch": 1, "setup": "plain", "cost": 1.0},
        {"target": "m", "T": 0.0, "batch": 1, "setup": "ngram:8", "cost": 0.9},
        {"target": "m", "T": 0.0, "batch": 1, "setup": "ngram:8:verify_cost=1000", "cost": 1.07},  # has keys: not c
    ]))
    rows = [{**row(["a"], "x", "plain", 99.0, rounds=20)},
            {**row(["a"], "x", "ngram:8:verify_cost=1.16", 99.0, rounds=10), "plain_rate": 0.5}]
    got = project.project(rows, project.round_costs(costs), plain_round_cost=1.1)
    assert got[0]["wall_s"] == 20.0
    assert got[1]["wall_s"] == pytest.approx(10 * (0.5 * 1.1 + 0.5 * 0.9))
    cell = spec_harness.summarize(got)[("m", 0.0, 1)]["all"]["ngram:8:verify_cost=1.16"]
    assert cell["speedup"] == pytest.approx(2.0)
    # T = 1 rows take the T = 0 cost when only that was measured (the H200 measured both alike)
    assert project.cost_of(project.round_costs(costs), {**rows[1], "T": 1.0}) == 0.9
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = script("project.py", str(tmp_path / "rows.jsonl"), "--costs", str(costs))
    assert r.returncode == 0 and "| x | 1 | 2.11× (2.11×) | 1.00 | 50% |" in r.stdout, r.stdout + r.stderr
    r = script("project.py", str(tmp_path / "rows.jsonl"), "--costs", str(tmp_path / "rows.jsonl"))
    assert r.returncode == 2 and r.stderr.strip() == (
        f"error: no measured round cost for m batch 1 ngram:8 in {tmp_path / 'rows.jsonl'}"), r.stderr
    r = script("project.py", str(tmp_path / "missing.jsonl"), "--costs", str(costs))
    assert r.returncode == 2 and r.stderr.startswith("error: no such file")
