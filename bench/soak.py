"""A soak of the default run: every process's resident memory over a long run, per iteration.

    python bench/soak.py --json docs/soak/soak.json --png docs/soak/soak.png [TRAIN OVERRIDES...]

launches ``train.py run.num_iterations=300 run.eval_every=50 run.name=soak`` (the overrides after the
options are passed on) and every ``--interval`` seconds samples the resident set size (RSS) of every
process below the driver. Each process is named by what realm records in the run directory, not by its
name: the driver (the launched pid), realm's watchdog (``processes.json``), each device process and the
engine beside it (``placement.json``: ``pid`` and ``companion_pids``). Processes no record names are told
apart by the process tree and how they started: realm's other Ray actors (its ``RayHost`` class: the
grader-only reward actor), grader workers (children of the driver, a device process or such an actor
started with the boot line of ``mathtask/grading/pool.py``); everything else below the driver is Ray's
own (GCS, raylet, dashboard, agents, idle workers) and is listed apart. A sample belongs to the
iteration that is running when it is
taken: the one after the last iteration ``metrics.jsonl`` holds (0: set-up and the first evaluation).

The report (written atomically every ``--report-every`` iterations, ``"complete": false`` until the run
ends) holds, per process, one value per iteration: the
largest RSS sampled while that iteration ran, in MB (10^6 bytes). ``max_rss_growth_last_200`` is the
largest relative growth of any realm process (driver, watchdog, device processes, engines, other
actors, grader workers) over the last 200 iterations: its RSS at the last iteration over its RSS at iteration
``num_iterations - 200``, minus 1. Ray's processes have their own growths beside it. The load average
is sampled with the memory, since a loaded machine runs the same iterations more slowly.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GRADER_BOOT = "mathtask.grading.worker"
"""In the ``python -c`` line every grader worker starts with (``mathtask/grading/pool.py``, ``_BOOT``)."""
REALM_KINDS = ("driver", "watchdog", "device", "engine", "host", "grader", "other")
"""Kinds whose growth ``max_rss_growth_last_200`` covers; "ray" is Ray's own processes, listed apart."""
MB = 1e6
RUN_ENV = {"RAY_memory_monitor_refresh_ms": "0", "RAY_worker_niceness": "0"}
"""Set for the launched run. Ray's memory monitor kills a worker when the *machine* is nearly full,
whoever fills it (on a shared machine, often someone else), which would end the soak with a lost actor.
Ray starts its workers (the device processes and engines) 15 nice levels below the driver: on a busy
machine they then get a share of the CPU a fraction of the driver's; at 0 the run's processes all get the
priority the soak is launched with (``nice -n 5 python bench/soak.py ...``)."""


@dataclass(frozen=True)
class ProcInfo:
    """One process below the driver at one sample: its parent, command line and resident bytes."""

    pid: int
    ppid: int
    cmdline: str
    rss: int


@dataclass
class Sample:
    """The RSS (bytes) of every process below the driver, by label, while ``iteration`` ran."""

    time_s: float
    iteration: int
    rss: dict[str, int]
    load_1min: float


@dataclass
class Labels:
    """What each labelled process is: its kind and the pids that carried the label."""

    kinds: dict[str, str] = field(default_factory=dict)
    pids: dict[str, list[int]] = field(default_factory=dict)
    by_pid: dict[int, tuple[str, str]] = field(default_factory=dict)
    """pid -> (kind, label) of the last sample: what ``classify`` keeps for a process no record names."""

    def note(self, label: str, kind: str, pid: int) -> None:
        self.by_pid[pid] = (kind, label)
        self.kinds[label] = kind
        seen = self.pids.setdefault(label, [])
        if pid not in seen:
            seen.append(pid)


def _ray_name(cmdline: str) -> str:
    """A short name for one of Ray's processes: its program's base name, or Ray's own title
    (``ray::DashboardAgent``); for ``python .../dashboard.py`` the script's name."""
    words = cmdline.split()
    if not words:
        return "?"
    prog = Path(words[0]).name
    script = next((w for w in words[1:3] if w.endswith(".py")), None)
    if prog.startswith("python") and script is not None:
        return Path(script).stem
    return prog.removeprefix("ray::")


def _host_name(cmdline: str) -> str | None:
    """For an actor of realm's ``RayHost`` (``runtime/placement.py``), the actor's name when Ray's title
    shows it (``ray::reward-0-0:RayHost.__init__`` -> "reward-0-0"), else ""; None for any other process."""
    title = cmdline.split()[0] if cmdline.split() else ""
    if not title.startswith("ray::") or "RayHost" not in title:
        return None
    name, _, _ = title.removeprefix("ray::").partition(":")
    return "" if name.startswith("RayHost") else name


def classify(
    procs: Mapping[int, ProcInfo],
    driver: int,
    placement: Mapping[str, Any],
    record: Mapping[str, Any],
    known: Mapping[int, tuple[str, str]] | None = None,
) -> dict[int, tuple[str, str]]:
    """pid -> (kind, label) for the driver and every process in ``procs`` (the driver's descendants).

    The driver, the watchdog ``record`` (``processes.json``) names, and the device processes and their
    engines (``placement.json``) are named by their records, which always win. A process no record names
    keeps the label it had in ``known`` (an earlier sample's: Ray retitles its actors as they run calls):
    realm's other actors (``RayHost``: the grader-only reward actor) are "host" by their Ray name; a grader
    worker is a process started with ``GRADER_BOOT`` whose parent is the driver, a device process or a host;
    any other descendant of those actors is "other" (its ancestor's label, then its pid); the rest is Ray's.

    Worked example: driver 10 with children 11 (watchdog), 12 (raylet), 13 (grader); the raylet's
    children 20 (device 0), 21 (its engine), 22 (DashboardAgent), 23 (``ray::reward-0-0:RayHost``);
    placement {"0": {"pid": 20, "companion_pids": {"engine": 21}}} -> 10 driver, 11 watchdog,
    20 "device 0", 21 "engine 0", 23 "host reward-0-0", 13 "grader 13 (driver)", 12 "ray raylet 12",
    22 "ray DashboardAgent 22"."""
    known = known or {}
    out = _by_records(procs, driver, placement, record)
    for pid in sorted(procs):
        host = _host_name(procs[pid].cmdline)
        if pid not in out and host is not None:
            out[pid] = known.get(pid) or ("host", f"host {host or pid}")
    owners = {pid: label for pid, (kind, label) in out.items() if kind in ("driver", "device", "host")}
    for pid in sorted(procs):
        info = procs[pid]
        if pid not in out and GRADER_BOOT in info.cmdline and info.ppid in owners:
            out[pid] = ("grader", f"grader {pid} ({owners[info.ppid]})")
    for pid in sorted(procs):
        if pid not in out:
            ancestor = _realm_ancestor(pid, procs, out)
            mine = ("other", f"{ancestor} child {pid}") if ancestor is not None else None
            out[pid] = known.get(pid) or mine or ("ray", f"ray {_ray_name(procs[pid].cmdline)} {pid}")
    return out


def _by_records(
    procs: Mapping[int, ProcInfo], driver: int, placement: Mapping[str, Any], record: Mapping[str, Any]
) -> dict[int, tuple[str, str]]:
    """The processes the run's records name: the driver, the watchdog, device processes and engines
    (a record left by an earlier launch names pids not in ``procs``: they are not used)."""
    out: dict[int, tuple[str, str]] = {driver: ("driver", "driver")}
    watchdog = (record.get("watchdog") or {}).get("pid")
    if isinstance(watchdog, int) and watchdog in procs:
        out[watchdog] = ("watchdog", "watchdog")
    for device, where in sorted(placement.items()):
        if where.get("pid") in procs:
            out[where["pid"]] = ("device", f"device {device}")
        for kind, pid in (where.get("companion_pids") or {}).items():
            if pid in procs:
                out[pid] = (kind if kind == "engine" else "other", f"{kind} {device}")
    return out


def _realm_ancestor(pid: int, procs: Mapping[int, ProcInfo], named: Mapping[int, tuple[str, str]]) -> str | None:
    """The label of the nearest device process, engine or host above ``pid``, if any (the driver does not
    count: every process here is below it)."""
    seen: set[int] = set()
    parent = procs[pid].ppid
    while parent in procs and parent not in seen:
        seen.add(parent)
        if parent in named and named[parent][0] in ("device", "engine", "host"):
            return named[parent][1]
        parent = procs[parent].ppid
    return None


def last_iteration(metrics_text: str) -> int | None:
    """The largest ``iteration`` among the complete lines of a metrics.jsonl, None before the first.
    A line cut short (the file being appended to) is skipped.

    Worked example: '{"iteration": 0, ...}\\n{"iteration": 1, ...}\\n{"itera' -> 1."""
    found: int | None = None
    for line in metrics_text.splitlines(keepends=True):
        if not line.endswith("\n"):
            continue
        try:
            it = int(json.loads(line)["iteration"])
        except (ValueError, KeyError, TypeError):
            continue
        found = it if found is None else max(found, it)
    return found


def this_launchs(metrics_text: str, modified_at: float, launched_at: float) -> str:
    """The metrics.jsonl text if this launch has written the file (``modified_at`` after ``launched_at``,
    both wall-clock seconds), else "": a relaunch finds the rows of the launch before it, up to where that
    one stopped, until its MetricsWriter rewrites the file down to the checkpoint it resumes from (which it
    always does, after set-up); until then its samples are set-up's, not an iteration's.

    Worked example: rows up to 15 left by a launch that died, file written at t=100, relaunched at t=200
    -> "" (samples tagged 0), and once the relaunch rewrites it at t=260 (rows up to 10) -> the text."""
    return metrics_text if modified_at >= launched_at else ""


def running_iteration(last_logged: int | None) -> int:
    """The iteration a sample belongs to: the one after the last one logged; 0 (set-up and the first
    held-out evaluation) before metrics.jsonl has a line. Iteration i runs from the line of i - 1 to its
    own line, so a held-out evaluation at iteration i counts as part of i."""
    return 0 if last_logged is None else last_logged + 1


def per_iteration(samples: Iterable[Sample], num_iterations: int) -> dict[str, list[float | None]]:
    """label -> for iterations 1..num_iterations the largest RSS (MB) sampled while it ran, None where no
    sample fell in it (samples of set-up, iteration 0, and after the last iteration are left out).

    Worked example: samples (iteration 1: a 100e6, a 120e6), (iteration 3: a 130e6, b 5e6), 3 iterations
    -> {"a": [120.0, None, 130.0], "b": [None, None, 5.0]}."""
    series: dict[str, list[float | None]] = {}
    for s in samples:
        if not 1 <= s.iteration <= num_iterations:
            continue
        for label, rss in s.rss.items():
            row = series.setdefault(label, [None] * num_iterations)
            old = row[s.iteration - 1]
            row[s.iteration - 1] = round(max(rss / MB, old if old is not None else 0.0), 1)
    return series


def value_at(row: list[float | None], iteration: int) -> float | None:
    """The value of ``row`` (iterations 1..) at ``iteration``, or at the nearest earlier iteration that
    has one; None when there is none."""
    for i in range(min(iteration, len(row)), 0, -1):
        if row[i - 1] is not None:
            return row[i - 1]
    return None


def growth(row: list[float | None], first: int, last: int) -> float | None:
    """RSS at ``last`` over RSS at ``first``, minus 1 (``value_at`` both); None when either is missing or
    the process did not run at ``first`` (a series that starts later has no value there).

    Worked example: [100, 101, 110, 120] from 2 to 4 -> 120 / 101 - 1 = 0.1881."""
    if first < 1 or row[first - 1] is None:
        return None
    start, end = value_at(row, first), value_at(row, last)
    return None if start is None or end is None or start <= 0 else end / start - 1


def growths(series: Mapping[str, list[float | None]], num_iterations: int, window: int) -> dict[str, float]:
    """label -> growth over the last ``window`` iterations (from ``num_iterations - window``), for the
    processes that ran at both ends."""
    first = max(num_iterations - window, 1)
    out = {}
    for label, row in series.items():
        g = growth(row, first, num_iterations)
        if g is not None:
            out[label] = round(g, 4)
    return out


def largest(
    values: Mapping[str, float], kinds: Mapping[str, str], among: Iterable[str]
) -> tuple[str | None, float | None]:
    """(label, value) of the largest of ``values`` whose kind is one of ``among``; (None, None) if none."""
    chosen = [(v, label) for label, v in values.items() if kinds.get(label) in set(among)]
    if not chosen:
        return None, None
    v, label = max(chosen)
    return label, v


def heldout(metrics_text: str) -> dict[int, float]:
    """iteration -> held-out success, from the complete lines of a metrics.jsonl that have one."""
    out = {}
    for line in metrics_text.splitlines(keepends=True):
        try:
            row = json.loads(line) if line.endswith("\n") else {}
        except ValueError:
            continue
        if isinstance(row, dict) and "heldout/success" in row:
            out[int(row["iteration"])] = float(row["heldout/success"])
    return out


def snapshot(driver: int) -> dict[int, ProcInfo]:
    """The driver's descendants now (psutil, the process tree), with their resident bytes."""
    import psutil

    out: dict[int, ProcInfo] = {}
    try:
        children = psutil.Process(driver).children(recursive=True)
    except psutil.Error:
        return out
    for p in children:
        try:
            with p.oneshot():
                out[p.pid] = ProcInfo(p.pid, p.ppid(), " ".join(p.cmdline()), p.memory_info().rss)
        except psutil.Error:  # it ended between the listing and the read
            continue
    return out


def _read_json(path: Path) -> dict[str, Any]:
    """A record of the run directory, {} while it is not there (or being replaced)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def rss_of(pid: int) -> int | None:
    import psutil

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


def take_sample(driver: int, run_dir: Path, labels: Labels, iteration: int, t0: float) -> Sample | None:
    """One sample of every process of the run, labelled (``classify``) and noted in ``labels``."""
    driver_rss = rss_of(driver)
    if driver_rss is None:
        return None
    procs = snapshot(driver)
    records = _read_json(run_dir / "placement.json"), _read_json(run_dir / "processes.json")
    named = classify(procs, driver, *records, known={p: n for p, n in labels.by_pid.items() if p in procs})
    rss = {"driver": driver_rss}
    for pid, (kind, label) in named.items():
        labels.note(label, kind, pid)
        if pid in procs:
            rss[label] = procs[pid].rss
    return Sample(round(time.monotonic() - t0, 1), iteration, rss, os.getloadavg()[0])


class Progress:
    """One line per new iteration: rate over the iterations this launch ran, and the time left."""

    def __init__(self, num_iterations: int):
        self.num_iterations = num_iterations
        self.first: tuple[int, float] | None = None
        self.shown = -1

    def line(self, done: int, now: float, sample: Sample) -> str | None:
        if done <= self.shown:
            return None
        self.shown = done
        if self.first is None:
            self.first = (done, now)
        it0, t0 = self.first
        rate = (done - it0) / (now - t0) * 60 if now > t0 and done > it0 else None
        eta = f"{(self.num_iterations - done) / rate:.0f} min left" if rate else "rate after two iterations"
        top = sorted(sample.rss.items(), key=lambda kv: -kv[1])[:3]
        mem = ", ".join(f"{label} {v / MB:.0f} MB" for label, v in top)
        per = f"{rate:.2f} it/min" if rate else "-"
        return (
            f"[soak] {done}/{self.num_iterations} iterations done | {per} | {eta} | load {sample.load_1min:.1f} | {mem}"
        )


def report(
    samples: list[Sample],
    labels: Labels,
    metrics_text: str,
    num_iterations: int,
    window: int,
    meta: dict[str, Any],
    done: int | None = None,
) -> dict[str, Any]:
    """The soak's JSON: growths, held-out success, per-process series, the command and the load. With
    ``done`` < ``num_iterations`` (a report while the run goes on), the series and growths end at ``done``."""
    done = num_iterations if done is None else done
    series = per_iteration(samples, done)
    grown = growths(series, done, window)
    worst, worst_growth = largest(grown, labels.kinds, REALM_KINDS)
    ray_worst, ray_growth = largest(grown, labels.kinds, ("ray",))
    success = heldout(metrics_text)
    loads = [s.load_1min for s in samples]
    return {
        "num_iterations": num_iterations,
        "iterations_done": done,
        "complete": done >= num_iterations,
        f"max_rss_growth_last_{window}": worst_growth,
        "max_rss_growth_process": worst,
        "window": window,
        "growth_from_iteration": max(done - window, 1),
        "ray_max_rss_growth": ray_growth,
        "ray_max_rss_growth_process": ray_worst,
        "heldout_success_at_100": success.get(100),
        "heldout_success_final": success[max(success)] if success else None,
        "heldout_success": {str(k): v for k, v in sorted(success.items())},
        "rss_growth": grown,
        **meta,
        "load": {
            "cpu_count": os.cpu_count(),
            "load_1min_mean": round(sum(loads) / len(loads), 2) if loads else None,
            "load_1min_max": round(max(loads), 2) if loads else None,
        },
        "num_samples": len(samples),
        "series_unit": "MB (1e6 bytes): the largest RSS sampled while each iteration ran, iterations 1..iterations_done",
        "processes": {label: {"kind": labels.kinds[label], "pids": labels.pids[label]} for label in sorted(series)},
        "series": {label: series[label] for label in sorted(series)},
    }


def plot(data: dict[str, Any], png: Path) -> None:
    """Every process's RSS per iteration: realm's processes above, Ray's below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from common.files import atomic_save_figure

    fig, axes = plt.subplots(2, 1, figsize=(11, 9), sharex=True)
    iterations = list(range(1, data["iterations_done"] + 1))
    for label, row in data["series"].items():
        ax = axes[1] if data["processes"][label]["kind"] == "ray" else axes[0]
        ax.plot(iterations, [float("nan") if v is None else v for v in row], label=label, linewidth=1)
    worst = data[f"max_rss_growth_last_{data['window']}"]
    axes[0].set_title(
        f"realm's processes: largest RSS growth from iteration {data['growth_from_iteration']} to "
        f"{data['iterations_done']}: {data['max_rss_growth_process']} {_pct(worst)}"
    )
    axes[1].set_title("Ray's own processes")
    for ax in axes:
        ax.set_ylabel("RSS (MB)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=3, loc="upper left")
    axes[1].set_xlabel("iteration")
    fig.tight_layout()
    atomic_save_figure(fig, png)  # closes the figure


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 100:+.1f}%"


def parse_args(argv: list[str]) -> tuple[Any, list[str]]:
    from common.cli import ArgumentParser

    parser = ArgumentParser(prog="python bench/soak.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=Path("docs/soak/soak.json"), help="the report")
    parser.add_argument("--png", type=Path, default=Path("docs/soak/soak.png"), help="RSS per iteration")
    parser.add_argument("--num-iterations", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--window", type=int, default=200, help="growth over this many last iterations")
    parser.add_argument("--name", default="soak", help="run.name: the run directory is outputs/NAME")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between samples")
    parser.add_argument("--report-every", type=int, default=25, help="also write the report every N iterations")
    parser.add_argument("--log", type=Path, default=None, help="train.py's output (default outputs/NAME.log)")
    args, overrides = parser.parse_known_args(argv)
    for name in ("num_iterations", "eval_every", "window", "report_every"):
        if getattr(args, name) < 1:
            parser.error(f"argument --{name.replace('_', '-')}: {getattr(args, name)} must be > 0")
    if args.interval <= 0:
        parser.error(f"argument --interval: {args.interval} must be > 0")
    clash = [
        o for o in overrides if o.split("=", 1)[0].lstrip("+") in ("run.num_iterations", "run.eval_every", "run.name")
    ]
    if clash:
        parser.error(f"{' '.join(clash)}: set it with --num-iterations, --eval-every or --name")
    return args, overrides


def monitor(
    proc: subprocess.Popen, run_dir: Path, num_iterations: int, interval: float, on_iteration: Callable[..., None]
) -> tuple[list[Sample], Labels]:
    """Sample until the driver exits, printing a progress line per iteration; ``on_iteration(samples,
    labels, done)`` after each new one (a report while the run goes on)."""
    labels, samples, progress, t0 = Labels(), [], Progress(num_iterations), time.monotonic()
    metrics, launched_at = run_dir / "metrics.jsonl", time.time()
    while proc.poll() is None:
        try:
            text = this_launchs(metrics.read_text(), metrics.stat().st_mtime, launched_at)
        except OSError:  # not there yet
            text = ""
        last = last_iteration(text)
        sample = take_sample(proc.pid, run_dir, labels, running_iteration(last), t0)
        if sample is not None:
            samples.append(sample)
            line = progress.line(last if last is not None else -1, time.monotonic(), sample)
            if line is not None and last is not None:
                print(line, flush=True)
                on_iteration(samples, labels, last)
        time.sleep(interval)
    return samples, labels


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # a SIGTERM ends the run too, as Ctrl-C does, rather than leaving it running


def main(argv: list[str] | None = None) -> None:
    from common.cli import fail
    from common.files import atomic_write_json

    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    command = [
        sys.executable, "train.py", f"run.num_iterations={args.num_iterations}",
        f"run.eval_every={args.eval_every}", f"run.name={args.name}", *overrides,
    ]  # fmt: skip
    run_dir = ROOT / "outputs" / args.name
    log = args.log or ROOT / "outputs" / f"{args.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    if (run_dir / "metrics.jsonl").exists():
        print(f"[soak] {run_dir} has a run already: train.py resumes it, the series start where it resumes")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    shown = "python " + shlex.join(command[1:])
    print(f"[soak] {shown} (train.py's output: {log})", flush=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.monotonic()

    def write(samples: list[Sample], labels: Labels, done: int) -> dict[str, Any]:
        meta = {
            "command": shown,
            "environment": RUN_ENV,
            "commit": commit,
            "started_utc": started,
            "wall_s": round(time.monotonic() - t0),
        }
        text = (run_dir / "metrics.jsonl").read_text()
        data = report(samples, labels, text, args.num_iterations, args.window, meta, min(done, args.num_iterations))
        atomic_write_json(args.json, data)
        plot(data, args.png)
        return data

    def every(samples: list[Sample], labels: Labels, done: int) -> None:
        if done > 0 and done % args.report_every == 0 and done < args.num_iterations:
            write(samples, labels, done)

    signal.signal(signal.SIGTERM, _interrupt)
    with open(log, "a") as out:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **RUN_ENV}  # the log shows each line as it is written
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            samples, labels = monitor(proc, run_dir, args.num_iterations, args.interval, every)
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise
    if proc.returncode != 0:
        tail = log.read_text().splitlines()[-1:] or [""]
        fail(f"train.py exited with status {proc.returncode} ({log}: {tail[0]})")
    data = write(samples, labels, args.num_iterations)
    print(
        f"[soak] {args.json}: max RSS growth over the last {args.window} iterations "
        f"{_pct(data[f'max_rss_growth_last_{args.window}'])} ({data['max_rss_growth_process']}), held-out success "
        f"{data['heldout_success_at_100']} at 100, {data['heldout_success_final']} at the end; {args.png}"
    )


if __name__ == "__main__":
    main()
