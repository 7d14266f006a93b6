"""A user's reward function, ``reward.function=FILE.py:NAME``: loaded, checked and called in worker processes.

The function's contract (docs/rewards.md, "Your own reward function")::

    def NAME(prompt: str, response: str, answer: str, metadata: dict) -> float | list[float]

``prompt`` is the problem's question, ``response`` the policy's response as the grader reads it (untrusted
model text, passed as a string and never evaluated by realm), ``answer`` the gold answer, and ``metadata``
a dict with ``problem_id``, ``dataset``, ``prompt_text`` (the exact prompt the policy saw), ``steps`` (the
response cut into steps as realm cuts it for a PRM: ``reward.step_delimiter``) and ``truncated``. A float is
an outcome reward (on the response's last token, as the success reward); a list is one reward per step (on
each step's last token, as a PRM's), and its length must be ``len(metadata["steps"])``. With
``reward.function_batched=true`` the function takes lists of the four and returns a list, one value per
response: one call per chunk of responses instead of one per response.

Calls run in a pool of worker processes (as many as the grader's), each of which imports the file once, with
a hard timeout per call (``reward.function_timeout_s``): a call that runs past it is killed with its
process. An exception, a timeout, a non-finite value or a list of the wrong length raises
``RewardFunctionError`` naming the function, the problem and what went wrong; the trainer stops on it with
one line and keeps its last complete checkpoint.
"""

from __future__ import annotations

import inspect
import math
import multiprocessing
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewards import user_fn_worker
from rewards.types import RewardFunctionError

PARAMETERS = ("prompt", "response", "answer", "metadata")


@dataclass(frozen=True)
class FunctionRef:
    """``FILE.py:NAME`` parsed: where the function is and what it is called."""

    path: Path
    name: str

    @classmethod
    def parse(cls, text: str, key: str = "reward.function") -> FunctionRef:
        """Worked example: "my_rewards.py:brevity" -> FunctionRef(Path("my_rewards.py"), "brevity")."""
        file, sep, name = text.rpartition(":")
        if not sep or not file or not name.isidentifier() or not file.endswith(".py"):
            raise ValueError(f"{key}={text!r}: expected FILE.py:NAME, e.g. examples/reward_functions.py:boxed_format")
        return cls(Path(file).expanduser(), name)

    def __str__(self) -> str:
        return f"{self.path}:{self.name}"


def load_function(ref: FunctionRef, batched: bool = False) -> Callable[..., Any]:
    """Import ``ref.path`` and return its ``ref.name``, checked to take the four parameters; a missing file, a
    file that does not import, a missing name or a wrong signature raises ``RewardFunctionError`` (one line)."""
    from common.cli import did_you_mean

    try:
        fn, names = user_fn_worker.import_function(ref.path, ref.name)
    except user_fn_worker.LoadError as e:
        raise RewardFunctionError(f"reward.function={ref}: {e}") from None
    if fn is None:
        where = ref.path.resolve()
        raise RewardFunctionError(
            f"reward.function={ref}: {where} has no function {ref.name!r}{did_you_mean(ref.name, names)}"
        )
    check_signature(fn, ref, batched)
    return fn


def check_signature(fn: Callable[..., Any], ref: FunctionRef, batched: bool) -> None:
    """``fn`` can be called with four positional arguments (prompt, response, answer, metadata)."""
    try:
        inspect.signature(fn).bind(*PARAMETERS)
    except TypeError as e:
        form = "lists of " if batched else ""
        raise RewardFunctionError(
            f"reward.function={ref}: {ref.name} must take ({', '.join(PARAMETERS)}) ({form}str, str, str, dict): {e}"
        ) from None
    except ValueError:  # a builtin without a signature: let the first call tell
        pass


STARTUP_TIMEOUT_S = 120.0
"""Workers start (spawn, import the user's file) within this; not part of any call's timeout."""


class UserRewardFunction:
    """The user's function, called on a batch of samples in a pool of worker processes with a per-call timeout.

    ``__call__(calls, problem_ids)`` takes one argument tuple (prompt, response, answer, metadata) per response
    and returns one value per response (a float or a list of floats, checked finite); any failure raises
    ``RewardFunctionError``. ``num_workers`` defaults to the grader's worker count.
    """

    def __init__(self, ref: FunctionRef, timeout_s: float, batched: bool = False, num_workers: int | None = None):
        from mathtask.grading.pool import DEFAULT_MAX_WORKERS

        load_function(ref, batched)  # fail here, in the caller, before any worker starts
        self.ref, self.timeout_s, self.batched = ref, timeout_s, batched
        self.num_workers = num_workers or DEFAULT_MAX_WORKERS
        self._pool: Any = None

    @property
    def name(self) -> str:
        return self.ref.name

    def _workers(self) -> Any:
        """The pool, started on first use; its workers' start-up (spawn, the user's imports) is waited for here,
        so that it counts against ``STARTUP_TIMEOUT_S``, not against the first calls' timeout."""
        if self._pool is None:
            # spawn: the caller may be a Ray actor with threads, where fork is unsafe.
            ctx = multiprocessing.get_context("spawn")
            args = (str(self.ref.path.resolve()), self.ref.name)
            self._pool = ctx.Pool(self.num_workers, initializer=user_fn_worker.init, initargs=args)
            started = [self._pool.apply_async(user_fn_worker.ready) for _ in range(self.num_workers)]
            try:
                if not all(r.get(timeout=STARTUP_TIMEOUT_S) for r in started):
                    raise RewardFunctionError(f"reward.function={self.ref}: the function did not load in a worker")
            except multiprocessing.TimeoutError:
                self.close()
                raise RewardFunctionError(
                    f"reward.function={self.ref}: its worker processes did not start in {STARTUP_TIMEOUT_S:g} s"
                ) from None
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __call__(self, calls: Sequence[tuple[str, str, str, dict]], problem_ids: Sequence[str]) -> list[Any]:
        if not calls:
            return []
        if self.batched:
            return self._batched(calls, problem_ids)
        pool = self._workers()
        pending = [pool.apply_async(user_fn_worker.call, (args,)) for args in calls]
        return [self._result(p, [pid]) for p, pid in zip(pending, problem_ids)]

    def _batched(self, calls: Sequence[tuple[str, str, str, dict]], problem_ids: Sequence[str]) -> list[Any]:
        size = math.ceil(len(calls) / self.num_workers)
        chunks = [range(i, min(i + size, len(calls))) for i in range(0, len(calls), size)]
        pool = self._workers()
        pending = [
            pool.apply_async(user_fn_worker.call, (tuple(list(c) for c in zip(*[calls[i] for i in r])),))
            for r in chunks
        ]
        out: list[Any] = []
        for p, r in zip(pending, chunks):
            values = self._result(p, [problem_ids[i] for i in r])
            if not isinstance(values, (list, tuple)) or len(values) != len(r):
                got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
                self.close()
                raise RewardFunctionError(
                    f"reward.function={self.ref} (batched) returned {got} values for {len(r)} responses "
                    f"(problems {problem_ids[r[0]]}..{problem_ids[r[-1]]}); it must return one per response"
                )
            out += list(values)
        return out

    def _result(self, pending: Any, problem_ids: list[str]) -> Any:
        which = problem_ids[0] if len(problem_ids) == 1 else f"{problem_ids[0]}..{problem_ids[-1]}"
        try:
            status, value = pending.get(timeout=self.timeout_s)
        except multiprocessing.TimeoutError:
            self.close()  # the call may never return: its worker goes with the pool
            raise RewardFunctionError(
                f"reward.function={self.ref} timed out after {self.timeout_s:g} s (reward.function_timeout_s) "
                f"on problem {which}"
            ) from None
        except Exception as e:  # noqa: BLE001 - a worker that could not start (e.g. its import failed there)
            self.close()
            raise RewardFunctionError(
                f"reward.function={self.ref} failed on problem {which}: {user_fn_worker.one_line(e)}"
            ) from None
        if status == "error":
            self.close()
            raise RewardFunctionError(f"reward.function={self.ref} raised {value} on problem {which}")
        return value


def check_value(value: Any, num_steps: int, ref: FunctionRef, problem_id: str) -> float | list[float]:
    """A returned value as a float (outcome) or a list of ``num_steps`` floats (per step); anything else, a
    non-finite number or a list of another length raises ``RewardFunctionError``.
    Worked example: 0.5 -> 0.5; [1, 0] with 2 steps -> [1.0, 0.0]; [1] with 2 steps -> error."""
    where = f"reward.function={ref} on problem {problem_id}"
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not math.isfinite(float(value)):
            raise RewardFunctionError(f"{where} returned {value} (not finite)")
        return float(value)
    if isinstance(value, (list, tuple)) and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value):
        if len(value) != num_steps:
            raise RewardFunctionError(
                f"{where} returned {len(value)} step rewards for a response of {num_steps} steps "
                "(one per step of metadata['steps'], or one float for the whole response)"
            )
        bad = [v for v in value if not math.isfinite(float(v))]
        if bad:
            raise RewardFunctionError(f"{where} returned a non-finite step reward ({bad[0]})")
        return [float(v) for v in value]
    raise RewardFunctionError(
        f"{where} returned {type(value).__name__} {value!r:.80}: expected a float or a list of floats"
    )
