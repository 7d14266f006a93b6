"""python -m eval.compare_runs on hand-made run directories."""

from __future__ import annotations

import json

import pytest

from eval.compare_runs import main
from eval.metrics import summarize


def make_run(root, name, correct_per_problem, subjects=None, temperature=0.0):
    problems = [
        [
            {
                "correct": c,
                "extracted": "1",
                "num_tokens": 100,
                "finish_reason": "stop",
                **({"subject": subjects[i]} if subjects else {}),
            }
            for c in row
        ]
        for i, row in enumerate(correct_per_problem)
    ]
    s = summarize(problems)
    s["settings"] = {"temperature": temperature, "template": {"name": "qwen_math_cot"}}
    s["run"] = {"model": name.split("-")[0], "dataset": "math500", "wall_seconds": 12.0}
    d = root / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(s))
    return d


def test_compare_writes_table_and_chart(tmp_path, capsys):
    a = make_run(
        tmp_path / "sweep",
        "base-greedy",
        [[True], [False], [True], [True]],
        subjects=["Algebra", "Algebra", "Geometry", "Geometry"],
    )
    make_run(
        tmp_path / "sweep", "ppo-sampled", [[True, False], [True, True], [False, False], [True, False]], temperature=0.6
    )
    out = tmp_path / "cmp"
    assert main([str(tmp_path / "sweep"), "--out", str(out)]) == 0  # a parent directory expands to its runs
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    md = (out / "comparison.md").read_text()
    # base: 3/4 greedy (Wilson [30.1, 95.4]); ppo: mean of (1/2, 1, 0, 1/2) = 50%, pass@2 = (1 + 1 + 0 + 1)/4 = 75%.
    assert "| base-greedy | base | math500 | 4 | greedy | qwen_math_cot | 75.0 [30.1, 95.4] |" in md
    assert "| ppo-sampled | ppo | math500 | 4 | n=2, T=0.6 | qwen_math_cot | 50.0 [" in md and "pass@2: 75.0 [" in md
    assert "| Algebra | 50.0 (2) |" in md and "| Geometry | 100.0 (2) |" in md
    assert (out / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([str(a), str(tmp_path / "sweep" / "ppo-sampled"), "--out", str(tmp_path / "cmp2")]) == 0


def test_compare_rejects_non_run_directories(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path), "--out", str(tmp_path / "o")])
    assert info.value.code == 1 and "no summary.json" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_compare_names_a_training_run_and_writes_nothing(tmp_path, capsys):
    # A training run's summary.json (held-out success before and after) is not an evaluation's.
    (tmp_path / "train_run").mkdir()
    (tmp_path / "train_run" / "summary.json").write_text('{"heldout_before": 0.4, "heldout_after": 0.6}')
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path / "train_run"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert info.value.code == 1 and "not an evaluation summary" in err and "python -m eval model=" in err
    assert not (tmp_path / "o").exists()
