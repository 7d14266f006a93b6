"""Clip, Delta and Clip-Delta: per-step PRM scores -> per-step rewards (reward paper, section 2).

``c_k`` in [0, 1] is the PRM score of the prefix ending at step k, for k = 1..K. Every function
returns one reward per step, the same length as its input:

- none:        r_k = c_k                               (raw PRM: the sum grows with K, hackable)
- clip:        r_k = min(c_k - eta, 0)                 (each r_k <= 0, so extra steps never help)
- delta:       r_k = c_k - c_{k+1} for k < K-1,  r_{K-1} = c_{K-1},  r_K = 0
               (sum_k r_k telescopes to c_1, whatever K is)
- clip_delta:  delta(clip(c, eta))                     (bounded above and below, independent of K)

Delta written another way: drop the last score (the success reward already judges the final step),
``c'_k = c_k`` for k < K and ``c'_K = 0``, then take forward differences ``r_k = c'_k - c'_{k+1}``
with ``c'_{K+1} = 0``. The batched versions use that form, which needs no special cases.

The 1-D functions take one response's ``[K]`` scores (K >= 1). The ``*_batched`` functions take a
padded ``[B, S]`` tensor with a boolean ``[B, S]`` step mask whose true entries are a prefix of each
row (response b has K_b = mask[b].sum() steps); entries past K_b come back as exactly 0, whatever
the padding holds: padding is selected away (``torch.where``), never multiplied by 0, because
NaN * 0 and inf * 0 are NaN.
"""

from __future__ import annotations

import torch

from rewards.config import Refinement


def clip(step_scores: torch.Tensor, eta: float) -> torch.Tensor:
    """r_k = min(c_k - eta, 0).  [K] -> [K]"""
    return (step_scores - eta).clamp(max=0.0)


def delta(step_scores: torch.Tensor) -> torch.Tensor:
    """r_k = c_k - c_{k+1} (k < K-1), r_{K-1} = c_{K-1}, r_K = 0; for K = 1, r_1 = 0.  [K] -> [K]"""
    dropped_last = step_scores.clone()
    dropped_last[-1:] = 0.0  # c'_K = 0
    next_scores = torch.cat([dropped_last[1:], dropped_last.new_zeros(1)])  # c'_{k+1}, with c'_{K+1} = 0
    return dropped_last - next_scores


def clip_delta(step_scores: torch.Tensor, eta: float) -> torch.Tensor:
    """Delta on the clipped scores: c~_k = min(c_k - eta, 0), then r = delta(c~).  [K] -> [K]"""
    return delta(clip(step_scores, eta))


def refine(step_scores: torch.Tensor, refinement: Refinement, eta: float) -> torch.Tensor:
    """Per-step rewards for one response under ``refinement``.  [K] -> [K]"""
    if refinement == Refinement.none:
        return step_scores.clone()
    if refinement == Refinement.clip:
        return clip(step_scores, eta)
    if refinement == Refinement.delta:
        return delta(step_scores)
    if refinement == Refinement.clip_delta:
        return clip_delta(step_scores, eta)
    raise ValueError(f"unknown refinement {refinement!r}: expected one of {[r.value for r in Refinement]}")


def _zero_where_not(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x where mask, else exactly 0 (also where x is NaN or inf)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def clip_batched(step_scores: torch.Tensor, step_mask: torch.Tensor, eta: float) -> torch.Tensor:
    """clip() on every row.  scores [B, S], mask [B, S] bool -> [B, S], 0 past each row's K."""
    return _zero_where_not(clip(_zero_where_not(step_scores, step_mask), eta), step_mask)


def delta_batched(step_scores: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
    """delta() on every row.  scores [B, S], mask [B, S] bool (a prefix per row) -> [B, S]."""
    num_steps = step_mask.sum(dim=1, keepdim=True)  # [B, 1]
    index = torch.arange(step_scores.shape[1], device=step_scores.device)  # [S]
    keep = step_mask.bool() & (index < num_steps - 1)  # steps 1..K-1: c'_K = 0 and padding = 0
    dropped_last = _zero_where_not(step_scores, keep)
    next_scores = torch.nn.functional.pad(dropped_last[:, 1:], (0, 1))  # c'_{k+1}
    return _zero_where_not(dropped_last - next_scores, step_mask)


def clip_delta_batched(step_scores: torch.Tensor, step_mask: torch.Tensor, eta: float) -> torch.Tensor:
    """clip_delta() on every row.  scores [B, S], mask [B, S] bool -> [B, S]."""
    return delta_batched(clip_batched(step_scores, step_mask, eta), step_mask)


def refine_batched(
    step_scores: torch.Tensor, step_mask: torch.Tensor, refinement: Refinement, eta: float
) -> torch.Tensor:
    """Per-step rewards for a padded batch.  scores [B, S], mask [B, S] bool -> [B, S], 0 where masked."""
    if refinement == Refinement.none:
        return _zero_where_not(step_scores.clone(), step_mask)
    if refinement == Refinement.clip:
        return clip_batched(step_scores, step_mask, eta)
    if refinement == Refinement.delta:
        return delta_batched(step_scores, step_mask)
    if refinement == Refinement.clip_delta:
        return clip_delta_batched(step_scores, step_mask, eta)
    raise ValueError(f"unknown refinement {refinement!r}: expected one of {[r.value for r in Refinement]}")
