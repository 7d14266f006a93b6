"""A relaunch into a run directory resumes only with the checkpoint's math settings (trainer/run_dir.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from common.config import to_plain
from trainer.checkpoint import save_checkpoint
from trainer.config import RunConfig, TrainConfig
from trainer.run_dir import (
    ResumeError,
    changed_settings,
    check_resume,
    math_settings,
    remove_unused,
    save_run_config,
)


def _checkpoint(run_dir: Path, cfg: TrainConfig | None, iteration: int = 10) -> None:
    state = {"iteration": iteration} | ({"config": to_plain(cfg)} if cfg is not None else {})
    save_checkpoint(run_dir / "checkpoints", iteration, state, lambda d: (d / "policy").mkdir(), keep_last=2)


def test_math_settings_worked_example():
    config = {
        "run": {"seed": 3, "name": "x", "num_iterations": 20},
        "algorithm": {"gamma": 1.0},
        "ppo": {"clip_eps": 0.2},
        "cluster": {"plan": "search"},
    }
    assert math_settings(config) == {"algorithm.gamma": 1.0, "ppo.clip_eps": 0.2, "run.seed": 3}


def test_changed_settings_name_old_and_new_values():
    old = {"algorithm": {}, "ppo": {"actor_lr": 1e-4, "clip_eps": 0.2}, "run": {"seed": 0}}
    new = {
        "algorithm": {},
        "ppo": {"actor_lr": 3e-4, "clip_eps": 0.2},
        "run": {"seed": 0},
        "rollout": {"num_prompts": 32},
    }
    assert changed_settings(old, new) == ["ppo.actor_lr (0.0001 -> 0.0003)", "rollout.num_prompts ('unset' -> 32)"]


def test_a_config_from_before_the_algorithm_group_reads_as_ppo():
    """Its KL and GAE keys under their old ``ppo`` names, no ``algorithm``: the same math as today's default."""
    new = to_plain(TrainConfig())
    old = {k: v for k, v in new.items() if k != "algorithm"}
    old["ppo"] = {**new["ppo"], "kl_coef": 0.01, "gamma": 1.0, "lam": 1.0, "whiten_advantages": True}
    old["ppo"] |= {"kl_controller": "fixed", "kl_target": 0.1, "kl_horizon": 10000}
    assert changed_settings(old, new) == []
    old["ppo"]["kl_coef"] = 0.05
    assert changed_settings(old, new) == ["algorithm.kl_coef (0.05 -> 0.01)"]


def test_a_fresh_directory_and_the_same_settings_resume(tmp_path):
    cfg = TrainConfig()
    assert check_resume(cfg, tmp_path).startswith("a fresh start")
    _checkpoint(tmp_path, cfg)
    longer = replace(cfg, run=replace(cfg.run, num_iterations=40, eval_every=5, keep_checkpoints=3))
    assert "iteration 10" in check_resume(
        longer, tmp_path
    )  # a run may be extended; evaluation and checkpoints are not math


def test_changed_math_settings_are_refused_with_the_keys_unless_resume_is_off(tmp_path):
    cfg = TrainConfig()
    _checkpoint(tmp_path, cfg)
    changed = replace(cfg, ppo=replace(cfg.ppo, actor_lr=3e-4), run=replace(cfg.run, seed=1))
    with pytest.raises(ResumeError) as info:
        check_resume(changed, tmp_path)
    message = str(info.value)
    assert "iter_000010 was trained with other settings" in message
    assert f"ppo.actor_lr ({cfg.ppo.actor_lr!r} -> 0.0003)" in message and "run.seed (0 -> 1)" in message
    assert "run.resume=false" in message
    off = replace(changed, run=replace(changed.run, resume=False))
    assert check_resume(off, tmp_path).startswith("a fresh start (run.resume=false")


def test_an_older_checkpoint_is_compared_with_the_run_config(tmp_path):
    # Checkpoints written before they held their config: the run's .hydra/config.yaml stands in.
    _checkpoint(tmp_path, None)
    save_run_config(tmp_path, "rollout:\n  num_prompts: 32\n", ["rollout.num_prompts=32"])
    with pytest.raises(ResumeError, match=r"rollout.num_prompts \(32 -> 64\)"):
        check_resume(TrainConfig(), tmp_path)
    assert (tmp_path / ".hydra" / "overrides.yaml").read_text() == "- rollout.num_prompts=32\n"


def test_a_damaged_newest_checkpoint_resumes_from_the_one_before_and_none_intact_is_refused(tmp_path):
    cfg = TrainConfig()
    _checkpoint(tmp_path, cfg, iteration=10)
    _checkpoint(tmp_path, cfg, iteration=20)
    (tmp_path / "checkpoints" / "iter_000020" / "trainer_state.json").write_text("{}")
    lines: list[str] = []
    assert "iteration 10" in check_resume(cfg, tmp_path, lines.append)
    assert len(lines) == 1 and "iter_000020 is damaged (trainer_state.json is 2 bytes" in lines[0]
    (tmp_path / "checkpoints" / "iter_000010" / "trainer_state.json").unlink()
    with pytest.raises(ResumeError, match=f"no intact checkpoint in {tmp_path / 'checkpoints'} \\(iter_000020: "):
        check_resume(cfg, tmp_path, lines.append)
    off = replace(cfg, run=replace(cfg.run, resume=False))
    assert check_resume(off, tmp_path).startswith("a fresh start (run.resume=false")


def test_a_directory_another_running_launch_noted_is_refused(tmp_path):
    import json
    import subprocess

    from runtime.processes import Proc, this_process

    other = subprocess.Popen(["sleep", "600"])
    try:
        start = int(Path(f"/proc/{other.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        record = {"driver": Proc(other.pid, start).__dict__, "watchdog": None, "processes": []}
        (tmp_path / "processes.json").write_text(json.dumps(record))
        with pytest.raises(ResumeError, match=f"another launch \\(pid {other.pid}\\) is running in {tmp_path}"):
            check_resume(TrainConfig(), tmp_path)
        mine = {"driver": this_process().__dict__, "watchdog": None, "processes": []}  # a restart in this process
        (tmp_path / "processes.json").write_text(json.dumps(mine))
        assert check_resume(TrainConfig(), tmp_path).startswith("a fresh start")
    finally:
        other.kill()
        other.wait()


def test_keep_checkpoints_must_keep_one():
    with pytest.raises(ValueError, match="run.keep_checkpoints=0"):
        RunConfig(keep_checkpoints=0)


def test_remove_unused_leaves_a_directory_with_anything_but_the_snapshot(tmp_path):
    only_snapshot, with_metrics = tmp_path / "a", tmp_path / "b"
    for d in (only_snapshot, with_metrics):
        save_run_config(d, "x: 1\n", [])
    (with_metrics / "metrics.jsonl").write_text("{}\n")
    remove_unused(only_snapshot)
    remove_unused(with_metrics)
    assert not only_snapshot.exists() and (with_metrics / ".hydra" / "config.yaml").exists()
