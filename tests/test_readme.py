"""Every command in README.md and in `python -m specjax.decode --help` runs (tiny settings appended).

The commands are read from the files, not copied here: a README edit that breaks a command fails this
test. Each runs through bash (the shell's quoting, as a user types it) in a scratch folder laid out
like a checkout next to `shared/` (a few prompts, a grammar, a schema, a corpus), with a tiny random
Hugging Face model (tests/tiny_hf.py) standing in for the embedded Gemma and `max_new_tokens=2`; the
training commands run 2 steps on synthetic data with that model as target, and the decode commands
that load their runs come after them. The README's first command, unchanged on the real embedded model,
is a slow test.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from tiny_hf import write_tiny_hf_model

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# Sizes written for Gemma 3 270M (262k vocabulary) that the tiny model's 258 tokens cannot hold.
TINY_VALUES = {"draft_vocab=32768": "draft_vocab=64", "max_new_tokens=256": "max_new_tokens=2",
               "max_new_tokens=64": "max_new_tokens=2", "max_new_tokens=16": "max_new_tokens=2"}
TRAIN_TINY = ("data.source=synthetic data.num_prompts=16 data.dev_prompts=4 data.max_new_tokens=16 task.draft_vocab=0 "
              "steps=2 batch_size=4 seq_len=32 optim.accum_steps=1 tau_every=0 eval_every=0 save_every=0 "
              "progress=false tensorboard=false")


def _strip_comment(line: str) -> str:
    """The command without a trailing `# comment` (a `#` outside quotes that follows whitespace)."""
    tokens = shlex.shlex(line, posix=True, punctuation_chars=False)
    tokens.whitespace_split, tokens.commenters = True, "#"
    kept = list(tokens)  # only to find where the comment starts: keep the original quoting below
    for cut in (m.start() for m in re.finditer(r"\s#", line)):
        try:
            if shlex.split(line[:cut]) == kept:
                return line[:cut].rstrip()
        except ValueError:
            continue
    return line.rstrip()


def readme_commands() -> list[str]:
    """The `python -m specjax...` command lines of README.md's bash blocks (a leading `pip install ... &&`
    dropped: the package is installed)."""
    text = README.read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split("&& ", 1)[1] if line.startswith("pip install") and "&& python" in line else line
            if "python -m specjax." in line and not line.lstrip().startswith(("#", "pip")):
                commands.append(_strip_comment(line.strip()))
    return commands


def help_commands() -> list[str]:
    """The example command lines `python -m specjax.decode --help` prints."""
    out = subprocess.run([sys.executable, "-m", "specjax.decode", "--help"], capture_output=True, text=True,
                         env=_env(None), timeout=120, check=True).stdout
    return [ln.strip() for ln in out.split("Examples:", 1)[1].splitlines() if "python -m specjax." in ln]


def _env(cache: Path | None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if cache is not None:
        env["SPECJAX_CACHE"] = str(cache)  # feature and grammar caches of the tiny runs stay in the scratch folder
    return env


def tiny_command(command: str, model: str) -> str:
    """The command with tiny settings: the tiny model, 2 new tokens, 2 training steps."""
    for big, small in TINY_VALUES.items():
        command = command.replace(big, small)
    # The path placeholder and the Qwen extra's model (not installed in CI) run on the tiny model: the test checks
    # that the command line parses and decodes, tests/models checks the models.
    command = re.sub(r"model=(/path/to/model\.gguf|qwen2\.5-coder-1\.5b-instruct)", f"model={model}", command)
    if "specjax.train" in command:
        if "--help" in command or "check=true" in command:
            return command
        vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
        draft = f" task.draft_arch.preset=tiny task.draft_arch.vocab_size={vocab} task.init_layers=[]"
        return f"{command} task.target={model} {TRAIN_TINY}{draft}{_tiny_taps(command)}"
    if "--help" in command:
        return command
    if "draft_model=" in command:  # spec=draft needs a drafter with the target's tokenizer: the target itself
        command = re.sub(r"draft_model=\S+", f"draft_model={model}", command)
    return f"{command}{'' if f'model={model}' in command else f' model={model}'} max_new_tokens=2 quiet=true"


def _tiny_taps(command: str) -> str:
    """An EAGLE-3 recipe's fused target layers, moved inside the tiny model's 6 blocks (same count, increasing)."""
    experiment = re.search(r"\+experiment=(\S+)", command)
    if not experiment:
        return ""
    recipe = OmegaConf.load(ROOT / "configs" / "experiment" / f"{experiment.group(1)}.yaml")
    taps = OmegaConf.select(recipe, "task.eagle_layers", default=None)
    return f" task.eagle_layers=[{','.join(str(i) for i in range(len(taps)))}]" if taps else ""


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """(cwd, tiny model path, cache): a checkout-like folder whose ../shared holds the data the commands read."""
    base = tmp_path_factory.mktemp("readme")
    cwd, prompts = base / "checkout", base / "shared" / "data" / "prompts"
    cwd.mkdir()
    prompts.mkdir(parents=True)
    rows = "".join(json.dumps({"prompt": f"Question {i}: what is {i} plus {i}?"}) + "\n" for i in range(12))
    for name in ("alpaca_80.jsonl", "alpaca_eval.jsonl", "gsm8k_train.jsonl"):
        (prompts / name).write_text(rows)
    (cwd / "user.json").write_text(json.dumps({"type": "object", "properties": {"name": {"type": "string"}},
                                               "required": ["name"]}))
    (cwd / "arith.lark").write_text('start: expr\nexpr: NUM (("+" | "*") NUM)*\nNUM: /[0-9]{1,3}/\n')
    (cwd / "corpus.jsonl").write_text("".join(json.dumps({"text": f"line {i} of a corpus"}) + "\n"
                                              for i in range(20)))
    model = str(write_tiny_hf_model(base / "tiny_hf"))
    return cwd, model, base / "cache"


def run_shell(command: str, cwd: Path, cache: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=_env(cache))


def _is_train_dependent(command: str) -> bool:
    return "specjax.train" in command or "draft_checkpoint=runs/" in command or "draft_model=runs/" in command


def test_readme_first_command_is_install_then_decode():
    assert "pip install -e . && python -m specjax.decode\n" in README.read_text(encoding="utf-8")


def test_readme_and_help_list_the_commands_this_test_runs():
    commands = readme_commands()
    assert commands[0] == "python -m specjax.decode"
    assert any("regex='[0-9]{4}-[0-9]{2}-[0-9]{2}'" in c for c in commands)
    assert any("""'stop=["\\n\\n"]'""" in c for c in commands)
    assert any("prompt_file=-" in c for c in help_commands())


def _decode_args(command: str) -> list[str]:
    """The arguments after `python -m specjax.decode`, as bash passes them (a leading `echo ... |` dropped)."""
    words = shlex.split(command.split("|", 1)[1] if command.startswith("echo ") else command)
    return words[words.index("specjax.decode") + 1:]


@pytest.mark.parametrize("command", [c for c in dict.fromkeys(readme_commands() + help_commands())
                                     if "-m specjax.decode" in c and "--help" not in c])
def test_decode_command_parses(command):
    """Every decode command line parses (Hydra's grammar, free text, stop escapes) in-process, in the default tier;
    `test_decode_command_runs` (slow) runs each one end to end."""
    from specjax.decode.__main__ import parse
    from specjax.decode.options import DecodeOptions

    opts = parse(_decode_args(command))
    assert isinstance(opts, DecodeOptions)
    if "'stop=[" in command:
        assert opts.stop == ["\n\n"]
    if "regex='" in command:
        assert opts.regex == re.search(r"regex='([^']*)'", command).group(1)
    if 'prompt="' in command:
        assert opts.prompt == re.search(r'prompt="([^"]*)"', command).group(1)


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in dict.fromkeys(readme_commands() + help_commands())
                                     if not _is_train_dependent(c)])
def test_decode_command_runs(scratch, command):
    cwd, model, cache = scratch
    r = run_shell(tiny_command(command, model), cwd, cache)
    assert r.returncode == 0, f"{tiny_command(command, model)}\n{r.stderr[-3000:]}"
    if "--help" not in command:
        assert "error" not in r.stderr, r.stderr
        assert r.stdout.strip(), r.stderr  # the completions
    if "'stop=[" in command:
        assert "\\n" not in r.stdout  # the escape was decoded, not printed back


@pytest.mark.slow
def test_training_commands_then_the_decode_commands_that_load_their_runs(scratch):
    """README's training commands in order (2 tiny steps each), then the decode commands that read their runs."""
    cwd, model, cache = scratch
    commands = [c for c in dict.fromkeys(readme_commands() + help_commands()) if _is_train_dependent(c)]
    train = [c for c in commands if "specjax.train" in c]
    decode = [c for c in commands if "specjax.train" not in c]
    assert train and decode
    for command in train + decode:
        r = run_shell(tiny_command(command, model), cwd, cache)
        assert r.returncode == 0, f"{tiny_command(command, model)}\n{r.stderr[-3000:]}"


@pytest.mark.slow
@pytest.mark.real_model
def test_readme_first_command_on_the_embedded_model(tmp_path):
    """`python -m specjax.decode` exactly as the quick start runs it (the default prompt, 128 tokens)."""
    r = subprocess.run([sys.executable, "-m", "specjax.decode"], cwd=tmp_path, capture_output=True, text=True,
                       env=_env(None), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("The three most important ideas in computer science are") and "stats:" in r.stderr
