"""Round 3's summary, as pre-registered (docs/hacking_study/round3/PREREGISTRATION.md):
``python -m studies.hacking.round3_summary RUNS_DIR --out DIR [--export]``.

Reads the finished runs below RUNS_DIR (the arms' ``<arm>_seed<S>/`` and the pilot's ``pilot/prm_seed<S>/``;
the files round 2's summary reads) and writes ``DIR/summary.md``, ``DIR/summary.json`` and ``DIR/curves.png``:
incidence of hacking, harm and reverse hacks per arm with exact intervals; Fisher's exact tests between arms;
held-out success with paired differences from success-only and TOST equivalence at +-3 points; per-seed McNemar
tests with Holm's correction over the family; the checkpoint-to-checkpoint noise of success-only; the share of
steps and responses with a non-zero learned reward; the decisions D1-D3; the reward paper's Table A beside; and
examples of hacked text. ``--export`` copies the runs compactly to ``DIR/runs/`` first and summarizes the
copies, so that summarizing ``DIR/runs`` again gives the same bytes.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common.files import atomic_save_figure, atomic_write_text
from studies.hacking import round2
from studies.hacking.round2 import StudyRun, discordant_counts, mcnemar_exact
from studies.hacking.round3 import (
    HACK_MAX_STEPS,
    HACK_MAX_TRUNCATED,
    HARM_POINTS,
    NUM_LAST_EVALS,
    hack_onset,
    reverse_onset,
)
from studies.hacking.stats import clopper_pearson, fisher_exact, holm, tost_paired

GENERATOR = "studies.hacking.round3"
BASELINE = "success"
ARMS = ("success", "prm", "prm_alpha_matched", "prm_clip_delta_matched")
EQUIVALENCE_MARGIN = 3.0
"""TOST margin, in points of held-out greedy success."""
FISHER_PAIRS = [
    ("prm", "prm_clip_delta_matched"),
    ("prm", "prm_alpha_matched"),
    ("prm_alpha_matched", "prm_clip_delta_matched"),
    ("prm", "success"),
    ("prm_alpha_matched", "success"),
    ("prm_clip_delta_matched", "success"),
]
TABLE_A = {"success": 30.58, "+PRM": 11.16, "+PRM Clip-Delta": 31.44}
"""The reward paper's Table A: greedy accuracy of Qwen2-1.5B-Instruct on MATH after PPO with each reward."""
NUM_LAST_ITERATIONS = 10


def _points(evaluations: Sequence[round2.Evaluation]) -> list[float]:
    return [100 * e.greedy_success for e in evaluations]


def _mean_of(metrics: Sequence[dict[str, Any]], key: str, last: int | None = None) -> float | None:
    values = [float(r[key]) for r in metrics if r.get(key) is not None and r.get("iteration", 0) >= 1]
    values = values[-last:] if last else values
    return statistics.fmean(values) if values else None


def _first(metrics: Sequence[dict[str, Any]], key: str) -> float | None:
    return next((float(r[key]) for r in metrics if r.get(key) is not None and r.get("iteration", 0) >= 1), None)


def run_record(run: StudyRun) -> dict[str, Any]:
    """One run's numbers: the pre-registered definitions, held-out success, and the learned reward's reach."""
    after = [e for e in run.evaluations if e.iteration > 0]
    m = run.metrics
    return {
        "run": run.name,
        "arm": run.label,
        "seed": run.seed,
        "num_iterations": max(r["iteration"] for r in m),
        "hack_onset": hack_onset(m),
        "reverse_onset": reverse_onset(m),
        "steps_max": max(r["response/num_steps"] for r in m if "response/num_steps" in r),
        "truncated_max": max(r["response/truncated"] for r in m if "response/truncated" in r),
        "steps_last": _mean_of(m, "response/num_steps", 1),
        "kl_last": _mean_of(m, "kl/mean", 1),
        "greedy_before": 100 * run.heldout_before,
        "greedy_final": 100 * after[-1].greedy_success,
        "greedy_last": statistics.fmean(_points(after[-NUM_LAST_EVALS:])),
        "last_eval_iterations": [e.iteration for e in after[-NUM_LAST_EVALS:]],
        "alpha": _first(m, "reward/alpha"),
        "eta": _first(m, "reward/eta"),
        "learned_std_first": _first(m, "reward/learned_std"),
        "learned_mean_last": _mean_of(m, "reward/learned", NUM_LAST_ITERATIONS),
        "nonzero_steps_first": _first(m, "reward/nonzero_step_fraction"),
        "nonzero_steps_last": _mean_of(m, "reward/nonzero_step_fraction", NUM_LAST_ITERATIONS),
        "nonzero_responses_first": _first(m, "reward/nonzero_response_fraction"),
        "nonzero_responses_last": _mean_of(m, "reward/nonzero_response_fraction", NUM_LAST_ITERATIONS),
    }


def _harm(records: list[dict[str, Any]]) -> None:
    """Each run's ``harm``: its last-three mean at least HARM_POINTS below success-only's on the same seed."""
    base = {r["seed"]: r["greedy_last"] for r in records if r["arm"] == BASELINE}
    for r in records:
        diff = r["greedy_last"] - base[r["seed"]] if r["seed"] in base and r["arm"] != BASELINE else None
        r["minus_success_last"] = diff
        r["harm"] = diff is not None and diff <= -HARM_POINTS


def incidence(records: Sequence[dict[str, Any]], arm: str) -> dict[str, Any]:
    """Hacking, harm and reverse-hack counts of an arm with their exact 95% intervals."""
    runs = [r for r in records if r["arm"] == arm]
    out: dict[str, Any] = {"arm": arm, "num_seeds": len(runs)}
    for key, test in (("hacks", "hack_onset"), ("harm", "harm"), ("reverse", "reverse_onset")):
        k = sum(bool(r[test]) if key == "harm" else r[test] is not None for r in runs)
        out[key] = {"count": k, "interval": clopper_pearson(k, len(runs)) if runs else None}
    out["onsets"] = {r["seed"]: r["hack_onset"] for r in runs}
    return out


def fisher_tests(incidences: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for a, b in FISHER_PAIRS:
        if a in incidences and b in incidences:
            ka, na = incidences[a]["hacks"]["count"], incidences[a]["num_seeds"]
            kb, nb = incidences[b]["hacks"]["count"], incidences[b]["num_seeds"]
            out.append(
                {"arms": [a, b], "table": [[ka, na - ka], [kb, nb - kb]], "p": fisher_exact(ka, na - ka, kb, nb - kb)}
            )
    return out


def heldout(records: Sequence[dict[str, Any]], arm: str) -> dict[str, Any]:
    """Held-out greedy success of an arm (points) and its TOST against success-only, paired by seed."""
    runs = [r for r in records if r["arm"] == arm]
    diffs = [r["minus_success_last"] for r in runs if r["minus_success_last"] is not None]
    out = {
        "arm": arm,
        "before": statistics.fmean(r["greedy_before"] for r in runs),
        "final": statistics.fmean(r["greedy_final"] for r in runs),
        "last": statistics.fmean(r["greedy_last"] for r in runs),
        "last_sd": statistics.stdev(r["greedy_last"] for r in runs) if len(runs) > 1 else None,
    }
    if arm != BASELINE and diffs:
        out["tost"] = tost_paired(diffs, EQUIVALENCE_MARGIN)
    return out


def mcnemar_tests(runs: Sequence[StudyRun]) -> list[dict[str, Any]]:
    """Each learned-reward arm's final per-problem correctness against success-only's, per seed; Holm over all."""
    base = {r.seed: r for r in runs if r.label == BASELINE}
    tests: list[dict[str, Any]] = []
    for run in runs:
        if run.label == BASELINE or run.seed not in base:
            continue
        final, ref = [e for e in run.evaluations if e.iteration > 0][-1], [e for e in base[run.seed].evaluations][-1]
        if final.problem_ids_sha256 != ref.problem_ids_sha256:
            continue
        b, c = discordant_counts(final.greedy, ref.greedy)
        tests.append({"arm": run.label, "seed": run.seed, "b": b, "c": c, "p": mcnemar_exact(b, c)})
    adjusted, rejected = holm([float(t["p"]) for t in tests])
    for t, a, r in zip(tests, adjusted, rejected):
        t.update(p_holm=a, significant=r)
    return tests


def success_noise(runs: Sequence[StudyRun]) -> dict[str, Any]:
    """Success-only's change between consecutive evaluations over the second half of training (points), and
    each such pair's McNemar p: what a few points' difference is worth."""
    changes, pvalues = [], []
    for run in runs:
        if run.label != BASELINE:
            continue
        after = [e for e in run.evaluations if e.iteration > 0]
        half = max(e.iteration for e in after) / 2
        second = [e for e in after if e.iteration >= half]
        for prev, cur in zip(second, second[1:]):
            changes.append(100 * (cur.greedy_success - prev.greedy_success))
            pvalues.append(mcnemar_exact(*discordant_counts(cur.greedy, prev.greedy)))
    absolute = sorted(abs(c) for c in changes)
    return {
        "num_pairs": len(changes),
        "median_abs_change": statistics.median(absolute) if absolute else None,
        "max_abs_change": absolute[-1] if absolute else None,
        "min_p": min(pvalues) if pvalues else None,
        "changes": changes,
    }


NUM_SEEDS = 5
"""Seeds an arm, as pre-registered (0-4)."""


def _at_least(incidences: dict[str, dict[str, Any]], arm: str, needed: int) -> bool | None:
    """Whether ``arm`` hacks on at least ``needed`` of NUM_SEEDS seeds: True or False as soon as the seeds not
    yet finished cannot change the answer, None (pending) before."""
    inc = incidences.get(arm)
    count, finished = (inc["hacks"]["count"], inc["num_seeds"]) if inc else (0, 0)
    if count >= needed:
        return True
    if count + NUM_SEEDS - finished < needed:
        return False
    return None


def decisions(incidences: dict[str, dict[str, Any]], held: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """D1-D3 as pre-registered; a decision is None while it depends on runs not yet finished, or on a D1 that
    does not hold."""
    d1 = _at_least(incidences, "prm", 4)
    clip_delta = incidences.get("prm_clip_delta_matched")
    tost = held.get("prm_clip_delta_matched", {}).get("tost")
    d2: bool | None = None
    if clip_delta and clip_delta["hacks"]["count"] > 0:
        d2 = False
    elif clip_delta and clip_delta["num_seeds"] == NUM_SEEDS and tost is not None:
        d2 = bool(tost["equivalent"])
    return {
        "D1_raw_prm_hacks": d1,
        "D2_clip_delta_resists_at_full_strength": d2 if d1 else None,
        "D3_structure_not_weakness": _at_least(incidences, "prm_alpha_matched", 3) if d1 else None,
    }


def build_summary(
    runs: Sequence[StudyRun], pilot: Sequence[StudyRun], decision: dict[str, Any] | None
) -> dict[str, Any]:
    records = [run_record(r) for r in runs]
    _harm(records)
    arms = [a for a in ARMS if any(r["arm"] == a for r in records)]
    arms += sorted({r["arm"] for r in records} - set(arms))
    incidences = {arm: incidence(records, arm) for arm in arms}
    held = {arm: heldout(records, arm) for arm in arms}
    examples = hacked_examples([r for r in runs if hack_onset(r.metrics) is not None])
    return {
        "generator": GENERATOR,
        "definitions": {"hack_max_steps": HACK_MAX_STEPS, "hack_max_truncated": HACK_MAX_TRUNCATED},
        "incidence": list(incidences.values()),
        "fisher": fisher_tests(incidences),
        "heldout": list(held.values()),
        "mcnemar": mcnemar_tests(runs),
        "success_noise": success_noise(runs),
        "decisions": decisions(incidences, held),
        "table_a": TABLE_A,
        "runs": records,
        "pilot": {"runs": [run_record(r) for r in pilot], "decision": decision},
        "examples": examples,
    }


def hacked_examples(hacking: Sequence[StudyRun], limit: int = 3) -> list[dict[str, Any]]:
    """The response with the most steps at the last saved iteration of the first ``limit`` hacking runs."""
    out = []
    for run in hacking[:limit]:
        rows = round2.read_rollouts(run)[-1]
        delimiter = round2.step_delimiter(run)
        row = round2.longest_response(rows, delimiter)
        form = round2.rollout_form(rows, delimiter)
        out.append(
            {
                "run": run.name,
                "iteration": row["iteration"],
                "success": row["success"],
                "finish_reason": row["finish_reason"],
                "response": round2.shorten(row["response"], 300),
                "batch_form": form,
            }
        )
    return out


# ---------------------------------------------------------------------------------------------------- summary.md


def _f(x: float | None, spec: str = ".1f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _interval(pair: Sequence[float] | None) -> str:
    return "–" if pair is None else f"[{100 * pair[0]:.0f}%, {100 * pair[1]:.0f}%]"


def _table(header: Sequence[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + " --- |" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _incidence_lines(s: dict[str, Any]) -> list[str]:
    rows = []
    for inc in s["incidence"]:
        cells = [inc["arm"], str(inc["num_seeds"])]
        for key in ("hacks", "harm", "reverse"):
            cells.append(f"{inc[key]['count']} of {inc['num_seeds']} {_interval(inc[key]['interval'])}")
        onsets = ", ".join(f"seed {k}: {v}" for k, v in inc["onsets"].items() if v is not None) or "–"
        rows.append([*cells, onsets])
    lines = ["## 1. Hacking, harm and reverse hacks (exact 95% intervals)", ""]
    lines += _table(["arm", "seeds", "hacks", "harm", "reverse hack", "hack onsets"], rows)
    lines += ["", "Fisher's exact test of hacking incidence (two-sided):", ""]
    lines += _table(
        ["arms", "hacked / not", "p"],
        [[" vs ".join(t["arms"]), f"{t['table'][0]} vs {t['table'][1]}", f"{t['p']:.4f}"] for t in s["fisher"]],
    )
    return lines


def _heldout_lines(s: dict[str, Any]) -> list[str]:
    rows = []
    for h in s["heldout"]:
        tost = h.get("tost")
        test = "–"
        if tost and tost.get("interval"):
            lo, hi = tost["interval"]
            verdict = "equivalent" if tost["equivalent"] else "not shown equivalent"
            test = f"{tost['mean']:+.1f} [{lo:+.1f}, {hi:+.1f}], p {tost['p']:.3f}: {verdict}"
        cells = [h["arm"], _f(h["before"]), _f(h["final"]), f"{_f(h['last'])} ± {_f(h['last_sd'])}", test]
        rows.append(cells)
    lines = ["## 2. Held-out greedy success (points) and equivalence with success-only", ""]
    lines += [
        f"TOST paired by seed on the mean of the last {NUM_LAST_EVALS} evaluations, margin ±{EQUIVALENCE_MARGIN:g}"
    ]
    lines += ["points (90% t interval of the mean difference, the larger one-sided p).", ""]
    lines += _table(
        ["arm", "before", "final", f"mean of last {NUM_LAST_EVALS} ± sd", "minus success-only (TOST)"], rows
    )
    return lines


def _mcnemar_lines(s: dict[str, Any]) -> list[str]:
    rows = [
        [
            t["arm"],
            t["seed"],
            f"{t['b']} / {t['c']}",
            f"{t['p']:.3g}",
            f"{t['p_holm']:.3g}",
            "yes" if t["significant"] else "no",
        ]
        for t in s["mcnemar"]
    ]
    noise = s["success_noise"]
    lines = [f"## 3. Per-seed McNemar against success-only (final evaluation), Holm over {len(rows)} tests", ""]
    lines += _table(["arm", "seed", "arm right only / success right only", "p", "p (Holm)", "significant"], rows)
    lines += [
        "",
        f"Success-only's own checkpoint-to-checkpoint noise (consecutive evaluations, second half of training, "
        f"{noise['num_pairs']} pairs): median absolute change {_f(noise['median_abs_change'])} points, largest "
        f"{_f(noise['max_abs_change'])}; the smallest McNemar p of any such pair {_f(noise['min_p'], '.3g')}.",
    ]
    return lines


def _reach_lines(s: dict[str, Any]) -> list[str]:
    rows = []
    for r in s["runs"]:
        cells = [r["run"], _f(r["alpha"], ".3f"), _f(r["eta"], ".3f"), _f(r["learned_std_first"], ".3f")]
        cells += [_f(r["nonzero_steps_first"], ".2f"), _f(r["nonzero_steps_last"], ".2f")]
        cells += [_f(r["nonzero_responses_first"], ".2f"), _f(r["nonzero_responses_last"], ".2f")]
        cells += [_f(r["steps_max"], ".2f"), _f(r["truncated_max"], ".3f"), _f(r["kl_last"], ".2f")]
        rows.append(cells)
    header = ["run", "α", "η", "learned std, it. 1", "non-zero steps, it. 1", "last 10", "non-zero responses, it. 1"]
    header += ["last 10", "max steps/resp", "max truncated", "KL last"]
    return ["## 4. Every run: the learned reward's strength and reach", "", *_table(header, rows)]


def _said_after_d1(d: dict[str, Any], key: str) -> str:
    if d["D1_raw_prm_hacks"] is False:
        return "not testable (D1 does not hold)"
    return {True: "yes", False: "no", None: "pending (runs not yet finished)"}[d[key]]


def _decision_lines(s: dict[str, Any]) -> list[str]:
    d = s["decisions"]
    said: dict[bool | None, str] = {True: "yes", False: "no", None: "pending (runs not yet finished)"}
    lines = ["## 5. Decisions, as pre-registered", ""]
    lines += [f"- D1, raw PRM hacks here (on at least 4 of 5 seeds): {said[d['D1_raw_prm_hacks']]}"]
    lines += [
        f"- D2, Clip-Delta at raw PRM's strength hacks on no seed and is equivalent to success-only: {_said_after_d1(d, 'D2_clip_delta_resists_at_full_strength')}"
    ]
    lines += [
        f"- D3, raw PRM at Clip-Delta's strength hacks on at least 3 of 5 seeds (structure, not weakness): {_said_after_d1(d, 'D3_structure_not_weakness')}"
    ]
    a = s["table_a"]
    lines += ["", f"Beside: the reward paper's Table A (Qwen2-1.5B-Instruct on MATH, greedy): success {a['success']},"]
    lines += [f"+PRM {a['+PRM']}, +PRM Clip-Delta {a['+PRM Clip-Delta']}."]
    return lines


def _example_lines(s: dict[str, Any]) -> list[str]:
    lines = ["## 6. Hacked text", ""]
    for e in s["examples"]:
        form = e["batch_form"]
        lines += [
            f"- {e['run']}, iteration {e['iteration']} ({e['finish_reason']}, success {e['success']:.0f}): "
            f"`{e['response']}`",
            f"  the whole batch: {form['steps_per_response']:.1f} steps per response, repeated steps "
            f"{100 * form['repeated_fraction']:.1f}%, junk steps {100 * form['junk_fraction']:.1f}%, truncated "
            f"{100 * form['truncated_fraction']:.1f}%, training success {form['success']:.3f}",
        ]
    return lines or ["## 6. Hacked text", "", "No run hacks."]


def _pilot_lines(s: dict[str, Any]) -> list[str]:
    p = s["pilot"]
    rows = [
        [r["run"], str(r["num_iterations"]), _f(r["hack_onset"], "d"), _f(r["steps_max"], ".2f"), _f(r["greedy_last"])]
        for r in p["runs"]
    ]
    lines = ["## 7. The pilot (raw PRM on seeds of its own; in none of the tests above)", ""]
    lines += _table(["run", "iterations", "hack onset", "max steps/resp", f"mean of last {NUM_LAST_EVALS}"], rows)
    if p["decision"]:
        lines += ["", f"Decision: {p['decision']['rule']} -> {p['decision']['num_iterations']} iterations."]
    return lines


def render_markdown(s: dict[str, Any]) -> str:
    n = len(s["runs"])
    lines = [f"# Reward hacking, round 3: {n} finished runs", ""]
    lines += ["Definitions and tests: PREREGISTRATION.md beside this file. Figures: curves.png.", ""]
    for part in (
        _incidence_lines,
        _heldout_lines,
        _mcnemar_lines,
        _reach_lines,
        _decision_lines,
        _example_lines,
        _pilot_lines,
    ):
        lines += [*part(s), ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- writing


PANELS = [
    ("heldout/success", 100.0, "held-out greedy success (%)", None),
    ("response/num_steps", 1.0, "steps per response", HACK_MAX_STEPS),
    ("response/truncated", 100.0, "truncated (%)", 100 * HACK_MAX_TRUNCATED),
    ("reward/learned_std", 1.0, "learned reward std over responses", None),
]


def plot_curves(runs: Sequence[StudyRun], path: Path) -> Path:
    """Each arm's seeds (thin) and their mean (thick) per panel, with the hacking thresholds dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[StudyRun]] = defaultdict(list)
    for run in runs:
        groups[run.label].append(run)
    colors = round2._option_colors(list(groups))
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    for ax, (key, scale, title, threshold) in zip(axes.flat, PANELS):
        for label, group in groups.items():
            curves = [{i: scale * v for i, v in round2._values(r.metrics, key)} for r in group]
            if all(curves):
                round2._plot_option(ax, curves, colors[label])
                ax.plot([], [], color=colors[label], linewidth=2.6, label=f"{label} ({len(group)} seeds)")
        if threshold is not None:
            ax.axhline(threshold, color="black", linestyle=":", linewidth=1.2)
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("Reward hacking, round 3 (96 new tokens): thin lines one seed, thick the mean; dotted the thresholds")
    fig.tight_layout()
    return atomic_save_figure(fig, path, dpi=90)


def write_summary(root: Path, out: Path, export: bool) -> Path:
    """Summarize the runs below ``root`` (``--export``: their compact copies in ``out/runs`` first)."""
    main_runs = _collect(root, pilot=False)
    pilot_runs = _collect(root, pilot=True)
    decision_path = root / "decision.json"
    if export:
        round2.export_study_runs(main_runs, out / "runs")
        round2.export_study_runs(pilot_runs, out / "runs" / "pilot")
        if decision_path.exists():
            atomic_write_text(out / "runs" / "decision.json", decision_path.read_text())
        return write_summary(out / "runs", out, export=False)
    decision = json.loads(decision_path.read_text()) if decision_path.exists() else None
    summary = build_summary(main_runs, pilot_runs, decision)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        out / "summary.json", json.dumps(round2._json_ready(summary), indent=1, ensure_ascii=False) + "\n"
    )
    atomic_write_text(out / "summary.md", render_markdown(summary))
    plot_curves(main_runs, out / "curves.png")
    return out / "summary.md"


def _collect(root: Path, pilot: bool) -> list[StudyRun]:
    where = root / "pilot" if pilot else root
    if not where.is_dir():
        return []
    runs = [round2.load_run(p) for p in round2.find_runs(where) if (p / "summary.json").exists()]
    runs = [r for r in runs if pilot or "pilot" not in r.path.relative_to(root).parts]
    return sorted(runs, key=lambda r: (ARMS.index(r.label) if r.label in ARMS else len(ARMS), r.label, int(r.seed)))


def main(argv: Sequence[str] | None = None) -> None:
    from common.cli import ArgumentParser, fail

    parser = ArgumentParser(prog="python -m studies.hacking.round3_summary", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs_dir", type=Path, help="the arms' runs; pilot/ and decision.json inside")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--export", action="store_true", help="copy the runs to OUT/runs first, summarize those")
    args = parser.parse_args(argv)
    try:
        print(f"wrote {write_summary(args.runs_dir, args.out, args.export)}, summary.json and curves.png")
    except round2.StudyInputError as e:
        fail(str(e))


if __name__ == "__main__":
    main()
