"""PPO losses and the per-token quantities they need: pure functions over [B, T] tensors.

Aggregation is a token mean: sum over real tokens / ``num_tokens``. ``num_tokens`` defaults to the
tokens in ``mask_BT``; a data-parallel rank that holds a slice of a minibatch passes the token count
of the *whole* minibatch, so that summing (or, times world size, averaging) the per-rank losses
gives exactly the full-minibatch loss. Stats use the same denominator and sum across ranks too.

References: Schulman et al. 2017 (PPO-clip), cleanrl ``ppo.py`` (policy/value loss, approx_kl,
clipfrac), torchtune ``rlhf/loss/ppo.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from ppo.advantages import masked_sum


def logprobs_from_logits(logits_BTV: Tensor, tokens_BT: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature)[token] for each position, [B, T].

    ``logits_BTV[:, t]`` must be the logits that predict ``tokens_BT[:, t]`` (already shifted).
    The temperature matches the sampler's so that these are the probabilities tokens were drawn with.
    """
    logits_BTV = logits_BTV.float()
    if temperature != 1.0:
        logits_BTV = logits_BTV / temperature
    token_logits_BT = logits_BTV.gather(-1, tokens_BT.unsqueeze(-1)).squeeze(-1)
    return token_logits_BT - logsumexp_in_row_blocks(logits_BTV)


LOGSUMEXP_BLOCK_ELEMENTS = 1 << 26
"""Elements of one block of ``logsumexp_in_row_blocks``: 256 MB of float32."""


def logsumexp_in_row_blocks(logits_BTV: Tensor) -> Tensor:
    """``torch.logsumexp(logits_BTV, dim=-1)``, [B, T], a block of rows at a time.

    torch.logsumexp materializes ``exp(x - max)`` as large as its input: for SmolLM2-135M's 49,152-token
    vocabulary and 32 rows x 257 columns that is a second 1.6 GB beside the logits. Rows are
    independent, so blocks of rows give the same values with a temporary of at most
    ``LOGSUMEXP_BLOCK_ELEMENTS``.
    """
    rows_per_block = max(1, LOGSUMEXP_BLOCK_ELEMENTS // max(1, logits_BTV[0].numel()))
    if logits_BTV.shape[0] <= rows_per_block:
        return torch.logsumexp(logits_BTV, dim=-1)
    return torch.cat([torch.logsumexp(block, dim=-1) for block in logits_BTV.split(rows_per_block)])


def entropy_from_logits(logits_BTV: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of softmax(logits / temperature) at each position, [B, T].

    H = -sum_v p_v log p_v = logsumexp(z) - sum_v p_v z_v,  z = logits / temperature  (no log of a
    tiny p_v is ever taken). The temperature is the sampler's, as in ``logprobs_from_logits``: the
    entropy reported (and, with ``ppo.entropy_coef``, maximised) is that of the distribution sampled.
    """
    logits_BTV = logits_BTV.float()
    if temperature != 1.0:
        logits_BTV = logits_BTV / temperature
    probs_BTV = torch.softmax(logits_BTV, dim=-1)
    return torch.logsumexp(logits_BTV, dim=-1) - (probs_BTV * logits_BTV).sum(-1)


def _token_mean(x_BT: Tensor, mask_BT: Tensor, num_tokens: Tensor | float | None) -> Tensor:
    if num_tokens is None:
        num_tokens = mask_BT.sum()
    if isinstance(num_tokens, Tensor):
        return masked_sum(x_BT, mask_BT) / num_tokens.clamp(min=1)
    return masked_sum(x_BT, mask_BT) / max(num_tokens, 1.0)


class PolicyLossStats(NamedTuple):
    """Scalar diagnostics of one policy-loss evaluation (token means, detached)."""

    clip_frac: Tensor
    """Fraction of tokens whose ratio was clipped (the clipped term was the active one)."""
    approx_kl: Tensor
    """k3 estimator of KL(pi_old || pi): (r - 1) - log r; >= 0, unbiased (Schulman's blog)."""
    ratio: Tensor
    """Mean of r = pi / pi_old; drifts from 1 as the epochs go on."""


def policy_loss(
    logprobs_BT: Tensor,
    old_logprobs_BT: Tensor,
    advantages_BT: Tensor,
    mask_BT: Tensor,
    clip_eps: float,
    num_tokens: Tensor | float | None = None,
) -> tuple[Tensor, PolicyLossStats]:
    """PPO-clip:  L = mean_t max(-A_t * r_t, -A_t * clip(r_t, 1 - eps, 1 + eps)),  r_t = pi / pi_old.

    Args:
        logprobs_BT: log pi(a_t|s_t) under the current parameters (with grad), [B, T].
        old_logprobs_BT: log pi_old(a_t|s_t) from the rollout policy, [B, T].
        advantages_BT: [B, T].
        mask_BT: 1 on real response tokens, [B, T].
        clip_eps: eps.
        num_tokens: denominator of the token mean (see the module docstring).

    Returns:
        loss: scalar to minimize.
        stats: PolicyLossStats.
    """
    log_ratio_BT = logprobs_BT - old_logprobs_BT
    ratio_BT = torch.exp(log_ratio_BT)
    pg_loss_unclipped_BT = -advantages_BT * ratio_BT
    pg_loss_clipped_BT = -advantages_BT * torch.clamp(ratio_BT, 1.0 - clip_eps, 1.0 + clip_eps)
    loss = _token_mean(torch.max(pg_loss_unclipped_BT, pg_loss_clipped_BT), mask_BT, num_tokens)
    with torch.no_grad():
        stats = PolicyLossStats(
            clip_frac=_token_mean((pg_loss_clipped_BT > pg_loss_unclipped_BT).float(), mask_BT, num_tokens),
            approx_kl=_token_mean((ratio_BT - 1) - log_ratio_BT, mask_BT, num_tokens),
            ratio=_token_mean(ratio_BT, mask_BT, num_tokens),
        )
    return loss, stats


def value_clip_range(
    returns_BT: Tensor,
    mask_BT: Tensor,
    clip_eps: float,
    mode: str,
    all_reduce_sum: Callable[[Tensor], Tensor] = lambda x: x,
) -> float | None:
    """How far one iteration may move a value prediction, in reward units; None: no clipping.

    ``mode`` (``ppo.value_clip``): ``none`` -> None; ``raw`` -> ``clip_eps`` in reward units;
    ``return_std`` -> ``clip_eps`` times the standard deviation of this iteration's returns over
    real tokens (floored at 1e-3).

    Why not always ``raw``: returns of about 0.4 (success only) and 2-5 (raw PRM) need very different
    moves from a zero-initialised head, and a prediction that has moved ``clip_eps`` gets no gradient
    for the rest of the epoch, so a fixed range makes the critic lag under large-return rewards only.

    ``all_reduce_sum`` sums over data-parallel ranks, so every rank gets the range of the whole batch.

    Worked example: returns 1, 2, 3, 4 on real tokens (population std 1.118), clip_eps 0.5,
    mode return_std -> 0.559.

    Args:
        returns_BT: value targets, [B, T].
        mask_BT: 1 on real response tokens, [B, T].
    """
    if mode == "none":
        return None
    if mode == "raw":
        return clip_eps
    if mode != "return_std":
        raise ValueError(f"ppo.value_clip={mode!r}: expected none, raw or return_std")
    returns_BT, mask_BT = returns_BT.double(), mask_BT.double()
    moments = torch.stack([mask_BT.sum(), masked_sum(returns_BT, mask_BT), masked_sum(returns_BT**2, mask_BT)])
    count, total, total_sq = all_reduce_sum(moments).tolist()
    count = max(count, 1.0)
    variance = max(total_sq / count - (total / count) ** 2, 0.0)
    return clip_eps * max(variance**0.5, 1e-3)


class ValueLossStats(NamedTuple):
    """Scalar diagnostics of one value-loss evaluation (token means, detached)."""

    clip_frac: Tensor
    """Fraction of tokens where the clipped value's error was the larger (active) one."""
    values: Tensor
    """Mean predicted value."""


def value_loss(
    values_BT: Tensor,
    old_values_BT: Tensor,
    returns_BT: Tensor,
    mask_BT: Tensor,
    clip_eps: float | None,
    num_tokens: Tensor | float | None = None,
) -> tuple[Tensor, ValueLossStats]:
    """Clipped value loss:  L = 1/2 mean_t max((V_t - R_t)^2, (V_old,t + clip(V_t - V_old,t, -eps, eps) - R_t)^2).

    ``clip_eps=None``: plain regression, L = 1/2 mean_t (V_t - R_t)^2 (clip_frac is then 0).

    Args:
        values_BT: V(s_t) under the current critic (with grad), [B, T].
        old_values_BT: V(s_t) at rollout time, [B, T].
        returns_BT: GAE returns (targets), [B, T].
        mask_BT: 1 on real response tokens, [B, T].
        clip_eps: how far one iteration may move a value prediction (in reward units; see
            ``value_clip_range``), or None.
        num_tokens: denominator of the token mean (see the module docstring).
    """
    if clip_eps is None:
        loss_BT = (values_BT - returns_BT) ** 2
        loss = 0.5 * _token_mean(loss_BT, mask_BT, num_tokens)
        with torch.no_grad():
            stats = ValueLossStats(
                clip_frac=torch.zeros((), device=values_BT.device), values=_token_mean(values_BT, mask_BT, num_tokens)
            )
        return loss, stats
    values_clipped_BT = old_values_BT + torch.clamp(values_BT - old_values_BT, -clip_eps, clip_eps)
    loss_unclipped_BT = (values_BT - returns_BT) ** 2
    loss_clipped_BT = (values_clipped_BT - returns_BT) ** 2
    loss = 0.5 * _token_mean(torch.max(loss_unclipped_BT, loss_clipped_BT), mask_BT, num_tokens)
    with torch.no_grad():
        stats = ValueLossStats(
            clip_frac=_token_mean((loss_clipped_BT > loss_unclipped_BT).float(), mask_BT, num_tokens),
            values=_token_mean(values_BT, mask_BT, num_tokens),
        )
    return loss, stats
