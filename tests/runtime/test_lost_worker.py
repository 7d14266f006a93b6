"""A device process killed with SIGKILL in the middle of a run: with ``run.max_restarts=1`` the run
restarts the cluster from its last complete checkpoint and ends with the metrics of a run that was
never interrupted; with no restarts left it stops within a minute, with one line naming the device,
the call, the cause and the command that resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.test_train_smoke import SMALL as SMALL_RUN

ROOT = Path(__file__).resolve().parents[2]
SMALL = [*SMALL_RUN, "run.num_iterations=4", "run.checkpoint_every=1"]
TIMING = ("time/", "throughput/", "call/")


def _start(run_dir: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
    args = [sys.executable, "train.py", *SMALL, f"hydra.run.dir={run_dir}", *extra]
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows if "restart" not in r]


def _kill_a_device_process_once(run_dir: Path, proc: subprocess.Popen, after_checkpoint: int) -> float:
    """SIGKILL device 1's process once the checkpoint of iteration ``after_checkpoint`` is complete
    (so the kill lands in the next iteration); returns when it was killed."""
    done = run_dir / "checkpoints" / f"iter_{after_checkpoint:06d}" / "COMPLETE"
    deadline = time.time() + 900
    while not done.exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    pid = json.loads((run_dir / "placement.json").read_text())["1"]["pid"]
    os.kill(pid, signal.SIGKILL)
    return time.time()


def test_a_killed_device_process_restarts_from_the_checkpoint_and_ends_as_an_uninterrupted_run(tmp_path):
    """The restarted run's metrics equal the uninterrupted run's bit for bit, timings aside: both run
    the same sums in the same order on one machine, under every CPU kernel set (docs/development.md,
    "Tolerances")."""
    clean = subprocess.run(
        [sys.executable, "train.py", *SMALL, f"hydra.run.dir={tmp_path / 'clean'}"],
        cwd=ROOT,
        env=dict(os.environ, VLLM_LOGGING_LEVEL="ERROR"),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert clean.returncode == 0, clean.stderr[-3000:]
    proc = _start(tmp_path / "killed", "run.max_restarts=1")
    _kill_a_device_process_once(tmp_path / "killed", proc, after_checkpoint=1)
    out, err = proc.communicate(timeout=1200)
    assert proc.returncode == 0, err[-3000:]
    assert "[restart 1/1] device 1 (device process; holds " in out and " died " in out
    rows = [json.loads(line) for line in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    restarts = [r for r in rows if "restart" in r]
    assert len(restarts) == 1 and restarts[0]["iteration"] == 1 and "device 1" in restarts[0]["reason"]
    assert _metrics(tmp_path / "killed") == _metrics(tmp_path / "clean")


def test_without_restarts_the_run_stops_within_a_minute_naming_the_device_call_and_resume_command(tmp_path):
    proc = _start(tmp_path, "run.max_restarts=0")
    killed_at = _kill_a_device_process_once(tmp_path, proc, after_checkpoint=1)
    out, err = proc.communicate(timeout=600)
    assert time.time() - killed_at < 60
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: device 1 (device process; holds ") and " died " in last, last
    assert "killed from outside" in last, last
    assert "Resume with: python train.py" in last and f"hydra.run.dir={tmp_path}" in last, last
