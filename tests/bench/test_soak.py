"""bench/soak.py's pure parts, by worked examples: naming a run's processes from its records and the
process tree, tagging samples with the running iteration, per-iteration series and their growth, and the
report and picture built from them. The soak itself (300 iterations, about an hour) runs by hand; its
result is docs/soak/soak.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.soak import (
    Labels,
    ProcInfo,
    Sample,
    classify,
    growth,
    growths,
    heldout,
    largest,
    last_iteration,
    parse_args,
    per_iteration,
    plot,
    report,
    running_iteration,
    this_launchs,
    value_at,
)

GRADER = "/venv/bin/python -c import sys; sys.path.insert(0, '/repo'); from mathtask.grading.worker import main; main()"
PYTHON_C = "/venv/bin/python -c import sys; print(1)"


def _tree() -> dict[int, ProcInfo]:
    """A run as ps shows it: driver 10; its children the watchdog 11, Ray's GCS 12, dashboard 13, raylet 14
    and a grader worker 15; the raylet's children the device processes 20 and 21, their engines 22 and 23
    Ray's agent 24 and realm's reward actor 28 (named in its title while it starts); a grader worker 25
    under device 0, 29 under the reward actor, a process 26 under engine 1, and 27 under 26."""
    rows = [
        (11, 10, "/venv/bin/python -c import sys; from runtime.processes import Proc, watch; watch(...)"),
        (12, 10, "/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp/ray"),
        (13, 10, "/venv/bin/python /venv/lib/python3.11/site-packages/ray/dashboard/dashboard.py --host=127.0.0.1"),
        (14, 10, "/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=x"),
        (15, 10, GRADER),
        (20, 14, "ray::RayHost.run_timed"),
        (21, 14, "ray::RayHost"),
        (22, 14, "ray::RayHost"),
        (23, 14, "ray::RayHost"),
        (24, 14, "ray::DashboardAgent"),
        (25, 20, GRADER),
        (26, 23, PYTHON_C),
        (27, 26, GRADER),  # a grader boot line, but its parent is neither the driver nor a device process
        (28, 14, "ray::reward-0-0:RayHost.__init__"),
        (29, 28, GRADER),
    ]
    return {pid: ProcInfo(pid, ppid, cmd, 1000 * pid) for pid, ppid, cmd in rows}


PLACEMENT = {
    "0": {"pid": 20, "companion_pids": {"engine": 22}, "roles": ["actor", "engine"]},
    "1": {"pid": 21, "companion_pids": {"engine": 23}, "roles": ["critic", "engine"]},
}
RECORD = {"driver": {"pid": 10, "start": 1}, "watchdog": {"pid": 11, "start": 2}, "processes": []}


def test_classify_names_processes_by_the_run_records_and_the_tree():
    named = classify(_tree(), 10, PLACEMENT, RECORD)
    assert named == {
        10: ("driver", "driver"),
        11: ("watchdog", "watchdog"),
        12: ("ray", "ray gcs_server 12"),
        13: ("ray", "ray dashboard 13"),
        14: ("ray", "ray raylet 14"),
        15: ("grader", "grader 15 (driver)"),
        20: ("device", "device 0"),
        21: ("device", "device 1"),
        22: ("engine", "engine 0"),
        23: ("engine", "engine 1"),
        24: ("ray", "ray DashboardAgent 24"),
        25: ("grader", "grader 25 (device 0)"),
        26: ("other", "engine 1 child 26"),
        27: ("other", "engine 1 child 27"),
        28: ("host", "host reward-0-0"),
        29: ("grader", "grader 29 (host reward-0-0)"),
    }


def test_classify_keeps_a_label_a_later_title_would_change():
    """Ray retitles an actor as it runs calls: once ``ray::reward-0-0:RayHost.__init__`` is labelled, the
    same pid titled ``ray::RayHost.run_timed`` keeps the label, and an unnamed one is labelled by pid.
    A record's label wins over an earlier one (a device process seen before placement.json existed)."""
    tree = _tree()
    first = classify(tree, 10, {}, RECORD)
    assert first[20] == ("host", "host 20") and first[28] == ("host", "host reward-0-0")
    tree[28] = ProcInfo(28, 14, "ray::RayHost.run_timed", 1)
    assert classify(tree, 10, {}, RECORD)[28] == ("host", "host 28")
    later = classify(tree, 10, PLACEMENT, RECORD, known=first)
    assert later[28] == ("host", "host reward-0-0") and later[20] == ("device", "device 0")


def test_classify_before_the_records_exist():
    """Before placement.json is written, the device processes are realm's actors named by pid, their
    engines too, and the watchdog is Ray's until processes.json names it."""
    named = classify(_tree(), 10, {}, {})
    assert named[20] == ("host", "host 20") and named[23] == ("host", "host 23")
    assert named[11] == ("ray", "ray python 11")
    assert named[25] == ("grader", "grader 25 (host 20)")
    assert named[26] == ("other", "host 23 child 26")
    assert named[15] == ("grader", "grader 15 (driver)")


def test_classify_ignores_records_naming_processes_not_in_the_tree():
    """A placement.json left by an earlier launch names pids that are not this run's: they are not used."""
    stale = {"0": {"pid": 99, "companion_pids": {"engine": 98}}}
    named = classify(_tree(), 10, stale, {"watchdog": {"pid": 97}})
    assert set(named) == set(_tree()) | {10}
    assert all(kind != "device" and kind != "engine" for kind, _ in named.values())


def test_last_iteration_skips_a_line_cut_short_and_takes_the_largest():
    text = '{"iteration": 0, "heldout/success": 0.5}\n{"iteration": 1, "x": 2}\n{"iteration": 2, "x'
    assert last_iteration(text) == 1
    assert last_iteration("") is None
    assert last_iteration('{"iteration": 0}\nnot json\n{"other": 1}\n') == 0


def test_running_iteration_is_the_one_after_the_last_logged():
    assert running_iteration(None) == 0  # set-up and the held-out evaluation before training
    assert running_iteration(0) == 1
    assert running_iteration(299) == 300
    assert running_iteration(300) == 301  # after the last: left out of the series


def test_a_relaunch_ignores_the_rows_of_the_launch_before_it_until_it_rewrites_them():
    """A launch died after iteration 15 (checkpoint at 10): the relaunch's set-up samples belong to 0,
    not 16; once its writer has cut the file to the checkpoint's rows, iteration 11 is running."""
    left = "".join(f'{{"iteration": {i}}}\n' for i in range(16))
    assert running_iteration(last_iteration(this_launchs(left, modified_at=100.0, launched_at=200.0))) == 0
    cut = "".join(f'{{"iteration": {i}}}\n' for i in range(11))
    assert running_iteration(last_iteration(this_launchs(cut, modified_at=260.0, launched_at=200.0))) == 11


def _sample(iteration: int, **rss_mb: float) -> Sample:
    return Sample(0.0, iteration, {k.replace("_", " "): int(v * 1e6) for k, v in rss_mb.items()}, 1.0)


def test_per_iteration_keeps_each_iterations_largest_sample():
    samples = [_sample(0, a=500), _sample(1, a=100), _sample(1, a=120), _sample(3, a=130, b=5), _sample(4, a=999)]
    assert per_iteration(samples, 3) == {"a": [120.0, None, 130.0], "b": [None, None, 5.0]}


def test_value_at_falls_back_to_the_nearest_earlier_iteration():
    row: list[float | None] = [None, 10.0, None, None]
    assert value_at(row, 4) == 10.0
    assert value_at(row, 2) == 10.0
    assert value_at(row, 1) is None


def test_growth_worked_examples():
    assert growth([100.0, 101.0, 110.0, 120.0], 2, 4) == pytest.approx(120 / 101 - 1)
    assert growth([100.0, 101.0, 110.0, None], 2, 4) == pytest.approx(110 / 101 - 1)  # last unsampled: the one before
    assert growth([None, None, 110.0, 120.0], 2, 4) is None  # the process did not run at the first iteration
    assert growth([100.0, 90.0], 1, 2) == pytest.approx(-0.1)


def test_growths_over_the_last_window_and_the_largest_of_a_kind():
    """300 iterations, window 200: from iteration 100 to 300. The engine grows 1514 -> 1628 MB (7.53%), the
    driver 500 -> 505 (1%), Ray's raylet 30 -> 45 (50%), a grader started at 150 has no growth."""
    n = 300
    series: dict[str, list[float | None]] = {
        "engine 0": [1514.0 + max(0, i - 100) * 0.57 for i in range(1, n + 1)],
        "driver": [500.0] * 99 + [500.0] + [505.0] * 200,
        "ray raylet 14": [30.0] * 100 + [45.0] * 200,
        "grader 7 (driver)": [None] * 149 + [60.0] * 151,
    }
    grown = growths(series, n, 200)
    assert grown == {"engine 0": pytest.approx(1628 / 1514 - 1, abs=1e-4), "driver": 0.01, "ray raylet 14": 0.5}
    kinds = {"engine 0": "engine", "driver": "driver", "ray raylet 14": "ray", "grader 7 (driver)": "grader"}
    assert largest(grown, kinds, ("driver", "engine", "grader")) == ("engine 0", grown["engine 0"])
    assert largest(grown, kinds, ("ray",)) == ("ray raylet 14", 0.5)
    assert largest(grown, kinds, ("device",)) == (None, None)
    # A run shorter than the window: growth from iteration 1.
    assert growths({"a": [10.0, 11.0, 12.0]}, 3, 200) == {"a": 0.2}


def test_heldout_reads_the_lines_that_have_it():
    text = (
        '{"iteration": 0, "heldout/success": 0.5}\n{"iteration": 1}\n{"iteration": 2, "heldout/success": 0.75}\n{"iter'
    )
    assert heldout(text) == {0: 0.5, 2: 0.75}


def test_report_and_picture_from_samples(tmp_path: Path):
    """Three iterations, window 2 (from iteration 1): the driver 100 -> 110 MB, engine 0 200 -> 210, Ray's
    raylet 30 -> 60; held-out success 0.5 before, 0.6 at 2."""
    samples = [
        _sample(i, driver=d, engine_0=e, ray_raylet_14=r)
        for i, d, e, r in [(1, 100, 200, 30), (2, 105, 205, 40), (3, 110, 210, 60)]
    ]
    labels = Labels()
    for label, kind in (("driver", "driver"), ("engine 0", "engine"), ("ray raylet 14", "ray")):
        labels.note(label, kind, 1)
    metrics = '{"iteration": 0, "heldout/success": 0.5}\n{"iteration": 1}\n{"iteration": 2, "heldout/success": 0.6}\n{"iteration": 3}\n'
    data = report(samples, labels, metrics, 3, 2, {"command": "python train.py"})
    assert data["max_rss_growth_last_2"] == 0.1 and data["max_rss_growth_process"] == "driver"
    assert (data["ray_max_rss_growth"], data["ray_max_rss_growth_process"]) == (1.0, "ray raylet 14")
    assert (data["heldout_success_at_100"], data["heldout_success_final"]) == (None, 0.6)
    assert data["series"]["engine 0"] == [200.0, 205.0, 210.0]
    assert data["load"]["load_1min_mean"] == 1.0 and data["command"] == "python train.py"
    assert data["complete"] and data["growth_from_iteration"] == 1
    json.dumps(data)  # it is written as JSON
    png = tmp_path / "soak.png"
    plot(data, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-iterations", "0"], "argument --num-iterations: 0 must be > 0"),
        (["run.name=other"], "run.name=other: set it with --num-iterations, --eval-every or --name"),
        (["--windw", "3"], "--windw"),
    ],
)
def test_bad_options_end_with_one_error_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 1 and len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_overrides_after_the_options_go_to_train():
    args, overrides = parse_args(["--window", "50", "algorithm=grpo", "+reward=prm"])
    assert args.window == 50 and args.num_iterations == 300 and overrides == ["algorithm=grpo", "+reward=prm"]


def test_a_report_while_the_run_goes_on_ends_at_the_iterations_done():
    """300 iterations asked, 2 done, window 1: the series end at 2, the growth is from 1 to 2."""
    samples = [_sample(1, driver=100), _sample(2, driver=120), _sample(3, driver=500)]
    labels = Labels()
    labels.note("driver", "driver", 1)
    data = report(samples, labels, '{"iteration": 0, "heldout/success": 0.5}\n', 300, 1, {}, done=2)
    assert (data["num_iterations"], data["iterations_done"], data["complete"]) == (300, 2, False)
    assert data["series"]["driver"] == [100.0, 120.0] and data["max_rss_growth_last_1"] == 0.2
    assert data["heldout_success_final"] == 0.5
