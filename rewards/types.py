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
    problem_id: str = ""
    """The problem's id (named in a user reward function's errors, passed in its metadata)."""
    truncated: bool = False
    """The response hit the token cap."""


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
    function_values: list[float | list[float]] | None = None
    """The user reward function's value per response as it returned it (a float, or one per step), unweighted;
    None without one (``reward.function``)."""
    function_name: str | None = None
    """The user reward function's name (its metrics are ``reward/<name>``)."""


def function_metrics(name: str, values: Sequence[float | list[float]]) -> dict[str, float]:
    """``reward/<name>``: the mean over responses of each response's value (a per-step one summed), and
    ``reward/<name>_nonzero_fraction``: the fraction of values (responses, or steps) that are not 0.
    Worked example: 1.0, [0.5, 0.0] and 0.0 -> mean (1 + 0.5 + 0) / 3 = 0.5, 2 of 4 values non-zero -> 0.5."""
    flat = [x for v in values for x in (v if isinstance(v, list) else [v])]
    totals = [sum(v) if isinstance(v, list) else v for v in values]
    return {
        f"reward/{name}": sum(totals) / max(len(totals), 1),
        f"reward/{name}_nonzero_fraction": sum(x != 0 for x in flat) / max(len(flat), 1),
    }


class RewardFunctionError(RuntimeError):
    """A user reward function failed (an exception, a timeout, a non-finite value, a list of the wrong length,
    a file or name that is not there): the run stops with this one-line message."""


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
    values = [p.function_values for p in parts]
    function_values = None if any(v is None for v in values) else [x for v in values for x in v or []]
    name = parts[0].function_name
    if function_values is not None and name is not None:  # means over values, not over parts: recomputed
        metrics.update(function_metrics(name, function_values))
    return RewardBatch(
        token_rewards=torch.cat(padded),
        success=torch.cat([p.success for p in parts]),
        learned=learned,
        step_scores=[c for p in parts for c in p.step_scores],
        num_steps=torch.cat([p.num_steps for p in parts]),
        extracted=[e for p in parts for e in p.extracted],
        metrics=metrics,
        function_values=function_values,
        function_name=name,
    )
