"""Calibration of whole iterations: the cost model's predicted seconds per PPO iteration, and per
call, against what real runs of the same plans measured on this machine.

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
``end_s``). Predicted: ``estimate_plan``'s iteration and ``iteration_schedule``'s calls. Over all
runs: the median relative error and Spearman's rank correlation of predicted against measured
iteration times, and per call the median of measured over predicted (which term is off, by how much).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.files import atomic_write_text  # noqa: E402

# Names the runtime's spans use for the cost model's calls (the grader-only reward is "reward").
MEASURED_NAME = {"rew_inf": ("rew_inf", "reward")}


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


def measured(run_dir: Path) -> dict[str, Any]:
    """Medians over the timed iterations after the first: iteration, calls' span, each call's span."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    timed = [r for r in rows if "time/iteration" in r][1:]
    if not timed:
        raise ValueError(f"{run_dir}/metrics.jsonl: needs at least 2 timed iterations (the first is warm-up)")
    calls: dict[str, list[float]] = {}
    spans = []
    for row in timed:
        names = [k[len("call/") : -len("/start_s")] for k in row if k.startswith("call/") and k.endswith("/start_s")]
        for name in names:
            calls.setdefault(name, []).append(row[f"call/{name}/end_s"] - row[f"call/{name}/start_s"])
        spans.append(max(row[f"call/{n}/end_s"] for n in names) - min(row[f"call/{n}/start_s"] for n in names))
    return {
        "iterations": [r["iteration"] for r in timed],
        "iteration_s": statistics.median(r["time/iteration"] for r in timed),
        "calls_span_s": statistics.median(spans),
        "calls": {name: statistics.median(v) for name, v in sorted(calls.items())},
    }


def compare(run_dir: Path, profile: Any) -> dict[str, Any]:
    """One row: the run's plan, its measured and predicted iteration and calls."""
    from planning.estimator import estimate_plan, hardware, iteration_schedule
    from planning.execution_plan import ExecutionPlan
    from trainer.plan_select import model_specs, workload

    cfg = run_config(run_dir)
    specs = model_specs(cfg)
    plan = ExecutionPlan.load(run_dir / "plan.yaml")
    w = workload(cfg, specs)
    hw = hardware("cpu", cfg.cluster.num_nodes, cfg.cluster.devices_per_node, profile)
    cost, schedule = estimate_plan(plan, w, hw), iteration_schedule(plan, w, hw)
    got = measured(run_dir)
    calls = {}
    for name, call in schedule.calls.items():
        seen = next((got["calls"][m] for m in MEASURED_NAME.get(name, (name,)) if m in got["calls"]), None)
        calls[name] = {"predicted_s": call.end - call.start, "measured_s": seen}
    load = run_dir / "load.json"
    return {
        "run": run_dir.name,
        "plan": plan.source,
        "cluster": f"{plan.num_nodes}x{plan.gpus_per_node}",
        "workload": f"{w.batch} x ({w.prompt_len} + {w.gen_len}) tokens, {cfg.model.name}",
        "measured_iteration_s": got["iteration_s"],
        "measured_calls_span_s": got["calls_span_s"],
        "predicted_iteration_s": cost.seconds_per_iteration,
        "measured_iterations": got["iterations"],
        "calls": calls,
        "predicted_order": schedule.order(),
        "load": json.loads(load.read_text()) if load.exists() else None,
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median relative error and Spearman of iteration times (whole and calls' span); per call, the
    median of measured over predicted seconds."""
    from planning.profile import spearman

    predicted = [r["predicted_iteration_s"] for r in rows]
    out: dict[str, Any] = {"num_plans": len(rows)}
    for key in ("measured_iteration_s", "measured_calls_span_s"):
        truth = [r[key] for r in rows]
        out[key] = {
            "median_relative_error": statistics.median(abs(p - m) / m for p, m in zip(predicted, truth)),
            "spearman": spearman(predicted, truth),
        }
    ratios: dict[str, list[float]] = {}
    for r in rows:
        for name, c in r["calls"].items():
            if c["measured_s"] is not None and c["predicted_s"] > 0:
                ratios.setdefault(name, []).append(c["measured_s"] / c["predicted_s"])
    out["measured_over_predicted_by_call"] = {n: statistics.median(v) for n, v in sorted(ratios.items())}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="PROFILE.json from python -m planning.profile")
    parser.add_argument("--runs", nargs="+", required=True, help="train.py run directories")
    parser.add_argument("--jsonl", default=None, help="write one row per run and a summary row here")
    args = parser.parse_args(argv)
    from planning.profile import Profile

    profile = Profile.load(args.profile)
    rows = [compare(Path(d), profile) for d in args.runs]
    for r in rows:
        print(
            f"{r['run']:<28} {r['plan']:<28} {r['cluster']:<4} measured {r['measured_iteration_s']:7.2f} s "
            f"(calls {r['measured_calls_span_s']:7.2f} s)  predicted {r['predicted_iteration_s']:7.2f} s"
        )
    result = summary(rows)
    for key in ("measured_iteration_s", "measured_calls_span_s"):
        s = result[key]
        print(f"{key}: median relative error {s['median_relative_error']:.0%}, spearman {s['spearman']:.2f}")
    print(
        "measured / predicted by call: "
        + ", ".join(f"{n} {v:.2f}" for n, v in result["measured_over_predicted_by_call"].items())
    )
    if args.jsonl:
        lines = [json.dumps(r) for r in rows] + [json.dumps({"summary": result})]
        atomic_write_text(Path(args.jsonl), "\n".join(lines) + "\n")
        print(f"wrote {args.jsonl}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
