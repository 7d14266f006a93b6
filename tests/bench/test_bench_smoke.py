"""Every bench/ script runs end to end on a tiny workload, so a benchmark cannot rot unseen.

(bench/ppo_iteration.py has its own file.) Each checks the script's output file, not its numbers:
the numbers are the benchmark's job and move with the machine's load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_grade_bench_on_ten_golds():
    proc = _run(["bench/grade.py", "--num-gsm8k", "5", "--num-math", "5", "--show", "0"])
    assert "mathtask.grade vs label:" in proc.stdout


def test_plan_search_bench_on_one_setting(tmp_path):
    out = tmp_path / "plan_search.json"
    _run(["bench/plan_search.py", "--json", str(out), "--seconds", "0.3", "--only", "7B+7B on 8"])
    rows = json.loads(out.read_text())
    assert len(rows) == 1 and out.with_suffix(".png").exists()


@pytest.mark.slow
def test_reshard_bench_on_one_layer(tmp_path):
    """Four gloo processes: slow on a loaded 2-core machine."""
    out = tmp_path / "reshard.json"
    _run(
        [
            "bench/reshard.py",
            "--json",
            str(out),
            "--num-layers",
            "1",
            "--repeats",
            "1",
            "--pairs",
            "fsdp4->tp2dp2",
            "--dtype",
            "fp32",
        ]
    )
    rows = json.loads(out.read_text())
    assert [r["pair"] for r in rows] == ["fsdp4->tp2dp2"] and rows[0]["exact"] is True


@pytest.mark.slow
def test_generate_bench_on_the_tiny_model():
    """A vLLM engine start-up: slow."""
    proc = _run(["bench/generate.py", "--model", "tiny", "--num-prompts", "2", "--max-new-tokens", "8"])
    assert "tokens/s" in proc.stdout + proc.stderr


def test_ppo_step_bench_times_eager_and_a_lever_in_processes_of_their_own():
    proc = _run(["bench/ppo_step.py", "--rows", "2", "--levers", "mallopt"])
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| eager") or line.startswith("| mallopt")]
    assert len(rows) == 2 and rows[0].split("|")[4].strip() == "1.00"  # eager against itself


def test_ppo_step_bench_profiles_a_step_of_micro_batches():
    proc = _run(["bench/ppo_step.py", "--rows", "4", "--microbatches", "2", "--torch-profile"])
    assert "4 rows in 2 micro-batch(es)" in proc.stdout
    assert "aten::mm" in proc.stdout and "Self CPU time total" in proc.stdout


def test_ppo_step_bench_names_an_unknown_lever():
    proc = subprocess.run(
        [sys.executable, "bench/ppo_step.py", "--levers", "fast"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "unknown lever 'fast'" in proc.stderr


def test_host_memory_bench_builds_the_default_plans_device_processes(tmp_path):
    """Two gloo processes build the tiny model's shards from a bfloat16 copy of it (a few seconds)."""
    out = tmp_path / "host_memory.json"
    proc = _run(["bench/host_memory.py", "--model", "tiny", "--checkpoint-dtype", "bfloat16", "--json", str(out)])
    report = json.loads(out.read_text())
    assert "build_host_bytes_over_model_bytes" in proc.stdout
    assert [r["device"] for r in report["device_processes"]] == [0, 1]
    assert report["checkpoint_dtype"] == "bfloat16" and report["models"]["actor"]["instances"] == 1
