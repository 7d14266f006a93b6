"""Every command line, fed bad input, ends with one line `error: ...` naming what is wrong (close matches for
a misspelt key, option or name), exits with status 1, prints no traceback and leaves the file tree as it was.

Each probe runs the real command in a fresh working directory (PYTHONPATH points at the repository) with
its own model cache, so that anything a probe writes, a run directory, a default output directory or a
built model, shows up in the tree's snapshot. These are CLI start-ups, a few seconds each.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.config import to_plain
from trainer.checkpoint import save_checkpoint
from trainer.config import TrainConfig
from trainer.run_dir import save_run_config

ROOT = Path(__file__).resolve().parent.parent
TRAIN = str(ROOT / "train.py")

# (command after the interpreter, text the error line must contain). Files named here are made by `workdir`.
PROBES = [
    ([TRAIN, "--cfg", "job", "+ppo.clip_esp=0.3"], "unknown config key ppo.clip_esp (did you mean ppo.clip_eps"),
    ([TRAIN, "ppo.clip_esp=0.3"], "unknown config key ppo.clip_esp (did you mean ppo.clip_eps"),
    ([TRAIN, "+reward=prm_clp"], "+reward=prm_clp: no option 'prm_clp' for reward (configs/reward/) (did you mean prm_clip"),
    ([TRAIN, "model=llama3-8b"], "model=llama3-8b: no option 'llama3-8b' for model"),
    ([TRAIN, "algorithm=grpoo"], "algorithm=grpoo: no option 'grpoo' for algorithm (configs/algorithm/) (did you mean grpo"),
    ([TRAIN, "ppo.kl_coef=0.1"], "unknown config key ppo.kl_coef (now algorithm.kl_coef)"),
    ([TRAIN, "algorithm=rloo", "rollout.num_samples_per_prompt=1"], "needs rollout.num_samples_per_prompt >= 2"),
    ([TRAIN, "reward.function=rewards.py"], "reward.function='rewards.py': expected FILE.py:NAME"),
    ([TRAIN, "+reward=function"], "+reward=function needs reward.function=FILE.py:NAME"),
    ([TRAIN, "reward.function=nowhere.py:f"], "reward.function=nowhere.py:f: no such file"),
    (
        [TRAIN, "run.dry_run=true", f"reward.function={ROOT}/examples/reward_functions.py:boxed_formt"],
        "reward function: reward.function=",
    ),
    (
        [TRAIN, "run.dry_run=true", f"reward.function={ROOT}/examples/reward_functions.py:boxed_formt"],
        "has no function 'boxed_formt' (did you mean boxed_format?)",
    ),
    ([TRAIN, "ppo.clip_eps=abc"], "ppo.clip_eps=abc: Value 'abc' of type 'str' could not be converted to Float"),
    ([TRAIN, "+ppo.clip_eps=0.3"], "ppo.clip_eps is already in the config; set it without the +"),
    ([TRAIN, "-m", "run.seed=0,1", "+reward=success,prmm"], "no option 'prmm' for reward"),
    ([TRAIN, "run.dry_run=true", "data.name=bad.jsonl"], "data: bad.jsonl:2: malformed JSON"),
    ([TRAIN, "run.name=named", "ppo.actor_lr=0.0003"], "was trained with other settings: ppo.actor_lr"),
    (["-m", "eval", "model=llama3-8b"], "model=llama3-8b: no option 'llama3-8b' for model"),
    (["-m", "eval", "limt=3"], "unknown config key limt (did you mean limit?)"),
    (["-m", "mathtask.grade", "--input", "missing.jsonl", "--output", "out.jsonl"], "--input missing.jsonl: cannot read"),
    (["-m", "mathtask.grade", "--input", "graded.jsonl", "--output", "out.jsonl"], "graded.jsonl:2: not JSON"),
    (["-m", "mathtask.grade", "--inptu", "x"], "unknown option --inptu (did you mean --input?)"),
    (["-m", "eval.compare_runs", "outputs/named"], "not an evaluation summary"),
    (["-m", "trainer.export", "empty"], "empty: neither a run directory"),
    (["-m", "trainer.export", "outputs/named", "--iteration", "0"], "argument --iteration: 0 must be > 0"),
    (["-m", "trainer.summarize", "empty"], "empty: no runs (directories with metrics.jsonl) under it"),
    (["-m", "trainer.summarize", "outputs", "--export"], "--export needs --out"),
    (["-m", "rewards.train_rm", "data=steps.jsonl", "output_dir=rm"], "steps.jsonl:1: malformed JSON"),
    (["-m", "rewards.train_rm", "kind=prn"], "kind=prn: Invalid value 'prn'"),
    (["-m", "planning.search", "--gpu", "h100", "--batch", "0"], "unknown option --gpu (now --hardware)"),
    (
        ["-m", "planning.search", "--actor", "qwen2.5-math-1.5b-instrukt", "--num-nodes", "1", "--devices-per-node",
         "8", "--num-prompts", "8", "--max-prompt-tokens", "8", "--max-new-tokens", "8"],
        "unknown model 'qwen2.5-math-1.5b-instrukt' (did you mean qwen2.5-math-1.5b-instruct",
    ),
    (
        ["-m", "planning.search", "--actor", "tiny", "--num-nodes", "1", "--devices-per-node", "1", "--num-prompts",
         "0", "--max-prompt-tokens", "8", "--max-new-tokens", "8"],
        "argument --num-prompts: 0 must be > 0",
    ),
]  # fmt: skip


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A working directory with malformed data files (problems, responses to grade, reward-model steps), an
    empty directory, and a named run (outputs/named) whose checkpoint was trained with the default settings."""
    (tmp_path / "bad.jsonl").write_text('{"question": "1 + 1?", "answer": "2"}\n{broken\n')
    (tmp_path / "graded.jsonl").write_text('{"response": "\\\\boxed{2}", "gold": "2"}\n{broken\n')
    (tmp_path / "steps.jsonl").write_text("{broken\n")
    (tmp_path / "empty").mkdir()
    run = tmp_path / "outputs" / "named"
    cfg = TrainConfig()
    state = {"iteration": 10, "config": to_plain(cfg)}
    save_checkpoint(run / "checkpoints", 10, state, lambda d: (d / "policy").mkdir(), keep_last=2)
    save_run_config(run, "run:\n  name: named\n", ["run.name=named"])
    (run / "summary.json").write_text('{"heldout_before": 0.4, "heldout_after": 0.6}\n')
    return tmp_path


def snapshot(root: Path) -> dict[str, str]:
    """Every file's sha256 and every directory under ``root`` (a changed, added or removed one shows)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize("command, message", PROBES, ids=[" ".join(c[:3]) for c, _ in PROBES])
def test_bad_input_is_one_error_line_exit_1_and_writes_nothing(command, message, workdir):
    before = snapshot(workdir)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REALM_CACHE_DIR": str(workdir / "cache")}
    proc = subprocess.run([sys.executable, *command], cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines[-1].startswith("error: ") and message in lines[-1], lines[-1]
    assert [line for line in lines if line.startswith("error: ")] == [lines[-1]]
    assert snapshot(workdir) == before


def test_help_says_what_the_command_is(workdir):
    for command, first in ((["-m", "eval", "--help"], "python -m eval"), ([TRAIN, "--help"], "python train.py")):
        proc = subprocess.run(
            [sys.executable, *command], cwd=workdir, env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0 and proc.stdout.startswith(first) and "powered by Hydra" not in proc.stdout
