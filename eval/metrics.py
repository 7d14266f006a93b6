"""Evaluation metrics: pure functions over per-sample grades.

Conventions: a problem has ``n`` samples (n = 1 for greedy); ``accuracy`` is the mean over
problems of the fraction of correct samples (greedy accuracy when n = 1, sampling accuracy
otherwise). Confidence intervals are 95% and taken over problems: the Wilson score interval when
every per-problem value is 0 or 1 (a binomial proportion: greedy accuracy, maj@k), a percentile
bootstrap over problems otherwise (sampling accuracy, pass@k), with a fixed seed so reports are
reproducible. Each interval says which method made it.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

Z_95 = 1.959963984540054
"""Two-sided 95% normal quantile."""


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): P(at least one of k samples drawn without replacement
    from the n generated is correct) = 1 - C(n-c, k) / C(n, k).

    >>> pass_at_k(4, 1, 2)   # 1 - C(3,2)/C(4,2) = 1 - 3/6
    0.5
    """
    if not 1 <= k <= num_samples:
        raise ValueError(f"pass@{k} needs 1 <= k <= n (n={num_samples})")
    if not 0 <= num_correct <= num_samples:
        raise ValueError(f"num_correct={num_correct} not in [0, {num_samples}]")
    if num_samples - num_correct < k:
        return 1.0
    # Product form of the ratio of binomials: stable for large n (no huge factorials).
    prob_all_wrong = 1.0
    for i in range(num_samples - num_correct + 1, num_samples + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def normalize_answer(answer: str | None) -> str | None:
    """Key for voting: the extracted answer without whitespace (``"x = 3"`` and ``"x=3"`` vote together).

    Answers that are equal but written differently (``\\frac12`` vs ``0.5``) vote separately: voting
    is by string, grading is by the grader.
    """
    if answer is None:
        return None
    key = "".join(answer.split())
    return key or None


def majority_vote(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """Is the most frequent extracted answer correct? Samples without an answer do not vote; ties
    go to the answer that appeared first; no answer at all counts as wrong.

    >>> majority_vote(["3", "4", "3", None], [True, False, True, False])
    True
    """
    if len(answers) != len(correct):
        raise ValueError("answers and correct must have the same length")
    keys = [normalize_answer(a) for a in answers]
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return False
    best = max(counts.values())
    winner = next(k for k in keys if k is not None and counts[k] == best)
    return bool(correct[keys.index(winner)])


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> bool:
    """Majority vote over the first ``k`` samples (sample order is the generation order)."""
    if not 1 <= k <= len(answers):
        raise ValueError(f"maj@{k} needs 1 <= k <= n (n={len(answers)})")
    return majority_vote(answers[:k], correct[:k])


def wilson_interval(num_successes: int, num_total: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (good near 0 and 1, unlike mean +- 2 SE).

    >>> [round(x, 4) for x in wilson_interval(8, 10)]
    [0.4902, 0.9433]
    """
    if num_total <= 0:
        return (0.0, 1.0)
    p = num_successes / num_total
    denom = 1 + z * z / num_total
    center = (p + z * z / (2 * num_total)) / denom
    half = z * math.sqrt(p * (1 - p) / num_total + z * z / (4 * num_total * num_total)) / denom
    return (max(0.0, center - half), min(1.0, center + half))


def bootstrap_interval(
    values: Sequence[float], num_resamples: int = 1000, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (resampling problems with replacement)."""
    if not values:
        return (0.0, 1.0)
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(num_resamples))
    lo_idx = int(math.floor((1 - confidence) / 2 * num_resamples))
    hi_idx = min(num_resamples - 1, int(math.ceil((1 + confidence) / 2 * num_resamples)) - 1)
    return (means[lo_idx], means[hi_idx])


def mean_with_ci(values: Sequence[float], seed: int = 0) -> dict[str, Any]:
    """``{"mean", "ci_low", "ci_high", "ci_method", "num"}`` with the method chosen as in the module docstring."""
    values = [float(v) for v in values]
    num = len(values)
    mean = sum(values) / num if num else 0.0
    if all(v in (0.0, 1.0) for v in values):
        lo, hi = wilson_interval(int(sum(values)), num)
        method = "wilson"
    else:
        lo, hi = bootstrap_interval(values, seed=seed)
        method = "bootstrap"
    return {"mean": mean, "ci_low": lo, "ci_high": hi, "ci_method": method, "num": num}


def length_stats(lengths: Sequence[int]) -> dict[str, float]:
    """Mean, median, 90th percentile (nearest rank) and max of response lengths in tokens."""
    if not lengths:
        return {"mean": 0.0, "median": 0.0, "p90": 0.0, "max": 0.0}
    s = sorted(lengths)
    n = len(s)
    median = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    p90 = s[max(0, math.ceil(0.9 * n) - 1)]
    return {"mean": sum(s) / n, "median": float(median), "p90": float(p90), "max": float(s[-1])}


def default_ks(num_samples: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself: the k's for pass@k / maj@k curves."""
    ks = [k for k in (2**i for i in range(int(math.log2(max(1, num_samples))) + 1)) if k <= num_samples]
    return sorted(set(ks + [num_samples]))


def by_group(keys: Sequence[Hashable], values: Sequence[float], seed: int = 0) -> dict[str, dict[str, Any]]:
    """``mean_with_ci`` of the values of each group, groups sorted by key."""
    groups: dict[Hashable, list[float]] = defaultdict(list)
    for key, value in zip(keys, values):
        groups[key].append(value)
    return {str(k): mean_with_ci(groups[k], seed=seed) for k in sorted(groups, key=lambda k: (str(type(k)), str(k)))}


def summarize(
    problems: Sequence[Sequence[dict[str, Any]]], ks: Sequence[int] | None = None, seed: int = 0
) -> dict[str, Any]:
    """All metrics of one evaluation.

    ``problems``: per problem, its samples in sample order; each sample a dict with ``correct``
    (bool), ``extracted`` (str | None), ``num_tokens`` (int), ``finish_reason`` and optionally
    ``subject`` / ``level`` (MATH). Every problem must have the same number of samples n.
    """
    if not problems:
        raise ValueError("no problems to summarize")
    n = len(problems[0])
    if n == 0 or any(len(p) != n for p in problems):
        raise ValueError("every problem needs the same, non-zero number of samples")
    ks = sorted(set(ks)) if ks else default_ks(n)
    if any(not 1 <= k <= n for k in ks):
        raise ValueError(f"ks={list(ks)}: each k must be in [1, n={n}]")

    per_problem_acc = [sum(bool(s["correct"]) for s in p) / n for p in problems]
    samples = [s for p in problems for s in p]
    summary: dict[str, Any] = {
        "num_problems": len(problems),
        "num_samples_per_problem": n,
        "accuracy": mean_with_ci(per_problem_acc, seed=seed),
    }
    if n > 1:
        summary["pass@k"] = {
            str(k): mean_with_ci([pass_at_k(n, sum(bool(s["correct"]) for s in p), k) for p in problems], seed=seed)
            for k in ks
        }
        summary["maj@k"] = {
            str(k): mean_with_ci(
                [
                    float(maj_at_k([s.get("extracted") for s in p], [bool(s["correct"]) for s in p], k))
                    for p in problems
                ],
                seed=seed,
            )
            for k in ks
        }
    for field in ("subject", "level"):
        keys = [p[0].get(field) for p in problems]
        if any(k is not None for k in keys):
            summary[f"by_{field}"] = by_group(["?" if k is None else k for k in keys], per_problem_acc, seed=seed)
    summary["length"] = length_stats([int(s["num_tokens"]) for s in samples])
    summary["truncated_fraction"] = sum(s.get("finish_reason") == "length" for s in samples) / len(samples)
    summary["no_answer_fraction"] = sum(s.get("extracted") is None for s in samples) / len(samples)
    return summary


def format_ci(stat: dict[str, Any], scale: float = 100.0, digits: int = 1) -> str:
    """``"42.0 [38.1, 46.0]"`` (percent by default)."""
    f: Callable[[float], str] = lambda x: f"{scale * x:.{digits}f}"
    return f"{f(stat['mean'])} [{f(stat['ci_low'])}, {f(stat['ci_high'])}]"
