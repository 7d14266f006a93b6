"""What the trainer hands the reward function and what it gets back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch


@dataclass
class RewardSample:
    """One response to score."""

    question: str
    gold: str
    dataset: str
    """Grader policy: "math" or "gsm8k"."""
    prompt_text: str
    """The exact prompt string fed to the policy (chat-templated)."""
    response_text: str
    """What the grader reads (the same decode the evaluation uses)."""
    response_token_ids: list[int]
    """As generated, possibly truncated (no EOS: the grader decides whether it still counts as correct)."""


@dataclass
class RewardBatch:
    token_rewards: torch.Tensor
    """[B, T] float32, T = the longest response: success + alpha * learned rewards on their tokens, 0 past
    each response. The KL term is not included (the trainer adds it)."""
    success: torch.Tensor
    """[B] 0/1 from the grader."""
    learned: torch.Tensor
    """[B] the total alpha * learned reward per response (alpha * ORM, or the sum of the refined PRM step
    rewards); 0 for success only."""
    step_scores: list[list[float]]
    """Raw PRM scores c_1..c_K per response ([] if the reward is not a PRM)."""
    num_steps: torch.Tensor
    """[B] steps per response (always counted: step inflation is how PRM hacking shows)."""
    extracted: list[str | None]
    """The grader's extracted final answers."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Batch means to log: reward/success, reward/num_steps, reward/learned, reward/step_score, reward/eta, ..."""


class RewardFn(Protocol):
    def __call__(self, samples: Sequence[RewardSample]) -> RewardBatch: ...
