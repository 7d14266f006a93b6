"""scripts/reproduce_reward_paper.sh end to end on CPU: the tiny model on the synthetic task, six reward
options of one iteration each, each final policy evaluated, one table (slow: the GPU recipes run the same code)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REWARDS = ["success", "orm", "prm", "prm_clip", "prm_delta", "prm_clip_delta"]
TINY = (
    "sft.num_steps=30 sft.target_success=0 rollout.num_prompts=4 rollout.num_samples_per_prompt=2 rollout.max_new_tokens=32 "
    "data.synthetic_num_train=64 data.synthetic_num_heldout=4 run.num_iterations=1 run.eval_every=0 "
    "run.num_heldout_samples=0 ppo.num_minibatches=2"
)


@pytest.mark.slow
@pytest.mark.builtin_reward_models("prm", "orm")
def test_tiny_sweep_trains_evaluates_and_tabulates_six_reward_options(tmp_path):
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        OUT=str(tmp_path),
        TRAIN_ARGS=TINY,
        EVAL_ARGS="limit=4",
        VLLM_LOGGING_LEVEL="ERROR",
        RAY_ADDRESS="local",
    )  # a Ray of its own
    proc = subprocess.run(
        ["bash", "scripts/reproduce_reward_paper.sh", "tiny"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=5400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (tmp_path / "table.md").read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| ")}
    for reward, label in zip(
        ["base", *REWARDS],
        [
            "(base model, no RL)",
            "Success reward (SR) only",
            "SR + OR",
            "SR + PR",
            "SR + PR-Clip",
            "SR + PR-Delta",
            "SR + PR-Clip-Delta",
        ],
    ):
        run = tmp_path / "base" if reward == "base" else tmp_path / reward / "seed0"
        summary = json.loads((run / "eval" / "synthetic" / "summary.json").read_text())
        assert summary["num_problems"] == 4 and summary["settings"]["template"]["name"] == "trained"
        realm, mv = summary["graders"]["accuracy"]["realm"], summary["graders"]["accuracy"]["math_verify"]
        assert rows[label] == f"| {label} | {100 * realm:.2f} | {100 * mv:.2f} |"
        if reward != "base":
            assert (run / "checkpoints" / "iter_000001" / "hf" / "model.safetensors").exists()
    # A relaunch finds every run and evaluation finished: nothing is trained or generated again.
    again = subprocess.run(
        ["bash", "scripts/reproduce_reward_paper.sh", "tiny"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert again.returncode == 0 and again.stdout.count("finished earlier") == 6
    assert (tmp_path / "table.md").read_text() == table
