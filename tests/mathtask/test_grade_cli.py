"""`python -m mathtask.grade --input IN.jsonl --output OUT.jsonl`: the input objects plus correct/extracted, in order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

ROWS = [
    {"response": "so $\\boxed{\\frac{1}{2}\\sqrt{3}}$", "gold": "\\frac{\\sqrt{3}}{2}", "id": 0},
    {"response": "#### 1600", "gold": "1,600", "dataset": "gsm8k", "id": 1},
    {"response": "The answer is 7.", "gold": "8", "id": 2, "extra": {"kept": True}},
    {"response": "no answer here", "gold": "3", "id": 3},
    {"response": "\\boxed{x^2 - 1}", "gold": "(x-1)(x+1)", "id": 4},
    {"response": "\\boxed{(3, \\pi/2)}", "gold": "\\left( 3, \\frac{\\pi}{2} \\right)", "dataset": "math", "id": 5},
]


def _run(args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "mathtask.grade", *args], cwd=ROOT, capture_output=True, text=True, timeout=120, **kwargs
    )


def test_cli_grades_in_input_order(tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    proc = _run(["--input", str(src), "--output", str(dst), "--timeout", "30"])
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [o["id"] for o in out] == [r["id"] for r in ROWS]
    for row, o in zip(ROWS, out):
        assert {k: o[k] for k in row} == row  # every input field survives unchanged
        assert set(o) == set(row) | {"correct", "extracted"}
    assert [o["correct"] for o in out] == [True, True, False, False, True, True]
    assert [o["extracted"] for o in out] == ["\\frac{1}{2}\\sqrt{3}", "1600", "7", None, "x^2 - 1", "(3, \\pi/2)"]


def test_cli_reasons_and_stdio():
    lines = json.dumps({"response": "\\boxed{4", "gold": "4"}) + "\n"
    proc = _run(["--input", "-", "--output", "-", "--reasons"], input=lines)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["correct"] is False and out["extracted"] is None and out["reason"] == "unclosed_box"


def test_cli_rejects_bad_lines(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(ROWS[0]) + "\nnot json\n")
    proc = _run(["--input", str(src), "--output", str(tmp_path / "out.jsonl")])
    assert proc.returncode == 1 and ":2:" in proc.stderr
    src.write_text(json.dumps({"response": "x", "gold": "1", "dataset": "aime"}) + "\n")
    proc = _run(["--input", str(src), "--output", str(tmp_path / "out.jsonl")])
    assert proc.returncode == 1 and "aime" in proc.stderr


def test_missing_input_is_one_line_not_a_traceback(tmp_path):
    proc = _run(["--input", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "out.jsonl")])
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "missing.jsonl" in proc.stderr
