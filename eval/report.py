"""Run directory files: ``summary.json`` and ``report.md`` (``samples.jsonl`` is written by evaluate).

Every file is written atomically (``common.files``), so a killed run never leaves a half-written
summary or report behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.files import atomic_write_json, atomic_write_text
from eval.metrics import format_ci

SAMPLES_FILE = "samples.jsonl"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
CONFIG_FILE = "config.json"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _metric_rows(summary: dict[str, Any]) -> list[str]:
    n = summary["num_samples_per_problem"]
    greedy = summary.get("settings", {}).get("temperature", 0.0) <= 0
    name = "greedy accuracy" if greedy and n == 1 else f"sampling accuracy (mean of {n})"
    rows = [(name, summary["accuracy"])]
    for kind in ("pass@k", "maj@k"):
        for k, stat in summary.get(kind, {}).items():
            rows.append((kind.replace("k", k), stat))
    return [f"| {label} | {format_ci(s)} | {s['ci_method']} |" for label, s in rows]


def _grader_rows(graders: dict[str, Any], primary: str) -> list[str]:
    """Each grader's accuracy over all samples, and how often they agree (eval.evaluate.grader_agreement)."""
    names = graders["names"]
    lines = [
        "### Graders",
        "",
        f"`correct` above is {primary}'s verdict; every sample was also graded by "
        + ", ".join(n for n in names if n != primary)
        + ".",
        "",
        "| grader | accuracy % |",
        "| --- | ---: |",
    ]
    lines += [f"| {n} | {_pct(graders['accuracy'][n])} |" for n in names]
    lines += ["", f"Same verdict on {_pct(graders['agreement'])}% of {graders['num_samples']} samples"]
    if len(names) == 2:
        a, b = names
        lines[-1] += f" (correct only for {a}: {graders[f'{a}_only']}, only for {b}: {graders[f'{b}_only']})"
    lines[-1] += "."
    return lines + [""]


def _group_table(title: str, groups: dict[str, dict[str, Any]]) -> list[str]:
    lines = [f"### By {title}", "", f"| {title} | problems | accuracy % [95% CI] |", "| --- | ---: | --- |"]
    lines += [f"| {k} | {g['num']} | {format_ci(g)} |" for k, g in groups.items()]
    return lines + [""]


def render_markdown(summary: dict[str, Any], records: list[dict[str, Any]], num_examples: int = 3) -> str:
    run = summary.get("run", {})
    settings = summary.get("settings", {})
    template = settings.get("template", {})
    lines = [f"# Evaluation: {run.get('model', '?')} on {run.get('dataset', '?')}", ""]
    lines += ["| | |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in _run_info(summary)] + [""]

    lines += ["## Results", "", "| metric | % [95% CI] | CI method |", "| --- | --- | --- |"]
    lines += _metric_rows(summary) + [""]
    if "graders" in summary:
        lines += _grader_rows(summary["graders"], settings.get("grader", "realm"))
    for key, title in (("by_subject", "subject"), ("by_level", "level")):
        if key in summary:
            lines += _group_table(title, summary[key])
    length = summary["length"]
    lines += [
        "## Responses",
        "",
        f"Length in tokens: mean {length['mean']:.0f}, median {length['median']:.0f}, p90 {length['p90']:.0f}, "
        f"max {length['max']:.0f}. Cut off at max new tokens: {_pct(summary['truncated_fraction'])}%. "
        f"No extractable answer: {_pct(summary['no_answer_fraction'])}%.",
        "",
    ]
    lines += _prompt_section(template, run.get("prompt_example"))
    if records and num_examples:
        lines += _examples(records[:num_examples])
    return "\n".join(lines)


def _run_info(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    """The report's header table: what was evaluated, on what, how, and with which engine."""
    run = summary.get("run", {})
    settings = summary.get("settings", {})
    subset = f" (fixed-seed subset: limit={run['limit']}, seed={run.get('data_seed', 0)})" if run.get("limit") else ""
    sampling = (
        "greedy"
        if settings.get("temperature", 0) <= 0
        else f"n={settings.get('num_samples')}, temperature={settings.get('temperature')}, "
        f"top_p={settings.get('top_p')}, seed={settings.get('seed')}"
    )
    info = [
        ("model", f"{run.get('model', '?')} (`{run.get('model_dir', '?')}`)"),
        ("dataset", f"{run.get('dataset', '?')}: {summary['num_problems']} problems{subset}"),
        ("sampling", sampling),
        ("max new tokens", settings.get("max_new_tokens")),
        ("prompt", f"`{settings.get('template', {}).get('name', '?')}`"),
        ("wall time", f"{run['wall_seconds']:.0f} s" if "wall_seconds" in run else "?"),
    ]
    if "engine" in run:
        e = run["engine"]
        info.append(
            ("engine", f"vLLM {e.get('vllm_version', '')} on {e.get('device', '?')}, dtype {e.get('dtype', '?')}")
        )
    return info


def _prompt_section(template: dict[str, Any], prompt_example: str | None) -> list[str]:
    """The template's settings, then the exact prompt text (or, for older runs, its system and user parts)."""
    fewshot_ids = template.get("fewshot_ids")
    lines = [
        "## Prompt template",
        "",
        f"`{template.get('name')}`: chat={template.get('chat')}, stop={template.get('stop')}, "
        f"{len(template.get('fewshot', []))} few-shot exemplars"
        + (f" (ids {', '.join(fewshot_ids)})" if fewshot_ids else "")
        + ".",
        "",
    ]
    if prompt_example:
        return lines + [
            "Exact prompt text, `{question}` standing for the problem:",
            "",
            "````text",
            prompt_example,
            "````",
            "",
        ]
    return lines + [f"system: `{template.get('system', '')}`", "", f"user: `{template.get('user', '')}`", ""]


def _examples(records: list[dict[str, Any]]) -> list[str]:
    """The first graded samples, each response cut at 800 characters."""
    lines = ["## Examples", ""]
    for r in records:
        response = r["response"] if len(r["response"]) <= 800 else r["response"][:800] + " [...]"
        lines += [
            f"**{r['id']}** (sample {r['sample_index']}): extracted `{r['extracted']}`, gold `{r['gold']}`, "
            f"{'correct' if r['correct'] else 'incorrect'} ({r['reason']})",
            "",
            "````text",
            response,
            "````",
            "",
        ]
    return lines


def write_report(run_dir: Path, summary: dict[str, Any], records: list[dict[str, Any]]) -> Path:
    """Write ``summary.json`` and ``report.md`` into ``run_dir``; returns ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / SUMMARY_FILE, summary)
    atomic_write_text(run_dir / REPORT_FILE, render_markdown(summary, records))
    return run_dir


def load_summary(run_dir: Path) -> dict[str, Any]:
    """An evaluation run's summary.json; ValueError naming the file when there is none, or when it is
    another kind of summary (a training run writes a summary.json too)."""
    path = Path(run_dir) / SUMMARY_FILE
    if not path.exists():
        raise ValueError(f"{run_dir}: no {SUMMARY_FILE} (not an evaluation run directory, or the run did not finish)")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(summary, dict) or not {"accuracy", "num_problems", "length"} <= set(summary):
        hint = (
            " (a training run: evaluate its policy with python -m eval model=RUN_DIR)"
            if "heldout_after" in summary
            else ""
        )
        raise ValueError(f"{path}: not an evaluation summary (no accuracy, num_problems, length){hint}")
    return summary


# ---- The reward paper's table (scripts/reproduce_reward_paper.sh) -------------------------------------

REWARD_ROWS = (
    ("base", "(base model, no RL)"),
    ("success", "Success reward (SR) only"),
    ("orm", "SR + OR"),
    ("prm", "SR + PR"),
    ("prm_clip", "SR + PR-Clip"),
    ("prm_delta", "SR + PR-Delta"),
    ("prm_clip_delta", "SR + PR-Clip-Delta"),
)
"""(reward option, the paper's row name), in the paper's order."""
BENCHMARK_NAMES = {"math500": "MATH-500", "math": "MATH", "gsm8k": "GSM8K", "synthetic": "synthetic"}
PAPER_BENCHMARK = {"math500": "MATH", "math": "MATH", "gsm8k": "GSM8K"}
PAPER_GREEDY: dict[str, dict[str, Any]] = {  # size -> {"model": name, benchmark: {reward option: %}}
    # Greedy accuracy (%) as shared/reference/reward-paper.md gives it (Tables B and C, from third-party
    # summaries of the full text, not checked against the PDF). Only the base model and SR + PR-Clip-Delta
    # are reported for the Qwen2.5-Math models.
    "1.5b": {"model": "Qwen2.5-Math-1.5B-Instruct", "MATH": {"base": 76.00, "prm_clip_delta": 76.78}, "GSM8K": {}},
    "7b": {
        "model": "Qwen2.5-Math-7B-Instruct",
        "MATH": {"base": 83.30, "prm_clip_delta": 83.38},
        "GSM8K": {"base": 95.60, "prm_clip_delta": 95.60},
    },
}
PAPER_ABLATION_MATH = {
    "base": 24.90,
    "success": 30.58,
    "orm": 30.57,
    "prm": 11.16,
    "prm_clip": 30.30,
    "prm_delta": 30.68,
    "prm_clip_delta": 31.44,
}
"""The paper's six-option ablation (Table A): Qwen2-1.5B-Instruct, MATH greedy accuracy (%)."""


def _cell(summary: dict[str, Any] | None, grader: str) -> str:
    if summary is None:
        return "—"
    if grader == "primary":
        return f"{100 * summary['accuracy']['mean']:.2f}"
    graders = summary.get("graders")
    return f"{100 * graders['accuracy'][grader]:.2f}" if graders and grader in graders["accuracy"] else "—"


def reward_paper_table(sweep_dir: Path, size: str, seed: int, benchmarks: list[str]) -> str:
    """The markdown table: greedy accuracy per benchmark per reward option, ours beside the paper's.

    Reads ``<sweep>/<reward>/seed<seed>/eval/<benchmark>/summary.json`` and ``<sweep>/base/eval/...``
    (scripts/reproduce_reward_paper.sh writes them); a missing evaluation is shown as "—".
    """
    paper = PAPER_GREEDY.get(size, {})
    header = ["RL reward"]
    for b in benchmarks:
        name = BENCHMARK_NAMES.get(b, b)
        header += [f"{name} greedy (realm)", f"{name} (math-verify)"]
        if PAPER_BENCHMARK.get(b) and paper:
            header.append(f"paper {PAPER_BENCHMARK[b]}")
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    num_problems: dict[str, int] = {}
    for reward, label in REWARD_ROWS:
        run = sweep_dir / "base" if reward == "base" else sweep_dir / reward / f"seed{seed}"
        row = [label]
        for b in benchmarks:
            path = run / "eval" / b / SUMMARY_FILE
            summary = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
            if summary is not None:
                num_problems[b] = summary["num_problems"]
            row += [_cell(summary, "primary"), _cell(summary, "math_verify")]
            if PAPER_BENCHMARK.get(b) and paper:
                value = paper[PAPER_BENCHMARK[b]].get(reward)
                row.append(f"{value:.2f}" if value is not None else "—")
        lines.append("| " + " | ".join(row) + " |")
    model = paper.get("model", f"the `{size}` policy")
    notes = [
        "",
        f"Greedy accuracy (%), one run per option (seed {seed}), {model}; problems per benchmark: "
        + ", ".join(f"{BENCHMARK_NAMES.get(b, b)} {n}" for b, n in num_problems.items())
        + ".",
        "realm: the project's grader (mathtask/grade.py); math-verify: the same responses graded by math-verify.",
        "Paper: Gao et al. 2024 (arXiv 2410.15115), which reports only the base model and SR + PR-Clip-Delta for "
        "Qwen2.5-Math; its MATH split is not stated (ours: MATH-500). Its six-option ablation on "
        "Qwen2-1.5B-Instruct (MATH greedy): "
        + ", ".join(f"{dict(REWARD_ROWS)[k]} {v:.2f}" for k, v in PAPER_ABLATION_MATH.items())
        + ".",
    ]
    return "\n".join(lines + notes) + "\n"


def _main(argv: list[str] | None = None) -> int:
    from common.cli import ArgumentParser, fail

    parser = ArgumentParser(prog="python -m eval.report")
    sub = parser.add_subparsers(dest="command", required=True)
    table = sub.add_parser("reward-paper-table", help="the reward paper's table of a reproduce_reward_paper.sh sweep")
    table.add_argument("sweep_dir", type=Path)
    table.add_argument(
        "--size", required=True, choices=["1.5b", "7b", "tiny"], help="which paper numbers to set beside"
    )
    table.add_argument("--seed", type=int, default=0)
    table.add_argument("--benchmarks", nargs="+", default=["math500", "gsm8k"])
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        fail(f"{args.sweep_dir}: no such directory (the OUT of scripts/reproduce_reward_paper.sh)")
    text = reward_paper_table(args.sweep_dir, args.size, args.seed, args.benchmarks)
    atomic_write_text(args.sweep_dir / "table.md", text)
    print(text, end="")
    print(args.sweep_dir / "table.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
