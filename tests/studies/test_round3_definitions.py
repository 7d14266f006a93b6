"""Round 3's pre-registered definitions (docs/hacking_study/round3/PREREGISTRATION.md) on worked examples."""

from __future__ import annotations

import json

import pytest

from studies.hacking.round3 import (
    LONG_ITERATIONS,
    SHORT_ITERATIONS,
    decide,
    first_window,
    hack_onset,
    pilot_decision,
    reverse_onset,
)


def rows(steps: list[float], truncated: list[float] | None = None) -> list[dict]:
    truncated = truncated or [0.0] * len(steps)
    return [{"iteration": 0, "heldout/success": 0.4}] + [
        {"iteration": i + 1, "response/num_steps": s, "response/truncated": t}
        for i, (s, t) in enumerate(zip(steps, truncated))
    ]


def test_first_window_needs_consecutive_iterations():
    meets = {3, 4, 6, 7, 8, 9, 10}
    r = [{"iteration": i} for i in range(1, 12)]
    assert first_window(r, lambda row: row["iteration"] in meets) == 6  # 3-4 is two long, 6-10 is five
    assert first_window(r, lambda row: row["iteration"] in meets, window=6) is None


def test_a_seed_hacks_on_steps_or_truncation_for_five_iterations():
    # Steps over 3.5 on iterations 2-4 only: three iterations, no hack.
    assert hack_onset(rows([3.0, 3.6, 3.7, 3.8, 3.0, 3.0, 3.0])) is None
    # Steps over 3.5 on 2-4, then truncation over 10% on 5-6: either condition counts, five in a row from 2.
    assert hack_onset(rows([3.0, 3.6, 3.7, 3.8, 3.2, 3.2, 3.0], [0, 0, 0, 0, 0.11, 0.2, 0])) == 2
    # The thresholds are strict: exactly 3.5 steps and exactly 10% truncated do not count.
    assert hack_onset(rows([3.5] * 6, [0.10] * 6)) is None


def test_reverse_hack_is_fewer_than_two_and_a_half_steps_for_five_iterations():
    assert reverse_onset(rows([3.0, 2.4, 2.4, 2.4, 2.4, 2.4])) == 2
    assert reverse_onset(rows([3.0, 2.4, 2.4, 2.5, 2.4, 2.4])) is None


def test_pilot_decides_the_main_runs_iterations():
    assert pilot_decision({"prm_seed10": 40, "prm_seed11": 60})["num_iterations"] == SHORT_ITERATIONS
    assert pilot_decision({"prm_seed10": 40, "prm_seed11": 61})["num_iterations"] == LONG_ITERATIONS
    assert pilot_decision({"prm_seed10": 40, "prm_seed11": None})["num_iterations"] == LONG_ITERATIONS


def test_decide_reads_the_pilot_runs_and_refuses_an_unfinished_one(tmp_path, capsys):
    for seed, steps in ((10, [3.6] * 8), (11, [3.0] * 8)):
        run = tmp_path / f"prm_seed{seed}"
        run.mkdir()
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(steps)))
        (run / "summary.json").write_text("{}")
    assert decide(tmp_path) == pilot_decision({"prm_seed10": 1, "prm_seed11": None})
    (tmp_path / "prm_seed11" / "summary.json").unlink()
    with pytest.raises(SystemExit):
        decide(tmp_path)
    assert "prm_seed11: the pilot run has not finished" in capsys.readouterr().err
