"""Calibration of whole iterations: the cost model's predicted seconds per PPO iteration, and per
call, against what real runs of the same plans measured on this machine. ``scripts/plan_calibration.sh``
makes the profile and the runs and calls this.

    .venv/bin/python -m planning.profile --out PROFILE.json        # per-layer costs on this CPU
    .venv/bin/python bench/plan_calibration.py --profile PROFILE.json --runs RUN_DIR [RUN_DIR ...] \
        --jsonl docs/plan_iteration_calibration.jsonl

Each RUN_DIR is a ``train.py`` run directory: its ``.hydra/overrides.yaml`` (the run's config is
composed again from them, so the workload is the run's own: ``trainer.plan_select.workload``), its
``plan.yaml`` and its ``metrics.jsonl``; an optional ``load.json`` (``{"before": [...], "after":
[...]}``, the load averages around the run) is copied into the row. The hardware is ``cpu`` in the
run's cluster shape, with the profile's measured per-layer costs.

Measured, per run: the median over the PPO iterations after the first (the first carries warm-up)
of ``time/iteration`` (the whole iteration, driver work included) and of the calls' span (first call
start to last call end), and of each call's span across its devices (``call/<name>/start_s`` to
``end_s``). Predicted, with the workload priced as ``train.py`` prices it (the run's longest rendered
prompt): ``estimate_plan``'s iteration, ``iteration_schedule``'s calls and its schedule alone (without
the shared-cores bound), and the model before it priced the run's prompts, the shared cores and the
fixed per-call costs (``predicted_before_s``). Over all runs: the median relative error and Spearman's
rank correlation of each prediction against the measured iteration times, and per call the median of
measured over predicted (which term is off, by how much).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.files import atomic_write_text  # noqa: E402

# The runtime's spans that make up a cost-model call (their union): the grader-only reward is "reward";
# the actor's reallocation ends when the engines have loaded the weights ("realloc_actor_load").
MEASURED_SPANS = {"rew_inf": ("rew_inf", "reward"), "realloc_actor": ("realloc_actor", "realloc_actor_load")}
NUM_CORES = os.cpu_count() or 1
MODEL_CALL = {span: call for call, spans in MEASURED_SPANS.items() for span in spans}


def run_config(run_dir: Path) -> Any:
    """The run's TrainConfig, composed from configs/ with the run's own overrides."""
    import yaml
    from hydra import compose, initialize_config_dir

    from trainer.compose import to_train_config
    from trainer.config import register_configs

    register_configs()
    overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) or []
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "configs"), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=overrides))


def longest_prompt(cfg: Any) -> int:
    """Tokens of the longest training prompt as the run renders it (``train.py`` gives the cost model the
    same number: the runtime trims each micro-batch's padding to its longest row)."""
    from transformers import AutoTokenizer

    from trainer.loop import load_data, render_prompts, resolve_model_dir

    problems, _ = load_data(cfg)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_dir(cfg.model))
    _, prompt_tokens = render_prompts(cfg, tokenizer, problems)
    return max(len(ids) for ids in prompt_tokens.values())


def measured(run_dir: Path) -> dict[str, Any]:
    """Medians over the timed iterations after the first: iteration, calls' span, each call's span."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = [r for r in rows if "time/iteration" in r][1:]
    if not timed:
        raise ValueError(f"{run_dir}/metrics.jsonl: needs at least 2 timed iterations (the first is warm-up)")
    from planning.schedule import CALL_INPUTS

    calls: dict[str, list[float]] = {}
    spans = []
    for row in timed:
        names = [k[len("call/") : -len("/start_s")] for k in row if k.startswith("call/") and k.endswith("/start_s")]
        start, end = {}, {}
        for name in {MODEL_CALL.get(n, n) for n in names}:
            parts = [n for n in MEASURED_SPANS.get(name, (name,)) if n in names]
            start[name] = min(row[f"call/{n}/start_s"] for n in parts)
            end[name] = max(row[f"call/{n}/end_s"] for n in parts)
        for name in start:
            # From when its inputs were done: the runtime submits a call early, and a device that
            # is ready first waits inside it for the others.
            ready = max([end[i] for i in CALL_INPUTS.get(name, ()) if i in end], default=start[name])
            calls.setdefault(name, []).append(end[name] - max(start[name], ready))
        spans.append(max(end.values()) - min(start.values()))
    return {
        "iterations": [r["iteration"] for r in timed],
        "iteration_s": statistics.median(r["time/iteration"] for r in timed),
        "calls_span_s": statistics.median(spans),
        "calls": {name: statistics.median(v) for name, v in sorted(calls.items())},
    }


def compare(name: str, run_dir: Path, profile: Any) -> dict[str, Any]:
    """One row: the run's plan, its measured and predicted iteration and calls."""
    from planning.estimator import estimate_plan, hardware, iteration_schedule
    from planning.execution_plan import ExecutionPlan
    from trainer.plan_select import model_specs, workload

    cfg = run_config(run_dir)
    specs = model_specs(cfg)
    plan = ExecutionPlan.load(run_dir / "plan.yaml")
    prompt_len = longest_prompt(cfg)
    w = workload(cfg, specs, prompt_len)  # as train.py prices it
    hw = hardware("cpu", cfg.cluster.num_nodes, cfg.cluster.devices_per_node, profile)
    cost, schedule = estimate_plan(plan, w, hw), iteration_schedule(plan, w, hw)
    # What the cost model predicted before it priced the run's prompts, the machine's shared cores and
    # the fixed per-call and per-step costs: the configured prompt length, a core per device, no overheads.
    bare = replace(hw, num_cores=None, call_overhead_s=0.0, step_overhead_s=0.0)
    before = estimate_plan(plan, replace(w, longest_prompt=None), bare).seconds_per_iteration
    got = measured(run_dir)
    calls = {
        name: {"predicted_s": call.end - call.start, "measured_s": got["calls"].get(name)}
        for name, call in schedule.calls.items()
    }
    load = run_dir / "load.json"
    return {
        "run": name,
        "plan": plan.source,
        "cluster": f"{plan.num_nodes}x{plan.gpus_per_node}",
        "workload": f"{w.batch} x ({prompt_len} of up to {w.prompt_len} + {w.gen_len}) tokens, {cfg.model.name}",
        "measured_iteration_s": got["iteration_s"],
        "measured_calls_span_s": got["calls_span_s"],
        "predicted_iteration_s": cost.seconds_per_iteration,
        "predicted_schedule_s": schedule.seconds,
        "predicted_before_s": before,
        "longest_prompt_tokens": prompt_len,
        "num_cores": hw.num_cores,
        "call_overhead_s": hw.call_overhead_s,
        "measured_iterations": got["iterations"],
        "calls": calls,
        "predicted_order": schedule.order(),
        "load": json.loads(load.read_text()) if load.exists() else None,
    }


PREDICTIONS = {
    "predicted_iteration_s": "the cost model",
    "predicted_schedule_s": "its schedule alone (no shared-cores bound)",
    "predicted_before_s": "before: configured prompt length, a core per device, no per-call cost",
}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median relative error and Spearman of iteration times (whole and calls' span) for each prediction;
    per call, the median of measured over predicted seconds."""
    from planning.profile import spearman

    out: dict[str, Any] = {"num_plans": len(rows), "num_cores": NUM_CORES}
    for guess in PREDICTIONS:
        predicted = [r[guess] for r in rows]
        for key in ("measured_iteration_s", "measured_calls_span_s"):
            truth = [r[key] for r in rows]
            out[f"{guess} vs {key}"] = {
                "median_relative_error": statistics.median(abs(p - m) / m for p, m in zip(predicted, truth)),
                "spearman": spearman(predicted, truth),
            }
    ratios: dict[str, list[float]] = {}
    for r in rows:
        for name, c in r["calls"].items():
            if c["measured_s"] is not None and c["predicted_s"] > 0:
                ratios.setdefault(name, []).append(c["measured_s"] / c["predicted_s"])
    out["measured_over_predicted_s_by_call"] = {n: statistics.median(v) for n, v in sorted(ratios.items())}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="PROFILE.json from python -m planning.profile")
    parser.add_argument("--runs", nargs="+", required=True, help="train.py run directories, each DIR or NAME=DIR")
    parser.add_argument("--jsonl", default=None, help="write one row per run and a summary row here")
    args = parser.parse_args(argv)
    from planning.profile import Profile

    profile = Profile.load(args.profile)
    named = [run.split("=", 1) if "=" in run else (Path(run).name, run) for run in args.runs]
    rows = [compare(name, Path(d), profile) for name, d in named]
    for r in rows:
        print(
            f"{r['run']:<28} {r['plan']:<24} {r['cluster']:<4} measured {r['measured_iteration_s']:7.2f} s "
            f"(calls {r['measured_calls_span_s']:7.2f} s)  predicted {r['predicted_iteration_s']:7.2f} s "
            f"(schedule {r['predicted_schedule_s']:7.2f} s; before {r['predicted_before_s']:7.2f} s)"
        )
    result = summary(rows)
    for key, s in result.items():
        if isinstance(s, dict) and "spearman" in s:
            print(f"{key}: median relative error {s['median_relative_error']:.0%}, spearman {s['spearman']:.2f}")
    ratios = result["measured_over_predicted_s_by_call"]
    print("measured / predicted by call: " + ", ".join(f"{n} {v:.2f}" for n, v in ratios.items()))
    if args.jsonl:
        lines = [json.dumps(r) for r in rows] + [json.dumps({"summary": result})]
        atomic_write_text(Path(args.jsonl), "\n".join(lines) + "\n")
        print(f"wrote {args.jsonl}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
