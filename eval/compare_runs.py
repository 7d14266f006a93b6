"""Compare evaluation runs: ``python -m eval.compare_runs RUN_DIR... [--out DIR]``.

Writes ``comparison.md`` (one row per run: accuracy with its 95% CI, pass@k / maj@k at the largest
k, lengths, wall time; plus a per-subject table when runs have one) and ``comparison.png``
(accuracy with CI error bars; pass@k curves when runs sampled), then prints the output directory
as the last line. A directory without ``summary.json`` is searched one level down, so a sweep's
parent directory can be passed as is.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from common.cli import ArgumentParser, fail
from common.files import atomic_save_figure, atomic_write_text
from eval.metrics import format_ci
from eval.report import SUMMARY_FILE, load_summary


def find_runs(paths: list[str]) -> list[Path]:
    runs: list[Path] = []
    for p in map(Path, paths):
        if (p / SUMMARY_FILE).exists():
            runs.append(p)
        elif p.is_dir() and (children := sorted(c.parent for c in p.glob(f"*/{SUMMARY_FILE}"))):
            runs.extend(children)
        else:
            raise ValueError(f"{p}: no {SUMMARY_FILE} here or one level down (not an evaluation run directory)")
    if not runs:
        raise ValueError("no run directories given")
    return runs


def _largest(stats: dict[str, Any] | None) -> tuple[str, dict[str, Any]] | None:
    if not stats:
        return None
    k = max(stats, key=int)
    return k, stats[k]


def _label(run_dir: Path, summary: dict[str, Any]) -> str:
    """A run's short name: its directory name (unique within a sweep)."""
    return run_dir.name


def comparison_table(runs: list[tuple[Path, dict[str, Any]]]) -> str:
    lines = [
        "| run | model | dataset | problems | samples | prompt | accuracy % [95% CI] | pass@k % | maj@k % | mean tokens | truncated % | wall s |",
        "| --- | --- | --- | ---: | --- | --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    for run_dir, s in runs:
        run, settings = s.get("run", {}), s.get("settings", {})
        sampling = (
            "greedy"
            if settings.get("temperature", 0) <= 0
            else f"n={s['num_samples_per_problem']}, T={settings['temperature']}"
        )
        cells = []
        for kind in ("pass@k", "maj@k"):
            best = _largest(s.get(kind))
            cells.append(f"{kind.replace('k', best[0])}: {format_ci(best[1])}" if best else "")
        wall = run.get("wall_seconds")
        lines.append(
            f"| {_label(run_dir, s)} | {run.get('model', '?')} | {run.get('dataset', '?')} | {s['num_problems']} | {sampling} | "
            f"{settings.get('template', {}).get('name', '?')} | {format_ci(s['accuracy'])} | {cells[0]} | {cells[1]} | "
            f"{s['length']['mean']:.0f} | {100 * s['truncated_fraction']:.1f} | {'' if wall is None else f'{wall:.0f}'} |"
        )
    return "\n".join(lines)


def subject_table(runs: list[tuple[Path, dict[str, Any]]], key: str = "by_subject") -> str | None:
    """Accuracy per subject (rows) and run (columns), for the runs that have subjects."""
    having = [(d, s) for d, s in runs if key in s]
    if not having:
        return None
    groups = sorted({g for _, s in having for g in s[key]})
    title = key.removeprefix("by_")
    lines = [
        f"| {title} | " + " | ".join(_label(d, s) for d, s in having) + " |",
        "| --- | " + " | ".join("---:" for _ in having) + " |",
    ]
    for g in groups:
        row = [f"{100 * s[key][g]['mean']:.1f} ({s[key][g]['num']})" if g in s[key] else "" for _, s in having]
        lines.append(f"| {g} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def plot(runs: list[tuple[Path, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    curves = [(d, s) for d, s in runs if s.get("pass@k")]
    ncols = 2 if curves else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6.5 * ncols, 0.5 * len(runs) + 2.5), squeeze=False)
    ax = axes[0][0]
    labels = [_label(d, s) for d, s in runs]
    means = [100 * s["accuracy"]["mean"] for _, s in runs]
    lo = [m - 100 * s["accuracy"]["ci_low"] for m, (_, s) in zip(means, runs)]
    hi = [100 * s["accuracy"]["ci_high"] - m for m, (_, s) in zip(means, runs)]
    y = list(range(len(runs)))
    ax.barh(y, means, xerr=[lo, hi], capsize=4, color="#4C72B0")
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("accuracy % (95% CI)")
    ax.set_xlim(0, max(100.0, max(m + h for m, h in zip(means, hi)) if means else 100.0))
    ax.grid(axis="x", alpha=0.3)
    if curves:
        ax2 = axes[0][1]
        for d, s in curves:
            ks = sorted(s["pass@k"], key=int)
            ax2.plot(
                [int(k) for k in ks],
                [100 * s["pass@k"][k]["mean"] for k in ks],
                marker="o",
                label=f"{_label(d, s)} pass@k",
            )
            if s.get("maj@k"):
                mk = sorted(s["maj@k"], key=int)
                ax2.plot(
                    [int(k) for k in mk],
                    [100 * s["maj@k"][k]["mean"] for k in mk],
                    marker="x",
                    linestyle="--",
                    label=f"{_label(d, s)} maj@k",
                )
        ax2.set_xscale("log", base=2)
        ax2.set_xlabel("k (samples)")
        ax2.set_ylabel("%")
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=7)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=120)


def compare(run_dirs: list[str], out_dir: Path) -> Path:
    runs = [(d, load_summary(d)) for d in find_runs(run_dirs)]
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = ["# Evaluation comparison", "", comparison_table(runs), ""]
    if (subjects := subject_table(runs)) is not None:
        parts += ["## Accuracy % by subject (problems)", "", subjects, ""]
    if (levels := subject_table(runs, "by_level")) is not None:
        parts += ["## Accuracy % by level (problems)", "", levels, ""]
    parts += ["## Runs", ""] + [f"- `{d.name}`: `{d}`" for d, _ in runs] + ["", "![comparison](comparison.png)", ""]
    atomic_write_text(out_dir / "comparison.md", "\n".join(parts))
    plot(runs, out_dir / "comparison.png")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m eval.compare_runs", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="evaluation run directories (or their parent directories)")
    parser.add_argument("--out", default="", help="output directory (default: outputs/eval/compare-<time>)")
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else Path("outputs") / "eval" / f"compare-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    try:
        out = compare(args.runs, out)  # reads every summary before it writes anything
    except ValueError as e:
        fail(str(e))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
