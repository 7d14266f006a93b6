"""Critic-free advantage estimators (GRPO, Dr. GRPO, RLOO, REINFORCE++) with process rewards: pure tensor math.

Shapes: B responses, T response tokens (right-padded; ``mask_BT`` 1 on real tokens, a prefix of each row).
``group_B`` gives each response its prompt's group: the responses sampled for one prompt share a group id.

Every estimator starts from the token rewards the reward function placed (the success reward and an ORM on a
response's last token, a PRM's refined step rewards on each step's last token, ``rewards.build``), with the KL
term folded in when the algorithm puts it in the reward. The reward-to-go of token t of response b is

    G_bt = sum_{t' >= t} gamma^(t' - t) r_bt'          (gamma = 1: the rewards of t's own step and the steps after)
    R_b  = G_b0                                        (the response's total)

and its advantage subtracts one baseline per response and divides by one scale per response:

    A_bt = (G_bt - baseline_b) / scale_b

| estimator     | baseline_b                                  | scale_b                                       |
| ------------- | ------------------------------------------- | --------------------------------------------- |
| grpo          | mean of R over b's group                    | std of R over b's group (``group_std``), or 1 |
| rloo          | mean of R over b's group without b          | 1                                             |
| reinforce_pp  | mean of R over the batch                    | std of R over the batch                       |

With outcome rewards only, G_bt = R_b on every token and these are GRPO's, Dr. GRPO's (grpo without the std),
RLOO's and REINFORCE++'s advantages. With step rewards, a token's advantage is built from the rewards of its own
step and the steps after it, as in DeepSeekMath's process supervision, but normalised differently: DeepSeekMath
centres *every step reward* by the group's mean step reward, so that a response of K steps collects -K * mean / std
in total, and when the mean is negative (as under Clip, whose rewards are all <= 0) every added step pays. Here
the baseline is subtracted once per response and the statistics are those of the totals R, which Clip-Delta's
telescoping sum keeps independent of K: appending steps to a response cannot raise its advantage sum A_b0 under
Clip-Delta (``docs/rewards.md``, "Process rewards without a critic"; ``tests/ppo/test_critic_free.py`` shows it
for every estimator, and what raw PRM rewards do instead).

A scale below ``MIN_SCALE`` counts as no spread (a group whose totals are equal up to rounding): its responses'
advantages are G - baseline unscaled, so that a group of equal totals never divides a reward-to-go by ~0.
REINFORCE++ takes its mean and std over responses, not over tokens as OpenRLHF's whitening does, so that a
response's length cannot move the statistics its own advantage is measured against.

References: Shao et al. 2024 (GRPO; DeepSeekMath section 4.1.3, process supervision), Liu et al. 2025 (Dr. GRPO),
Ahmadian et al. 2024 (RLOO), Hu 2025 (REINFORCE++); verl ``core_algos.py`` and OpenRLHF ``experience_maker.py``.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

import torch
from torch import Tensor

MIN_SCALE = 1e-4
"""A group (or batch) standard deviation of totals below this, in reward units, is taken as no spread."""


class Estimator(Enum):
    gae = "gae"
    """PPO's: GAE over a critic's values (``ppo.advantages``)."""
    grpo = "grpo"
    """Group-normalised: baseline the group's mean total, scale its std (Dr. GRPO: no std)."""
    rloo = "rloo"
    """Leave-one-out: baseline the mean total of the other responses to the same prompt."""
    reinforce_pp = "reinforce_pp"
    """REINFORCE++: baseline and scale the batch's mean and std of totals."""


def returns_to_go(rewards_BT: Tensor, mask_BT: Tensor, gamma: float = 1.0) -> Tensor:
    """G_bt = sum_{t' >= t} gamma^(t' - t) r_bt' over real tokens, [B, T] -> [B, T], 0 on padding.

    Worked example: rewards [0, 0.5, 1] (gamma 1) -> [1.5, 1.5, 1]; gamma 0.5 -> [0.5, 1, 1].
    """
    rewards_BT = rewards_BT * mask_BT
    if gamma == 1.0:
        return rewards_BT.flip(1).cumsum(1).flip(1) * mask_BT
    out = torch.zeros_like(rewards_BT)
    running = torch.zeros_like(rewards_BT[:, 0])
    for t in reversed(range(rewards_BT.shape[1])):
        running = rewards_BT[:, t] + gamma * running
        out[:, t] = running
    return out * mask_BT


def group_mean_std(values_B: Tensor, group_B: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per response, its group's mean, population std and size, [B] each (float64 inside).

    Worked example: values [1, 0, 0, 0] in groups [0, 0, 1, 1] -> means [0.5, 0.5, 0, 0], stds [0.5, 0.5, 0, 0],
    sizes [2, 2, 2, 2].
    """
    groups, index = torch.unique(group_B, return_inverse=True)
    x = values_B.double()
    count = torch.zeros(len(groups), dtype=torch.float64).index_add_(0, index, torch.ones_like(x))
    mean = torch.zeros_like(count).index_add_(0, index, x) / count
    var = torch.zeros_like(count).index_add_(0, index, (x - mean[index]) ** 2) / count
    return mean[index], var.sqrt()[index], count[index]


def _scale(std_B: Tensor) -> Tensor:
    """std where there is a spread, else 1 (see ``MIN_SCALE``)."""
    return torch.where(std_B > MIN_SCALE, std_B, torch.ones_like(std_B))


def baseline_and_scale(
    totals_B: Tensor, group_B: Tensor, estimator: Estimator, group_std: bool = True
) -> tuple[Tensor, Tensor]:
    """(baseline_b, scale_b) for every response from the totals R_b, [B] each, float64 (the module's table).

    Worked example, R = [1, 0, 0, 0] in one group of 4: grpo baselines 0.25, scales std = 0.433; rloo baselines
    [0, 1/3, 1/3, 1/3], scales 1; reinforce_pp (one batch) as grpo.
    """
    R = totals_B.double()
    if estimator == Estimator.grpo:
        mean, std, _ = group_mean_std(R, group_B)
        return mean, _scale(std) if group_std else torch.ones_like(mean)
    if estimator == Estimator.rloo:
        mean, _, count = group_mean_std(R, group_B)
        if bool((count < 2).any()):
            raise ValueError("rloo needs at least 2 responses per prompt (rollout.num_samples_per_prompt >= 2)")
        return (mean * count - R) / (count - 1), torch.ones_like(mean)
    if estimator == Estimator.reinforce_pp:
        mean, std = R.mean(), R.std(correction=0)
        return mean.expand_as(R), _scale(std).expand_as(R)
    raise ValueError(f"{estimator}: not a critic-free estimator")


class CriticFreeAdvantages(NamedTuple):
    """What one critic-free iteration derives from its token rewards; [B, T] tensors are 0 on padding."""

    advantages: Tensor
    """A_bt, [B, T]."""
    returns: Tensor
    """G_bt, the rewards-to-go, [B, T]."""
    baseline: Tensor
    """[B]"""
    scale: Tensor
    """[B]"""


def critic_free_advantages(
    rewards_BT: Tensor,
    mask_BT: Tensor,
    group_B: Tensor,
    estimator: Estimator,
    group_std: bool = True,
    gamma: float = 1.0,
) -> CriticFreeAdvantages:
    """A_bt = (G_bt - baseline_b) / scale_b from the token rewards (the KL term already in them when the
    algorithm puts it in the reward). [B, T], [B, T], [B] -> ``CriticFreeAdvantages``."""
    G_BT = returns_to_go(rewards_BT, mask_BT, gamma)
    totals_B = G_BT[:, 0] if G_BT.shape[1] else torch.zeros(G_BT.shape[0])
    baseline_B, scale_B = baseline_and_scale(totals_B, group_B, estimator, group_std)
    advantages_BT = ((G_BT.double() - baseline_B[:, None]) / scale_B[:, None]).to(G_BT.dtype) * mask_BT
    return CriticFreeAdvantages(advantages_BT, G_BT, baseline_B.float(), scale_B.float())


def equal_reward_group_fraction(totals_B: Tensor, group_B: Tensor) -> float:
    """The fraction of groups whose responses' totals are all equal (their outcome advantages are all 0: the
    group teaches nothing). Worked example: totals [1, 1, 0, 1] in groups [0, 0, 1, 1] -> 0.5."""
    groups, index = torch.unique(group_B, return_inverse=True)
    big = torch.full((len(groups),), -torch.inf, dtype=torch.float64)
    low = torch.full((len(groups),), torch.inf, dtype=torch.float64)
    x = totals_B.double()
    big = big.scatter_reduce(0, index, x, reduce="amax")
    low = low.scatter_reduce(0, index, x, reduce="amin")
    return float((big == low).double().mean()) if len(groups) else 0.0
