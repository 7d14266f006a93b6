"""Grader benchmark: mathtask.grade vs math-verify on the same labeled set, in the same run.

The set is built from real gold answers (GSM8K test `####` answers, MATH-500 `answer` fields):
for each gold, equivalent rewrites (boxed, "The final answer is", \\dfrac, a/b, decimals,
thousands separators, x = ..., units, \\left/\\right) labeled correct, and wrong answers (off by
one, another problem's answer, an unclosed box, no answer marker) labeled incorrect. Labels
follow the mathtask.grade policy, so "no marker" rows count against math-verify, which accepts a
bare number anywhere; the report separates those rows.

    python bench/grade.py [--num-gsm8k 250] [--num-math 500] [--show 15]
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import random
import re
import sys
import time
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mathtask.grade import grade, grade_many, warm_up  # noqa: E402
from mathtask.grading.compare import FAST_OPS, NeedSympy, judge  # noqa: E402
from mathtask.grading.exact import exact_value  # noqa: E402
from mathtask.grading.extract import extract_gold, extract_with_reason  # noqa: E402
from mathtask.grading.normalize import Scalar, _parse_cached, parse_answer  # noqa: E402
from mathtask.grading.pool import shutdown  # noqa: E402


def _data_file(*parts: str) -> Path:
    for base in (ROOT / "data", Path("/work/shared/data")):
        if (base.joinpath(*parts)).exists():
            return base.joinpath(*parts)
    raise FileNotFoundError("/".join(parts))


def load_golds(num_gsm8k: int, num_math: int) -> list[tuple[str, str]]:
    golds = []
    with open(_data_file("gsm8k", "test.jsonl")) as f:
        for line in f:
            golds.append(("gsm8k", json.loads(line)["answer"].rsplit("####", 1)[1].strip()))
            if len(golds) >= num_gsm8k:
                break
    with open(_data_file("math", "math500_test.jsonl")) as f:
        for k, line in enumerate(f):
            if k >= num_math:
                break
            golds.append(("math", json.loads(line)["answer"]))
    return golds


# ---------------------------------------------------------------------------------------------
# Variants


def _with_commas(n: int) -> str:
    return f"{n:,}"


def _decimal_of(value: Fraction) -> str | None:
    """The exact terminating decimal of value, if there is one."""
    den = value.denominator
    for p in (2, 5):
        while den % p == 0:
            den //= p
    if den != 1:
        return None
    digits = 0
    while (value * 10**digits).denominator != 1:
        digits += 1
    s = f"{float(value):.{digits}f}" if digits < 15 else None
    return s if s is not None and Fraction(s) == value else None


def _value(gold: str) -> Fraction | None:
    node = parse_answer(gold)
    return exact_value(node.latex) if isinstance(node, Scalar) else None


def equivalent_rewrites(gold: str, dataset: str) -> list[tuple[str, str]]:
    """(kind, answer text) pairs with the gold's value."""
    out = []
    value = _value(gold)
    if "\\frac" in gold:
        out.append(("dfrac", gold.replace("\\frac", "\\dfrac")))
    if " " in gold:
        out.append(("no_spaces", gold.replace(" ", "")))
    if gold.startswith("(") and gold.endswith(")") and "\\left" not in gold:
        out.append(("left_right", "\\left" + gold[:-1] + "\\right)"))
    if value is not None:
        if value.denominator == 1:
            n = value.numerator
            if abs(n) >= 1000:
                out.append(("thousands", _with_commas(n)))
            out.append(("trailing_zeros", f"{n}.00"))
            out.append(("units", f"{n} \\text{{ units}}"))
        else:
            out.append(("slash", f"{value.numerator}/{value.denominator}"))
            dec = _decimal_of(value)
            if dec is not None and dec != gold:
                out.append(("decimal", dec))
            out.append(("unreduced", f"\\frac{{{2 * value.numerator}}}{{{2 * value.denominator}}}"))
    m = re.match(r"^([^-+,=(){}\[\]]+?)\s*([-+])\s*([^-+,=(){}\[\]]+)$", gold)
    if m is not None and dataset == "math":
        # a + b -> b + a, a - b -> -b + a: the same value that only sympy can confirm.
        first, sign, second = m.group(1).strip(), m.group(2), m.group(3).strip()
        out.append(("swapped_terms", f"{'-' if sign == '-' else ''}{second} + {first}"))
    if "\\sqrt" in gold and dataset == "math":
        out.append(("sqrt_as_power", re.sub(r"\\sqrt\{([^{}]*)\}", r"(\1)^{1/2}", gold)))
    if dataset == "math" and "=" not in gold and "\\text" not in gold and "," not in gold and "\\in" not in gold:
        out.append(("assignment", f"x = {gold}"))
    if dataset == "gsm8k":
        out.append(("currency", f"\\${gold}"))
    return out


def wrong_answers(gold: str, dataset: str, others: list[str], rng: random.Random) -> list[tuple[str, str]]:
    out = []
    value = _value(gold)
    if value is not None:
        if value.denominator == 1:
            out.append(("off_by_one", str(value.numerator + 1)))
        else:
            out.append(("wrong_fraction", f"\\frac{{{value.numerator + 1}}}{{{value.denominator}}}"))
        dec = _decimal_of(value) if value.denominator != 1 else None
        if dec is None and value.denominator != 1:
            out.append(("approximation", f"{float(value):.3f}"))
    for _ in range(20):
        other = rng.choice(others)
        if other.replace(" ", "") == gold.replace(" ", ""):
            continue
        other_value = _value(other)
        if value is not None and other_value is not None and other_value == value:
            continue
        if (value is None) != (other_value is None):
            out.append(("other_answer", other))
            break
        if value is not None:
            out.append(("other_answer", other))
            break
    return out


def build_cases(golds: list[tuple[str, str]], seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    by_dataset = collections.defaultdict(list)
    for dataset, gold in golds:
        by_dataset[dataset].append(gold)
    cases = []
    for k, (dataset, gold) in enumerate(golds):

        def add(kind, response, label):
            # Called within this iteration only, so the loop variables are the ones meant.
            case = {"dataset": dataset, "gold": gold}  # noqa: B023
            cases.append({**case, "kind": kind, "response": response, "label": label})

        add("boxed", f"Adding these up gives the result.\nTherefore the answer is $\\boxed{{{gold}}}$.", True)
        if dataset == "gsm8k":
            add("hash", f"So she has {gold} left.\n#### {gold}", True)
        add("final_answer", f"The final answer is ${gold}$. I hope it is correct.", True)
        for kind, answer in equivalent_rewrites(gold, dataset):
            add(kind, f"Thus, $\\boxed{{{answer}}}$", True)
        for kind, answer in wrong_answers(gold, dataset, by_dataset[dataset], rng):
            add(kind, f"Thus, $\\boxed{{{answer}}}$", False)
        add("unclosed_box", f"Thus, $\\boxed{{{gold}", False)
        if k % 5 == 0:
            add("no_marker", f"I am fairly sure it is {gold} but cannot finish.", False)
    return cases


# ---------------------------------------------------------------------------------------------
# Graders


def math_verify_grader():
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)

    def run(case: dict) -> bool:
        try:
            gold = parse(f"${case['gold']}$")
            return bool(verify(gold, parse(case["response"])))
        except Exception:
            return False

    return run


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-gsm8k", type=int, default=250)
    parser.add_argument("--num-math", type=int, default=500)
    parser.add_argument("--num-workers", type=int, default=None)
    parser.add_argument("--show", type=int, default=15, help="disagreements to print")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    cases = build_cases(load_golds(args.num_gsm8k, args.num_math), args.seed)
    responses = [c["response"] for c in cases]
    golds = [c["gold"] for c in cases]
    datasets = [c["dataset"] for c in cases]
    num_cases = len(cases)
    print(
        f"{num_cases} cases from {args.num_gsm8k} GSM8K + {args.num_math} MATH-500 golds "
        f"({sum(c['label'] for c in cases)} labeled correct)"
    )

    # Warm both graders (worker start-up, ANTLR caches) so that the timings compare grading.
    mv = math_verify_grader()
    for c in cases[:20]:
        mv(c)
    warm_up(args.num_workers)
    grade_many(responses[:20], golds[:20], datasets[:20], num_workers=args.num_workers)

    # Ours first and with fresh caches for each run, so that no run grades pairs a previous run
    # already parsed (math-verify's own caches warm up during its run like ours do).
    ours, ours_time = _timed(lambda: grade_many(responses, golds, datasets, num_workers=args.num_workers))
    shutdown()
    _parse_cached.cache_clear()
    warm_up(1)
    grade_many(responses[:20], golds[:20], datasets[:20], num_workers=1)
    ours_seq, ours_seq_time = _timed(lambda: [grade(r, g, d) for r, g, d in zip(responses, golds, datasets)])
    mv_results, mv_time = _timed(lambda: [mv(c) for c in cases])

    num_fast = 0
    slow_rows = []
    for k, (r, g, d) in enumerate(zip(responses, golds, datasets)):
        extracted, _ = extract_with_reason(r, d)
        if extracted is None:
            num_fast += 1
            continue
        try:
            judge(extracted, extract_gold(g, d), FAST_OPS)
            num_fast += 1
        except NeedSympy:
            slow_rows.append(k)

    print("\ntiming (same cases, same process, warmed up)")
    print(f"  math-verify parse+verify, sequential : {mv_time:7.2f} s  {1000 * mv_time / num_cases:6.3f} ms/pair")
    print(
        f"  mathtask.grade grade_many (worker pool)  : {ours_time:7.2f} s  {1000 * ours_time / num_cases:6.3f} ms/pair"
        f"  ratio {ours_time / mv_time:.2f}x of math-verify"
    )
    print(
        f"  mathtask.grade grade(), one at a time    : {ours_seq_time:7.2f} s  {1000 * ours_seq_time / num_cases:6.3f} ms/pair"
        f"  ratio {ours_seq_time / mv_time:.2f}x of math-verify"
    )
    print(f"  decided in-process without sympy     : {num_fast}/{num_cases} ({100 * num_fast / num_cases:.0f}%)")

    # The worst case for us: only the pairs that need sympy, fresh workers and caches again.
    hard = slow_rows
    if hard:
        shutdown()
        _parse_cached.cache_clear()
        warm_up(args.num_workers)
        _, hard_time = _timed(
            lambda: grade_many(
                [responses[k] for k in hard],
                [golds[k] for k in hard],
                [datasets[k] for k in hard],
                num_workers=args.num_workers,
            )
        )
        _, hard_mv_time = _timed(lambda: [mv(cases[k]) for k in hard])
        print(
            f"  sympy-only subset ({len(hard)} pairs): mathtask.grade {1000 * hard_time / len(hard):.2f} ms/pair,"
            f" math-verify {1000 * hard_mv_time / len(hard):.2f} ms/pair, ratio {hard_time / hard_mv_time:.2f}x"
        )

    ours_correct = [r.correct for r in ours]
    assert ours_correct == [r.correct for r in ours_seq], "grade_many and grade() disagree"
    labels = [c["label"] for c in cases]

    def accuracy(pred, rows):
        return sum(pred[k] == labels[k] for k in rows) / max(1, len(rows))

    print("\nagreement with the constructed labels")
    all_rows = range(num_cases)
    policy_rows = [k for k in all_rows if cases[k]["kind"] != "no_marker"]
    print(f"  {'subset':34} {'n':>5}  {'mathtask.grade':>10}  {'math-verify':>11}")
    subsets = [("all", list(all_rows)), ("all but no_marker rows", policy_rows)]
    for dataset in ("gsm8k", "math"):
        subsets.append((dataset, [k for k in all_rows if datasets[k] == dataset]))
    for kind in sorted({c["kind"] for c in cases}):
        subsets.append((f"kind={kind}", [k for k in all_rows if cases[k]["kind"] == kind]))
    for name, rows in subsets:
        print(
            f"  {name:34} {len(rows):5d}  {100 * accuracy(ours_correct, rows):9.1f}%  {100 * accuracy(mv_results, rows):10.1f}%"
        )
    both = sum(a == b for a, b in zip(ours_correct, mv_results))
    print(f"\neval.grade and math-verify agree on {both}/{num_cases} ({100 * both / num_cases:.1f}%)")
    reasons = collections.Counter(r.reason for r in ours)
    print("mathtask.grade reasons:", dict(reasons))

    wrong_ours = [k for k in all_rows if ours_correct[k] != labels[k]]
    wrong_mv = [k for k in policy_rows if mv_results[k] != labels[k]]
    print("math-verify disagreements by kind:", dict(collections.Counter(cases[k]["kind"] for k in wrong_mv)))
    for title, rows in (
        ("mathtask.grade vs label", wrong_ours),
        ("math-verify vs label (no_marker rows excluded)", wrong_mv),
    ):
        print(f"\n{title}: {len(rows)} disagreements" + (f", first {args.show}:" if rows else ""))
        for k in rows[: args.show]:
            c = cases[k]
            print(
                f"  [{c['dataset']}/{c['kind']}] label={c['label']} gold={c['gold']!r} response={c['response'][-60:]!r}"
                f" -> ours={ours_correct[k]} ({ours[k].reason}, {ours[k].extracted!r}) mv={mv_results[k]}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
