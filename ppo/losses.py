"""Policy and value losses and the per-token quantities they need: pure functions over [B, T] tensors.

The policy loss of a minibatch is its per-token losses aggregated as ``algorithm.loss_agg`` says
(``aggregate``): a token mean (PPO), a mean over responses of their token means (GRPO) or a token sum over
responses x a constant (Dr. GRPO). The denominators are those of the *whole* minibatch (``Denominators``): a
data-parallel rank that holds a slice of it passes the minibatch's token and response counts, so that summing
(or, times world size, averaging) the per-rank losses gives exactly the full-minibatch loss. Stats are token
means with the same token count and sum across ranks too.

References: Schulman et al. 2017 (PPO-clip), cleanrl ``ppo.py`` (policy/value loss, approx_kl,
clipfrac), torchtune ``rlhf/loss/ppo.py``, verl ``core_algos.agg_loss`` (the aggregation modes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from ppo.advantages import masked_sum
from ppo.config import LossAgg


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


HEAD_BLOCK_ROWS = 128
"""Rows of one block of ``head_logprobs``: 128 x 49,152 float32 logits (SmolLM2) are 25 MB, against the
1.6 GB that 32 rows x 257 response columns take at once."""


def head_logprobs(
    hidden_NH: Tensor,
    weight_VH: Tensor,
    tokens_N: Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    block_rows: int = HEAD_BLOCK_ROWS,
) -> tuple[Tensor, Tensor | None]:
    """Log-probability of each token, and (``with_entropy``) the entropy, under softmax(hidden @ weight^T /
    temperature), [N] each, float32.

    The numbers of ``logprobs_from_logits`` and ``entropy_from_logits`` on the logits ``F.linear(hidden_NH,
    weight_VH)``, but the [N, V] float32 logits never exist beyond one block of ``block_rows`` rows: forward
    and backward go a block at a time, and the backward recomputes a block's logits instead of keeping them.
    On a CPU the full logits cost more in memory traffic than the LM head costs in FLOPs (SmolLM2-135M, 32
    rows x 257 columns: 1.6 GB written, read and written again). Differentiable in ``hidden_NH`` and
    ``weight_VH`` through both outputs. Under autocast the head's matmuls run in the autocast dtype, as
    ``F.linear`` would; the softmax math is float32 either way.

    Args:
        hidden_NH: final hidden states of the positions that predict ``tokens_N``, [N, H].
        weight_VH: the LM head's weight (no bias), [V, H].
        tokens_N: the token each row predicts, [N] (long).
        temperature: the sampler's, as in ``logprobs_from_logits``.

    Worked example: hidden [[1, 0]], weight [[1, 0], [0, 0]] -> logits [1, 0]; token 0 has logprob
    1 - log(e + 1) = -0.3133, and the entropy is log(e + 1) - (e * 1 + 1 * 0) / (e + 1) = 0.5822.
    """
    device = hidden_NH.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden_NH.dtype
    with torch.autocast(device, enabled=False):
        logprobs_N, entropy_N = _HeadLogprobs.apply(
            hidden_NH, weight_VH, tokens_N, temperature, with_entropy, block_rows, dtype
        )
    return logprobs_N, entropy_N if with_entropy else None


def _block_logits(hidden_nH: Tensor, weight_VH: Tensor, temperature: float, dtype: torch.dtype) -> Tensor:
    """z = F.linear(hidden, weight) / temperature, the head computed in ``dtype`` and z at least float32, [n, V]."""
    logits = torch.nn.functional.linear(hidden_nH.to(dtype), weight_VH.to(dtype))
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return logits.div_(temperature) if temperature != 1.0 else logits


class _HeadLogprobs(torch.autograd.Function):
    """``head_logprobs``: keeps hidden, weight and tokens for the backward, which recomputes each block's logits."""

    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, tokens_N, temperature, with_entropy, block_rows, dtype):
        softmax_dtype = torch.promote_types(dtype, torch.float32)  # float32 for a bf16 / fp16 head
        logprobs_N = torch.empty(hidden_NH.shape[0], dtype=softmax_dtype, device=hidden_NH.device)
        entropy_N = torch.zeros_like(logprobs_N)
        for start in range(0, hidden_NH.shape[0], block_rows):
            rows = slice(start, start + block_rows)
            z_nV = _block_logits(hidden_NH[rows], weight_VH, temperature, dtype)
            lse_n = torch.logsumexp(z_nV, dim=-1)
            logprobs_N[rows] = z_nV.gather(-1, tokens_N[rows, None])[:, 0] - lse_n
            if with_entropy:  # the expression of entropy_from_logits, so the same float32 numbers
                entropy_N[rows] = lse_n - (torch.softmax(z_nV, dim=-1) * z_nV).sum(-1)
        ctx.save_for_backward(hidden_NH, weight_VH, tokens_N)
        ctx.temperature, ctx.block_rows, ctx.dtype, ctx.softmax_dtype = temperature, block_rows, dtype, softmax_dtype
        ctx.set_materialize_grads(False)  # an output left out of the loss gets None, not zeros
        return logprobs_N, entropy_N

    @staticmethod
    def backward(ctx, grad_logprobs_N, grad_entropy_N):
        hidden_NH, weight_VH, tokens_N = ctx.saved_tensors
        grad_hidden_NH = torch.zeros_like(hidden_NH) if ctx.needs_input_grad[0] else None
        grad_weight_VH = torch.zeros_like(weight_VH, dtype=ctx.softmax_dtype) if ctx.needs_input_grad[1] else None
        for start in range(0, hidden_NH.shape[0], ctx.block_rows):
            rows = slice(start, start + ctx.block_rows)
            hidden_nH = hidden_NH[rows]
            z_nV = _block_logits(hidden_nH, weight_VH, ctx.temperature, ctx.dtype)
            grad_z_nV = _grad_block_logits(
                z_nV,
                tokens_N[rows],
                None if grad_logprobs_N is None else grad_logprobs_N[rows],
                None if grad_entropy_N is None else grad_entropy_N[rows],
                ctx.temperature,
            ).to(ctx.dtype)
            if grad_hidden_NH is not None:
                grad_hidden_NH[rows] = (grad_z_nV @ weight_VH.to(ctx.dtype)).to(hidden_NH.dtype)
            if grad_weight_VH is not None and ctx.dtype == ctx.softmax_dtype:  # in place: no [V, H] temporary
                grad_weight_VH.addmm_(grad_z_nV.T, hidden_nH)
            elif grad_weight_VH is not None:
                grad_weight_VH += (grad_z_nV.T @ hidden_nH.to(ctx.dtype)).to(ctx.softmax_dtype)
        if grad_weight_VH is not None:
            grad_weight_VH = grad_weight_VH.to(weight_VH.dtype)
        return grad_hidden_NH, grad_weight_VH, None, None, None, None, None


def _grad_block_logits(
    z_nV: Tensor, tokens_n: Tensor, grad_logprobs_n: Tensor | None, grad_entropy_n: Tensor | None, temperature: float
) -> Tensor:
    """The gradient with respect to one block's logits, [n, V], from those of its logprobs and entropies, [n]
    (either may be None), with z = logits / temperature (``z_nV``, overwritten):

        dlogprob/dz_v = onehot_v - p_v,   dH/dz_v = -p_v (z_v - sum_u p_u z_u),   dz/dlogits = 1 / temperature.
    """
    p_nV = torch.softmax(z_nV, dim=-1)  # not exp(z - lse): a float32 lse would cost p ~1e-6 relative
    g_n = grad_logprobs_n if grad_logprobs_n is not None else torch.zeros_like(p_nV[:, 0])
    if grad_entropy_n is None:
        grad_nV = p_nV.mul_(-g_n[:, None])
    else:
        mean_z_n1 = (p_nV * z_nV).sum(-1, keepdim=True)
        grad_nV = p_nV.mul_(z_nV.sub_(mean_z_n1).mul_(-grad_entropy_n[:, None]).sub_(g_n[:, None]))
    grad_nV.scatter_add_(-1, tokens_n[:, None], g_n[:, None])
    return grad_nV.div_(temperature) if temperature != 1.0 else grad_nV


def _token_mean(x_BT: Tensor, mask_BT: Tensor, num_tokens: Tensor | float | None) -> Tensor:
    if num_tokens is None:
        num_tokens = mask_BT.sum()
    if isinstance(num_tokens, Tensor):
        return masked_sum(x_BT, mask_BT) / num_tokens.clamp(min=1)
    return masked_sum(x_BT, mask_BT) / max(num_tokens, 1.0)


class Denominators(NamedTuple):
    """The counts of one whole minibatch (all data-parallel ranks) that its losses divide by."""

    num_tokens: Tensor
    """Real response tokens."""
    num_responses: Tensor
    """Responses (rows with at least one real token)."""
    norm_tokens: float = 1.0
    """seq_mean_token_sum_norm's constant (Dr. GRPO: the generation budget)."""


def aggregate(loss_BT: Tensor, mask_BT: Tensor, agg: LossAgg, den: Denominators) -> Tensor:
    """One minibatch's (or this rank's share of its) loss from per-token losses, as ``agg`` says.

        token_mean:               sum_bt l_bt / num_tokens
        seq_mean_token_mean:      sum_b (sum_t l_bt / T_b) / num_responses        (T_b: b's real tokens)
        seq_mean_token_sum_norm:  sum_bt l_bt / (num_responses * norm_tokens)

    Worked example: l = [[1, 1, 1, 1], [4, 0, 0, 0]] with mask [[1, 1, 1, 1], [1, 0, 0, 0]] (5 tokens, 2
    responses, norm 4): token_mean 8 / 5 = 1.6; seq_mean_token_mean (1 + 4) / 2 = 2.5; token_sum_norm 8 / 8 = 1.
    """
    if agg == LossAgg.token_mean:
        return _token_mean(loss_BT, mask_BT, den.num_tokens)
    if agg == LossAgg.seq_mean_token_mean:
        per_response = masked_sum(loss_BT, mask_BT, dim=1) / mask_BT.sum(1).clamp(min=1)
        return _divide(per_response.sum(), den.num_responses)
    if agg == LossAgg.seq_mean_token_sum_norm:
        return _divide(masked_sum(loss_BT, mask_BT), den.num_responses) / den.norm_tokens
    raise ValueError(f"unknown loss aggregation {agg!r}")


def _divide(total: Tensor, count: Tensor | float) -> Tensor:
    return total / count.clamp(min=1) if isinstance(count, Tensor) else total / max(count, 1.0)


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
    old_logprobs_BT: Tensor | None,
    advantages_BT: Tensor,
    mask_BT: Tensor,
    clip_eps: float,
    num_tokens: Tensor | float | None = None,
    agg: LossAgg = LossAgg.token_mean,
    den: Denominators | None = None,
) -> tuple[Tensor, PolicyLossStats]:
    """PPO-clip:  L = agg_t max(-A_t * r_t, -A_t * clip(r_t, 1 - eps, 1 + eps)),  r_t = pi / pi_old.

    Args:
        logprobs_BT: log pi(a_t|s_t) under the current parameters (with grad), [B, T].
        old_logprobs_BT: log pi_old(a_t|s_t) from the rollout policy, [B, T]; None: ``logprobs_BT`` detached
            (one optimizer step per batch, ``ppo.config.reuses_update_logprobs``: r_t is exactly 1, its
            gradient that of log pi).
        advantages_BT: [B, T].
        mask_BT: 1 on real response tokens, [B, T].
        clip_eps: eps.
        num_tokens: denominator of the token mean (see the module docstring); the stats' always.
        agg, den: the loss's aggregation and its denominators (``aggregate``); None: a token mean over
            ``num_tokens``.

    Returns:
        loss: scalar to minimize.
        stats: PolicyLossStats.
    """
    log_ratio_BT = logprobs_BT - (logprobs_BT.detach() if old_logprobs_BT is None else old_logprobs_BT)
    ratio_BT = torch.exp(log_ratio_BT)
    pg_loss_unclipped_BT = -advantages_BT * ratio_BT
    pg_loss_clipped_BT = -advantages_BT * torch.clamp(ratio_BT, 1.0 - clip_eps, 1.0 + clip_eps)
    pg_loss_BT = torch.max(pg_loss_unclipped_BT, pg_loss_clipped_BT)
    if den is None:
        loss = _token_mean(pg_loss_BT, mask_BT, num_tokens)
    else:
        loss = aggregate(pg_loss_BT, mask_BT, agg, den)
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
