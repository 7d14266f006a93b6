"""The public grading table: every policy point of mathtask/grade.py, correct and incorrect rows."""

from __future__ import annotations

import collections

import pytest

from mathtask.grade import GradeResult, extract_answer, grade, grade_many
from tests.mathtask.grade_cases import CASES


def _row_id(row) -> str:
    point, response, gold, dataset, expected = row
    return f"{point}:{'ok' if expected else 'no'}:{gold[:24]}|{response[-30:]}"


@pytest.mark.parametrize("row", CASES, ids=[_row_id(r) for r in CASES])
def test_table_row(row):
    point, response, gold, dataset, expected = row
    # A generous timeout: the table checks the policy, not speed, on possibly loaded machines.
    result = grade(response, gold, dataset, timeout_s=60)
    assert isinstance(result, GradeResult)
    assert result.correct is expected, f"{point}: {response!r} vs gold {gold!r} -> {result}"


def test_table_covers_each_policy_point_both_ways():
    outcomes = collections.defaultdict(set)
    for point, _, _, _, expected in CASES:
        outcomes[point].add(expected)
    assert len(CASES) >= 150
    # Points whose rows can only be one way by definition.
    one_sided = {"no_answer": {False}, "truncated": {False}, "approx": {False}}
    for point, seen in outcomes.items():
        assert seen == one_sided.get(point, {True, False}), point


def test_batch_agrees_with_single_calls():
    responses = [r[1] for r in CASES]
    golds = [r[2] for r in CASES]
    datasets = [r[3] for r in CASES]
    batch = grade_many(responses, golds, datasets, timeout_s=60, num_workers=2)
    assert [r.correct for r in batch] == [r[4] for r in CASES]


@pytest.mark.parametrize(
    "response, dataset, expected",
    [
        ("so $\\boxed{\\frac{1}{2}}$.", "math", "\\frac{1}{2}"),
        ("\\boxed{\\boxed{7}}", "math", "7"),
        ("a \\boxed{1} b \\boxed{\\{1, 2\\}}", "math", "\\{1, 2\\}"),
        ("The final answer is $x=3$. I hope it is correct.", "math", "x=3"),
        ("steps\n#### 1,600", "gsm8k", "1,600"),
        ("#### 12", "math", None),
        ("no marker at all", "math", None),
        ("\\boxed{12", "math", None),
    ],
)
def test_extract_answer(response, dataset, expected):
    assert extract_answer(response, dataset) == expected


def test_reasons():
    assert grade("\\boxed{5}", "5").reason == "equal"
    assert grade("\\boxed{6}", "5").reason == "not_equal"
    assert grade("nothing here", "5").reason == "no_answer"
    assert grade("\\boxed{5", "5").reason == "unclosed_box"
    assert grade("The answer is $\\frac{1}{2", "5").reason == "truncated"


def test_unknown_dataset_is_a_programming_error():
    with pytest.raises(ValueError):
        grade("\\boxed{5}", "5", dataset="aime")
