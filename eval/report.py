"""Run directory files: ``summary.json`` and ``report.md`` (``samples.jsonl`` is written by evaluate).

Every file is written atomically (``eval.files``), so a killed run never leaves a half-written
summary or report behind.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eval.files import atomic_write_json, atomic_write_text
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


def _group_table(title: str, groups: dict[str, dict[str, Any]]) -> list[str]:
    lines = [f"### By {title}", "", f"| {title} | problems | accuracy % [95% CI] |", "| --- | ---: | --- |"]
    lines += [f"| {k} | {g['num']} | {format_ci(g)} |" for k, g in groups.items()]
    return lines + [""]


def render_markdown(summary: dict[str, Any], records: list[dict[str, Any]], num_examples: int = 3) -> str:
    run = summary.get("run", {})
    settings = summary.get("settings", {})
    template = settings.get("template", {})
    lines = [f"# Evaluation: {run.get('model', '?')} on {run.get('dataset', '?')}", ""]
    info = [
        ("model", f"{run.get('model', '?')} (`{run.get('model_dir', '?')}`)"),
        ("dataset", f"{run.get('dataset', '?')}: {summary['num_problems']} problems"
                    + (f" (fixed-seed subset: limit={run['limit']}, seed={run.get('data_seed', 0)})" if run.get("limit") else "")),
        ("sampling", "greedy" if settings.get("temperature", 0) <= 0 else
         f"n={settings.get('num_samples')}, temperature={settings.get('temperature')}, top_p={settings.get('top_p')}, seed={settings.get('seed')}"),
        ("max new tokens", settings.get("max_new_tokens")),
        ("prompt", f"`{template.get('name', '?')}`"),
        ("wall time", f"{run['wall_seconds']:.0f} s" if "wall_seconds" in run else "?"),
    ]
    if "engine" in run:
        e = run["engine"]
        info.append(("engine", f"vLLM {e.get('vllm_version', '')} on {e.get('device', '?')}, dtype {e.get('dtype', '?')}"))
    lines += ["| | |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in info] + [""]

    lines += ["## Results", "", "| metric | % [95% CI] | CI method |", "| --- | --- | --- |"]
    lines += _metric_rows(summary) + [""]
    for key, title in (("by_subject", "subject"), ("by_level", "level")):
        if key in summary:
            lines += _group_table(title, summary[key])
    length = summary["length"]
    lines += [
        "## Responses", "",
        f"Length in tokens: mean {length['mean']:.0f}, median {length['median']:.0f}, p90 {length['p90']:.0f}, "
        f"max {length['max']:.0f}. Cut off at max new tokens: {_pct(summary['truncated_fraction'])}%. "
        f"No extractable answer: {_pct(summary['no_answer_fraction'])}%.", "",
    ]

    lines += ["## Prompt template", "",
              f"`{template.get('name')}`: chat={template.get('chat')}, stop={template.get('stop')}, "
              f"{len(template.get('fewshot', []))} few-shot exemplars"
              + (f" (ids {', '.join(template.get('fewshot_ids', []))})" if template.get("fewshot_ids") else "") + ".", ""]
    if run.get("prompt_example"):
        lines += ["Exact prompt text, `{question}` standing for the problem:", "", "````text",
                  run["prompt_example"], "````", ""]
    else:
        lines += [f"system: `{template.get('system', '')}`", "", f"user: `{template.get('user', '')}`", ""]

    if records and num_examples:
        lines += ["## Examples", ""]
        for r in records[:num_examples]:
            response = r["response"] if len(r["response"]) <= 800 else r["response"][:800] + " [...]"
            lines += [f"**{r['id']}** (sample {r['sample_index']}): extracted `{r['extracted']}`, gold `{r['gold']}`, "
                      f"{'correct' if r['correct'] else 'incorrect'} ({r['reason']})", "", "````text", response, "````", ""]
    return "\n".join(lines)


def write_report(run_dir: Path, summary: dict[str, Any], records: list[dict[str, Any]]) -> Path:
    """Write ``summary.json`` and ``report.md`` into ``run_dir``; returns ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / SUMMARY_FILE, summary)
    atomic_write_text(run_dir / REPORT_FILE, render_markdown(summary, records))
    return run_dir


def load_summary(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / SUMMARY_FILE
    if not path.exists():
        raise FileNotFoundError(f"{run_dir}: no {SUMMARY_FILE} (not an evaluation run directory, or the run did not finish)")
    return json.loads(path.read_text(encoding="utf-8"))
