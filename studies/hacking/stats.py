"""The statistics round 3 pre-registered (docs/hacking_study/round3/PREREGISTRATION.md), exact where they can be,
in pure Python: exact binomial intervals, Fisher's exact test, a paired TOST on Student's t, Holm's correction.
Each function's docstring has a worked example a person can check against a table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p). Worked example: k = 0, n = 5, p = 0.5 -> 1/32 = 0.03125."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(min(k, n) + 1))


def _bisect(f: Any, lo: float, hi: float, steps: int = 100) -> float:
    """The root of a function increasing on [lo, hi] (f(lo) <= 0 <= f(hi)), by bisection."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval for a binomial proportion k / n: the p whose one-sided tail
    probabilities of the observed k are (1 - level) / 2. Worked examples (95%): 1 of 5 -> (0.0051, 0.7164);
    0 of 5 -> (0, 0.5218); 5 of 5 -> (0.4782, 1)."""
    a = (1 - level) / 2
    lower = 0.0 if k == 0 else _bisect(lambda p: (1 - binomial_cdf(k - 1, n, p)) - a, 0.0, 1.0)
    upper = 1.0 if k == n else _bisect(lambda p: a - binomial_cdf(k, n, p), 0.0, 1.0)
    return lower, upper


def fisher_exact(a: int, b: int, c: int, d: int) -> float:
    """Two-sided p of Fisher's exact test for the table [[a, b], [c, d]] (rows: two arms; columns: hacked,
    did not): the probability, with the margins fixed, of every table at most as likely as the observed one.
    Worked examples: [[5, 0], [0, 5]] -> 2 / 252 = 0.0079; [[4, 1], [0, 5]] -> 12 / 252 = 0.0476;
    [[1, 4], [0, 5]] -> 1."""
    row1, col1, n = a + b, a + c, a + b + c + d

    def prob(x: int) -> float:
        return math.comb(col1, x) * math.comb(n - col1, row1 - x) / math.comb(n, row1)

    observed = prob(a)
    support = range(max(0, row1 + col1 - n), min(row1, col1) + 1)
    return min(1.0, sum(prob(x) for x in support if prob(x) <= observed * (1 + 1e-9)))


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b). Worked example: I_0.5(2, 2) = 0.5."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1 - x) / b


def student_t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom. Worked examples (df = 4): t = 2.776 -> 0.975,
    t = 2.132 -> 0.950, t = 0 -> 0.5."""
    tail = 0.5 * incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def student_t_quantile(q: float, df: int) -> float:
    """The t with P(T <= t) = q. Worked example: q = 0.95, df = 4 -> 2.1318."""
    return _bisect(lambda t: student_t_cdf(t, df) - q, -1e3, 1e3, steps=200)


def tost_paired(diffs: Sequence[float], margin: float, alpha: float = 0.05) -> dict[str, Any]:
    """Two one-sided paired t tests of |mean difference| < ``margin``: H0 mean <= -margin and H0 mean >= +margin,
    each at ``alpha``; equivalent when both reject, i.e. when the 1 - 2 alpha t interval of the mean lies inside
    (-margin, +margin). Worked example: diffs 1, -1, 0, 2, -2 (mean 0, sd 1.581, se 0.707), margin 3:
    t = 4.243 both ways at 4 df, p = 0.0066 each: equivalent; 90% interval 0 +- 2.132 * 0.707 = +-1.508."""
    n = len(diffs)
    if n < 2:
        return {"n": n, "mean": diffs[0] if diffs else math.nan, "equivalent": False, "p": math.nan}
    mean = sum(diffs) / n
    sd = (sum((x - mean) ** 2 for x in diffs) / (n - 1)) ** 0.5
    se = sd / n**0.5
    df = n - 1
    if se == 0:
        p_lower = p_upper = 0.0 if abs(mean) < margin else 1.0
    else:
        p_lower = 1.0 - student_t_cdf((mean + margin) / se, df)
        p_upper = student_t_cdf((mean - margin) / se, df)
    half = student_t_quantile(1 - alpha, df) * se
    return {
        "n": n,
        "mean": mean,
        "sd": sd,
        "p_lower": p_lower,
        "p_upper": p_upper,
        "p": max(p_lower, p_upper),
        "interval": (mean - half, mean + half),
        "equivalent": max(p_lower, p_upper) < alpha,
    }


def holm(pvalues: Sequence[float], alpha: float = 0.05) -> tuple[list[float], list[bool]]:
    """Holm's step-down correction: adjusted p-values (in the input's order) and which are rejected at
    ``alpha``. Worked example: 0.01, 0.04, 0.03 (m = 3) -> sorted 0.01, 0.03, 0.04 adjusted 0.03, 0.06, 0.06;
    only the first rejected."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted, [p <= alpha for p in adjusted]
