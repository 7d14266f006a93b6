"""Summarize a sweep: ``python -m trainer.summarize MULTIRUN_DIR [--out DIR] [--export]``.

Reads every finished run directory below MULTIRUN_DIR (one per Hydra job: metrics.jsonl, summary.json,
.hydra/overrides.yaml; runs without summary.json are still going and are only listed) and writes
``summary.md`` (one row per reward option, seeds averaged) and
``curves.png`` (held-out success, steps per response, response length, training success, the learned
reward, KL over iterations: one colour per reward option, each seed thin, their mean thick).

``--export`` first copies each finished run, compactly, to ``DIR/runs/<run>/`` (``export_runs``) and
summarizes those copies, so that a committed ``DIR`` holds the data behind its table:
``python -m trainer.summarize DIR/runs --out DIR`` regenerates summary.md and summary.json byte for byte.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common.cli import ArgumentParser, fail
from common.files import atomic_save_figure, atomic_write_text
from trainer.metrics import CURVES, drawn, panel_grid, read_metrics

REWARD_ORDER = [
    "success",
    "orm",
    "prm",
    "prm_clip",
    "prm_delta",
    "prm_clip_delta",
    "prm_alpha_matched",
    "prm_clip_delta_matched",
]


def read_overrides(run: Path) -> dict[str, str]:
    """A run's Hydra overrides by key, without the ``+``/``~`` prefixes: ``{"reward": "prm", "run.seed": "0"}``
    ({} when the run has no .hydra/overrides.yaml)."""
    path = run / ".hydra" / "overrides.yaml"
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        item = line.strip().lstrip("- ").strip("'\"")
        if "=" in item:
            k, v = item.split("=", 1)
            out[k.lstrip("+~")] = v
    return out


def find_runs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("metrics.jsonl"))


def _order(row: dict[str, Any]) -> tuple[int, str, str]:
    reward = row["reward"]
    return (REWARD_ORDER.index(reward) if reward in REWARD_ORDER else len(REWARD_ORDER), reward, row["seed"])


def run_row(run: Path) -> dict[str, Any]:
    rows = read_metrics(run)
    over = read_overrides(run)
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    last = rows[-1] if rows else {}

    def mean_of(key: str) -> float:
        vals = [r[key] for r in rows if key in r]
        return statistics.fmean(vals) if vals else float("nan")

    def first_of(key: str) -> float:
        vals = [r[key] for r in rows if key in r]
        return vals[0] if vals else float("nan")

    def last_of(key: str) -> float:
        vals = [r[key] for r in rows if key in r]
        return vals[-1] if vals else float("nan")

    return {
        "run": str(run),
        "reward": over.get("reward", "success"),
        "seed": over.get("run.seed", "0"),
        "iterations": last.get("iteration", 0),
        "greedy_before": summary.get("heldout_before", float("nan")),
        "greedy_after": summary.get("heldout_after", last_of("heldout/success")),
        "sampled_after": last_of("heldout/sampled_success"),
        "steps_last": last_of("response/num_steps"),
        "steps_first": first_of("response/num_steps"),
        "length_last": last_of("response/length"),
        "length_first": first_of("response/length"),
        "success_mean": mean_of("reward/success"),
        "learned_mean": mean_of("reward/learned"),
        "learned_last": last_of("reward/learned"),
        "step_score_mean": mean_of("reward/step_score"),
        "orm_score_mean": mean_of("reward/orm_score"),
        "kl_last": last_of("kl/mean"),
        "truncated_last": last_of("response/truncated"),
        "explained_variance_mean": mean_of("critic/explained_variance"),
        "steps_max": max((r["response/num_steps"] for r in rows if "response/num_steps" in r), default=float("nan")),
        "greedy_curve": [[r["iteration"], r["heldout/success"]] for r in rows if "heldout/success" in r],
    }


# Two-sided 95% quantiles of Student's t by degrees of freedom (1..30); beyond 30 the normal's 1.96 is
# within 2% of them.
_T95 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1; nan for one value) over seeds; a nan value (a metric a
    run did not log) makes both nan."""
    if not values:
        return float("nan"), float("nan")
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan")
    # By hand, not statistics.stdev: that raises on nan instead of propagating it.
    return mean, (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def paired_interval(option: dict[str, float], baseline: dict[str, float]) -> tuple[float, float, int]:
    """Mean over shared seeds of option - baseline, the half-width of its 95% t interval, and the number of
    pairs. Worked example: differences 0.05, 0.02, 0.08 -> mean 0.05, sd 0.03, half-width
    4.303 * 0.03 / sqrt(3) = 0.0745."""
    seeds = sorted(set(option) & set(baseline))
    diffs = [option[s] - baseline[s] for s in seeds]
    if len(diffs) < 2:
        return (diffs[0] if diffs else float("nan")), float("nan"), len(diffs)
    t = _T95[len(diffs) - 2] if len(diffs) - 1 <= len(_T95) else 1.96
    mean, std = mean_std(diffs)
    return mean, t * std / len(diffs) ** 0.5, len(diffs)


# Per-iteration keys left out of exported metrics: timings and throughput differ between machines and
# runs and no summary reads them.
NOT_EXPORTED = ("time/", "throughput/")


def export_runs(root: Path, out: Path) -> list[Path]:
    """Compact copies (``export_run``) of the finished runs under ``root`` in ``out/<run>/`` (run = path
    relative to root). Returns the copies."""
    copies = []
    for run in find_runs(root):
        if (run / "summary.json").exists():
            copies.append(export_run(run, out / run.relative_to(root)))
    return copies


def export_run(run: Path, copy: Path, not_exported: tuple[str, ...] = NOT_EXPORTED) -> Path:
    """A compact copy of one finished run in ``copy``: metrics.jsonl without the keys starting with
    ``not_exported``, summary.json without the machine's run_dir, .hydra/overrides.yaml, and samples.jsonl
    cut to the last iteration's samples. Returns ``copy``."""
    (copy / ".hydra").mkdir(parents=True, exist_ok=True)
    rows = [{k: v for k, v in r.items() if not k.startswith(not_exported)} for r in read_metrics(run)]
    atomic_write_text(copy / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    summary = {k: v for k, v in json.loads((run / "summary.json").read_text()).items() if k != "run_dir"}
    atomic_write_text(copy / "summary.json", json.dumps(summary, indent=2) + "\n")
    atomic_write_text(copy / ".hydra" / "overrides.yaml", (run / ".hydra" / "overrides.yaml").read_text())
    samples_path = run / "samples.jsonl"
    if samples_path.exists():
        samples = [json.loads(line) for line in samples_path.read_text().splitlines() if line.strip()]
        last = max((s["iteration"] for s in samples), default=None)
        atomic_write_text(
            copy / "samples.jsonl", "".join(json.dumps(s) + "\n" for s in samples if s["iteration"] == last)
        )
    return copy


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return "nan" if x != x else f"{x:.3f}"
    return str(x)


def write_summary(root: Path, out: Path) -> tuple[Path, Path | None]:
    found = find_runs(root)
    if not found:
        raise ValueError(f"{root}: no runs (directories with metrics.jsonl) under it")
    # A run still going (or killed) has no summary.json yet: its partial curves would skew the means.
    runs = [r for r in found if (r / "summary.json").exists()]
    unfinished = [r for r in found if r not in runs]
    if not runs:
        raise ValueError(f"{root}: no finished runs (with summary.json) under it; {len(unfinished)} still going")
    runs, rows = zip(*sorted(((r, run_row(r)) for r in runs), key=lambda pair: _order(pair[1])))
    for run, row in zip(runs, rows):  # paths as seen from the sweep directory, so the summary can move with it
        row["run"] = str(run.relative_to(root))
    by_reward: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_reward[row["reward"]].append(row)
    order = [r for r in REWARD_ORDER if r in by_reward] + sorted(set(by_reward) - set(REWARD_ORDER))
    cols = [
        "greedy_before",
        "greedy_after",
        "sampled_after",
        "steps_first",
        "steps_last",
        "length_first",
        "length_last",
        "success_mean",
        "learned_mean",
        "step_score_mean",
        "orm_score_mean",
        "kl_last",
    ]
    header = (
        "| reward | seeds | held-out greedy before | after | held-out sampled after | steps/resp first | last "
        "| resp length first | last | success reward (mean) | learned reward (mean) | PRM step score (mean) "
        "| ORM score (mean) | KL (last) |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for name in order:
        group = by_reward[name]
        vals = [statistics.fmean([g[c] for g in group]) for c in cols]
        lines.append(f"| {name} | {len(group)} | " + " | ".join(_fmt(v) for v in vals) + " |")
    lines += ["", *_seed_tables(by_reward, order), "", *_run_table(rows)]
    out.mkdir(parents=True, exist_ok=True)
    md = out / "summary.md"
    listing = [f"- {r['reward']} seed {r['seed']}: {r['run']}" for r in rows]
    listing += [f"- unfinished (left out): {r.relative_to(root)}" for r in unfinished]
    atomic_write_text(md, "\n".join(lines) + "\n\nRuns:\n" + "\n".join(listing) + "\n")
    atomic_write_text(out / "summary.json", json.dumps(rows, indent=2))
    return md, _plot(runs, rows, out / "curves.png")


def _run_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per run: its held-out greedy curve at every evaluation and its end state."""
    header = (
        "| reward | seed | held-out greedy at each eval (iteration: value) | held-out sampled (last) "
        "| steps/resp (max over iterations) | KL (last) | critic explained variance (mean) |"
    )
    lines = ["Per run:", "", header, "|" + "---|" * (header.count("|") - 1)]
    for row in rows:
        curve = " / ".join(f"{it}: {_fmt(float(v))}" for it, v in row["greedy_curve"])
        cells = [_fmt(row[c]) for c in ("sampled_after", "steps_max", "kl_last", "explained_variance_mean")]
        lines.append(f"| {row['reward']} | {row['seed']} | {curve} | " + " | ".join(cells) + " |")
    return lines


# (column, label) of the spread table: the quantities the reward options are compared on.
_SPREAD = [
    ("greedy_after", "held-out greedy"),
    ("sampled_after", "held-out sampled"),
    ("steps_last", "steps/resp (last)"),
    ("truncated_last", "truncated (last)"),
    ("kl_last", "KL (last)"),
    ("explained_variance_mean", "critic explained variance (mean)"),
]


def _seed_tables(by_reward: dict[str, list[dict[str, Any]]], order: list[str]) -> list[str]:
    """Mean ± std over seeds per option, and each option's paired difference from success-only (same
    seed: same warm-up, same prompts) with its 95% t interval."""
    header = "| reward | seeds | " + " | ".join(label for _, label in _SPREAD) + " |"
    lines = ["Over seeds (mean ± sample std):", "", header, "|" + "---|" * (header.count("|") - 1)]
    for name in order:
        cells = []
        for col, _ in _SPREAD:
            mean, std = mean_std([g[col] for g in by_reward[name]])
            cells.append(f"{_fmt(mean)} ± {_fmt(std)}")
        lines.append(f"| {name} | {len(by_reward[name])} | " + " | ".join(cells) + " |")
    if "success" not in by_reward:
        return lines
    paired = [("greedy_after", "held-out greedy"), ("sampled_after", "held-out sampled")]
    header = "| reward | pairs | " + " | ".join(f"{label} − success-only [95% interval]" for _, label in paired) + " |"
    lines += ["", "Paired difference from success-only (per seed):", "", header, "|" + "---|" * (header.count("|") - 1)]
    base = {col: {g["seed"]: g[col] for g in by_reward["success"]} for col, _ in paired}
    for name in [n for n in order if n != "success"]:
        cells, num_pairs = [], 0
        for col, _ in paired:
            diff, half, num_pairs = paired_interval({g["seed"]: g[col] for g in by_reward[name]}, base[col])
            cells.append(f"{diff:+.3f} [{diff - half:+.3f}, {diff + half:+.3f}]" if half == half else f"{diff:+.3f}")
        lines.append(f"| {name} | {num_pairs} | " + " | ".join(cells) + " |")
    return lines


# One colour per reward option, far apart and colour-blind safe (Okabe and Ito's palette); success-only black.
OPTION_COLOURS = {
    "success": "#000000",
    "orm": "#E69F00",
    "prm": "#D55E00",
    "prm_clip": "#0072B2",
    "prm_delta": "#009E73",
    "prm_clip_delta": "#CC79A7",
    "prm_alpha_matched": "#56B4E9",
    "prm_clip_delta_matched": "#F0E442",
}
SWEEP_CURVES = [c for c in CURVES if c.key not in ("actor/entropy", "critic/loss")]
"""The sweep picture's panels: what the reward options are compared on (``trainer.metrics.CURVES``)."""


def _plot(runs: list[Path], rows: list[dict[str, Any]], path: Path) -> Path:
    """One colour per reward option: each seed's own curve thin, the mean over seeds thick; one legend below
    the panels says which is which. Panels a sweep has nothing for are left out."""
    from matplotlib.lines import Line2D

    by_reward: dict[str, list[list[dict[str, Any]]]] = defaultdict(list)
    for run, row in zip(runs, rows):
        by_reward[row["reward"]].append(read_metrics(run))
    order = [r for r in REWARD_ORDER if r in by_reward] + sorted(set(by_reward) - set(REWARD_ORDER))
    curves = drawn(SWEEP_CURVES, [m for runs_of in by_reward.values() for metrics in runs_of for m in metrics])
    fig, axes = panel_grid(len(curves), size=(4.6, 3.3))
    for ax, curve in zip(axes, curves):
        for reward in order:
            _draw_option(ax, curve.key, by_reward[reward], OPTION_COLOURS.get(reward, "gray"))
        ax.set_title(curve.title, fontsize=10)
        ax.set_xlabel("iteration")
        ax.set_ylabel(curve.ylabel, fontsize=8)
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=OPTION_COLOURS.get(r, "gray"), linewidth=2.5, label=r) for r in order]
    handles += [
        Line2D([], [], color="gray", linewidth=2.5, label="thick: mean over seeds"),
        Line2D([], [], color="gray", linewidth=0.8, alpha=0.5, label="thin: one seed"),
    ]
    fig.suptitle(_headline(rows, order), fontsize=12)
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return atomic_save_figure(fig, path, dpi=90)


def _headline(rows: Sequence[dict[str, Any]], order: list[str]) -> str:
    """What the sweep shows in one line: its shape, and where held-out greedy success ended (mean over seeds).

    Worked example: one option, success, 5 seeds of 20 iterations going 0.435 -> 0.653 on average ->
    "success, 5 seeds, 20 iterations: held-out greedy success 0.435 -> 0.653 (mean over seeds)".
    """
    num_seeds = sorted({sum(r["reward"] == o for r in rows) for o in order})
    seeds = f"{'/'.join(map(str, num_seeds))} seed{'s' if num_seeds != [1] else ''}"
    shape = f"{seeds}, {max(r['iterations'] for r in rows)} iterations"
    mean = {o: statistics.fmean(r["greedy_after"] for r in rows if r["reward"] == o) for o in order}
    if len(order) == 1:
        before = statistics.fmean(r["greedy_before"] for r in rows)
        return f"{order[0]}, {shape}: held-out greedy success {before:.3f} -> {mean[order[0]]:.3f} (mean over seeds)"
    best, worst = max(order, key=mean.__getitem__), min(order, key=mean.__getitem__)
    return (
        f"{len(order)} reward options, {shape} each: final held-out greedy success (mean over seeds) highest "
        f"with {best} ({mean[best]:.3f}), lowest with {worst} ({mean[worst]:.3f})"
    )


def _draw_option(ax: Any, key: str, runs_of: list[list[dict[str, Any]]], colour: str) -> None:
    """One option's curves of ``key`` on ``ax``: each seed thin (when there are several), their mean thick
    over the iterations every seed logged."""
    curves = [{m["iteration"]: m[key] for m in metrics if key in m} for metrics in runs_of]
    if len(curves) > 1:
        for curve in curves:
            ax.plot(list(curve), list(curve.values()), color=colour, alpha=0.3, linewidth=0.8)
    shared = sorted(set.intersection(*(set(c) for c in curves)))
    if shared:
        mean = [statistics.fmean(c[i] for c in curves) for i in shared]
        ax.plot(shared, mean, color=colour, linewidth=2.0, marker="o", markersize=2.5)


def main(argv: list[str] | None = None) -> None:
    ap = ArgumentParser(prog="python -m trainer.summarize", description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="a Hydra multirun directory (or any folder of run directories)")
    ap.add_argument("--out", type=Path, default=None, help="where to write summary.md/curves.png (default: root)")
    ap.add_argument(
        "--export",
        action="store_true",
        help="copy the finished runs compactly to OUT/runs/ and summarize the copies (needs --out)",
    )
    args = ap.parse_args(argv)
    root = args.root
    if not root.is_dir():
        fail(f"{root}: no such directory")
    if args.export:
        if args.out is None:
            fail("--export needs --out (where the copies and the summary go)")
        if not any((r / "summary.json").exists() for r in find_runs(root)):
            fail(f"{root}: no finished runs (with summary.json) under it to export")
        copies = export_runs(args.root, args.out / "runs")
        print(f"exported {len(copies)} runs to {args.out / 'runs'}")
        root = args.out / "runs"
    try:
        md, png = write_summary(root, args.out or root)
    except (ValueError, OSError) as e:  # a run directory it cannot read (malformed JSON): name it, no traceback
        fail(f"{e}")
    print(md.read_text())
    print(f"wrote {md} and {png}")


if __name__ == "__main__":
    main()
