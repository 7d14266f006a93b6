"""Typed reward config: the `reward/` config group composes onto this schema."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class RewardKind(Enum):
    success = "success"
    """Correct(q, s) in {0, 1} on the final token only."""
    orm = "orm"
    """success + alpha * ORM(q, s) on the final token."""
    prm = "prm"
    """success + alpha * refined PRM step rewards on each step's last token."""


class Refinement(Enum):
    none = "none"
    """Raw PRM: r_k = c_k (hackable: more steps, more reward)."""
    clip = "clip"
    """r_k = min(c_k - eta, 0)."""
    delta = "delta"
    """r_k = c_k - c_{k+1} (k < K-1), r_{K-1} = c_{K-1}, r_K = 0."""
    clip_delta = "clip_delta"
    """Clip, then Delta on the clipped scores."""


@dataclass
class RewardModelConfig:
    path: str = ""
    """HF directory of the reward model, or `builtin:synthetic-prm` / `builtin:synthetic-orm`."""


@dataclass
class RewardConfig:
    kind: RewardKind = RewardKind.success
    refinement: Refinement = Refinement.none
    alpha: float = 1.0
    """Weight of the learned reward relative to the success reward (weight 1)."""
    eta: float = 0.5
    """Clip threshold in [0, 1]."""
    step_delimiter: str = "\n\n"
    model: RewardModelConfig = field(default_factory=RewardModelConfig)

    def __post_init__(self) -> None:
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"reward.eta={self.eta}: must lie in [0, 1]")
        if self.kind != RewardKind.success and not self.model.path:
            raise ValueError(f"reward.kind={self.kind.value} needs reward.model.path (an HF dir or builtin:...)")
        if self.kind != RewardKind.prm and self.refinement != Refinement.none:
            raise ValueError(f"reward.refinement={self.refinement.value} only applies to reward.kind=prm")
