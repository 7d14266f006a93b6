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
from trainer.plan_select import model_specs, plan_report, resolve_plan, workload

ROOT = Path(__file__).resolve().parents[1]
LAST_LINE = re.compile(r"plan: (\d+) devices, predicted (\d+\.\d\d) s/iteration, peak (\d+\.\d) GiB/device")
register_configs()


def _cfg(*overrides: str) -> TrainConfig:
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=list(overrides)))


@pytest.mark.parametrize("cluster", ["gpu_1x8", "gpu_2x8"])
@pytest.mark.parametrize("model", ["qwen2.5-math-1.5b-instruct", "qwen2.5-math-7b-instruct"])
def test_dry_run_prints_each_call_and_the_cost_models_totals(cluster, model):
    cfg = _cfg(f"cluster={cluster}", f"model={model}")
    report = plan_report(cfg)
    lines = [*report.lines, report.summary]
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
    assert report.problem is None


@pytest.mark.parametrize("recipe", ["reward_paper_1.5b", "reward_paper_7b"])
@pytest.mark.parametrize("algorithm", ["grpo", "dr_grpo"])
def test_critic_free_recipes_dry_run_on_their_own_graph_and_fit(recipe, algorithm):
    """The reward paper's recipes with a critic-free algorithm: no critic rows (and with Dr. GRPO's beta 0 no
    reference row) in the plan or the memory table, and the plan fits an H100."""
    cfg = _cfg(f"experiment={recipe}", f"algorithm={algorithm}", "cluster=gpu_1x8")
    report = plan_report(cfg)
    text = "\n".join([*report.lines, report.summary])
    assert "critic" not in text, text
    assert ("ref_inf" in text) == (algorithm == "grpo")
    assert report.problem is None and float(LAST_LINE.fullmatch(report.summary).group(3)) <= 80
    assert set(report.plan.calls) == {"actor_gen", "actor_train"} | ({"ref_inf"} if algorithm == "grpo" else set())


@pytest.mark.parametrize("cluster", ["gpu_1x8", "gpu_2x8"])
def test_the_heuristic_fits_the_reward_papers_7b_batch(cluster):
    # 4096 prompts x 8 samples x (1024 + 1024) tokens: 67M tokens per iteration on Qwen2.5-Math-7B.
    cfg = _cfg(
        f"cluster={cluster}",
        "model=qwen2.5-math-7b-instruct",
        "rollout.num_prompts=4096",
        "rollout.max_prompt_tokens=1024",
        "rollout.max_new_tokens=1024",
    )
    peak = float(LAST_LINE.fullmatch(plan_report(cfg).summary).group(3))
    assert peak <= 80  # an H100's memory


def _train_without_ray(tmp_path: Path, *overrides: str, offline: str = "0") -> subprocess.CompletedProcess:
    """train.py with `import ray` made to fail: a dry run must never reach it. ``offline`` is HF_HUB_OFFLINE:
    "0" lets a hub id that is not cached pass the model check as "downloaded at start" (nothing is fetched
    by the dry run itself, and the tests' network namespace has no route out anyway)."""
    blocker = tmp_path / "blocked"
    (blocker / "ray").mkdir(parents=True, exist_ok=True)
    (blocker / "ray" / "__init__.py").write_text("raise ImportError('the dry run imported ray')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker), str(ROOT)]), HF_HUB_OFFLINE=offline)
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
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: plan: {plan}: calls.actor_gen.tp=8 does not divide num_attention_heads=12"
    )


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
    assert proc.stderr.strip().splitlines()[-1].startswith("error: plan: cluster.plan=search: no allocation of")
    assert "Traceback" not in proc.stderr


def test_dry_run_fails_on_a_plan_that_does_not_fit_with_the_reason_last(tmp_path):
    # Qwen2.5-Math-7B on one H100 under the heuristic plan: 7.6e9 parameters x 18 B of training state
    # alone is 127 GiB, more than the GPU's 80 GiB.
    proc = _train_without_ray(
        tmp_path, "cluster=gpu_1x8", "cluster.devices_per_node=1", "model=qwen2.5-math-7b-instruct"
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"error: the plan does not fit: its fullest device needs \d+\.\d GiB more than a h100 has.*", last
    )
    assert LAST_LINE.fullmatch(proc.stdout.strip().splitlines()[-1])  # the plan is still printed, above


def test_dry_run_reads_every_data_record_and_names_the_bad_line(tmp_path):
    data = tmp_path / "problems.jsonl"
    data.write_text('{"question": "1 + 1?", "answer": "2"}\n{"question": "2 + 2?", "answer": "4"}\n{broken\n')
    proc = _train_without_ray(tmp_path, f"data.name={data}", f"data.heldout={data}")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: data: {data}:3: malformed JSON")
    data.write_text(data.read_text().replace("{broken\n", ""))
    proc = _train_without_ray(tmp_path, f"data.name={data}", f"data.heldout={data}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "data: 2 training prompts" in proc.stdout and "2 held-out problems" in proc.stdout


def test_dry_run_fails_when_the_model_is_not_here_offline(tmp_path):
    # HF_HUB_OFFLINE=1 and no copy in the hub cache: the run would stop at start, and so does its dry run.
    proc = _train_without_ray(tmp_path, "cluster=gpu_1x8", "model=qwen2.5-math-1.5b-instruct", offline="1")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: model: model 'qwen2.5-math-1.5b-instruct'") and "not available offline" in last
    assert "Traceback" not in proc.stderr


def test_the_dry_run_prices_the_plan_at_the_longest_prompt_as_the_run_does(tiny_model_dir, tmp_path):
    """With the tiny model built (``tiny_model_dir``) the dry run renders the training prompts, as the run
    does before it plans (``trainer.loop.longest_prompt``), so the search prices the same workload and its
    plan.yaml is the one the run will write; without it, it says so and prices rollout.max_prompt_tokens."""
    from transformers import AutoTokenizer

    from trainer.loop import load_data, longest_prompt, render_prompts
    from trainer.preflight import longest_training_prompt, preflight

    cfg = _cfg()
    train, _ = load_data(cfg)
    expected = longest_prompt(render_prompts(cfg, AutoTokenizer.from_pretrained(tiny_model_dir), train)[1], train)
    assert longest_training_prompt(cfg) == expected < cfg.rollout.max_prompt_tokens
    lines, problems = preflight(cfg, tmp_path)
    assert not problems
    assert f"prompts: the longest training prompt is {expected} tokens" in "\n".join(lines)
    assert f"time at {expected}-token prompts" in next(line for line in lines if line.startswith("cluster: "))
    missing = _cfg("model.tiny.seed=12345")  # another tiny model, never built
    assert longest_training_prompt(missing) is None
    assert "tokenizer is not here yet" in "\n".join(preflight(missing, None)[0])
