"""What the run and sweep pictures draw: panels only for what a run logged, a headline that says what happened."""

from __future__ import annotations

from trainer.metrics import CURVES, drawn
from trainer.summarize import _headline


def test_a_success_only_run_draws_no_learned_reward_panels():
    rows = [
        {"iteration": 1, "reward/learned": 0.0, "kl/mean": 0.0, "reward/success": 0.3},
        {"iteration": 2, "reward/learned": 0.0, "kl/mean": 0.3, "reward/success": 0.4},
    ]
    assert [c.key for c in drawn(CURVES, rows)] == ["reward/success", "kl/mean"]
    rows[1]["reward/learned"] = 1.5  # a PRM run: now there is a learned reward to show
    assert [c.key for c in drawn(CURVES, rows)] == ["reward/success", "reward/learned", "kl/mean"]


def test_every_panel_names_its_unit():
    assert all(c.ylabel and c.title for c in CURVES)


def test_headline_of_one_option_and_of_several():
    rows = [
        {"reward": "success", "iterations": 20, "greedy_before": 0.4, "greedy_after": 0.6},
        {"reward": "success", "iterations": 20, "greedy_before": 0.5, "greedy_after": 0.7},
    ]
    assert _headline(rows, ["success"]) == (
        "success, 2 seeds, 20 iterations: held-out greedy success 0.450 -> 0.650 (mean over seeds)"
    )
    rows += [
        {"reward": "prm", "iterations": 20, "greedy_before": 0.4, "greedy_after": 0.2},
        {"reward": "prm", "iterations": 20, "greedy_before": 0.5, "greedy_after": 0.3},
    ]
    assert _headline(rows, ["success", "prm"]) == (
        "2 reward options, 2 seeds, 20 iterations each: final held-out greedy success (mean over seeds) highest "
        "with success (0.650), lowest with prm (0.250)"
    )
