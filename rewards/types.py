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


# Batch means taken over steps rather than responses (merged weighted by each part's number of steps).
STEP_METRICS = ("reward/step_score", "reward/zero_clip_fraction", "reward/nonzero_step_fraction")


def merge_reward_batches(parts: Sequence[RewardBatch]) -> RewardBatch:
    """One ``RewardBatch`` for the concatenated responses of ``parts`` (reward replicas that each scored
    a contiguous slice of one batch): tensors and lists concatenated, token rewards zero-padded to the
    longest response, and the batch means re-weighted: by responses, by steps for ``STEP_METRICS``;
    ``reward/eta`` and ``reward/alpha`` must agree, ``reward/learned_std`` is recomputed. Worked example: parts of 1 and 3 responses with ``reward/success`` 1.0
    and 0.0 merge to 0.25.
    """
    parts = [p for p in parts if len(p.success)] or list(parts[:1])
    if len(parts) == 1:
        return parts[0]
    num_tokens = max(p.token_rewards.shape[1] for p in parts)
    padded = [torch.nn.functional.pad(p.token_rewards, (0, num_tokens - p.token_rewards.shape[1])) for p in parts]
    metrics: dict[str, float] = {}
    for key in dict.fromkeys(k for p in parts for k in p.metrics):
        present = [p for p in parts if key in p.metrics]
        if key in ("reward/eta", "reward/alpha"):
            if len({p.metrics[key] for p in present}) > 1:
                raise ValueError(f"reward replicas disagree on {key}: {[p.metrics[key] for p in present]}")
            metrics[key] = present[0].metrics[key]
            continue
        weights = [sum(map(len, p.step_scores)) if key in STEP_METRICS else len(p.success) for p in present]
        metrics[key] = sum(w * p.metrics[key] for w, p in zip(weights, present)) / max(sum(weights), 1)
    learned = torch.cat([p.learned for p in parts])
    if "reward/learned_std" in metrics:  # a spread is not a mean: recomputed over all responses
        metrics["reward/learned_std"] = float(learned.std(correction=0))
    return RewardBatch(
        token_rewards=torch.cat(padded),
        success=torch.cat([p.success for p in parts]),
        learned=learned,
        step_scores=[c for p in parts for c in p.step_scores],
        num_steps=torch.cat([p.num_steps for p in parts]),
        extracted=[e for p in parts for e in p.extracted],
        metrics=metrics,
    )
