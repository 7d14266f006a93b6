"""Token rewards, GAE and whitening: pure tensor math over right-padded responses.

Shapes: B responses, T response tokens (right-padded). ``mask_BT`` is 1 on real response tokens
and 0 on padding; real tokens form a prefix of each row, so the episode of row b ends at its last
real token and everything after it is ignored (and returned as 0).

References: Ziegler et al. 2019 (KL-shaped rewards), Schulman et al. 2016 (GAE),
cleanrl ``ppo.py`` (the GAE loop), torchtune ``rlhf/rewards.py`` (masked statistics).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` where ``mask`` is 1 (over all elements, or along ``dim``)."""
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is 1.

    An all-zero mask gives 0 (not NaN): an empty minibatch slice must not poison a sum of stats.
    """
    return masked_sum(x, mask, dim) / mask.sum(dim).clamp(min=1)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``x`` over the positions where ``mask`` is 1 (Bessel-corrected if ``unbiased``)."""
    mean = masked_mean(x, mask)
    sum_sq = masked_sum((x - mean) ** 2, mask)
    num = mask.sum()
    if unbiased:
        return sum_sq / (num - 1).clamp(min=1)
    return sum_sq / num.clamp(min=1)


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """(x - mean) / std over the masked positions; padding positions come back as 0.

    ``shift_mean=False`` only rescales (keeps the mean), as some PPO variants do for rewards.
    """
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask


def explained_variance(values_BT: Tensor, returns_BT: Tensor, mask_BT: Tensor) -> float:
    """1 - Var(R - V) / Var(R) over real tokens: how much of the return variance the critic predicts.

    1 is a perfect critic, 0 one no better than the mean return, < 0 worse than that. Computed on the
    rollout-time values (before the critic's update), as in cleanrl. Returns with no variance give 0.
    Worked example: R = 1, 2, 3, 4 and V = 1, 2, 3, 3 -> Var(R - V) = 0.25, Var(R) = 1.667 -> 0.85.
    """
    var_returns = masked_var(returns_BT.double(), mask_BT.double()).item()
    if var_returns <= 0.0:
        return 0.0
    return 1.0 - masked_var((returns_BT - values_BT).double(), mask_BT.double()).item() / var_returns


def kl_shaped_rewards(
    scores_BT: Tensor, logprobs_BT: Tensor, ref_logprobs_BT: Tensor, mask_BT: Tensor, kl_coef: float
) -> tuple[Tensor, Tensor]:
    """Per-token rewards r_t = score_t - beta * (log pi(a_t|s_t) - log pi_ref(a_t|s_t)).

    Args:
        scores_BT: task rewards already placed on tokens (success/ORM on the last token, PRM on
            each step's last token), [B, T].
        logprobs_BT, ref_logprobs_BT: log-probabilities of the sampled tokens under the rollout
            policy and the frozen reference, [B, T].
        mask_BT: 1 on real response tokens, [B, T].
        kl_coef: beta.

    Returns:
        rewards_BT: [B, T], 0 on padding.
        kl_BT: the per-token KL estimate log pi - log pi_ref, [B, T], 0 on padding.
    """
    kl_BT = (logprobs_BT - ref_logprobs_BT) * mask_BT
    rewards_BT = (scores_BT - kl_coef * kl_BT) * mask_BT
    return rewards_BT, kl_BT


def gae(rewards_BT: Tensor, values_BT: Tensor, mask_BT: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over right-padded responses.

        delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)       V(s_{t+1}) = 0 after the last real token
        A_t     = delta_t + gamma * lam * A_{t+1}          A = 0 after the last real token
        R_t     = A_t + V(s_t)                             (the critic's regression target)

    Args:
        rewards_BT: per-token rewards, [B, T].
        values_BT: V(s_t), the critic's value of the state before emitting token t, [B, T].
        mask_BT: 1 on real response tokens, [B, T].

    Returns:
        advantages_BT, returns_BT: [B, T], 0 on padding.
    """
    T = rewards_BT.shape[1]
    rewards_BT, values_BT = rewards_BT * mask_BT, values_BT * mask_BT
    advantages_reversed = []
    next_advantage = torch.zeros_like(rewards_BT[:, 0])
    next_value = torch.zeros_like(values_BT[:, 0])
    for t in reversed(range(T)):
        # mask_BT[:, t + 1] is 0 past the last real token: that is where the episode ends, so the
        # bootstrap value and the carried advantage are both cut to 0 there.
        not_done = mask_BT[:, t + 1] if t + 1 < T else torch.zeros_like(mask_BT[:, 0])
        delta = rewards_BT[:, t] + gamma * next_value * not_done - values_BT[:, t]
        next_advantage = delta + gamma * lam * next_advantage * not_done
        next_value = values_BT[:, t]
        advantages_reversed.append(next_advantage)
    advantages_BT = torch.stack(advantages_reversed[::-1], dim=1) * mask_BT
    returns_BT = (advantages_BT + values_BT) * mask_BT
    return advantages_BT, returns_BT


class Advantages(NamedTuple):
    """Everything one PPO iteration derives from scores, logprobs and values; all [B, T], 0 on padding."""

    rewards: Tensor
    """KL-penalized per-token rewards."""
    kl: Tensor
    """log pi - log pi_ref per token."""
    advantages: Tensor
    """GAE advantages, whitened over the batch if asked."""
    returns: Tensor
    """Value targets: raw (unwhitened) advantages + values."""


def compute_advantages(
    scores_BT: Tensor,
    logprobs_BT: Tensor,
    ref_logprobs_BT: Tensor,
    values_BT: Tensor,
    mask_BT: Tensor,
    kl_coef: float,
    gamma: float,
    lam: float,
    whiten: bool,
) -> Advantages:
    """KL-shaped rewards -> GAE -> (optional) whitening, over the whole iteration's batch.

    Whitening happens once on the full batch (not per minibatch), and the returns are computed
    from the raw advantages so the critic's targets keep their scale.
    """
    rewards_BT, kl_BT = kl_shaped_rewards(scores_BT, logprobs_BT, ref_logprobs_BT, mask_BT, kl_coef)
    advantages_BT, returns_BT = gae(rewards_BT, values_BT, mask_BT, gamma, lam)
    if whiten:
        advantages_BT = masked_whiten(advantages_BT, mask_BT)
    return Advantages(rewards=rewards_BT, kl=kl_BT, advantages=advantages_BT, returns=returns_BT)
