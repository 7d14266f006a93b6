"""Choosing the Clip threshold eta from the initial policy's step scores.

Under Clip a step gets ``min(c_k - eta, 0)``: zero when ``c_k >= eta``. The reward paper wants most
steps at zero and only low-quality steps penalised, but gives no value for eta. So we state the
fraction of steps that should get zero and read eta off the initial rollouts' score distribution.
"""
from __future__ import annotations

from typing import Sequence

import torch


def eta_for_zero_fraction(step_scores: Sequence[Sequence[float]] | torch.Tensor, zero_fraction: float) -> float:
    """eta such that ``zero_fraction`` of the given steps score ``c_k >= eta`` (Clip gives them 0).

    With n scores and m = round(zero_fraction * n): eta is the m-th largest score (ties can only
    raise the zero fraction); m = 0 gives eta = 1 (the largest allowed value).
    Worked example: scores 0.1, 0.2, ..., 1.0 and zero_fraction 0.8 -> m = 8 -> eta = 0.3; the
    eight steps scoring 0.3..1.0 get 0 and the two below get -0.2 and -0.1.
    """
    if not 0.0 <= zero_fraction <= 1.0:
        raise ValueError(f"zero_fraction={zero_fraction}: must lie in [0, 1]")
    if isinstance(step_scores, torch.Tensor):
        flat = step_scores.flatten().tolist()
    else:
        flat = [float(c) for scores in step_scores for c in scores]
    if not flat:
        raise ValueError("no step scores to choose eta from (no response had a step)")
    ordered = sorted(flat, reverse=True)
    num_zero = round(zero_fraction * len(ordered))
    if num_zero == 0:
        return 1.0
    return min(max(ordered[num_zero - 1], 0.0), 1.0)


def zero_fraction(step_scores: Sequence[Sequence[float]], eta: float) -> float:
    """The fraction of steps that Clip at ``eta`` gives zero reward (c_k >= eta)."""
    flat = [c for scores in step_scores for c in scores]
    return sum(1 for c in flat if c >= eta) / len(flat) if flat else 1.0
