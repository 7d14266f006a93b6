"""Benchmark: execution-plan search vs the three baselines at the ReaL paper's settings.

    .venv/bin/python bench/plan_search.py --json bench/out/plan_search.json

Settings (LLaMA-2 shapes, the reward model has the critic's shape and the reference the actor's;
batch 512, prompt 128, generation 896 on 8-GPU A100-80GB nodes): 7B+7B on 8 and 16 GPUs, 13B+7B on
16, 34B+7B on 32, 70B+7B and 70B+70B on 64 and 128, plus a long-context setting (7B+7B on 16 GPUs,
generation 2048). For each: the predicted seconds per iteration of ReaL-Heuristic, the symmetric
(DeepSpeed-Chat-style) and the disjoint (OpenRLHF-style) plan ("oom" when it does not fit), of the
searched plan, the speedups over each fitting baseline, and the search's CPU and wall time. Each
search gets a budget of this process's CPU time (``--seconds``), so results do not depend on how
busy the shared machine is. All iteration times are the estimator's predictions, computed in the
same run; none is a GPU measurement.

The settings are reported in three groups (7B-34B; 70B; long context), each with the searched plan's
mean speedup over ReaL-Heuristic beside the ReaL paper's measured figures (+26% on average over its
heuristic, v1 abstract; +81% at long context, v2). ReaL-Heuristic gets ReaL's placement rule and,
for the micro-batches and checkpointing the rule leaves open, each call's fastest that fits alone
(``planning.builders.real_heuristic_plan``), not ReaL's defaults; its plan is in the JSON.

Writes the JSON (a list of objects, one per setting) atomically and a PNG of the speedups next to it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.files import atomic_save_figure, atomic_write_json  # noqa: E402
from planning.estimator import Workload, hardware  # noqa: E402
from planning.search import search  # noqa: E402
from planning.shapes import named_spec  # noqa: E402

CRITIC_FREE = "none"
"""A setting's critic ``none``: a critic-free algorithm's dataflow graph (GRPO: no critic calls; the reference
for its KL term and a 7B reward model stay)."""
# (actor, critic, GPUs, generation length)
SETTINGS = [
    ("7b", "7b", 8, 896),
    ("7b", "7b", 16, 896),
    ("13b", "7b", 16, 896),
    ("34b", "7b", 32, 896),
    ("70b", "7b", 64, 896),
    ("70b", "70b", 64, 896),
    ("70b", "7b", 128, 896),
    ("70b", "70b", 128, 896),
    ("7b", "7b", 16, 2048),
    ("7b", CRITIC_FREE, 8, 896),
    ("70b", CRITIC_FREE, 128, 896),
]
BASELINE_LABELS = {"real_heuristic": "ReaL-Heuristic", "symmetric": "symmetric", "disjoint": "disjoint"}
GROUPS = {
    "7B-34B": "ReaL reports +26% on average over its heuristic (v1 abstract; measured)",
    "70B": "ReaL reports +26% on average over its heuristic (v1 abstract, all sizes; measured)",
    "long context": "ReaL reports +81% on average over its heuristic at long context (v2; measured)",
    "critic-free": "ReaL has no critic-free figure; its heuristic is adapted to the graph (planning/builders.py)",
}
"""Each group of settings, and the ReaL paper's figure it is read beside."""


def group_of(actor: str, critic: str, gen_len: int) -> str:
    """The settings' group: critic-free, long context (generation 2048), 70B actors, or 7B-34B actors."""
    if critic == CRITIC_FREE:
        return "critic-free"
    if gen_len > 896:
        return "long context"
    return "70B" if actor == "70b" else "7B-34B"


def run_setting(actor: str, critic: str, num_gpus: int, gen_len: int, seconds: float, seed: int) -> dict:
    critic_free = critic == CRITIC_FREE
    reward = named_spec("7b" if critic_free else critic)
    w = Workload(
        named_spec(actor),
        None if critic_free else named_spec(critic),
        reward,
        batch=512,
        prompt_len=128,
        gen_len=gen_len,
    )
    hw = hardware("a100-80g", max(1, num_gpus // 8), min(8, num_gpus))
    report = search(w, hw, seconds_budget=seconds, seed=seed, clock=time.process_time)
    models = f"{actor.upper()} GRPO (no critic, 7B reward)" if critic_free else f"{actor.upper()}+{critic.upper()}"
    row = {
        "setting": f"{models} on {num_gpus} GPUs, gen {gen_len}",
        "group": group_of(actor, critic, gen_len),
        "actor": actor,
        "critic": critic,
        "num_gpus": num_gpus,
        "batch": 512,
        "prompt_len": 128,
        "gen_len": gen_len,
        "search_s_per_iteration": report.cost.seconds_per_iteration,
        "search_wall_s": report.search_seconds,
        "search_cpu_s": report.cpu_seconds,
        "num_plans_evaluated": report.num_evaluations,
        "started_from": report.start,
        "plan": report.plan.to_dict()["calls"],
    }
    heuristic = report.baselines["real_heuristic"][0]
    row["real_heuristic_plan"] = None if heuristic is None else heuristic.to_dict()["calls"]
    for name in BASELINE_LABELS:
        cost = report.baselines[name][1]
        if cost is not None and cost.fits:
            row[f"{name}_s_per_iteration"] = cost.seconds_per_iteration
            row[f"speedup_vs_{name}"] = cost.seconds_per_iteration / report.cost.seconds_per_iteration
        else:  # None: oom
            row[f"{name}_s_per_iteration"] = None
            row[f"speedup_vs_{name}"] = None
    return row


def _fmt(value: float | None, spec: str) -> str:
    return "oom" if value is None else format(value, spec)


def group_summary(rows: list[dict]) -> list[str]:
    """Per group: the searched plan's mean speedup over ReaL-Heuristic (the arithmetic mean of the
    speedups, minus 1, over the settings where ReaL-Heuristic fits) and its range, beside ReaL's figure."""
    lines = []
    for group, paper in GROUPS.items():
        speedups = [r["speedup_vs_real_heuristic"] for r in rows if r["group"] == group]
        fitting = [s for s in speedups if s is not None]
        if not speedups:
            continue
        if not fitting:
            lines.append(f"{group}: ReaL-Heuristic does not fit in any setting; {paper}")
            continue
        mean = sum(fitting) / len(fitting)
        lines.append(
            f"{group}: searched plan {mean - 1:+.0%} on average over ReaL-Heuristic "
            f"({min(fitting):.2f}-{max(fitting):.2f}x over {len(fitting)} of {len(speedups)} settings, "
            f"predicted); {paper}"
        )
    return lines


def table(rows: list[dict]) -> str:
    header = (
        "| setting | ReaL-Heuristic s | symmetric s | disjoint s | search s | × ReaL-Heuristic | × symmetric "
        "| × disjoint | search CPU s |"
    )
    lines = [header, "|" + "---|" * 9]
    for r in sorted(rows, key=lambda r: list(GROUPS).index(r["group"])):
        cells = [r["setting"]] + [_fmt(r[f"{n}_s_per_iteration"], ".1f") for n in BASELINE_LABELS]
        cells.append(f"{r['search_s_per_iteration']:.1f}")
        cells += [_fmt(r[f"speedup_vs_{n}"], ".2f") for n in BASELINE_LABELS]
        cells.append(f"{r['search_cpu_s']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


PAPER_SPEEDUP = {"7B-34B": 1.26, "70B": 1.26, "long context": 1.81, "critic-free": None}
"""The ReaL paper's measured mean speedup over its heuristic, drawn beside each group."""


def _plot(rows: list[dict], path: Path) -> None:
    """One panel per group of settings: the searched plan's predicted speedup over each baseline, and
    the ReaL paper's measured mean over its heuristic as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    groups = [g for g in GROUPS if any(r["group"] == g for r in rows)]
    sizes = [sum(r["group"] == g for r in rows) for g in groups]
    fig, axes = plt.subplots(1, len(groups), figsize=(12, 4.8), sharey=True, width_ratios=sizes, squeeze=False)
    width = 0.27
    for ax, group in zip(axes[0], groups):
        members = [r for r in rows if r["group"] == group]
        for k, (name, label) in enumerate(BASELINE_LABELS.items()):
            values = [r[f"speedup_vs_{name}"] or float("nan") for r in members]
            xs = [i + (k - 1) * width for i in range(len(members))]
            bars = ax.bar(xs, values, width, label=f"search vs {label}", color=f"C{k}")
            for bar, r in zip(bars, members):
                if r[f"speedup_vs_{name}"] is None:
                    ax.text(bar.get_x() + width / 2, 1.05, "oom", ha="center", va="bottom", rotation=90, fontsize=7)
        ax.axhline(1.0, color="grey", lw=0.8)
        if PAPER_SPEEDUP[group] is not None:
            ax.axhline(
                PAPER_SPEEDUP[group], color="C0", lw=1.0, ls="--", label="ReaL paper: over its heuristic (measured)"
            )
        labels = [r["setting"].replace(" on ", "\n").replace(", gen", "\ngen").replace(" (", "\n(") for r in members]
        ax.set_xticks(range(len(members)), labels, fontsize=7)
        ax.set_title(group, fontsize=9)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FormatStrFormatter("%.1f×"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%.1f×"))
        ax.tick_params(axis="y", which="both", labelsize=7)
    axes[0][0].set_ylabel("predicted speedup of the searched plan (×, log)")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle(
        "Plan search vs baselines (estimator predictions, A100-80GB nodes, batch 512, prompt 128)", fontsize=10
    )
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True, help="output JSON path (PNG written next to it)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=30.0,
        help="search budget per setting in CPU seconds of this process (70B+70B gets 3x)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help="run settings whose name contains this text")
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG and summary from an existing --json")
    args = parser.parse_args()
    if args.plot_only:
        rows = json.loads(Path(args.json).read_text())
        print(table(rows))
        print("\n".join(group_summary(rows)))
        _plot(rows, Path(args.json).with_suffix(".png"))
        return
    from tqdm import tqdm

    settings = [s for s in SETTINGS if args.only is None or args.only.lower() in f"{s[0]}+{s[1]} on {s[2]}"]
    rows = []
    for actor, critic, num_gpus, gen_len in tqdm(settings, desc="settings", unit="setting"):
        budget = args.seconds * (3 if actor == critic == "70b" else 1)
        rows.append(run_setting(actor, critic, num_gpus, gen_len, budget, args.seed))
        atomic_write_json(Path(args.json), rows)
    print(table(rows))
    print("\n".join(group_summary(rows)))
    _plot(rows, Path(args.json).with_suffix(".png"))
    print(f"wrote {args.json} and {Path(args.json).with_suffix('.png')}")


if __name__ == "__main__":
    main()
