"""`python -m trainer.export` and `python -m eval model=RUN/checkpoints/iter_N` on a real (tiny) training run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.export import ExportError, find_checkpoint

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "sft.num_steps=30",
    "sft.target_success=0",
    "rollout.num_prompts=4",
    "rollout.num_samples_per_prompt=2",
    "rollout.max_new_tokens=32",
    "data.synthetic_num_train=64",
    "data.synthetic_num_heldout=16",
    "run.eval_every=0",
    "run.num_heldout_samples=0",
    "ppo.num_minibatches=2",
]


def _run(args: list[str], timeout: int = 1800) -> subprocess.CompletedProcess:
    # RAY_ADDRESS=local: a new Ray of its own even when another job on the machine runs one (ray.init would join it).
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR", RAY_ADDRESS="local")
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_paths_that_are_not_checkpoints_are_refused_by_name(tmp_path):
    with pytest.raises(ExportError, match="neither a run directory"):
        find_checkpoint(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ExportError, match="no complete checkpoint"):
        find_checkpoint(tmp_path)
    with pytest.raises(ExportError, match="iteration 7"):
        find_checkpoint(tmp_path, iteration=7)


@pytest.mark.slow
def test_exported_policy_reproduces_the_trainers_heldout_accuracy(tmp_path):
    run = tmp_path / "run"
    _run(["train.py", "run.num_iterations=2", *SMALL, f"hydra.run.dir={run}"])
    trainer_after = json.loads((run / "summary.json").read_text())["heldout_after"]

    out = _run(["-m", "trainer.export", str(run), "--iteration", "2"]).stdout.strip().splitlines()[-1]
    hf = run / "checkpoints" / "iter_000002" / "hf"
    assert Path(out) == hf
    info = json.loads((hf / "realm_export.json").read_text())
    assert info["iteration"] == 2 and info["heldout"]["num_problems"] == 16

    # transformers loads it on its own, and its weights are the trained ones (not the starting policy's).
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(hf)
    base = AutoModelForCausalLM.from_pretrained(info["base_model"])
    assert AutoTokenizer.from_pretrained(hf).chat_template
    assert not torch.equal(model.model.layers[0].mlp.up_proj.weight, base.model.layers[0].mlp.up_proj.weight)

    # The same problems, prompt and token budget as the trainer's held-out evaluation, through vLLM.
    proc = _run(
        [
            "-m",
            "eval",
            f"model={run}/checkpoints/iter_000002",
            f"data.name={hf}/heldout.jsonl",
            "prompt=trained",
            "max_new_tokens=32",
            f"out_dir={tmp_path / 'eval'}",
        ]
    )
    summary = json.loads((Path(proc.stdout.strip().splitlines()[-1]) / "summary.json").read_text())
    assert summary["num_problems"] == 16
    assert summary["accuracy"]["mean"] == pytest.approx(trainer_after)
    assert summary["run"]["model"] == "run-iter2"
