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
