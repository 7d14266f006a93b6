"""train.py's error reporting, in process, with the training loop replaced (no Ray, no vLLM)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# eval/__main__.py puts the model configs in Hydra's ConfigStore too; in one test process Hydra warns
# that configs/model/tiny.yaml shares that name. Real runs are one command each and never see it.
@pytest.mark.filterwarnings(r"ignore:\s*'model/tiny' is validated against ConfigStore schema:UserWarning")
def test_a_failed_sweep_job_is_reported_when_it_fails(monkeypatch, tmp_path, capsys):
    import trainer.loop

    calls = []

    def boom(cfg, run_dir):
        calls.append(cfg.run.seed)
        raise RuntimeError(f"boom at seed {cfg.run.seed}")

    monkeypatch.setattr(trainer.loop, "train", boom)
    monkeypatch.setattr(sys, "argv", ["train.py", "-m", "run.seed=0,1", f"hydra.sweep.dir={tmp_path}"])
    with pytest.raises(SystemExit):
        runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    assert calls == [0, 1]  # the second job still ran
    err = capsys.readouterr().err
    assert "[sweep] job 0 (run.seed=0) failed:" in err and "RuntimeError: boom at seed 0" in err
    assert "[sweep] job 1 (run.seed=1) failed:" in err
    assert err.index("boom at seed 0") < err.index("[sweep] job 1")  # reported before the next job, not at the end
