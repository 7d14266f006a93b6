"""runtime/processes.py on real processes: a driver stand-in that starts the watchdog, a child of its own
and a process that leaves its tree (as Ray's agents do when the raylet dies); SIGKILL of the driver, its
orderly close, and the next launch's clean-up of a record, by pid and start time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runtime.processes import (
    GRACE_S,
    POLL_S,
    Proc,
    RunInUse,
    descendants,
    end_left_over,
    is_running,
    read_record,
    this_process,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")

DRIVER = textwrap.dedent(
    """
    import subprocess, sys, time
    from pathlib import Path
    from runtime.processes import ProcessGuard

    record, orphan_file, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    guard = ProcessGuard.start(record)
    helper = subprocess.Popen(["sleep", "600"])
    # A shell that starts a background sleep and exits after 3 s: the sleep is then reparented away from
    # this process's tree, like Ray's dashboard agent when the raylet dies.
    subprocess.Popen(["sh", "-c", f"sleep 600 & echo $! > {orphan_file}; sleep 3"])
    print(helper.pid, flush=True)
    if mode == "close":
        sys.stdin.readline()
        guard.close()
        print("closed", flush=True)
    time.sleep(600)
    """
)


def _proc(pid: int) -> Proc:
    start = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    return Proc(pid, start)


def _start_driver(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, Proc, Proc, Path]:
    """The stand-in driver, its helper child and its orphan, once the watchdog has noted the orphan and
    the orphan has left the driver's tree."""
    record, orphan_file = tmp_path / "processes.json", tmp_path / "orphan.pid"
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(record), str(orphan_file), mode],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert driver.stdout is not None
    helper = _proc(int(driver.stdout.readline()))
    deadline = time.monotonic() + 60
    while not (orphan_file.exists() and orphan_file.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    orphan = _proc(int(orphan_file.read_text()))
    while orphan.pid not in {p.pid for p in read_record(record)[1]} or orphan in descendants([driver.pid]):
        assert time.monotonic() < deadline, "the watchdog did not note the orphan, or it never left the tree"
        time.sleep(0.1)
    return driver, helper, orphan, record


def _gone_within(procs: list[Proc], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(is_running(p) for p in procs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_descendants_follow_the_tree_from_a_table():
    me = this_process()
    table = {1: [me.pid], me.pid: []}
    assert descendants([1], table) == [Proc(me.pid, me.start, me.name)]
    assert descendants([me.pid], table) == []


def test_a_killed_driver_leaves_nothing_running(tmp_path):
    driver, helper, orphan, _ = _start_driver(tmp_path, "kill")
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    # The watchdog notices within a poll and ends both with SIGTERM (sleep does not ignore it).
    assert _gone_within([helper, orphan], POLL_S + GRACE_S + 5), (is_running(helper), is_running(orphan))


def test_an_orderly_close_ends_what_left_the_tree_and_leaves_the_drivers_helpers(tmp_path):
    driver, helper, orphan, record = _start_driver(tmp_path, "close")
    assert driver.stdin is not None and driver.stdout is not None
    driver.stdin.write("\n")
    driver.stdin.flush()
    assert driver.stdout.readline().strip() == "closed"
    try:
        assert not is_running(orphan)
        assert is_running(helper)  # the driver's own child: its business, not the watchdog's
        assert read_record(record)[1] == [], "the record names nothing once everything it noted has ended"
    finally:
        driver.kill()
        driver.wait()
        os.kill(helper.pid, signal.SIGKILL)


def _write(record: Path, driver: Proc, procs: list[Proc]) -> None:
    record.write_text(
        json.dumps({"driver": driver.__dict__, "watchdog": None, "processes": [p.__dict__ for p in procs]})
    )


def test_the_next_launch_ends_what_the_record_names_by_pid_and_start_time(tmp_path):
    finished = subprocess.Popen(["true"])
    dead_driver = _proc(finished.pid)
    finished.wait()
    left = subprocess.Popen(["sleep", "600"])
    other = subprocess.Popen(["sleep", "600"])
    try:
        reused = Proc(other.pid, _proc(other.pid).start + 1)  # its pid, another start: another process
        record = tmp_path / "processes.json"
        _write(record, dead_driver, [_proc(left.pid), reused])
        lines: list[str] = []
        ended = end_left_over(record, lines.append)
        left.wait(timeout=GRACE_S + 5)
        assert [p.pid for p in ended] == [left.pid] and other.poll() is None
        assert len(lines) == 1 and f"{left.pid} (sleep)" in lines[0] and str(record) in lines[0]
    finally:
        for p in (left, other):
            p.kill()
            p.wait()


def test_the_next_launch_refuses_while_the_recorded_driver_still_runs(tmp_path):
    running_driver = subprocess.Popen(["sleep", "600"])
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        record = tmp_path / "processes.json"
        _write(record, _proc(running_driver.pid), [_proc(bystander.pid)])
        with pytest.raises(RunInUse, match=f"another launch \\(pid {running_driver.pid}\\) is running in {tmp_path}"):
            end_left_over(record, print)
        assert bystander.poll() is None
    finally:
        for p in (running_driver, bystander):
            p.kill()
            p.wait()
