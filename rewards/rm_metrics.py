"""Held-out quality of a reward model: accuracies at threshold 0.5, majority baselines and AUCs."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import torch

from rewards.rm_config import RMKind
from rewards.rm_encode import Encoded, collate


def auc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """Area under the ROC curve: the chance that a random positive outscores a random negative (ties
    count half). 0.5 for a constant score, whatever the class balance; nan if one class is absent."""
    positives = [s for s, y in zip(scores, labels) if y]
    negatives = [s for s, y in zip(scores, labels) if not y]
    if not positives or not negatives:
        return float("nan")
    ranked = sorted(negatives)
    wins = sum(
        bisect.bisect_left(ranked, p) + 0.5 * (bisect.bisect_right(ranked, p) - bisect.bisect_left(ranked, p))
        for p in positives
    )
    return wins / (len(positives) * len(negatives))


@torch.inference_mode()
def heldout_metrics(
    reader, data: Sequence[Encoded], pad_id: int, kind: RMKind, device: str, batch_size: int = 64
) -> dict[str, Any]:
    """Held-out accuracies at threshold 0.5, with what a constant would get, and AUCs.

    step_*: every step's score vs its label (PRM). final_*: the score at the last read (the last step
    for a PRM, the response for an ORM) vs the final label. final_min_*: a PRM's lowest step score over
    the response, the solution score PRMs are ranked by as verifiers (Lightman et al. 2023, Math-Shepherd):
    one bad step makes the solution bad, while the last step alone may look fine after an earlier slip.
    The majority baseline is the accuracy of always answering the more common label; AUC is
    threshold-free (0.5 = no better than a constant).
    """
    step_scores: list[float] = []
    step_labels: list[int] = []
    final_scores: list[float] = []
    min_scores: list[float] = []
    running_min = float("inf")  # a response's windows are consecutive and end with is_last_window
    final_labels = [e.final_label for e in data if e.is_last_window]
    for first in range(0, len(data), batch_size):
        batch = data[first : first + batch_size]
        ids, mask, rows, cols, _ = collate(batch, pad_id)
        scores = torch.sigmoid(reader(ids.to(device), mask.to(device), rows.to(device), cols.to(device))).cpu().tolist()
        position = 0
        for e in batch:
            mine = scores[position : position + len(e.reads)]
            position += len(e.reads)
            running_min = min([running_min, *mine])
            if e.is_last_window:
                final_scores.append(mine[-1])
                min_scores.append(running_min)
                running_min = float("inf")
            step_scores += mine
            step_labels += [int(y >= 0.5) for y in e.labels]

    def accuracy(scores: Sequence[float], labels: Sequence[int]) -> float:
        return sum((s >= 0.5) == bool(y) for s, y in zip(scores, labels)) / len(labels)

    def majority(labels: Sequence[int]) -> float:
        return max(sum(labels), len(labels) - sum(labels)) / len(labels)

    by_source: dict[str, list[int]] = {}
    for e, s in zip([e for e in data if e.is_last_window], final_scores):
        by_source.setdefault(e.source, []).append(int((s >= 0.5) == bool(e.final_label)))
    metrics: dict[str, Any] = {
        "final_accuracy": accuracy(final_scores, final_labels),
        "final_majority_baseline": majority(final_labels),
        "final_auc": auc(final_scores, final_labels),
        "num_heldout_responses": len(data),
        "final_accuracy_by_source": {k: sum(v) / len(v) for k, v in sorted(by_source.items())},
    }
    if kind == RMKind.prm:
        metrics.update(
            step_accuracy=accuracy(step_scores, step_labels),
            step_majority_baseline=majority(step_labels),
            step_auc=auc(step_scores, step_labels),
            final_min_accuracy=accuracy(min_scores, final_labels),
            final_min_auc=auc(min_scores, final_labels),
            num_heldout_steps=len(step_labels),
        )
    return metrics


def accuracies_line(metrics: dict[str, Any]) -> str:
    keys = ("step_accuracy", "step_auc", "final_accuracy", "final_auc", "final_min_auc")
    return ", ".join(f"{k} {metrics[k]:.3f}" for k in keys if k in metrics)
