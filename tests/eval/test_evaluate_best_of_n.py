"""Best-of-N reranking with hand-made reward scores."""

from __future__ import annotations

import json
from itertools import combinations

import pytest

from eval.best_of_n import aggregate, best_of_n_curves, expected_best_of_n, run_best_of_n, score_samples
from rewards.best_of_n import main


def test_prm_aggregations():
    steps = [0.9, 0.2, 0.8]
    assert aggregate(steps, "min") == 0.2
    assert aggregate(steps, "last") == 0.8
    assert aggregate(steps, "product") == pytest.approx(0.9 * 0.2 * 0.8)  # 0.144
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(steps, "mean-ish")


def test_expected_best_of_n_worked_example():
    # Scores 0.9, 0.5, 0.1; the top-scored sample is wrong, the other two right.
    scores, correct = [0.9, 0.5, 0.1], [False, True, True]
    assert expected_best_of_n(scores, correct, 1) == pytest.approx(2 / 3)  # a random sample
    assert expected_best_of_n(scores, correct, 2) == pytest.approx(1 / 3)  # only the subset {0.5, 0.1} is right
    assert expected_best_of_n(scores, correct, 3) == 0.0  # always picks 0.9


def test_expected_best_of_n_equals_brute_force_with_ties():
    scores = [0.5, 0.7, 0.5, 0.1, 0.7]
    correct = [True, False, False, True, True]
    for k in range(1, 6):
        subsets = list(combinations(range(5), k))
        # ties go to the lower sample index
        picks = [min(s, key=lambda i: (-scores[i], i)) for s in subsets]
        assert expected_best_of_n(scores, correct, k) == pytest.approx(sum(correct[i] for i in picks) / len(subsets))


def sample(pid, i, correct, extracted, question="q"):
    return {
        "id": pid,
        "sample_index": i,
        "correct": correct,
        "extracted": extracted,
        "question": question,
        "response": f"step one\n\nstep two {extracted}",
        "num_tokens": 5,
        "finish_reason": "stop",
    }


# Problem a: samples right, wrong, wrong, right; problem b: wrong, wrong, right, wrong.
PROBLEMS = [
    [sample("a", 0, True, "1"), sample("a", 1, False, "2"), sample("a", 2, False, "2"), sample("a", 3, True, "1")],
    [sample("b", 0, False, "5"), sample("b", 1, False, "6"), sample("b", 2, True, "7"), sample("b", 3, False, "5")],
]


def test_curves_with_a_perfect_and_an_adversarial_reranker():
    perfect = [[1.0, 0.0, 0.0, 0.9], [0.0, 0.1, 1.0, 0.2]]
    backwards = [[-s for s in p] for p in perfect]
    curves = best_of_n_curves(PROBLEMS, {"perfect": perfect, "backwards": backwards}, ns=[1, 2, 4])
    # random = mean accuracy: (2/4 + 1/4) / 2.
    assert curves["random"] == {"1": 0.375, "2": 0.375, "4": 0.375}
    # The perfect reranker reaches pass@N; pass@2 = (1 - C(2,2)/C(4,2) + 1 - C(3,2)/C(4,2)) / 2 = (5/6 + 1/2) / 2.
    assert curves["perfect"]["4"] == curves["pass@N"]["4"] == 1.0
    assert curves["perfect"]["2"] == pytest.approx(curves["pass@N"]["2"]) == pytest.approx(2 / 3)
    assert curves["backwards"]["4"] == 0.0
    assert curves["perfect"]["1"] == curves["backwards"]["1"] == 0.375  # best-of-1 is a random sample
    # maj@4: a votes 1,2,2,1 -> tie, first seen "1" (right); b votes 5,6,7,5 -> "5" (wrong).
    assert curves["maj@N"]["4"] == 0.5


def test_score_samples_orm_and_prm():
    # A fake PRM: one score per "\n\n"-step; a wrong answer's last step scores low.
    def prm(pairs):
        return [[0.9, 0.8 if " 1" in r or " 7" in r else 0.1] for _, r in pairs]

    scores = score_samples(PROBLEMS, prm, "prm", ["min", "last", "product"])
    assert scores["prm-last"][0] == [0.8, 0.1, 0.1, 0.8]
    assert scores["prm-product"][1][2] == pytest.approx(0.72)
    scores = score_samples(PROBLEMS, lambda pairs: [0.5] * len(pairs), "orm", [])
    assert list(scores) == ["orm"] and scores["orm"][1] == [0.5] * 4


def test_run_dir_round_trip(tmp_path):
    with (tmp_path / "samples.jsonl").open("w") as f:
        for p in PROBLEMS:
            for s in p:
                f.write(json.dumps(s) + "\n")

    def prm(pairs):
        return [[0.9, 0.8 if " 1" in r or " 7" in r else 0.1] for _, r in pairs]

    result = run_best_of_n(tmp_path, prm, "prm", ["min", "last"], "fake-prm")
    assert result["curves"]["prm-last"]["4"] == 1.0  # a perfect PRM on this data
    assert (tmp_path / "best_of_n.png").exists()
    md = (tmp_path / "best_of_n.md").read_text()
    assert "| prm-last | 37.5 | 66.7 | 100.0 |" in md


def test_cli_rejects_greedy_runs_and_bad_aggregations(tmp_path, capsys):
    (tmp_path / "samples.jsonl").write_text(json.dumps(sample("a", 0, True, "1")) + "\n")
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path), "--rm", "x", "--kind", "prm", "--aggregations", "median"])
    assert info.value.code == 1 and "unknown aggregation 'median'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="1 sample per problem"):
        run_best_of_n(tmp_path, lambda pairs: [0.0] * len(pairs), "orm", [], "fake")
