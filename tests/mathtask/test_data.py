"""Loaders: the shipped files, the MATH train split convention, errors that name file and line."""

from __future__ import annotations

import hashlib
import json

import pytest

from mathtask.data import DATA_DIR, DataError, last_boxed, load_jsonl, load_problems
from mathtask.synthetic import generate_problems, labeled_solutions, split_problems

SHA256 = {
    "gsm8k/test.jsonl": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
    "gsm8k/train.jsonl": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
    "math/math500_test.jsonl": "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
    "math/test5000.jsonl": "3371949f33dd702d04b43fddd7d53a028de0aaca0e76abb1b875a050297b3aa4",
}


@pytest.mark.parametrize("name", sorted(SHA256))
def test_shipped_files_match_their_checksums(name):
    assert hashlib.sha256((DATA_DIR / name).read_bytes()).hexdigest() == SHA256[name]


def test_builtin_sizes_and_records():
    gsm = load_problems("gsm8k")
    assert len(gsm) == 1319 and gsm[0].answer == "18" and gsm[0].dataset == "gsm8k"
    m500 = load_problems("math500")
    assert len(m500) == 500 and m500[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert m500[0].metadata == {"subject": "Precalculus", "level": 2}
    full = load_problems("math")
    assert len(full) == 5000 and all(1 <= p.metadata["level"] <= 5 for p in full)
    train = load_problems("math_train")
    assert len(train) == 4500
    assert not {p.question for p in train} & {p.question for p in m500}


def test_gsm8k_thousands_separator_kept_as_gold():
    answers = {p.answer for p in load_problems("gsm8k_train")}
    assert any("," in a for a in answers)


def test_limit_is_a_fixed_seed_subset():
    a = load_problems("gsm8k", limit=10, seed=3)
    b = load_problems("gsm8k", limit=10, seed=3)
    assert [p.id for p in a] == [p.id for p in b] and len(a) == 10


def test_last_boxed_handles_nesting():
    assert last_boxed("x \\boxed{1} y \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
    assert last_boxed("\\boxed{unclosed") is None


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n{not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: malformed JSON"):
        load_jsonl(path)
    path.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: no gold answer"):
        load_jsonl(path)


def test_empty_file_and_unknown_name(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="no records"):
        load_problems(str(empty))
    with pytest.raises(DataError, match="unknown dataset 'mathh'"):
        load_problems("mathh")


def test_synthetic_is_deterministic_and_worked_example():
    a = generate_problems(50, seed=1, difficulty=3)
    b = generate_problems(50, seed=1, difficulty=3)
    assert a == b and len({p.question for p in a}) == 50
    p = a[0]
    steps = p.solution.split("\n\n")
    assert len(steps) == 4 and steps[-1] == f"The answer is \\boxed{{{p.answer}}}."
    # Each arithmetic step is "x op y = z" with z correct and the next step starting from z.
    for step, nxt in zip(steps[:-1], steps[1:]):
        lhs, rhs = step.split(" = ")
        x, op, y = lhs.split(" ")
        assert int(rhs) == {"+": int(x) + int(y), "-": int(x) - int(y), "*": int(x) * int(y)}[op]
        assert nxt.startswith(rhs) or nxt.startswith("The answer")


def test_synthetic_splits_are_disjoint():
    train, heldout = split_problems(300, 100, seed=0, difficulty=2)
    assert not {p.question for p in train} & {p.question for p in heldout}


def test_corrupted_solutions_have_math_shepherd_labels():
    p = generate_problems(1, seed=0, difficulty=4)[0]
    sols = labeled_solutions(p, seed=0, num_corrupted=3)
    assert sols[0].final_label == 1 and all(sols[0].step_labels)
    for s in sols[1:]:
        first_bad = s.step_labels.index(0)
        assert all(s.step_labels[:first_bad]) and not any(s.step_labels[first_bad:])
        assert s.final_label == 0 and s.steps[:first_bad] == sols[0].steps[:first_bad]


def test_asking_for_more_synthetic_problems_than_exist_fails_fast():
    with pytest.raises(ValueError, match="fewer than 2200 distinct problems"):
        generate_problems(2200, seed=0, difficulty=1)
