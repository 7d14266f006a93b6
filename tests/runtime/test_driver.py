"""The driver's own pieces: how a call's input is cut over replicas, and how results come back."""

from __future__ import annotations

import pytest
import torch

from rewards.types import RewardBatch
from runtime.dispatch import Gather
from runtime.driver import _gathered, split_rows


def test_row_slices_cover_the_batch_in_order():
    batch = {"x": torch.arange(10), "y": torch.arange(10) * 2}
    parts = split_rows(batch, 3)
    assert [p["x"].tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert [p["y"].tolist() for p in parts] == [[0, 2, 4, 6], [8, 10, 12], [14, 16, 18]]
    assert split_rows(["a", "b", "c", "d", "e"], 2) == [["a", "b", "c"], ["d", "e"]]  # reward samples
    with pytest.raises(ValueError, match="2 rows cannot feed 3"):
        split_rows({"x": torch.arange(2)}, 3)


def test_results_come_back_from_each_replicas_reporting_device_in_replica_order():
    # Two replicas of two devices each (reporting devices 1 and 3): only their rows count, in replica order.
    values = {("ref_inf", d): torch.full((2, 1), float(d)) for d in (0, 1, 2, 3)}
    assert _gathered(Gather.concat, values, [1, 3]).flatten().tolist() == [1.0, 1.0, 3.0, 3.0]
    stats = {("actor_train", d): {"loss": 0.5} for d in (0, 1)}
    assert _gathered(Gather.first, stats, [0]) == {"loss": 0.5}
    assert _gathered(Gather.none, stats, [0]) is None
    reward = {
        ("rew_inf", d): RewardBatch(
            token_rewards=torch.tensor([[float(d)]]),
            success=torch.tensor([float(d > 1)]),
            learned=torch.zeros(1),
            step_scores=[[]],
            num_steps=torch.tensor([1]),
            extracted=[None],
            metrics={"reward/success": float(d > 1)},
        )
        for d in (1, 3)
    }
    merged = _gathered(Gather.merge_rewards, reward, [1, 3])
    assert merged.success.tolist() == [0.0, 1.0] and merged.metrics["reward/success"] == 0.5
