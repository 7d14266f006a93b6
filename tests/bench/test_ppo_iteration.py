"""bench/ppo_iteration.py: metric rows -> per-iteration phases (fast), and the whole script on a tiny workload (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import ppo_iteration
from tests import tolerance as tol

ROOT = Path(__file__).resolve().parents[2]


def _row(iteration: int, total: float) -> dict:
    return {
        "iteration": iteration,
        "time/generate": 1.0,
        "time/reward": 0.5,
        "time/inference": 0.25,
        "time/train": 2.0,
        "time/sync": 0.25,
        "time/iteration": total,
        "response/length": 10.0,
        "throughput/tokens_per_s": 40.0,
        "response/truncated": 0.25,
    }


def test_row_zero_is_the_before_training_eval_not_an_iteration():
    rows = [{"iteration": 0, "heldout/success": 0.1}, _row(1, 5.0), _row(2, 4.5)]
    its = ppo_iteration.realm_iterations(rows, rollouts=8)
    assert [r["iteration"] for r in its] == [1, 2]
    # other = 5.0 - (1 + 0.5 + 0.25 + 2 + 0.25) = 1.0; 10 tokens x 8 rows; 75% of 8 rows stopped at EOS
    assert its[0]["other"] == pytest.approx(1.0) and its[1]["other"] == pytest.approx(0.5)
    assert its[0]["tokens"] == 80 and its[0]["stopped_at_eos"] == 6
    part = {"iterations": its}
    ppo_iteration.summarize(part, ppo_iteration.REALM_PHASES)
    assert part["timed_iterations"] == [2]  # the first is warm-up
    assert part["tokens_per_s"] == pytest.approx(80 / 4.5)


def test_call_spans_become_per_call_seconds_and_missing_phases_count_zero():
    row = {
        **_row(1, 5.0),
        "call/actor_gen/start_s": 0.5,
        "call/actor_gen/end_s": 1.5,
        "call/ref_inf/start_s": 2.0,
        "call/ref_inf/end_s": 2.25,
        "call/critic_inf/start_s": 2.0,
    }
    del row["time/reward"]  # the plan runtime times reward scoring within inference
    its = ppo_iteration.realm_iterations([row, {**row, "iteration": 2}], rollouts=8)
    assert its[0]["calls"] == {"actor_gen": 1.0, "ref_inf": 0.25}  # critic_inf has no end: left out
    part = {"iterations": its}
    ppo_iteration.summarize(part, ppo_iteration.REALM_PHASES)
    assert part["mean_s"]["reward"] == 0.0 and part["mean_call_s"] == {"actor_gen": 1.0, "ref_inf": 0.25}


def test_no_timed_iteration_is_an_error():
    with pytest.raises(RuntimeError, match="no timed iteration"):
        ppo_iteration.realm_iterations([{"iteration": 0, "heldout/success": 0.0}], rollouts=4)


@pytest.mark.slow
def test_script_runs_on_a_tiny_workload(tmp_path):
    """Ray + vLLM start-up make this a minute or more: slow. TRL is skipped (it needs the package registry)."""
    out = tmp_path / "ppo.json"
    proc = subprocess.run(
        [
            sys.executable,
            "bench/ppo_iteration.py",
            "--json",
            str(out),
            "--skip-trl",
            "--iterations",
            "2",
            "--num-prompts",
            "4",
            "--samples-per-prompt",
            "2",
            "--max-new-tokens",
            "8",
            "--heldout-limit",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [r["iteration"] for r in result["realm"]["iterations"]] == [1, 2]
    assert result["realm"]["tokens_per_s"] > 0 and result["trl"]["status"] == "skipped"
    assert out.with_suffix(".png").exists()
    # The FLOP accounting: every call of the timed iteration logged, priced, and timed on an empty batch.
    calls = result["flops"]["calls"]
    assert set(calls) == {"actor_inf", "ref_inf", "critic_inf", "actor_train", "critic_train"}
    assert all(c["gflop"] > 0 and c["empty_call_s"] > 0 and 0 < c["fraction_of_peak"] < 1 for c in calls.values())
    # Each call's own matmul shapes, timed alone, and the share of its time they take.
    assert all(c["matmul_rate_gflops"] > 0 and c["fraction_of_matmul_rate"] > 0 for c in calls.values())
    assert result["flops"]["peaks"]["one_thread_gflops"] > 0 and out.with_name("ppo_flops.png").exists()


@pytest.mark.parametrize(
    "mode, cliprange, same", [("none", None, True), ("raw", 0.2, True), ("return_std", 0.2, False)]
)
def test_trl_gets_the_value_loss_realm_trains_with(mode, cliprange, same):
    from ppo.config import PPOConfig, ValueClip

    vc = ppo_iteration.trl_value_clip(PPOConfig(value_clip=ValueClip(mode), value_clip_eps=0.2))
    assert (vc["realm"], vc["trl_cliprange_value"], vc["same_loss"]) == (mode, cliprange, same)
    assert ("differs" in vc["note"]) == (not same)


def test_an_infinite_trl_value_clip_range_is_realms_plain_regression():
    """TRL's value loss, 1/2 max((V - R)^2, (clamp(V, V_old - c, V_old + c) - R)^2), with c = inf (what
    bench/_trl_ppo.py passes for realm's default ppo.value_clip=none) equals realm's unclipped loss."""
    import torch

    from ppo.losses import value_loss

    values = torch.tensor([[0.0, 1.5, -2.0], [3.0, 0.5, 0.0]])
    old = torch.tensor([[0.1, 0.0, 0.0], [0.0, 0.4, 0.0]])
    returns = torch.tensor([[1.0, 1.0, 1.0], [-1.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    c = float("inf")
    clipped = torch.clamp(values, old - c, old + c)
    trl = 0.5 * (torch.max((values - returns) ** 2, (clipped - returns) ** 2) * mask).sum() / mask.sum()
    realm, stats = value_loss(values, old, returns, mask, None)
    # (1 + 0.25 + 9 + 16 + 2.25) / 5 / 2 = 2.85
    assert float(trl) == pytest.approx(2.85) and float(realm) == pytest.approx(2.85)
    assert float(stats.clip_frac) == 0.0


def _cfg(algorithm: str, num_prompts: int = 64, samples: int = 8, max_new_tokens: int = 48):
    import argparse

    args = argparse.Namespace(
        algorithm=algorithm,
        num_prompts=num_prompts,
        samples_per_prompt=samples,
        max_new_tokens=max_new_tokens,
        iterations=3,
        heldout_limit=8,
        model="",
        realm_override=[],
    )
    cfg, overrides = ppo_iteration.realm_config(args)
    assert overrides[0] == f"algorithm={algorithm}"
    return cfg


def test_trl_grpo_takes_realms_optimizer_steps_on_realms_rows():
    """The default run's workload: 64 x 8 = 512 rows, 2 epochs x 4 minibatches of 128 rows. TRL generates
    per_device_train_batch_size x steps_per_generation = 512 rows, passes over them num_iterations = 2 times and
    steps every gradient_accumulation_steps = 1 micro-batch: 2 x 4 / 1 = 8 steps of 128 rows, as realm."""
    s = ppo_iteration.trl_grpo_settings(_cfg("grpo"))
    assert s["trainer"] == "GRPOTrainer"
    assert s["spec"]["layout"] == {
        "per_device_train_batch_size": 128,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": 4,
        "num_iterations": 2,
    }
    assert (s["spec"]["loss_type"], s["spec"]["scale_rewards"], s["spec"]["beta"]) == ("grpo", "group", 0.04)
    assert s["spec"]["num_generations"] == 8 and s["spec"]["max_new_tokens"] == 48
    # SmolLM2's workload in 4-row micro-batches: 64 rows, minibatches of 16 = 4 micro-batches per step.
    s = ppo_iteration.trl_grpo_settings(_cfg("grpo", 16, 4, 256), microbatch_rows=4)
    layout = s["spec"]["layout"]
    assert layout == {
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 4,
        "steps_per_generation": 16,
        "num_iterations": 2,
    }
    assert layout["num_iterations"] * layout["steps_per_generation"] // layout["gradient_accumulation_steps"] == 8
    assert any("micro-batch" in d for d in s["differs"])  # TRL's grpo loss is a mean of micro-batch means
    with pytest.raises(ValueError, match="must divide the minibatch of 16 rows"):
        ppo_iteration.trl_grpo_settings(_cfg("grpo", 16, 4, 256), microbatch_rows=3)


def test_trl_grpo_runs_dr_grpo_and_no_algorithm_with_kl_in_the_reward():
    s = ppo_iteration.trl_grpo_settings(_cfg("dr_grpo"))
    assert (s["spec"]["loss_type"], s["spec"]["scale_rewards"], s["spec"]["beta"]) == ("dr_grpo", "none", 0.0)
    for name, why in (("rloo", "group-mean baselines only"), ("reinforce_pp", "group-mean baselines only")):
        with pytest.raises(ValueError, match=why):
            ppo_iteration.trl_grpo_settings(_cfg(name))


@pytest.mark.equivalence
def test_trl_grpo_loss_terms_are_realms():
    """TRL 0.29.1's GRPO loss (written out from grpo_trainer._compute_loss, loss_type="grpo"): per token
    -min(r A, clip(r) A) + beta (exp(ref - logp) - (ref - logp) - 1), then the mean over responses of each
    response's token mean. Realm's: policy_loss aggregated seq_mean_token_mean plus beta x the k3 estimate
    aggregated the same way. Same rows, same numbers, within rule 1 of tests/tolerance.py (realm sums the
    policy and KL terms separately: another order)."""
    import torch

    from ppo.config import KLEstimator, LossAgg
    from ppo.kl import kl_estimate
    from ppo.losses import Denominators, aggregate, policy_loss

    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]])
    old = torch.tensor([[-1.1, -0.5, -1.5], [-0.3, -1.0, 0.0]])
    ref = torch.tensor([[-0.9, -0.7, -2.0], [-0.5, -1.2, 0.0]])
    adv = torch.tensor([[1.0], [-0.5]]).expand(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    beta, eps = 0.04, 0.2
    r = torch.exp(logp - old)
    trl_token = -torch.min(r * adv, torch.clamp(r, 1 - eps, 1 + eps) * adv)
    trl_token = trl_token + beta * (torch.exp(ref - logp) - (ref - logp) - 1)
    trl = ((trl_token * mask).sum(-1) / mask.sum(-1)).mean()
    den = Denominators(mask.sum(), torch.tensor(2.0))
    pg, _ = policy_loss(logp, old, adv, mask, eps, agg=LossAgg.seq_mean_token_mean, den=den)
    kl = aggregate(kl_estimate(logp, ref, mask, KLEstimator.k3), mask, LossAgg.seq_mean_token_mean, den)
    # A token's 8 roundings (two exps, the ratio's product, clip, min, k3's two differences, beta's product),
    # a response's 3 tokens, the mean of 2 responses, then realm's beta x KL and sum of the two losses; at the
    # largest sum's |terms| (a response's) or 1, whichever is larger.
    bound = tol.rounding(8 + 3 + 2 + 2, max(1.0, float((trl_token.abs() * mask).sum(-1).max())))
    tol.assert_scalars_close({"loss": float(pg + beta * kl)}, {"loss": float(trl)}, {"loss": bound})


def test_trl_grpo_advantages_are_realms_times_the_bessel_factor():
    """One group of 4 with rewards [1, 0, 0, 0]: realm (ppo.critic_free) divides 0.75 by the population std
    0.433 -> 1.732; TRL by the unbiased std 0.5 (+ 1e-4) -> 1.4997: sqrt(3 / 4) = 0.866 of realm's, as the
    benchmark's 'differs' line says."""
    import torch

    from ppo.critic_free import Estimator, critic_free_advantages

    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    realm = critic_free_advantages(rewards[:, None], torch.ones(4, 1), torch.zeros(4), Estimator.grpo).advantages[:, 0]
    trl = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    assert float(realm[0]) == pytest.approx(3**0.5, rel=1e-6) and float(trl[0]) == pytest.approx(0.75 / 0.5001)
    assert float(trl[0] / realm[0]) == pytest.approx((3 / 4) ** 0.5, rel=1e-3)
    assert "0.866" in ppo_iteration.trl_grpo_settings(_cfg("grpo", 16, 4, 256))["differs"][0]
