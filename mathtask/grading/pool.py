"""A persistent pool of grader worker processes, shared by all threads, with hard per-item timeouts.

Timeouts are enforced by killing the worker process: sympy can spend unbounded time inside one
Python call, and signal.alarm only works in a process's main thread. One dispatcher thread owns
the workers; callers (any thread: Ray actors, thread pools) queue items and wait for their
results, first come first served. Workers are started on demand up to a cap and kept, because
starting one costs about a second (importing sympy and the LaTeX grammar).
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

# The worker imports `mathtask.grading` from this checkout, whatever the caller's cwd and sys.path.
_ROOT = str(Path(__file__).resolve().parents[2])
_BOOT = f"import sys; sys.path.insert(0, {_ROOT!r}); from mathtask.grading.worker import main; main()"

# Cold start on a loaded machine; not part of any item's timeout.
STARTUP_TIMEOUT_S = 60.0
# Items queued per worker: hides the pipe round trip; those behind a timed-out item are requeued.
PIPELINE_DEPTH = 2
MAX_STARTUP_FAILURES = 3
# Workers cost ~150 MB each; most items never reach them (the fast path decides in-process).
DEFAULT_MAX_WORKERS = max(1, min(os.cpu_count() or 1, 8))


class _Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both are pipes
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.fd = self.stdout.fileno()
        self.buffer = b""
        self.ready = False
        self.started_at = time.monotonic()
        self.inflight: collections.deque[_Task] = collections.deque()
        self.head_since = 0.0

    def send(self, task: _Task) -> bool:
        answer, gold = task.batch.items[task.index]
        line = json.dumps({"id": task.index, "answer": answer, "gold": gold}) + "\n"
        try:
            self.stdin.write(line.encode())
            self.stdin.flush()
            return True
        except (OSError, ValueError):
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

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        for stream in (self.stdin, self.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class _Batch:
    def __init__(self, items: list[tuple[str, str]], timeout_s: float, num_workers: int):
        self.items = items
        self.timeout_s = timeout_s
        self.num_workers = num_workers
        self.results: list[tuple[bool, str] | None] = [None] * len(items)
        self.num_left = len(items)
        self.done = threading.Event()


class _Task:
    __slots__ = ("batch", "index")

    def __init__(self, batch: _Batch, index: int):
        self.batch = batch
        self.index = index


class Dispatcher:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: collections.deque[_Task] = collections.deque()
        self._batches: set[_Batch] = set()
        self._workers: list[_Worker] = []
        self._num_startup_failures = 0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._closed = False
        self.last_progress = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="grader-dispatch", daemon=True)
        self._thread.start()

    # -- caller side ---------------------------------------------------------------------------

    def run(self, items: list[tuple[str, str]], timeout_s: float, num_workers: int) -> list[tuple[bool, str]]:
        if not items:
            return []
        batch = _Batch(items, timeout_s, num_workers)
        with self._lock:
            if not self._queue and not any(w.inflight for w in self._workers):
                self.last_progress = time.monotonic()
            self._batches.add(batch)
            self._queue.extend(_Task(batch, k) for k in range(len(items)))
        self._wake()
        # Every item finishes or times out within timeout_s of starting, so a pool that makes no
        # progress at all for this long is broken; give up rather than hang the caller.
        stall_s = 2 * STARTUP_TIMEOUT_S + timeout_s
        while not batch.done.wait(0.5):
            if not self._thread.is_alive() or time.monotonic() - self.last_progress > stall_s:
                break
        return [r if r is not None else (False, "error") for r in list(batch.results)]

    def warm_up(self, num: int) -> None:
        """Starts workers until num are running and waits (at most STARTUP_TIMEOUT_S) until they are ready."""
        with self._lock:
            while len(self._workers) < num:
                self._workers.append(_Worker())
        self._wake()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and self._thread.is_alive():
            with self._lock:
                if sum(w.ready for w in self._workers) >= num:
                    return
            time.sleep(0.02)

    def close(self) -> None:
        self._closed = True
        self._wake()
        with self._lock:
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.kill()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    # -- dispatcher thread ---------------------------------------------------------------------

    def _finish(self, task: _Task, result: tuple[bool, str]) -> None:
        batch = task.batch
        if batch.results[task.index] is not None:
            return
        batch.results[task.index] = result
        batch.num_left -= 1
        self.last_progress = time.monotonic()
        if batch.num_left == 0:
            with self._lock:
                self._batches.discard(batch)
            batch.done.set()

    def _replace(self, worker: _Worker, startup_failed: bool) -> None:
        worker.kill()
        with self._lock:
            # Items queued behind the lost one never started: they go back to the front.
            self._queue.extendleft(reversed(worker.inflight))
            if worker in self._workers:
                self._workers.remove(worker)
        worker.inflight.clear()
        if startup_failed:
            self._num_startup_failures += 1

    def _loop(self) -> None:
        while not self._closed:
            try:
                self._step()
            except Exception:
                # The dispatcher must outlive any surprise; callers still get answers.
                time.sleep(0.05)

    def _step(self) -> None:
        """One round: staff the pool, hand out queued items, wait for replies or a deadline, read
        the replies, then replace workers that did not start or ran past an item's time limit."""
        workers = self._staff()
        self._send(workers)
        readable = self._wait(workers)
        self._read(workers, readable)
        self._expire(workers)

    def _staff(self) -> list[_Worker]:
        """Start workers up to the demand (capped), retire idle surplus ones; returns the current ones.

        After MAX_STARTUP_FAILURES failed starts with no worker ready, the queued items fail instead of
        waiting forever for a worker that cannot start.
        """
        with self._lock:
            cap = max([DEFAULT_MAX_WORKERS] + [b.num_workers for b in self._batches])
            demand = len(self._queue) + sum(len(w.inflight) for w in self._workers)
            if self._num_startup_failures >= MAX_STARTUP_FAILURES and not any(w.ready for w in self._workers):
                failed, self._queue = list(self._queue), collections.deque()
                self._num_startup_failures = 0
            else:
                failed = []
                while not self._closed and len(self._workers) < min(cap, demand):
                    try:
                        self._workers.append(_Worker())
                    except OSError:
                        # Cannot start a process at all (no executable, fd or pid limits).
                        self._num_startup_failures = MAX_STARTUP_FAILURES
                        break
            # Extra workers started for a large num_workers request go once they are idle.
            surplus = []
            if not self._queue:
                for worker in list(self._workers):
                    if len(self._workers) <= cap:
                        break
                    if worker.ready and not worker.inflight:
                        self._workers.remove(worker)
                        surplus.append(worker)
            workers = list(self._workers)
        for worker in surplus:
            worker.kill()
        for task in failed:
            self._finish(task, (False, "error"))
        return workers

    def _send(self, workers: list[_Worker]) -> None:
        """Fill each ready worker's pipeline (PIPELINE_DEPTH items) from the queue."""
        now = time.monotonic()
        for worker in workers:
            while worker.ready and len(worker.inflight) < PIPELINE_DEPTH:
                with self._lock:
                    if not self._queue:
                        break
                    task = self._queue.popleft()
                if not worker.send(task):
                    with self._lock:
                        self._queue.appendleft(task)
                    break
                if not worker.inflight:
                    worker.head_since = now
                worker.inflight.append(task)

    def _wait(self, workers: list[_Worker]) -> list[int]:
        """Block until a worker writes, the caller wakes us, or the nearest deadline; the readable fds."""
        deadlines = []
        for worker in workers:
            if not worker.ready:
                deadlines.append(worker.started_at + STARTUP_TIMEOUT_S)
            elif worker.inflight:
                deadlines.append(worker.head_since + worker.inflight[0].batch.timeout_s)
        if deadlines:
            wait = max(0.0, min(deadlines) - time.monotonic())
        else:
            # Nothing running: sleep until woken, unless queued items are waiting for a worker
            # that could not be started (the next step fails them).
            wait = 0.05 if self._queue else 5.0
        fds = [self._wake_r] + [w.fd for w in workers]
        readable, _, _ = select.select(fds, [], [], wait)
        if self._wake_r in readable:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except OSError:
                pass
        return readable

    def _read(self, workers: list[_Worker], readable: list[int]) -> None:
        """Take the replies of the readable workers: ready signals and results, in order."""
        now = time.monotonic()
        for worker in workers:
            if worker.fd not in readable:
                continue
            lines = worker.read_lines()
            if lines is None:
                # The worker died (a crash, or the memory limit): its current item is an error.
                if worker.inflight:
                    self._finish(worker.inflight.popleft(), (False, "error"))
                self._replace(worker, startup_failed=not worker.ready)
                continue
            for line in lines:
                try:
                    reply = json.loads(line)
                except ValueError:
                    continue
                if reply.get("ready"):
                    worker.ready = True
                    self.last_progress = now
                    self._num_startup_failures = 0
                elif worker.inflight and reply.get("id") == worker.inflight[0].index:
                    task = worker.inflight.popleft()
                    self._finish(task, (bool(reply.get("correct")), str(reply.get("reason", "error"))))
                    worker.head_since = now

    def _expire(self, workers: list[_Worker]) -> None:
        """Replace a worker that did not start in time, or whose current item ran past its limit."""
        now = time.monotonic()
        for worker in workers:
            if worker.proc.returncode is not None or worker not in self._workers:
                continue
            if not worker.ready and now - worker.started_at > STARTUP_TIMEOUT_S:
                self._replace(worker, startup_failed=True)
            elif worker.ready and worker.inflight and now - worker.head_since > worker.inflight[0].batch.timeout_s:
                self._finish(worker.inflight.popleft(), (False, "timeout"))
                self._replace(worker, startup_failed=False)


_dispatcher: Dispatcher | None = None
_dispatcher_pid = -1
_dispatcher_lock = threading.Lock()


def dispatcher() -> Dispatcher:
    """The process's dispatcher; a forked child gets its own (the parent's workers stay the parent's)."""
    global _dispatcher, _dispatcher_pid, _dispatcher_lock
    if _dispatcher_pid != os.getpid():
        _dispatcher_lock = threading.Lock()
        _dispatcher = None
        _dispatcher_pid = os.getpid()
    with _dispatcher_lock:
        if _dispatcher is None:
            _dispatcher = Dispatcher()
        return _dispatcher


def run(items: list[tuple[str, str]], timeout_s: float, num_workers: int) -> list[tuple[bool, str]]:
    """(correct, reason) for each (answer, gold), in order. Never raises for item content."""
    return dispatcher().run(items, timeout_s, num_workers)


def shutdown() -> None:
    """Stops this process's workers; the next graded item starts fresh ones."""
    global _dispatcher
    with _dispatcher_lock:
        if _dispatcher is not None and _dispatcher_pid == os.getpid():
            _dispatcher.close()
        _dispatcher = None


def _close_at_exit() -> None:
    if _dispatcher is not None and _dispatcher_pid == os.getpid():
        _dispatcher.close()


atexit.register(_close_at_exit)
