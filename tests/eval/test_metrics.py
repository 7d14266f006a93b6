"""Metrics as worked examples: every expected number can be checked by hand."""

from __future__ import annotations

import math
import random

import pytest

from eval.metrics import (
    bootstrap_interval,
    default_ks,
    length_stats,
    maj_at_k,
    majority_vote,
    mean_with_ci,
    pass_at_k,
    summarize,
    wilson_interval,
)


def test_pass_at_k_worked_examples():
    # n=4 samples, c=1 correct. pass@1 = c/n; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6; pass@4 = 1.
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == 1.0
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10.
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    # Large n stays finite and equals the binomial formula.
    assert pass_at_k(200, 13, 100) == pytest.approx(1 - math.comb(187, 100) / math.comb(200, 100))
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_pass_at_k_is_the_subset_average():
    # Brute force over all k-subsets of a fixed grading: the estimator is exact, not an approximation.
    from itertools import combinations

    correct = [True, False, False, True, False, False]
    for k in range(1, 7):
        subsets = list(combinations(correct, k))
        assert pass_at_k(6, 2, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_majority_vote_worked_examples():
    # "3" gets 2 votes, "4" one; None does not vote.
    assert majority_vote(["3", "4", "3", None], [True, False, True, False]) is True
    # Whitespace is ignored for voting: "x = 2" and "x=2" are one answer with 2 votes.
    assert majority_vote(["x = 2", "5", "x=2"], [False, True, False]) is False
    # Tie 1-1: the answer seen first wins.
    assert majority_vote(["7", "8"], [False, True]) is False
    assert majority_vote(["8", "7"], [True, False]) is True
    assert majority_vote([None, None], [False, False]) is False
    # maj@k looks at the first k samples only: first 3 -> "1" (2 votes, wrong); all 5 -> "2" (3 votes, right).
    answers, correct = ["1", "2", "1", "2", "2"], [False, True, False, True, True]
    assert maj_at_k(answers, correct, 3) is False
    assert maj_at_k(answers, correct, 5) is True


def test_wilson_interval_worked_examples():
    # 8/10: center = (0.8 + 1.96^2/20) / (1 + 1.96^2/10) = 0.7167, half-width 0.2266.
    lo, hi = wilson_interval(8, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.4902, 0.9433)
    # 0/10 still has a non-degenerate upper bound: z^2 / (n + z^2) = 3.8415 / 13.8415 = 0.2775.
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)


def test_bootstrap_interval_brackets_the_mean_and_is_reproducible():
    values = [0.0, 0.25, 0.5, 0.75, 1.0] * 20  # mean 0.5, SE = 0.354/sqrt(100) = 0.035
    lo, hi = bootstrap_interval(values, seed=0)
    assert lo < 0.5 < hi
    assert hi - lo == pytest.approx(2 * 1.96 * 0.0354, rel=0.2)
    assert bootstrap_interval(values, seed=0) == (lo, hi)


def test_mean_with_ci_picks_the_method():
    assert mean_with_ci([1, 0, 1, 1])["ci_method"] == "wilson"
    stat = mean_with_ci([1, 0.5, 0, 1])
    assert stat["ci_method"] == "bootstrap" and stat["mean"] == pytest.approx(0.625) and stat["num"] == 4


def test_length_stats_and_default_ks():
    # sorted: 1 2 3 4 10 -> median 3, p90 = ceil(0.9*5) = 5th value = 10.
    assert length_stats([10, 1, 3, 2, 4]) == {"mean": 4.0, "median": 3.0, "p90": 10.0, "max": 10.0}
    assert length_stats([1, 2, 3, 4])["median"] == 2.5
    assert default_ks(1) == [1]
    assert default_ks(8) == [1, 2, 4, 8]
    assert default_ks(6) == [1, 2, 4, 6]


def sample(correct, extracted="1", num_tokens=10, finish_reason="stop", **meta):
    return {
        "correct": correct,
        "extracted": extracted,
        "num_tokens": num_tokens,
        "finish_reason": finish_reason,
        **meta,
    }


def test_summarize_greedy_with_subjects_and_levels():
    problems = [
        [sample(True, subject="Algebra", level=1, num_tokens=10)],
        [sample(False, subject="Algebra", level=2, num_tokens=20, finish_reason="length", extracted=None)],
        [sample(True, subject="Geometry", level=2, num_tokens=30)],
        [sample(True, subject="Geometry", level=2, num_tokens=40)],
    ]
    s = summarize(problems)
    assert s["num_problems"] == 4 and s["num_samples_per_problem"] == 1
    assert s["accuracy"]["mean"] == 0.75 and s["accuracy"]["ci_method"] == "wilson"
    assert "pass@k" not in s  # greedy: one sample per problem
    assert s["by_subject"]["Algebra"]["mean"] == 0.5 and s["by_subject"]["Geometry"]["mean"] == 1.0
    assert s["by_level"]["1"]["mean"] == 1.0 and s["by_level"]["2"]["mean"] == pytest.approx(2 / 3)
    assert s["length"]["mean"] == 25.0
    assert s["truncated_fraction"] == 0.25 and s["no_answer_fraction"] == 0.25


def test_summarize_sampling_pass_and_maj():
    # Problem A: 2 of 4 correct, answers 5,5,6,6 (5 is right: tie -> first seen, "5" wins).
    # Problem B: 1 of 4 correct, answers 1,2,2,3 (1 is right: majority "2" is wrong).
    a = [sample(True, "5"), sample(True, "5"), sample(False, "6"), sample(False, "6")]
    b = [sample(True, "1"), sample(False, "2"), sample(False, "2"), sample(False, "3")]
    s = summarize([a, b])
    assert s["accuracy"]["mean"] == pytest.approx((0.5 + 0.25) / 2)
    assert s["accuracy"]["ci_method"] == "bootstrap"
    assert list(s["pass@k"]) == ["1", "2", "4"]
    # pass@2: A = 1 - C(2,2)/C(4,2) = 5/6; B = 1 - C(3,2)/C(4,2) = 1/2.
    assert s["pass@k"]["2"]["mean"] == pytest.approx((5 / 6 + 1 / 2) / 2)
    assert s["pass@k"]["4"]["mean"] == 1.0
    # maj@1 = first sample correct: both right. maj@4: A right, B wrong.
    assert s["maj@k"]["1"]["mean"] == 1.0
    assert s["maj@k"]["4"]["mean"] == 0.5


def test_summarize_rejects_ragged_input():
    with pytest.raises(ValueError, match="same"):
        summarize([[sample(True)], [sample(True), sample(False)]])
    with pytest.raises(ValueError, match="no problems"):
        summarize([])
    with pytest.raises(ValueError, match="ks"):
        summarize([[sample(True)]], ks=[2])


def test_wilson_coverage_is_close_to_95_percent():
    # Simulation: a true rate of 0.3 over 50 problems is inside the interval ~95% of the time.
    rng = random.Random(0)
    hits = 0
    for _ in range(2000):
        k = sum(rng.random() < 0.3 for _ in range(50))
        lo, hi = wilson_interval(k, 50)
        hits += lo <= 0.3 <= hi
    assert 0.92 < hits / 2000 < 0.98


@pytest.mark.parametrize("module", ["eval.metrics", "eval.best_of_n"])
def test_docstring_examples(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0
