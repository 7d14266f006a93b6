"""Random and adversarial text: the grader never raises, never hangs, and stays within its timeout."""

from __future__ import annotations

import random
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from mathtask.grade import GradeResult, extract_answer, grade, grade_many
from mathtask.grading.compare import FAST_OPS, NeedSympy, judge
from mathtask.grading.exact import exact_value
from mathtask.grading.normalize import parse_answer

REASONS = {"equal", "not_equal", "no_answer", "unclosed_box", "truncated", "timeout", "error"}
# Takes sympy tens of seconds: a stand-in for a hung comparison.
SLOW = "\\boxed{\\prod_{k=1}^{10^{5}} \\frac{k+1}{k}}"

_TOKENS = [
    "\\boxed{",
    "\\fbox{",
    "{",
    "}",
    "\\{",
    "\\}",
    "(",
    ")",
    "[",
    "]",
    "\\frac",
    "\\dfrac",
    "\\sqrt",
    "\\left(",
    "\\right)",
    "^",
    "_",
    "!",
    "+",
    "-",
    "*",
    "/",
    ",",
    "=",
    "<",
    "\\le",
    "\\ge",
    "\\pm",
    "\\cup",
    "\\infty",
    "\\pi",
    "i",
    "e",
    "x",
    "y",
    "\\text{",
    "\\mathbf{",
    "\\%",
    "\\$",
    "^\\circ",
    "\\overline{",
    "\\begin{pmatrix}",
    "\\end{pmatrix}",
    "\\\\",
    "&",
    "$",
    "####",
    "The answer is ",
    "Answer: ",
    ".",
    " ",
    "\n",
    "0",
    "1",
    "2",
    "7",
    "10",
    "0.5",
    "1,000",
    "\\binom",
    "\\log_",
    "\\sin",
    "\\cdot",
    "\\times",
    "or",
    "and",
    "cm",
    "(C)",
    "_2",
    "\u2212",
    "\u221a",
    "\u00b2",
    "\u00bd",
    "\U0001f4a5",
    "\u202e",
    "\x00",
    "\ud800",
]
_LATEX = st.lists(st.sampled_from(_TOKENS), max_size=40).map("".join)
_ANY_TEXT = st.one_of(st.text(max_size=300), _LATEX)


@settings(max_examples=400, deadline=None, database=None)
@given(_ANY_TEXT, _ANY_TEXT, st.sampled_from(["math", "gsm8k"]))
def test_in_process_stages_never_raise(response, gold, dataset):
    start = time.monotonic()
    extracted = extract_answer(response, dataset)
    assert extracted is None or isinstance(extracted, str)
    parse_answer(gold)
    exact_value(gold)
    if extracted is not None:
        try:
            judge(extracted, gold, FAST_OPS)
        except NeedSympy:
            pass
    assert time.monotonic() - start < 1.0


def _soup(rng: random.Random) -> str:
    return "".join(rng.choice(_TOKENS) for _ in range(rng.randint(0, 30)))


ADVERSARIAL = [
    "x" * 100_000,
    "\\boxed{" + "{" * 50_000 + "}" * 50_001,
    "\\boxed{" * 10_000,
    "{" * 100_000,
    "\\boxed{" + "\\frac{" * 3000 + "}" * 6001,
    "\\boxed{10^{10^{10^{10}}}}",
    "\\boxed{(10^6)!}",
    "\\boxed{9!!!!!!!!!!}",
    "\\boxed{\\binom{10^9}{5 \\cdot 10^8}}",
    "\\boxed{2^{2^{2^{2^{2^{2}}}}}}",
    "\\boxed{x^{10^{100}}}",
    "\\boxed{e^{e^{e^{e^{10}}}}}",
    "\\boxed{\\sin(10^{100})}",
    "\\boxed{\\frac{1}{0}}",
    "\\boxed{" + "(" * 500 + "1" + ")" * 500 + "}",
    "\\boxed{" + "1+" * 400 + "1}",
    "\\boxed{" + ",".join(["1"] * 500) + "}",
    "\\boxed{\ud800\u202e\x00\U0001f4a5}",
    "The answer is " + "$" * 1001,
    "\\boxed{" + "9" * 5000 + "}",
    "\\boxed{0." + "3" * 3000 + "}",
    "\\boxed{\\Gamma(10^{10})}",
    "\\boxed{" + "a_{" * 200 + "}" * 201,
    "####" * 20_000,
    "The answer is " * 10_000,
]


def test_adversarial_batch_is_bounded():
    golds = ["1", "10^{10^{10^{10}}}", "(1,2)"]
    responses = [r for r in ADVERSARIAL for _ in golds]
    gold_column = [g for _ in ADVERSARIAL for g in golds]
    # The same strings as gold answers.
    responses += ["\\boxed{1}"] * len(ADVERSARIAL)
    gold_column += ADVERSARIAL
    start = time.monotonic()
    results = grade_many(responses, gold_column, "math", timeout_s=2.0, num_workers=2)
    elapsed = time.monotonic() - start
    assert len(results) == len(responses)
    assert all(isinstance(r, GradeResult) and r.reason in REASONS for r in results)
    assert elapsed < 40, elapsed


def test_random_soup_batch():
    rng = random.Random(1234)
    responses = [_soup(rng) for _ in range(300)]
    golds = [_soup(rng) for _ in range(300)]
    datasets = [rng.choice(["math", "gsm8k"]) for _ in range(300)]
    results = grade_many(responses, golds, datasets, timeout_s=2.0, num_workers=2)
    assert all(isinstance(r, GradeResult) and r.reason in REASONS for r in results)
    # An answer always equals itself as the gold, whatever it is.
    answered = [
        (r, x.extracted, d)
        for r, x, d in zip(responses, results, datasets)
        if x.extracted and "####" not in x.extracted
    ]
    same = grade_many(*zip(*answered), timeout_s=2.0, num_workers=2)
    for (response, extracted, _), result in zip(answered, same):
        if result.reason != "timeout":
            assert result.correct, (response, extracted, result)


def test_timeout_kills_worker_and_the_rest_go_on():
    start = time.monotonic()
    results = grade_many(
        [SLOW, "\\boxed{\\sqrt{8}}", SLOW, "\\boxed{3}", "\\boxed{2+2i}"],
        ["1", "2\\sqrt2", "2", "3", "2i+2"],
        # Far below SLOW's tens of seconds, far above the others' milliseconds even on a busy machine.
        timeout_s=1.5,
        num_workers=1,
    )
    assert [r.reason for r in results] == ["timeout", "equal", "timeout", "equal", "equal"]
    assert [r.correct for r in results] == [False, True, False, True, True]
    # Two timeouts, two worker restarts (about a second each on a busy 2-core machine).
    assert time.monotonic() - start < 20


def test_timeout_outside_the_main_thread():
    box = {}

    def run():
        start = time.monotonic()
        box["result"] = grade(SLOW, "1", timeout_s=0.5)
        box["elapsed"] = time.monotonic() - start

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert box["result"].reason == "timeout"
    assert box["elapsed"] < 10


def test_concurrent_threads_share_the_pool():
    cases = [
        ("\\boxed{\\sqrt{12}}", "2\\sqrt3", True),
        ("\\boxed{\\frac{\\pi}{3}}", "60^\\circ", False),
        ("\\boxed{(x+1)^2}", "x^2+2x+1", True),
        ("\\boxed{3+4i}", "4i+3", True),
    ] * 3
    results = [None] * len(cases)

    def run(k):
        response, gold, _ = cases[k]
        # Generous: this checks sharing, not speed, and CI machines can be heavily loaded.
        results[k] = grade(response, gold, timeout_s=60)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert [r.correct if r else None for r in results] == [c[2] for c in cases], results


def test_no_worker_process_means_errors_not_a_hang(monkeypatch):
    from mathtask.grading import pool

    monkeypatch.setattr(pool.sys, "executable", "/nonexistent/python")
    dispatcher = pool.Dispatcher()
    try:
        start = time.monotonic()
        assert dispatcher.run([("\\sqrt{2}", "2^{1/2}")], 1.0, 1) == [(False, "error")]
        assert time.monotonic() - start < 10
    finally:
        dispatcher.close()
