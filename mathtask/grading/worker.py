"""The grader's worker process: sympy comparisons that the caller can kill.

Started by `mathtask.grading.pool` as `python -c ...` (not multiprocessing: spawn would re-import the
caller's __main__, and fork is unsafe in threaded callers such as Ray actors). Protocol, one JSON
object per line: the worker first writes {"ready": true}; then for each {"id", "answer", "gold"}
it reads, it writes {"id", "correct", "reason"}, in order.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

# A runaway sympy computation should fail with MemoryError, not take the machine down.
MEMORY_LIMIT_BYTES = 4 << 30


def _limit_memory() -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = MEMORY_LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(hard, MEMORY_LIMIT_BYTES)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, ValueError, OSError):
        pass


def _exit_with_parent(parent_pid: int) -> None:
    # A worker busy in sympy never sees stdin close; this notices the parent is gone.
    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            os._exit(0)


_WARM_UP = (
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}"),
    ("(x-1)(x+1)", "x^2-1"),
    ("\\left(3, \\frac{\\pi}{2}\\right)", "(3, \\pi/2)"),
    ("2+3i", "3i+2"),
)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    # Anything a library prints must not corrupt the protocol channel.
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _limit_memory()
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()

    from mathtask.grading.compare import judge
    from mathtask.grading.symbolic import FULL_OPS

    for answer, gold in _WARM_UP:
        try:
            judge(answer, gold, FULL_OPS)
        except Exception:
            pass
    protocol.write('{"ready": true}\n')

    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            return
        try:
            item = json.loads(line)
            correct = bool(judge(item["answer"], item["gold"], FULL_OPS))
            reply = {"id": item["id"], "correct": correct, "reason": "equal" if correct else "not_equal"}
        except MemoryError:
            reply = {"id": _item_id(line), "correct": False, "reason": "error"}
        except Exception:
            reply = {"id": _item_id(line), "correct": False, "reason": "error"}
        protocol.write(json.dumps(reply) + "\n")


def _item_id(line: bytes):
    try:
        return json.loads(line)["id"]
    except Exception:
        return None


if __name__ == "__main__":
    main()
