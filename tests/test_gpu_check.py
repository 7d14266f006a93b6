"""``scripts/gpu_check.sh``: its checks on CPU over gloo (``--cpu``) in the default suite, on a GPU with
``-m gpu``; one failing check makes the run fail while the others still report."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _load_gpu_check():
    """``scripts/gpu_check.py`` as a module (``scripts`` is not a package)."""
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHECKS = [name for name, _ in _load_gpu_check().CHECKS]


def _run(*args: str) -> tuple[int, dict[str, str], list[str]]:
    """(exit status, check -> PASS/FAIL/NOTE, stdout lines) of ``bash scripts/gpu_check.sh *args``."""
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    lines = proc.stdout.splitlines()
    status = {
        line.split()[1].rstrip(":"): line.split()[0]
        for line in lines
        if line.split()[:1] in (["PASS"], ["FAIL"], ["NOTE"])
    }
    assert list(status) == CHECKS, proc.stdout + proc.stderr[-3000:]
    return proc.returncode, status, lines


def test_gpu_check_runs_its_checks_on_cpu():
    """Everything but the NCCL attempt runs on CPU; the NCCL one says there is no GPU."""
    returncode, status, lines = _run("--cpu")
    assert status == {name: "NOTE" if name == "p2p_nccl_one_gpu" else "PASS" for name in CHECKS}, lines
    assert returncode == 0 and lines[-1].startswith("gpu_check: 5 passed, 0 failed, 1 notes on cpu"), lines


@pytest.mark.gpu
def test_gpu_check_passes_on_a_gpu():
    returncode, status, lines = _run()
    assert returncode == 0, lines
    assert all(status[name] == "PASS" for name in CHECKS if name != "p2p_nccl_one_gpu"), lines
    assert status["p2p_nccl_one_gpu"] in ("PASS", "NOTE"), lines  # NOTE: NCCL refuses two ranks on one GPU


def test_a_failed_check_fails_the_run_and_the_others_still_report(capsys):
    gpu_check = _load_gpu_check()

    def absent(device: torch.device) -> str:
        raise gpu_check.Note("not here")

    gpu_check.CHECKS = [("fine", lambda device: "ok"), ("broken", lambda device: str(1 / 0)), ("absent", absent)]
    assert gpu_check.run_checks(torch.device("cpu")) == (1, 1, 1)
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in out] == [
        "PASS fine: ok",
        "FAIL broken: ZeroDivisionError: division by zero",
        "NOTE absent: not here",
    ]


def test_step_split_prints_each_part_the_profile_and_the_floor_on_cpu():
    """``--step-split`` on CPU with the tiny model: a SPLIT line per path and row count with every part,
    a PROFILE line per path, a FLOOR line per path (the GPU run's lines: docs/gpu_measure/step_split.log)."""
    env = dict(os.environ, PYTHON=sys.executable)
    args = ["--cpu", "--step-split", "--rows", "1,2", "--prompt", "4", "--response", "4"]
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    splits = [line for line in lines if line.startswith("SPLIT ")]
    assert [line.split(":")[0] for line in splits] == [
        f"SPLIT {path} rows={rows} tokens={rows * 8}" for path in ("plain", "fsdp") for rows in (1, 2)
    ]
    for part in ("forward", "backward", "clip", "optimizer", "zero_grad", "step"):
        assert all(f" {part} " in line for line in splits), splits
    assert [line.split(" rows")[0] for line in lines if line.startswith("PROFILE ")] == [
        "PROFILE plain",
        "PROFILE fsdp",
    ]
    floors = [line for line in lines if line.startswith("FLOOR ")]
    assert [line.split(":")[0] for line in floors] == ["FLOOR plain", "FLOOR fsdp"]
    assert all("forward" in line and "train" in line and "step" in line for line in floors), floors


@pytest.mark.slow
def test_gpu_measure_runs_every_step_on_cpu(tmp_path):
    """``scripts/gpu_measure.sh OUT --cpu``: the one script a lent GPU runs, end to end on CPU with the tiny
    model, so that it cannot fail on a typo there; its profile gains the tiny model's floor."""
    from planning.profile import Profile

    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", "scripts/gpu_measure.sh", str(tmp_path), "--cpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {p.name for p in tmp_path.iterdir()} == {
        "gpu_check.log",
        "step_split.log",
        "overheads.log",
        "cpu-2core.json",
    }
    assert "tiny" in Profile.load(tmp_path / "cpu-2core.json").overheads
