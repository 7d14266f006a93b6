"""The one answer grader: training's success reward and MATH/GSM8K accuracy both call it.

Usage:
    from mathtask.grade import grade, grade_many, extract_answer
    grade(response, gold, dataset="math")          # -> GradeResult(correct, extracted, reason)
    python -m mathtask.grade --input IN.jsonl --output OUT.jsonl

Policy
------
Extraction
  * The answer is the content of the last \\boxed{...} or \\fbox{...} in the response (nested
    braces handled; a box inside the box is unwrapped). Without a box, it is the text after the
    last of: "####" (gsm8k only), "The final answer is", "The answer is", "Answer:",
    "Final Answer:" (case-insensitive), up to the end of that math span or sentence.
  * No box and no marker: incorrect ("no_answer"). An unclosed last box ("unclosed_box") or a
    marker followed by an unterminated math span or unbalanced braces ("truncated"): incorrect.
  * A gold that contains \\boxed is reduced to its last box first; a gold with "####" to the
    text after it.
Equality is by mathematical value, whatever the presentation
  * \\dfrac/\\tfrac/\\frac/a/b, spacing, \\left/\\right, \\text/\\mathbf/\\mbox wrappers, math
    delimiters, thousands separators (1,600 and 10,\\!080), trailing zeros, exact decimals vs
    fractions, mixed numbers (1\\frac{4}{5} = 9/5), unreduced fractions, radicals, expanded vs
    factored expressions, unsimplified exact values (2^{10}, \\binom{5}{2}, 5!, \\log_2 8),
    repeating decimals (0.\\overline{3}), complex numbers in any form (i is the imaginary unit).
  * "x = 5" answers "5" (and the reverse); "(a,b) = (4,5)" answers "(4,5)"; "y = 2x+3" and
    "2x - y + 3 = 0" are the same equation (equations are equal up to a nonzero factor).
  * An inequality in one variable is the interval it describes: "x \\le 2" equals (-\\infty, 2];
    "x < 2 or x > 3" equals (-\\infty,2) \\cup (3,\\infty); "x > 2 and x \\le 5", "|x-3| \\le 2",
    "x \\in [a,b]" and "\\{x \\mid ...\\}" likewise.
  * Units, currency, degree signs and a trailing % are labels: 25\\% equals 25 and 30^\\circ
    equals 30, but the scale must match the gold's: 0.25 vs 25\\% is incorrect, and so is
    \\frac{\\pi}{6} vs 30^\\circ. (Inside \\sin/\\cos/... a degree sign converts: \\cos 60^\\circ = 1/2.)
  * Approximations of exact answers are incorrect (0.333 vs \\frac13, 3.14 vs \\pi): values are
    compared exactly (numerically at 60 digits, relative difference below 1e-45, on exact
    expressions), never with a tolerance. Expressions in variables are equal when they agree at
    several fixed sample points (variable names are case-insensitive, as in math-verify).
  * Solution sets and "all solutions" lists (comma/"and"/"or"-separated, or ±) are unordered
    and compared as sets. Tuples, points, vectors and intervals are ordered; open/closed ends
    must match. A set is not a tuple. A bare list answering a tuple must keep its order; a
    column vector equals the tuple of its entries.
  * Base-n answers must be in the requested base: for gold 1011_2 the answer 1011 or 1011_2 is
    correct, the decimal value 11 is not.
  * Multiple choice: C, (C), \\text{(C)}, \\textbf{(C)}, "(C) 42" are the same answer.
  * Word answers (\\text{east}) compare case-insensitively, ignoring a leading article.
Safety
  * Model text is never evaluated as Python: plain numbers go through a small exact-rational
    parser, everything else through latex2sympy2_extended's LaTeX grammar, whose trees are
    size-bounded (exponents, factorials) before anything is evaluated.
  * Extraction is linear in the response; only a bounded candidate (1000 characters) is parsed.
  * Comparisons that need sympy run in worker processes; an item that runs past timeout_s has
    its worker killed and replaced and is graded incorrect ("timeout"). grade() never raises
    for any response or gold text and is safe to call from any thread.

Reasons: "equal", "not_equal", "no_answer", "unclosed_box", "truncated", "timeout", "error".
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mathtask.grading.compare import FAST_OPS, NeedSympy, judge
from mathtask.grading.extract import DATASETS, check_dataset, extract_gold, extract_with_reason

__all__ = ["GradeResult", "extract_answer", "grade", "grade_many", "warm_up"]


@dataclass
class GradeResult:
    correct: bool
    extracted: str | None
    reason: str


def extract_answer(response: str, dataset: str = "math") -> str | None:
    """The final answer text of a response, or None if it has none (or it is unusable)."""
    return extract_with_reason(response, dataset)[0]


def grade(response: str, gold: str, dataset: str = "math", timeout_s: float = 5.0) -> GradeResult:
    """Grades one response against its gold answer. Raises only for an unknown dataset.

    timeout_s bounds the sympy comparison once a worker runs it; the first call that needs a
    worker also waits for it to start (about a second; warm_up() pays that up front).
    """
    return grade_many([response], [gold], dataset, timeout_s=timeout_s, num_workers=1)[0]


def grade_many(
    responses: Sequence[str],
    golds: Sequence[str],
    datasets: Sequence[str] | str = "math",
    timeout_s: float = 5.0,
    num_workers: int | None = None,
) -> list[GradeResult]:
    """Grades a batch; results are in input order.

    Items the in-process fast path cannot decide go to the shared pool of worker processes,
    which grows to at least num_workers (default: CPU count, at most 8) while the batch runs.
    """
    if len(responses) != len(golds):
        raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
    if isinstance(datasets, str):
        datasets = [datasets] * len(responses)
    elif len(datasets) != len(responses):
        raise ValueError(f"{len(responses)} responses but {len(datasets)} datasets")
    for dataset in set(datasets):
        check_dataset(dataset)

    results: list[GradeResult | None] = [None] * len(responses)
    slow: list[int] = []
    slow_items: list[tuple[str, str]] = []
    for k, (response, gold, dataset) in enumerate(zip(responses, golds, datasets)):
        extracted = None
        try:
            extracted, why = extract_with_reason(response, dataset)
            if extracted is None:
                results[k] = GradeResult(False, None, why)
                continue
            gold_text = extract_gold(gold if isinstance(gold, str) else str(gold), dataset)
            try:
                correct = judge(extracted, gold_text, FAST_OPS)
            except NeedSympy:
                slow.append(k)
                slow_items.append((extracted, gold_text))
                continue
            results[k] = GradeResult(correct, extracted, "equal" if correct else "not_equal")
        except Exception:
            results[k] = GradeResult(False, extracted, "error")

    if slow:
        from mathtask.grading.pool import DEFAULT_MAX_WORKERS, run

        outcomes = run(slow_items, timeout_s, num_workers or DEFAULT_MAX_WORKERS)
        for k, (extracted, _), (correct, reason) in zip(slow, slow_items, outcomes):
            results[k] = GradeResult(correct, extracted, reason)
    return results  # type: ignore[return-value]


def warm_up(num_workers: int | None = None) -> None:
    """Starts grader workers and waits until they are ready, so that the first batch does not wait."""
    from mathtask.grading.pool import DEFAULT_MAX_WORKERS, dispatcher

    dispatcher().warm_up(num_workers or DEFAULT_MAX_WORKERS)


def _read_rows(name: str, default_dataset: str) -> list[tuple[dict, str]]:
    """(row, dataset) for every line of the input (``-``: stdin); a bad line is one ``error:`` naming it."""
    from common.cli import fail

    try:
        source = sys.stdin if name == "-" else open(name, encoding="utf-8")
    except OSError as e:
        fail(f"--input {name}: cannot read: {e.strerror}")
    rows = []
    with source:
        for num_line, line in enumerate(source, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                fail(f"{name}:{num_line}: not JSON: {e}")
            if not isinstance(row, dict) or "response" not in row or "gold" not in row:
                fail(f"{name}:{num_line}: needs an object with 'response' and 'gold'")
            dataset = row.get("dataset") or default_dataset
            if dataset not in DATASETS:
                fail(f"{name}:{num_line}: unknown dataset {dataset!r} (one of {', '.join(DATASETS)})")
            rows.append((row, dataset))
    return rows


def _main(argv: Sequence[str] | None = None) -> int:
    from common.cli import ArgumentParser, fail, positive

    parser = ArgumentParser(
        prog="python -m mathtask.grade",
        description="Grade JSONL lines {response, gold[, dataset]}; writes each line plus correct and extracted.",
    )
    parser.add_argument("--input", required=True, help="input .jsonl (use - for stdin)")
    parser.add_argument("--output", required=True, help="output .jsonl (use - for stdout)")
    parser.add_argument("--dataset", default="math", choices=DATASETS, help="for lines without a dataset field")
    parser.add_argument("--timeout", type=positive(float), default=5.0, help="per-item timeout in seconds")
    parser.add_argument("--num-workers", type=positive(int), default=None, help="worker processes (default: CPU count)")
    parser.add_argument("--reasons", action="store_true", help="also write the reason field")
    args = parser.parse_args(argv)

    rows = _read_rows(args.input, args.dataset)
    if args.output != "-" and not Path(args.output).resolve().parent.is_dir():
        fail(f"--output {args.output}: no such directory")

    results = grade_many(
        [r["response"] for r, _ in rows],  # both keys checked present above
        [r["gold"] for r, _ in rows],
        [d for _, d in rows],
        timeout_s=args.timeout,
        num_workers=args.num_workers,
    )
    lines = []
    for (row, _), result in zip(rows, results):
        out = dict(row)
        out["correct"] = result.correct
        out["extracted"] = result.extracted
        if args.reasons:
            out["reason"] = result.reason
        lines.append(json.dumps(out, ensure_ascii=False) + "\n")
    if args.output == "-":
        sys.stdout.writelines(lines)
    else:
        from common.files import atomic_write_text

        atomic_write_text(Path(args.output), "".join(lines))
    num_correct = sum(r.correct for r in results)
    print(f"graded {len(results)}: {num_correct} correct", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
