"""Best-of-N with a reward model: the inference-time use of an ORM / PRM.

Given an evaluation run that sampled n responses per problem (``python -m eval ... num_samples=16
temperature=0.7``), score every response with a reward model, pick the top-scored one among N,
and report accuracy against N, next to the baselines:

- ``random``: a uniformly random sample (= sampling accuracy; what best-of-1 is),
- ``maj@N``: majority vote over the first N samples,
- ``pass@N``: the oracle (some sample among N is correct), the ceiling for any reranker.

PRM step scores ``c_1..c_K`` become one response score by ``min`` (the weakest step), ``last``
(the score of the full solution) or ``product`` (all steps good, if independent).

Best-of-N accuracy is the exact expectation over N-subsets of the n samples drawn uniformly
without replacement (like the unbiased pass@k estimator), not the first N: with samples sorted by
score (ties: lower sample index first), the one at rank r is the pick with probability
C(n-1-r, N-1) / C(n, N).

The scorer is any function of (question, response) pairs (``Scorer``): evaluation does not depend
on ``rewards``. The command that scores with a reward model is ``python -m rewards.best_of_n``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from common.files import atomic_save_figure, atomic_write_json, atomic_write_text
from eval.evaluate import read_samples
from eval.metrics import default_ks, maj_at_k, pass_at_k
from eval.report import SAMPLES_FILE

AGGREGATIONS: dict[str, Callable[[Sequence[float]], float]] = {
    "min": min,
    "last": lambda s: s[-1],
    "product": math.prod,
}


class Scorer(Protocol):
    """(question, response) pairs -> per pair one ORM score, or a list of PRM step scores."""

    def __call__(self, pairs: Sequence[tuple[str, str]]) -> list[float | Sequence[float]]: ...


def aggregate(step_scores: Sequence[float], how: str) -> float:
    """One score for a response from its PRM step scores.

    >>> [round(aggregate([0.9, 0.2, 0.8], h), 3) for h in ("min", "last", "product")]
    [0.2, 0.8, 0.144]
    """
    if how not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {how!r}: expected one of {sorted(AGGREGATIONS)}")
    if not step_scores:
        raise ValueError("no step scores to aggregate")
    return float(AGGREGATIONS[how](step_scores))


def expected_best_of_n(scores: Sequence[float], correct: Sequence[bool], num_chosen: int) -> float:
    """P(the top-scored of ``num_chosen`` samples, drawn without replacement from all n, is correct).

    >>> expected_best_of_n([0.9, 0.5, 0.1], [False, True, True], 2)  # subsets {0,1},{0,2} -> 0; {1,2} -> 1
    0.3333333333333333
    """
    n = len(scores)
    if len(correct) != n:
        raise ValueError("scores and correct must have the same length")
    if not 1 <= num_chosen <= n:
        raise ValueError(f"best-of-{num_chosen} needs 1 <= N <= n (n={n})")
    order = sorted(range(n), key=lambda i: (-scores[i], i))
    total = math.comb(n, num_chosen)
    return sum(math.comb(n - 1 - rank, num_chosen - 1) for rank, i in enumerate(order) if correct[i]) / total


def best_of_n_curves(
    problems: Sequence[Sequence[dict[str, Any]]],
    response_scores: Mapping[str, Sequence[Sequence[float]]],
    ns: Sequence[int] | None = None,
) -> dict[str, dict[str, float]]:
    """Accuracy against N for each method.

    ``problems``: per problem its n samples (dicts with ``correct`` and ``extracted``), in sample order.
    ``response_scores``: method name -> per problem, one score per sample.
    Returns ``{method: {str(N): accuracy}}`` including the ``random``, ``maj@N`` and ``pass@N`` baselines.
    """
    n = len(problems[0])
    if any(len(p) != n for p in problems):
        raise ValueError("every problem needs the same number of samples")
    ns = list(ns) if ns else default_ks(n)
    correct = [[bool(s["correct"]) for s in p] for p in problems]
    answers = [[s.get("extracted") for s in p] for p in problems]
    num = len(problems)
    curves: dict[str, dict[str, float]] = {
        "random": {str(k): sum(sum(c) / n for c in correct) / num for k in ns},
        "maj@N": {str(k): sum(maj_at_k(a, c, k) for a, c in zip(answers, correct)) / num for k in ns},
        "pass@N": {str(k): sum(pass_at_k(n, sum(c), k) for c in correct) / num for k in ns},
    }
    for method, scores in response_scores.items():
        if len(scores) != num or any(len(s) != n for s in scores):
            raise ValueError(f"{method}: need {n} scores for each of the {num} problems")
        curves[method] = {str(k): sum(expected_best_of_n(s, c, k) for s, c in zip(scores, correct)) / num for k in ns}
    return curves


def score_samples(
    problems: Sequence[Sequence[dict[str, Any]]], scorer: Scorer, kind: str, aggregations: Sequence[str]
) -> dict[str, list[list[float]]]:
    """Score every sample once and aggregate: ``{"orm": ...}`` or ``{"prm-min": ..., "prm-last": ...}``."""
    flat = [s for p in problems for s in p]
    missing = [s["id"] for s in flat if "question" not in s]
    if missing:
        raise ValueError(f"samples lack the 'question' field (run made by an older eval), e.g. {missing[0]!r}")
    raw = scorer([(s["question"], s["response"]) for s in flat])
    if len(raw) != len(flat):
        raise ValueError(f"scorer returned {len(raw)} scores for {len(flat)} responses")
    if kind == "orm":
        per_method = {"orm": [float(x if not isinstance(x, Sequence) else x[-1]) for x in raw]}
    else:
        steps = [list(x) if isinstance(x, Sequence) else [float(x)] for x in raw]
        per_method = {f"prm-{a}": [aggregate(s, a) for s in steps] for a in aggregations}
    n = len(problems[0])
    return {m: [v[i : i + n] for i in range(0, len(v), n)] for m, v in per_method.items()}


def group_samples(records: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    by_id: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_id.setdefault(r["id"], []).append(r)
    return [sorted(v, key=lambda r: r["sample_index"]) for v in by_id.values()]


def render_markdown(curves: dict[str, dict[str, float]], meta: dict[str, Any]) -> str:
    ns = list(next(iter(curves.values())))
    lines = [
        f"# Best-of-N on {meta.get('run_dir', '?')}",
        "",
        f"Reward model `{meta.get('rm', '?')}` ({meta.get('kind', '?')}); {meta.get('num_problems')} problems x "
        f"{meta.get('num_samples')} samples. Accuracy % against N (best-of-N: expectation over N-subsets; "
        "maj@N: first N samples).",
        "",
        "| method | " + " | ".join(f"N={k}" for k in ns) + " |",
        "| --- | " + " | ".join("---:" for _ in ns) + " |",
    ]
    for method, curve in curves.items():
        lines.append(f"| {method} | " + " | ".join(f"{100 * curve[k]:.1f}" for k in ns) + " |")
    return "\n".join(lines + ["", "![best-of-N](best_of_n.png)", ""])


def plot(curves: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for method, curve in curves.items():
        ks = [int(k) for k in curve]
        style = "--" if method in ("random", "maj@N", "pass@N") else "-"
        ax.plot(ks, [100 * v for v in curve.values()], style, marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N (samples to choose from)")
    ax.set_ylabel("accuracy %")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=120)


def run_best_of_n(
    run_dir: Path, scorer: Scorer, kind: str, aggregations: Sequence[str], rm_name: str, ns: Sequence[int] | None = None
) -> dict[str, Any]:
    problems = group_samples(read_samples(run_dir / SAMPLES_FILE))
    if not problems:
        raise ValueError(f"{run_dir}: no samples (is it an evaluation run directory?)")
    if len(problems[0]) < 2:
        raise ValueError(
            f"{run_dir}: 1 sample per problem; best-of-N needs a sampled run (num_samples=N temperature>0)"
        )
    curves = best_of_n_curves(problems, score_samples(problems, scorer, kind, aggregations), ns)
    meta = {
        "run_dir": str(run_dir),
        "rm": rm_name,
        "kind": kind,
        "num_problems": len(problems),
        "num_samples": len(problems[0]),
    }
    result = {**meta, "curves": curves}
    atomic_write_json(run_dir / "best_of_n.json", result)
    atomic_write_text(run_dir / "best_of_n.md", render_markdown(curves, meta))
    plot(curves, run_dir / "best_of_n.png")
    return result
