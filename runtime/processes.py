"""The processes a run starts (Ray's local cluster, device processes, engines, grader workers), by id:
noted in the run directory while the driver lives, and ended once it is gone.

A driver killed with SIGKILL runs no cleanup of its own. Most of a local Ray follows it (the GCS and
the raylet exit when the driver's connection drops, and the raylet's workers with them), but Ray's
dashboard agent and runtime-env agent stay for minutes, and any process in the middle of a long call
stays until that call returns. So, without anything that depends on the driver's last moments:

- ``ProcessGuard.start(record)``: the driver starts a watchdog process (``watch``), its own child in a
  session of its own (a Ctrl-C or a kill of the driver's process group does not reach it). Every
  ``POLL_S`` it notes the driver's descendants, each by pid and start time, in ``record``
  (``<run_dir>/processes.json``). When the driver is gone (killed, or it crashed), or when the driver
  says it is done (``ProcessGuard.close``, after ``ray.shutdown()``), it ends every noted process that
  is still the same process: SIGTERM, then SIGKILL after ``GRACE_S``.
- ``end_left_over(record)``: the next launch into the same run directory ends whatever the record
  names that still runs (what a watchdog killed along with its driver left), before it starts Ray.

A process is ended only when its pid *and* its start time are the noted ones (a pid the kernel gave to
another process since is left alone), never by its name. Linux only (``/proc``); elsewhere the guard
does nothing.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

POLL_S = 1.0
"""How often the watchdog notes the driver's descendants and checks that the driver lives."""
GRACE_S = 3.0
"""Between SIGTERM and SIGKILL: Ray's raylet ends its own workers on SIGTERM."""
_ROOT = str(Path(__file__).resolve().parents[1])


@dataclass(frozen=True, order=True)
class Proc:
    """A process as the kernel names it: pid and start time (clock ticks after boot, /proc/PID/stat
    field 22), which together never name two processes."""

    pid: int
    start: int
    name: str = field(default="", compare=False)
    """/proc/PID/comm when noted: for messages only (a process may rename itself, as Ray's workers do)."""


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of ``pid`` from /proc, or None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces and parentheses.
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19]), fields[0]


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def this_process() -> Proc:
    found = _stat(os.getpid())
    return Proc(os.getpid(), found[1] if found else 0, _name(os.getpid()))


def is_running(proc: Proc) -> bool:
    """``proc`` still runs: its pid names a process with its start time that is not a zombie."""
    found = _stat(proc.pid)
    return found is not None and found[1] == proc.start and found[2] != "Z"


def children_table() -> dict[int, list[int]]:
    """Parent pid -> pids of its children, every process on the machine (one pass over /proc)."""
    table: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            found = _stat(int(entry.name))
            if found is not None:
                table.setdefault(found[0], []).append(int(entry.name))
    return table


def descendants(pids: Iterable[int], table: dict[int, list[int]] | None = None) -> list[Proc]:
    """Every process below ``pids`` in the process tree (not ``pids`` themselves), by pid.

    Worked example: table {1: [10], 10: [11, 12], 12: [13]} -> descendants([10]) are 11, 12, 13."""
    table = children_table() if table is None else table
    out: dict[int, Proc] = {}
    stack = list(pids)
    while stack:
        for child in table.get(stack.pop(), []):
            if child not in out:
                found = _stat(child)
                if found is not None:
                    out[child] = Proc(child, found[1], _name(child))
                    stack.append(child)
    return sorted(out.values())


def end_processes(procs: Iterable[Proc], grace_s: float = GRACE_S) -> list[Proc]:
    """End every one of ``procs`` that still runs, and what they started since they were noted: SIGTERM,
    then SIGKILL after ``grace_s``; returns the ones that were running."""
    noted = [Proc(p.pid, p.start, p.name or _name(p.pid)) for p in procs if is_running(p)]
    running = sorted(set(noted) | set(descendants([p.pid for p in noted])))
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, grace_s)):
        for p in running:
            if is_running(p):
                try:
                    os.kill(p.pid, sig)
                except OSError:
                    pass
        deadline = time.monotonic() + wait_s
        while any(is_running(p) for p in running) and time.monotonic() < deadline:
            time.sleep(0.05)
    return running


def _write_record(record: Path, driver: Proc, watchdog: Proc | None, procs: Iterable[Proc]) -> None:
    """``record``: the driver, the watchdog (None once it is done) and the noted processes."""
    from common.files import atomic_write_json

    as_json = [{"pid": p.pid, "start": p.start, "name": p.name} for p in sorted(procs)]
    try:
        atomic_write_json(
            record,
            {"driver": driver.__dict__, "watchdog": watchdog and watchdog.__dict__, "processes": as_json},
        )
    except OSError:  # a full disk: the watchdog keeps its notes in memory and still ends them
        pass


def read_record(record: Path) -> tuple[Proc | None, list[Proc]]:
    """(the driver, the other noted processes) of a record; (None, []) when there is none or it does not
    parse (a record cut short: nothing in it can be trusted to name a process)."""
    try:
        data = json.loads(record.read_text())
        procs = [Proc(int(p["pid"]), int(p["start"]), str(p.get("name", ""))) for p in data["processes"]]
        extra = [Proc(**data["watchdog"])] if data.get("watchdog") else []
        return Proc(**data["driver"]), procs + extra
    except (OSError, ValueError, KeyError, TypeError):
        return None, []


def in_use_by(record: Path) -> Proc | None:
    """The driver of another launch that noted its processes in ``record`` and still runs, or None."""
    driver, _ = read_record(record)
    return driver if driver is not None and driver.pid != os.getpid() and is_running(driver) else None


class RunInUse(RuntimeError):
    """Another launch, still running, recorded its processes in this run directory."""


def end_left_over(record: Path, log: Callable[[str], None] = print) -> list[Proc]:
    """End the processes an earlier launch noted in ``record`` that still run (its watchdog died with
    it), logging one line when there were any; RunInUse when that launch's driver still runs (two
    launches into one run directory would overwrite each other's checkpoints)."""
    driver, procs = read_record(record)
    if driver is None:
        return []
    if in_use_by(record) is not None:
        raise RunInUse(
            f"another launch (pid {driver.pid}) is running in {record.parent}: stop it first, or choose another run.name"
        )
    ended = end_processes(procs)
    if ended:
        named = ", ".join(f"{p.pid} ({p.name})" for p in ended)
        log(f"[processes] ended {len(ended)} processes an earlier launch left running, as {record} names them: {named}")
    return ended


def watch(driver: Proc, record: Path, poll_s: float = POLL_S) -> None:
    """The watchdog's loop (in its own process, a child of ``driver``): note the driver's descendants in
    ``record`` every ``poll_s``. Once the driver is gone, end every noted process; when the driver writes
    ``stop`` on our stdin instead (it shut Ray down and goes on), end the noted ones that are no longer
    its descendants (what outlived Ray's shutdown), and leave its own helpers (grader workers) to it."""
    me = this_process()
    noted: set[Proc] = set()
    _write_record(record, driver, me, noted)  # the driver's own entry first: a launch in this directory
    stopped = False
    while is_running(driver) and os.getppid() == driver.pid:
        now = {p for p in descendants([driver.pid]) if p.pid != me.pid}
        if not now <= noted:
            noted = {p for p in noted if is_running(p)} | now
            _write_record(record, driver, me, noted)
        ready, _, _ = select.select([sys.stdin], [], [], poll_s)
        if ready:  # "stop", or end of file: the driver closed its end of the pipe
            stopped = sys.stdin.readline().strip() == "stop"
            break
    if stopped:
        still_below = {p.pid for p in descendants([driver.pid])}
        noted = {p for p in noted if p.pid not in still_below}
    end_processes(noted)
    _write_record(record, driver, None, [p for p in noted if is_running(p)])


class ProcessGuard:
    """The driver's handle on its watchdog (``watch``)."""

    def __init__(self, proc: subprocess.Popen | None):
        self.proc = proc

    @classmethod
    def start(cls, record: Path, log: Callable[[str], None] = print) -> ProcessGuard:
        """End what an earlier launch left (``end_left_over``), then start the watchdog for this one."""
        if not Path("/proc/self/stat").exists():
            return cls(None)
        end_left_over(record, log)
        driver = this_process()
        boot = (
            f"import sys; sys.path.insert(0, {_ROOT!r}); from pathlib import Path; "
            f"from runtime.processes import Proc, watch; watch(Proc({driver.pid}, {driver.start}), Path({str(record)!r}))"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", boot],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # not in the driver's process group: a Ctrl-C there leaves it to clean up
            text=True,
        )
        return cls(proc)

    def close(self, timeout_s: float = 2 * GRACE_S + 10) -> None:
        """The driver is done (Ray is shut down): the watchdog ends what is left of the run's processes and
        exits; waits for it."""
        if self.proc is None or self.proc.stdin is None:
            return
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
        except OSError:  # it is gone already
            pass
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.proc = None
