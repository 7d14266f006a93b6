"""`python train.py run.dry_run=true`: the plan, one line per call, and the cost model's totals on the
last line, for the GPU clusters and the Qwen2.5-Math models, on this CPU machine and without Ray."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from planning.estimator import estimate_plan, hardware
from trainer.compose import to_train_config
from trainer.config import TrainConfig, register_configs
from trainer.plan_select import dry_run_report, model_specs, resolve_plan, workload

ROOT = Path(__file__).resolve().parents[1]
LAST_LINE = re.compile(r"plan: (\d+) devices, predicted (\d+\.\d\d) s/iteration, peak (\d+\.\d) GiB/device")
register_configs()


def _cfg(*overrides: str) -> TrainConfig:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=list(overrides)))


@pytest.mark.parametrize("cluster", ["gpu_1x8", "gpu_2x8"])
@pytest.mark.parametrize("model", ["qwen2.5-math-1.5b-instruct", "qwen2.5-math-7b-instruct"])
def test_dry_run_prints_each_call_and_the_cost_models_totals(cluster, model, tmp_path):
    cfg = _cfg(f"cluster={cluster}", f"model={model}")
    lines = dry_run_report(cfg, tmp_path)
    num_devices, seconds, peak = LAST_LINE.fullmatch(lines[-1]).groups()
    assert 1 <= int(num_devices) <= cfg.cluster.num_devices
    specs = model_specs(cfg)
    cost = estimate_plan(
        resolve_plan(cfg, specs),
        workload(cfg, specs),
        hardware("h100", cfg.cluster.num_nodes, cfg.cluster.devices_per_node),
    )
    assert (float(seconds), float(peak)) == (round(cost.seconds_per_iteration, 2), round(cost.peak_bytes / 2**30, 1))
    assert cost.fits and float(peak) <= 80
    for call in ("actor_gen", "ref_inf", "critic_inf", "actor_train", "critic_train"):
        (line,) = [x for x in lines if x.split()[0] == call]
        assert re.search(r"devices \S+ +pp\d+ dp\d+ tp\d+ mb\d+.* \d+\.\d\d s +\d+\.\d GiB/device", line), line
    assert (tmp_path / "plan.yaml").exists()


@pytest.mark.parametrize("cluster", ["gpu_1x8", "gpu_2x8"])
def test_the_heuristic_fits_the_reward_papers_7b_batch(cluster, tmp_path):
    # 4096 prompts x 8 samples x (1024 + 1024) tokens: 67M tokens per iteration on Qwen2.5-Math-7B.
    cfg = _cfg(
        f"cluster={cluster}",
        "model=qwen2.5-math-7b-instruct",
        "rollout.num_prompts=4096",
        "rollout.max_prompt_tokens=1024",
        "rollout.max_new_tokens=1024",
    )
    peak = float(LAST_LINE.fullmatch(dry_run_report(cfg, tmp_path)[-1]).group(3))
    assert peak <= 80  # an H100's memory


def _train_without_ray(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """train.py with `import ray` made to fail: a dry run must never reach it."""
    blocker = tmp_path / "blocked"
    (blocker / "ray").mkdir(parents=True)
    (blocker / "ray" / "__init__.py").write_text("raise ImportError('the dry run imported ray')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker), str(ROOT)]))
    return subprocess.run(
        [sys.executable, "train.py", "run.dry_run=true", f"hydra.run.dir={tmp_path / 'run'}", *overrides],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_train_py_dry_run_on_two_nodes_without_ray(tmp_path):
    proc = _train_without_ray(tmp_path, "cluster=gpu_2x8", "model=qwen2.5-math-7b-instruct")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    num_devices = int(LAST_LINE.fullmatch(lines[-1]).group(1))
    assert num_devices == 16
    assert (
        sum(line.split()[0] in ("actor_gen", "ref_inf", "critic_inf", "actor_train", "critic_train") for line in lines)
        == 5
    )
    assert (tmp_path / "run" / "plan.yaml").exists()


def test_train_py_dry_run_with_a_bad_plan_file_names_call_and_field(tmp_path):
    plan = tmp_path / "plan.yaml"
    everything = "devices: [0, 1, 2, 3, 4, 5, 6, 7]"
    plan.write_text(
        "num_nodes: 1\ngpus_per_node: 8\ncalls:\n"
        + "".join(
            f"  {call}: {{{everything}, dp: 8}}\n" for call in ("ref_inf", "critic_inf", "actor_train", "critic_train")
        )
        + f"  actor_gen: {{{everything}, tp: 8}}\n"
    )
    proc = _train_without_ray(tmp_path, "cluster=gpu_1x8", "model=qwen2.5-math-1.5b-instruct", f"cluster.plan={plan}")
    assert proc.returncode == 1
    assert f"plan error: {plan}: calls.actor_gen.tp=8 does not divide num_attention_heads=12" in proc.stderr


def test_train_py_dry_run_says_when_search_finds_no_fitting_plan(tmp_path):
    # Qwen2.5-Math-7B training on a single H100 cannot hold its Adam state (7.6e9 x 18 B = 127 GiB).
    proc = _train_without_ray(
        tmp_path,
        "cluster=gpu_1x8",
        "cluster.devices_per_node=1",
        "cluster.plan=search",
        "cluster.plan_search_seconds=1",
        "model=qwen2.5-math-7b-instruct",
    )
    assert proc.returncode == 1
    assert "plan error: cluster.plan=search: no allocation of" in proc.stderr
    assert "Traceback" not in proc.stderr
