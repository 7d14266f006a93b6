"""The reward paper's table from hand-made evaluation summaries (numbers a person can check)."""

from __future__ import annotations

import json
from pathlib import Path

from eval.report import _main, reward_paper_table


def _summary(path: Path, acc: float, mv: float, num: int = 500) -> None:
    path.mkdir(parents=True)
    (path / "summary.json").write_text(
        json.dumps(
            {
                "num_problems": num,
                "accuracy": {"mean": acc},
                "graders": {"names": ["realm", "math_verify"], "accuracy": {"realm": acc, "math_verify": mv}},
            }
        )
    )


def test_rows_in_the_papers_order_with_its_numbers_beside_ours(tmp_path):
    _summary(tmp_path / "base" / "eval" / "math500", 0.75, 0.748)
    _summary(tmp_path / "prm_clip_delta" / "seed0" / "eval" / "math500", 0.77, 0.772)
    _summary(tmp_path / "prm_clip_delta" / "seed0" / "eval" / "gsm8k", 0.8522, 0.85, num=1319)
    text = reward_paper_table(tmp_path, "1.5b", 0, ["math500", "gsm8k"])
    lines = text.splitlines()
    assert lines[0] == (
        "| RL reward | MATH-500 greedy (realm) | MATH-500 (math-verify) | paper MATH "
        "| GSM8K greedy (realm) | GSM8K (math-verify) | paper GSM8K |"
    )
    assert lines[2] == "| (base model, no RL) | 75.00 | 74.80 | 76.00 | — | — | — |"
    assert lines[3] == "| Success reward (SR) only | — | — | — | — | — | — |"
    assert lines[8] == "| SR + PR-Clip-Delta | 77.00 | 77.20 | 76.78 | 85.22 | 85.00 | — |"
    assert "MATH-500 500, GSM8K 1319" in text and "SR + PR 11.16" in text


def test_cli_writes_table_md(tmp_path, capsys):
    _summary(tmp_path / "success" / "seed1" / "eval" / "synthetic", 0.5, 0.5, num=8)
    assert (
        _main(["reward-paper-table", str(tmp_path), "--size", "tiny", "--seed", "1", "--benchmarks", "synthetic"]) == 0
    )
    table = (tmp_path / "table.md").read_text()
    assert "| Success reward (SR) only | 50.00 | 50.00 |" in table and "paper" not in table.splitlines()[0]
    assert capsys.readouterr().out.endswith(f"{tmp_path / 'table.md'}\n")
