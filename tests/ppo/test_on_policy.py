"""The on-policy skip (``ppo.config.reuses_update_logprobs``): when the policy takes one optimizer step per batch
of rollouts, the old logprobs are the update's own, detached, and no ``actor_inf`` forward runs. The loss, its
gradient and the step equal those of the unskipped path (old logprobs from a forward of their own) within the
rules of tests/tolerance.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from ppo.config import reuses_update_logprobs
from runtime.device.shards import PolicyShard
from tests import tolerance as tol
from tests.runtime.test_shards import forward_bound, gradient_rounding, make_batch
from trainer.compose import to_train_config
from trainer.config import register_configs

ROOT = Path(__file__).resolve().parents[2]
register_configs()


def _cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=list(overrides)))


ONE_STEP = ("ppo.num_epochs=1", "ppo.num_minibatches=1")


@pytest.mark.parametrize(
    ("overrides", "skips"),
    [
        (("algorithm=ppo",), False),  # the default: 2 epochs x 4 minibatches, and a critic
        (("algorithm=ppo", *ONE_STEP), False),  # GAE's rewards carry the KL term, read before the update
        (("algorithm=grpo",), False),  # 8 steps: the later ones see a moved policy
        (("algorithm=grpo", *ONE_STEP), True),
        (("algorithm=grpo", "ppo.num_epochs=1", "ppo.num_minibatches=2"), False),
        (("algorithm=grpo", "ppo.num_epochs=2", "ppo.num_minibatches=1"), False),
        (("algorithm=dr_grpo", *ONE_STEP), True),
        (("algorithm=rloo", *ONE_STEP), False),  # the KL term in the reward reads the old logprobs
        (("algorithm=rloo", "algorithm.kl_coef=0", *ONE_STEP), True),
        (("algorithm=reinforce_pp", *ONE_STEP), False),
    ],
)
def test_the_skip_is_decided_from_the_config(overrides, skips):
    cfg = _cfg(*overrides)
    assert reuses_update_logprobs(cfg.algorithm, cfg.ppo) is skips


def _grpo_shard(model_dir) -> PolicyShard:
    cfg = _cfg("algorithm=grpo", *ONE_STEP, "ppo.actor_lr=1e-3")
    return PolicyShard(model_dir=str(model_dir), ppo=cfg.ppo, algorithm=cfg.algorithm)


def _update_fields(batch: dict, old: torch.Tensor) -> dict:
    """Reference logprobs off the policy's (so the k3 term and its gradient are not 0) and random advantages."""
    g = torch.Generator().manual_seed(1)
    mask = batch["response_mask"]
    return {
        **batch,
        "ref_logprobs": (old + 0.3 * torch.randn(mask.shape, generator=g)) * mask,
        "advantages": torch.randn(mask.shape, generator=g) * mask,
    }


@pytest.mark.equivalence
def test_one_step_with_its_own_logprobs_matches_the_separate_forward(tiny_model_dir):
    """GRPO's loss (PPO-clip, seq-mean-token-mean, k3 KL in the loss) on one step. Unskipped: the old logprobs from
    ``compute_logprobs`` in 2 micro-batches (blocked unlike the loss's forward), so its ratio is 1 +- delta,
    delta within rule 1 of a forward's logprobs; skipped: exactly 1. Both backward the same sums otherwise, so
    the loss differs by at most delta times the largest |advantage|, each gradient element by delta times its
    scale on top of rule 1's rounding of the gradient's sums; after the one AdamW step the weights are within
    rule 3 and the stats within ``trained_scalars``. The skipped path's ratio is 1 and its clip fraction and
    approximate KL 0."""
    batch = make_batch()
    unskipped, skipped = _grpo_shard(tiny_model_dir), _grpo_shard(tiny_model_dir)
    old = unskipped.compute_logprobs(batch, 2)
    fields = _update_fields(batch, old)
    delta = forward_bound(tiny_model_dir, batch, old)
    rho = gradient_rounding(tiny_model_dir, batch, num_minibatches=1)
    den = unskipped.trainer.denominators(batch["response_mask"])

    want, _ = unskipped._policy_loss({**fields, "old_logprobs": old}, den)
    got, got_stats = skipped._policy_loss(fields, den)
    tol.assert_close(got, want, delta * tol.scale_of(fields["advantages"]), msg="loss")
    want.backward()
    got.backward()
    params = dict(skipped.model.named_parameters())
    for name, p in unskipped.model.named_parameters():
        tol.assert_close(params[name].grad, p.grad, (rho + delta) * tol.scale_of(p.grad), msg=f"{name} grad")
    assert float(got_stats["ratio"]) == 1.0 and float(got_stats["clip_frac"]) == float(got_stats["approx_kl"]) == 0.0

    for shard in (unskipped, skipped):
        shard.model.zero_grad(set_to_none=True)
    want_stats = unskipped.update({**fields, "old_logprobs": old})
    got_stats = skipped.update(fields)
    tol.assert_scalars_close(got_stats, want_stats, tol.trained_scalars(want_stats, rho, 1))
    states = [{k: v.detach().clone() for k, v in s.model.state_dict().items()} for s in (skipped, unskipped)]
    tol.assert_trained_close(*states, [1e-3], rho)
    assert got_stats["ratio"] == pytest.approx(1.0, abs=1e-6) and got_stats["approx_kl"] == 0.0


def test_an_update_of_several_steps_refuses_to_run_without_old_logprobs(tiny_model_dir):
    """Two minibatches: the second step's policy has moved, so its own logprobs are not the old ones."""
    cfg = _cfg("algorithm=grpo", "ppo.num_epochs=1", "ppo.num_minibatches=2")
    shard = PolicyShard(model_dir=str(tiny_model_dir), ppo=cfg.ppo, algorithm=cfg.algorithm)
    batch = make_batch()
    fields = _update_fields(batch, shard.compute_logprobs(batch))
    with pytest.raises(ValueError, match="1 x 2 optimizer steps: it needs the old logprobs"):
        shard.update(fields)
