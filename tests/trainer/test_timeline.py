"""Call spans of an iteration (seconds into it) and the timeline picture."""

from __future__ import annotations

import pytest

from runtime.driver import Event
from trainer.timeline import busy_seconds, call_spans, plot_timeline


def test_call_spans_and_timeline(tmp_path):
    t0 = 100.0
    events = [
        Event("actor_train", 0, 102.0, 105.0),
        Event("actor_train", 1, 102.1, 105.2),
        Event("critic_train", 2, 102.0, 104.0),
        Event("reward", -1, 101.0, 101.5),
    ]
    spans = call_spans(events, t0)
    assert spans["call/actor_train/start_s"] == pytest.approx(2.0)
    assert spans["call/actor_train/end_s"] == pytest.approx(5.2)
    assert spans["call/critic_train/end_s"] == pytest.approx(4.0)
    out = plot_timeline(events, t0, tmp_path / "timeline.png")
    assert out.exists() and out.stat().st_size > 1000 and not (tmp_path / "timeline.tmp.png").exists()


def test_busy_seconds_count_overlapping_calls_once():
    events = [Event("a", 0, 0.0, 3.0), Event("b", 0, 2.0, 5.0), Event("c", 1, 1.0, 2.0)]
    assert busy_seconds(events) == {0: 5.0, 1: 1.0}
