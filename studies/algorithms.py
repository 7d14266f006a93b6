"""The critic-free algorithms against PPO (``scripts/algorithm_comparison.sh``; docs/algorithms.md):
``python -m studies.algorithms RUNS_DIR --out DIR [--export]``.

Reads the finished named runs below RUNS_DIR (``<algorithm>[_<reward>]_seed<S>/``: metrics.jsonl, summary.json,
.hydra/overrides.yaml) and writes ``DIR/summary.md``, ``DIR/summary.json``, ``DIR/curves.png`` (the success-reward
runs: held-out greedy success, training success, KL and response length per iteration, each algorithm's seeds)
and ``DIR/process_rewards.png`` (the PRM runs: steps per response, truncation, held-out success and the learned
reward). A run's option is its algorithm, and its reward option when that is not success; seeds pair by seed,
and each option is compared with PPO's success-reward runs on the same seeds.

``--export`` first copies each finished run compactly to ``DIR/runs/<run>/`` (timings kept) and summarizes the
copies, so that ``python -m studies.algorithms DIR/runs --out DIR`` regenerates summary.md and summary.json byte
for byte.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common.cli import ArgumentParser, fail
from common.files import atomic_save_figure, atomic_write_text
from trainer.metrics import read_metrics
from trainer.summarize import export_run, find_runs, mean_std, paired_interval, read_overrides

BASELINE = "ppo"
ALGORITHM_ORDER = ["ppo", "grpo", "dr_grpo", "rloo", "reinforce_pp"]
CURVES = [
    ("heldout/success", "held-out greedy success"),
    ("reward/success", "training success (sampled)"),
    ("kl/mean", "KL(pi || pi_ref) per response"),
    ("response/length", "response tokens"),
]
PRM_CURVES = [
    ("response/num_steps", "steps per response"),
    ("response/truncated", "truncated (hit the token cap)"),
    ("heldout/success", "held-out greedy success"),
    ("reward/learned", "learned reward per response"),
]


def option_of(overrides: dict[str, str]) -> str:
    """``grpo`` for algorithm=grpo with the success reward, ``grpo+prm_clip_delta`` with +reward=prm_clip_delta."""
    algorithm, reward = overrides.get("algorithm", "ppo"), overrides.get("reward", "success")
    return algorithm if reward == "success" else f"{algorithm}+{reward}"


def run_record(run: Path) -> dict[str, Any]:
    rows = read_metrics(run)
    over = read_overrides(run)
    summary = json.loads((run / "summary.json").read_text())
    iterations = [r for r in rows if r.get("iteration", 0) >= 1]
    seconds = [r["time/iteration"] for r in iterations if "time/iteration" in r]
    return {
        "run": run.name,
        "option": option_of(over),
        "seed": over.get("run.seed", "0"),
        "iterations": len(iterations),
        "greedy_before": summary["heldout_before"],
        "greedy_after": summary["heldout_after"],
        "gain": summary["heldout_after"] - summary["heldout_before"],
        "heldout": {int(r["iteration"]): r["heldout/success"] for r in rows if "heldout/success" in r},
        "seconds_per_iteration": sum(seconds) / len(seconds) if seconds else None,
        "steps_last": iterations[-1].get("response/num_steps") if iterations else None,
        "truncated_max": max((r.get("response/truncated", 0.0) for r in iterations), default=None),
        "kl_last": iterations[-1].get("kl/mean") if iterations else None,
        "equal_groups_mean": _mean(r.get("advantages/equal_reward_group_fraction") for r in iterations),
    }


def _mean(values: Any) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _order(option: str) -> tuple[int, str]:
    algorithm = option.split("+")[0]
    return (ALGORITHM_ORDER.index(algorithm) if algorithm in ALGORITHM_ORDER else len(ALGORITHM_ORDER), option)


def build_summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per option: seeds, held-out greedy success before and after (mean and sample std over seeds), the gain,
    the paired difference from PPO's final success on the same seeds with its 95% t interval, seconds per
    iteration; and every run."""
    by_option: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_option[r["option"]].append(r)
    baseline = {r["seed"]: r["greedy_after"] for r in by_option.get(BASELINE, [])}
    baseline_iterations = {r["seed"]: r["iterations"] for r in by_option.get(BASELINE, [])}
    options = []
    for option in sorted(by_option, key=_order):
        runs = by_option[option]
        # A longer run is compared at PPO's last iteration: its own final success had more updates to get there.
        at_baseline = {
            r["seed"]: r["heldout"][baseline_iterations[r["seed"]]]
            for r in runs
            if r["seed"] in baseline_iterations and baseline_iterations[r["seed"]] in r.get("heldout", {})
        }
        diff, half, pairs = paired_interval(at_baseline, baseline)
        options.append(
            {
                "option": option,
                "seeds": [r["seed"] for r in runs],
                "before": mean_std([r["greedy_before"] for r in runs]),
                "after": mean_std([r["greedy_after"] for r in runs]),
                "gain": mean_std([r["gain"] for r in runs]),
                "min_gain": min(r["gain"] for r in runs),
                "vs_ppo": None
                if option == BASELINE or not pairs
                else {"mean": diff, "half_width": half, "pairs": pairs},
                "seconds_per_iteration": _mean(r["seconds_per_iteration"] for r in runs),
            }
        )
    return {"generator": "studies.algorithms", "options": options, "runs": list(records)}


def _pm(stat: Sequence[float]) -> str:
    mean, std = stat
    return f"{mean:.3f}" if std != std else f"{mean:.3f} ± {std:.3f}"


def _num(x: float | None, spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def _vs_ppo(vs: dict[str, Any] | None) -> str:
    """The paired difference in points; one pair has no interval (its t interval is undefined)."""
    if vs is None:
        return "–"
    mean, half, pairs = 100 * vs["mean"], 100 * vs["half_width"], vs["pairs"]
    if pairs < 2 or half != half:
        return f"{mean:+.1f} (1 pair, no interval)"
    return f"{mean:+.1f} [{mean - half:+.1f}, {mean + half:+.1f}] ({pairs} pairs)"


def render_markdown(summary: dict[str, Any]) -> str:
    lines = [
        "# Critic-free algorithms against PPO",
        "",
        "Held-out greedy success on 200 problems (mean ± sample std over seeds); the paired difference from PPO's",
        "final success on the same seed, in points, with its 95% t interval, taken at PPO's last iteration (a longer",
        "run is compared at that iteration, not at its own end); seconds per iteration as the run measured them (wall",
        "clock, the machine's load included).",
        "",
        "| option | seeds | before | after | gain | smallest gain | vs PPO (points) | s / iteration |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in summary["options"]:
        cells = [o["option"], " ".join(o["seeds"]), _pm(o["before"]), _pm(o["after"]), _pm(o["gain"])]
        cells += [f"{o['min_gain']:+.3f}", _vs_ppo(o["vs_ppo"]), _num(o["seconds_per_iteration"], ".1f")]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Per run:", ""]
    lines += ["| run | iterations | before | after | steps/resp last | max truncated | KL last | equal-reward groups |"]
    lines += ["| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in summary["runs"]:
        cells = [r["run"], str(r["iterations"]), f"{r['greedy_before']:.3f}", f"{r['greedy_after']:.3f}"]
        cells += [_num(r["steps_last"], ".2f"), _num(r["truncated_max"], ".3f"), _num(r["kl_last"], ".3f")]
        cells.append(_num(r["equal_groups_mean"], ".2f"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(runs: Sequence[Path], records: Sequence[dict[str, Any]], path: Path, keys: list[tuple[str, str]]) -> Path:
    """One panel per key: each option's seeds as thin lines in its colour, their mean as a thick one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    options = sorted({r["option"] for r in records}, key=_order)
    colours = {o: f"C{i}" for i, o in enumerate(options)}
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6), squeeze=False)
    for ax, (key, title) in zip(axes[0], keys):
        for option in options:
            curves = []
            for run, r in zip(runs, records):
                if r["option"] == option:
                    points = [(m["iteration"], m[key]) for m in read_metrics(run) if key in m]
                    curves.append(dict(points))
                    if points:
                        ax.plot(*zip(*points), color=colours[option], lw=0.6, alpha=0.4)
            common = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            if common:
                means = [sum(c[i] for c in curves) / len(curves) for i in common]
                ax.plot(common, means, color=colours[option], lw=2.0, label=option)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("iteration", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def write_summary(root: Path, out: Path) -> list[Path]:
    runs = [r for r in find_runs(root) if (r / "summary.json").exists()]
    if not runs:
        fail(f"{root}: no finished runs (run directories with metrics.jsonl and summary.json)")
    records = [run_record(r) for r in runs]
    summary = build_summary(records)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    atomic_write_text(out / "summary.md", render_markdown(summary))
    written = [out / "summary.md", out / "summary.json"]
    success = [(p, r) for p, r in zip(runs, records) if "+" not in r["option"]]
    prm = [(p, r) for p, r in zip(runs, records) if "+" in r["option"]]
    for group, name, keys in ((success, "curves.png", CURVES), (prm, "process_rewards.png", PRM_CURVES)):
        if group:
            written.append(plot([p for p, _ in group], [r for _, r in group], out / name, keys))
    return written


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m studies.algorithms", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--export", action="store_true", help="copy the finished runs to OUT/runs first")
    args = parser.parse_args(argv)
    root = args.runs_dir
    if args.export:
        for run in find_runs(root):
            if (run / "summary.json").exists():
                export_run(run, args.out / "runs" / run.relative_to(root), not_exported=("call/",))
        root = args.out / "runs"
    for path in write_summary(root, args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
