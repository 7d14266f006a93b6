"""math-verify (Hugging Face's grader) as an alternative to realm's grader, for scores set beside
papers and trainers that report math-verify's.

    from mathtask.grading.math_verify import grade_many_math_verify
    grade_many_math_verify(["... \\boxed{0.5}"], ["\\frac{1}{2}"], ["math"])[0].correct   # True

The gold is parsed as ``\\boxed{gold}``, the response with math-verify's default extraction (LaTeX,
boxed answers first, then plain expressions), and the two are compared with ``verify``. math-verify
bounds its own parsing and comparison with ``signal.alarm``, which works only in a process's main
thread, so every batch runs in a worker process's main thread: safe to call from any thread, and a
worker that runs past the batch's time budget is killed and its items graded incorrect ("timeout").
Model text is parsed by math-verify's LaTeX grammar and sympy, never evaluated as Python.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from mathtask.grade import GradeResult

NAME = "math_verify"


def _grade_batch(items: list[tuple[str, str]], timeout_s: int) -> list[tuple[bool, str | None, str]]:
    """(correct, extracted, reason) per (response, gold); runs in a worker's main thread."""
    from math_verify import parse, verify

    out: list[tuple[bool, str | None, str]] = []
    for response, gold in items:
        try:
            gold_parsed = parse("\\boxed{" + gold + "}", parsing_timeout=timeout_s)
            pred = parse(response, parsing_timeout=timeout_s)
            if not pred:
                out.append((False, None, "no_answer"))
                continue
            correct = bool(verify(gold_parsed, pred, timeout_seconds=timeout_s))
            out.append((correct, str(pred[-1]), "equal" if correct else "not_equal"))
        except Exception:  # noqa: BLE001 - a grader never fails the evaluation over one response
            out.append((False, None, "error"))
    return out


def grade_many_math_verify(
    responses: Sequence[str], golds: Sequence[str], datasets: Sequence[str] | str = "math", timeout_s: int = 5
) -> list[GradeResult]:
    """Grades a batch with math-verify; results in input order (``datasets`` is unused: one policy)."""
    if len(responses) != len(golds):
        raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
    items = [(str(r), str(g)) for r, g in zip(responses, golds)]
    if not items:
        return []
    # Each item parses twice and verifies once, each bounded by timeout_s; the budget adds start-up slack.
    budget = 30 + 3 * timeout_s * len(items)
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    try:
        outcomes = pool.submit(_grade_batch, items, timeout_s).result(timeout=budget)
    except FutureTimeout:
        for p in list(getattr(pool, "_processes", {}).values()):
            p.kill()
        outcomes = [(False, None, "timeout")] * len(items)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return [GradeResult(correct, extracted, reason) for correct, extracted, reason in outcomes]
