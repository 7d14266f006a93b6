"""Choosing the Clip threshold eta from the initial policy's step scores.

Under Clip a step gets ``min(c_k - eta, 0)``: zero when ``c_k >= eta``. The reward paper wants most
steps at zero and only low-quality steps penalised, but gives no value for eta. So we state the
fraction of steps that should get zero and read eta off the initial rollouts' score distribution.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def eta_for_zero_fraction(
    step_scores: Sequence[Sequence[float]] | torch.Tensor, zero_fraction: float, step_mask: torch.Tensor | None = None
) -> float:
    """eta such that ``zero_fraction`` of the given steps score ``c_k >= eta`` (Clip gives them 0).

    ``step_scores`` is one list of scores per response, or a padded ``[B, S]`` tensor with its
    ``step_mask`` ([B, S] bool, true on real steps): padding is not a step and must not be counted
    (zeros there would pull eta down). A tensor without a mask must be 1-D (every entry a step).

    With n scores and m = round(zero_fraction * n): eta is the m-th largest score (ties can only
    raise the zero fraction); m = 0 gives eta = 1 (the largest allowed value).
    Worked example: scores 0.1, 0.2, ..., 1.0 and zero_fraction 0.8 -> m = 8 -> eta = 0.3; the
    eight steps scoring 0.3..1.0 get 0 and the two below get -0.2 and -0.1.
    """
    if not 0.0 <= zero_fraction <= 1.0:
        raise ValueError(f"zero_fraction={zero_fraction}: must lie in [0, 1]")
    if isinstance(step_scores, torch.Tensor):
        if step_mask is not None:
            if step_mask.shape != step_scores.shape:
                raise ValueError(
                    f"step_mask {tuple(step_mask.shape)} does not match step_scores {tuple(step_scores.shape)}"
                )
            flat = step_scores[step_mask.bool()].tolist()
        elif step_scores.dim() == 1:
            flat = step_scores.tolist()
        else:
            raise ValueError(f"padded step scores {tuple(step_scores.shape)} need a step_mask (padding is not a step)")
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
