"""A small persistent pool of grader worker processes with hard per-item timeouts.

Timeouts are enforced by killing the worker process: sympy can spend unbounded time inside C
code or a single Python call, and signal.alarm only works in a process's main thread. The pool
is shared by every thread of the calling process; a caller never waits for another caller's
workers (it starts its own), and idle workers are kept for the next call because starting one
costs about a second (importing sympy and the LaTeX grammar).
"""
from __future__ import annotations

import atexit
import collections
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

# The worker imports `eval.grading` from this checkout, whatever the caller's cwd and sys.path.
_ROOT = str(Path(__file__).resolve().parents[2])
_BOOT = f"import sys; sys.path.insert(0, {_ROOT!r}); from eval.grading.worker import main; main()"

# Cold start on a loaded 2-core machine; not part of any item's timeout.
STARTUP_TIMEOUT_S = 60.0
# Items queued per worker: hides the pipe round trip without delaying a timeout's detection.
PIPELINE_DEPTH = 4
MAX_STARTUP_FAILURES = 3


class _Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        self.fd = self.proc.stdout.fileno()
        self.buffer = b""
        self.ready = False
        self.started_at = time.monotonic()
        self.inflight: collections.deque[int] = collections.deque()
        self.head_since = 0.0

    def send(self, payload: dict) -> bool:
        try:
            self.proc.stdin.write((json.dumps(payload) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def read_lines(self) -> list[bytes] | None:
        """Complete lines available now, or None at end of file (the worker died)."""
        try:
            chunk = os.read(self.fd, 1 << 16)
        except OSError:
            return None
        if not chunk:
            return None
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return lines

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class WorkerPool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._owner_pid = os.getpid()
        self.max_idle = max(2, os.cpu_count() or 2)

    def _check_fork(self) -> None:
        # After a fork the idle workers belong to the parent; never share their pipes.
        if os.getpid() != self._owner_pid:
            self._idle = []
            self._owner_pid = os.getpid()
            self._lock = threading.Lock()

    def acquire(self, num: int) -> list[_Worker]:
        self._check_fork()
        with self._lock:
            taken = []
            while self._idle and len(taken) < num:
                worker = self._idle.pop()
                if worker.alive():
                    taken.append(worker)
                else:
                    worker.kill()
        while len(taken) < num:
            taken.append(_Worker())
        return taken

    def release(self, workers: list[_Worker]) -> None:
        self._check_fork()
        surplus = []
        with self._lock:
            for worker in workers:
                if worker.alive() and not worker.inflight and len(self._idle) < self.max_idle:
                    worker.buffer = b""
                    self._idle.append(worker)
                else:
                    surplus.append(worker)
        for worker in surplus:
            worker.kill()

    def warm_up(self, num: int) -> None:
        self.release(self.acquire(num))

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


POOL = WorkerPool()
atexit.register(POOL.close)


def run(items: list[tuple[str, str]], timeout_s: float, num_workers: int) -> list[tuple[bool, str]]:
    """(correct, reason) for each (answer, gold), in order. Never raises for item content."""
    num_items = len(items)
    results: list[tuple[bool, str] | None] = [None] * num_items
    if num_items == 0:
        return []
    pending = collections.deque(range(num_items))
    workers = POOL.acquire(max(1, min(num_workers, num_items)))
    num_startup_failures = 0
    num_done = 0

    def replace(worker: _Worker) -> None:
        nonlocal num_startup_failures
        worker.kill()
        # Items queued behind the lost one never started; they go back to the queue.
        pending.extendleft(reversed(worker.inflight))
        worker.inflight.clear()
        workers.remove(worker)
        if num_startup_failures < MAX_STARTUP_FAILURES:
            workers.append(_Worker())

    try:
        while num_done < num_items:
            if not workers:
                for k in pending:
                    results[k] = (False, "error")
                pending.clear()
                break
            now = time.monotonic()
            for worker in workers:
                while worker.ready and pending and len(worker.inflight) < PIPELINE_DEPTH:
                    k = pending.popleft()
                    answer, gold = items[k]
                    if not worker.send({"id": k, "answer": answer, "gold": gold}):
                        pending.appendleft(k)
                        break
                    if not worker.inflight:
                        worker.head_since = now
                    worker.inflight.append(k)

            deadlines = []
            for worker in workers:
                if not worker.ready:
                    deadlines.append(worker.started_at + STARTUP_TIMEOUT_S)
                elif worker.inflight:
                    deadlines.append(worker.head_since + timeout_s)
            wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else 0.05
            readable, _, _ = select.select([w.fd for w in workers], [], [], wait)

            now = time.monotonic()
            for worker in [w for w in workers if w.fd in readable]:
                lines = worker.read_lines()
                if lines is None:
                    if worker.inflight:
                        results[worker.inflight.popleft()] = (False, "error")
                        num_done += 1
                    if not worker.ready:
                        num_startup_failures += 1
                    replace(worker)
                    continue
                for line in lines:
                    try:
                        reply = json.loads(line)
                    except ValueError:
                        continue
                    if reply.get("ready"):
                        worker.ready = True
                        continue
                    if worker.inflight and reply.get("id") == worker.inflight[0]:
                        k = worker.inflight.popleft()
                        results[k] = (bool(reply.get("correct")), str(reply.get("reason", "error")))
                        num_done += 1
                        worker.head_since = now

            now = time.monotonic()
            for worker in list(workers):
                if not worker.ready and now - worker.started_at > STARTUP_TIMEOUT_S:
                    num_startup_failures += 1
                    replace(worker)
                elif worker.ready and worker.inflight and now - worker.head_since > timeout_s:
                    results[worker.inflight.popleft()] = (False, "timeout")
                    num_done += 1
                    replace(worker)
    finally:
        for worker in workers:
            if worker.inflight:
                worker.kill()
        POOL.release(workers)
    return [r if r is not None else (False, "error") for r in results]
