"""`pip install .` (not only -e): the realm-train and realm-eval commands, with the configs and datasets as
package data, work from any working directory."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_commands_name_callables_that_exist():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {"realm-train", "realm-eval"}
    for target in scripts.values():
        module, _, name = target.partition(":")
        assert callable(getattr(importlib.import_module(module), name)), target


@pytest.mark.slow
def test_a_wheel_installs_working_commands(tmp_path):
    wheels, site, cwd, source = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere", tmp_path / "source"
    cwd.mkdir()
    # A copy of the checkout: building in place would leave build/ and an .egg-info in it.
    skip = shutil.ignore_patterns(
        ".git", ".venv", ".cache", "outputs", "multirun", "build", "*.egg-info", "__pycache__"
    )
    shutil.copytree(ROOT, source, ignore=skip)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", str(source), "-w", str(wheels)], check=True
    )
    (wheel,) = wheels.glob("realm-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {"train.py", "configs/train.yaml", "configs/model/tiny.yaml", "data/gsm8k/test.jsonl"}
    assert shipped | {"planning/profiles/cpu-2core.json"} <= names
    subprocess.run([*pip, "install", "-q", "--no-deps", "--target", str(site), str(wheel)], check=True)
    env = {**os.environ, "PYTHONPATH": str(site), "REALM_CACHE_DIR": str(tmp_path / "cache")}

    def run(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)

    where = run("-c", "import trainer, train; print(trainer.__file__, train.__file__)")
    assert where.stdout.split() == [str(site / "trainer" / "__init__.py"), str(site / "train.py")]
    dry = run(str(site / "bin" / "realm-train"), "run.dry_run=true", "data=gsm8k")
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "data: 7473 training prompts (gsm8k_train), 1319 held-out problems (gsm8k)" in dry.stdout
    assert list((cwd / "outputs").rglob("plan.yaml"))  # runs write under the working directory
    help_text = run(str(site / "bin" / "realm-eval"), "--help")
    assert help_text.returncode == 0 and help_text.stdout.startswith("python -m eval")
