"""Scalar and equation equality with sympy. Runs only inside grader worker processes.

LaTeX is parsed by latex2sympy2_extended's ANTLR grammar into unevaluated sympy trees (model text
is never handed to sympify/parse_expr/eval). Before anything is evaluated, a magnitude bound
rejects trees like 10^{10^{10^{10}}} or 100000! that would exhaust time or memory; such answers
are equal only to the identical string.

Equality is decided numerically at high precision, never with a tolerance that could accept an
approximation: both sides are exact expressions (decimals are converted to exact fractions
before parsing), and two distinct closed forms do not agree to 45 significant digits. Expressions
with variables are compared at several fixed pseudo-random points, which decides polynomial and
rational identities (expanded vs factored) and trigonometric ones alike.
"""

from __future__ import annotations

import functools
import math
import random
import re

import sympy
from latex2sympy2_extended.latex2sympy2 import ConversionConfig, latex2sympy

from mathtask.grading.compare import NeedSympy, ScalarOps, fast_equation, fast_scalar

_CONFIG = ConversionConfig(
    interpret_as_mixed_fractions=False,
    interpret_simple_eq_as_assignment=False,
    interpret_contains_as_eq=False,
    lowercase_symbols=True,
)
PRECISION = 60
REL_TOL = sympy.Float("1e-45", PRECISION)
NUM_POINTS = 5
# log10 bounds: no intermediate value with more than MAX_DIGITS digits, no factorial beyond
# MAX_FACTORIAL, no exponent beyond MAX_EXPONENT (in absolute value).
MAX_DIGITS = 5000.0
MAX_FACTORIAL = 2000
MAX_EXPONENT = 1e5
MAX_LATEX_CHARS = 600

_I = sympy.Symbol("i")
_DECIMAL_RE = re.compile(r"(?<![\d.])(\d*)\.(\d+)(?![\d.])")
_MIXED_RE = re.compile(r"(?<![\d.}^_])(\d+)\s*\\frac\{(\d+)\}\{(\d+)\}")


class TooLarge(Exception):
    pass


def _exact_decimals(latex: str) -> str:
    """3.14 -> (\\frac{314}{100}): latex2sympy would make a 15-digit Float of it."""

    def repl(m: re.Match) -> str:
        whole, frac = m.group(1), m.group(2)
        if len(whole) + len(frac) > 60:
            return m.group(0)
        # A lone brace group is a set to latex2sympy; parentheses keep it a number.
        text = "(\\frac{%s}{1%s})" % ((whole + frac).lstrip("0") or "0", "0" * len(frac))
        return "{" + text + "}" if latex[max(0, m.start() - 1)] in "^_" and m.start() > 0 else text

    return _DECIMAL_RE.sub(repl, latex)


def _constant_value(expr) -> float:
    """|expr| at low precision, for a constant subtree that _magnitude already bounded."""
    try:
        return abs(complex(expr.evalf(15, maxn=60)))
    except Exception:
        raise TooLarge("unevaluable constant") from None


def _magnitude(expr) -> float:
    """An upper bound on |log10 |expr|| (symbols count as |x| <= 100), raising TooLarge for trees
    whose evaluation would produce huge numbers: exponents over MAX_EXPONENT, factorials over
    MAX_FACTORIAL, or any intermediate value with more than MAX_DIGITS digits."""
    if isinstance(expr, sympy.Rational):
        return max(abs(expr.p).bit_length(), expr.q.bit_length()) * 0.30103
    if isinstance(expr, sympy.Float):
        return abs(math.log10(abs(float(expr)))) if expr != 0 and expr.is_finite else 0.0
    if isinstance(expr, sympy.Symbol):
        return 2.0
    args = getattr(expr, "args", ())
    if not args:
        return 1.0
    if isinstance(expr, (sympy.Pow, sympy.exp)):
        base, exponent = (args[0], args[1]) if isinstance(expr, sympy.Pow) else (sympy.E, args[0])
        base_mag = _magnitude(base)
        exp_mag = _magnitude(exponent)
        if exponent.free_symbols:
            if exp_mag > math.log10(MAX_EXPONENT):
                raise TooLarge("exponent")
            exp_value = 10**exp_mag
        else:
            if exp_mag > MAX_DIGITS:
                raise TooLarge("exponent")
            exp_value = _constant_value(exponent)
        if exp_value > MAX_EXPONENT and base not in (sympy.S.Zero, sympy.S.One, sympy.S.NegativeOne):
            raise TooLarge("exponent")
        bound = exp_value * max(base_mag, 1.0)
    elif isinstance(expr, (sympy.factorial, sympy.gamma, sympy.factorial2, sympy.subfactorial, sympy.binomial)):
        mags = [_magnitude(a) for a in args]
        if max(mags) > math.log10(MAX_FACTORIAL) + 1:
            raise TooLarge("factorial")
        n = max(_constant_value(a) for a in args) if not expr.free_symbols else 10 ** max(mags)
        if n > MAX_FACTORIAL:
            raise TooLarge("factorial")
        bound = n * math.log10(n + 2)
    else:
        mags = [_magnitude(a) for a in args]
        if isinstance(expr, sympy.Mul):
            bound = sum(mags)
        elif isinstance(expr, sympy.Add):
            bound = max(mags) + math.log10(len(mags))
        else:
            # Functions (trig, log, abs, floor, ...) do not grow their argument's size.
            bound = max(mags) + 1.0
    if bound > MAX_DIGITS:
        raise TooLarge("size")
    return bound


def _fix(expr):
    """`i` is the imaginary unit; any float left over is read as the exact decimal it prints as."""
    if _I in getattr(expr, "free_symbols", ()):
        expr = expr.xreplace({_I: sympy.I})
    floats = [f for f in expr.atoms(sympy.Float)] if hasattr(expr, "atoms") else []
    if floats:
        expr = expr.xreplace({f: sympy.Rational(str(f)) for f in floats})
    return expr


@functools.lru_cache(maxsize=4096)
def to_sympy(latex: str):
    """The sympy tree of one scalar, or None if it does not parse (or is too large to evaluate)."""
    if len(latex) > MAX_LATEX_CHARS:
        return None
    text = _MIXED_RE.sub(r"(\1+\\frac{\2}{\3})", latex)
    text = _exact_decimals(text)
    try:
        expr = latex2sympy(text, normalization_config=None, conversion_config=_CONFIG)
    except Exception:
        return None
    # Sets, tuples, relations and matrices are structure, handled before a scalar gets here.
    if not isinstance(expr, sympy.Expr):
        return None
    try:
        expr = _fix(expr)
        _magnitude(expr)
    except (TooLarge, RecursionError, OverflowError, ValueError, TypeError, ZeroDivisionError):
        return None
    return expr


def _number(expr, subs=None):
    """A high-precision complex value, or None if expr is not a finite number there."""
    try:
        # Substitute exactly first: evalf(subs=...) returns garbage at removable singularities.
        value = (expr.xreplace(subs) if subs else expr).evalf(PRECISION, maxn=200)
        if not value.is_number or value.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
            return None
        re_part, im_part = value.as_real_imag()
        re_part, im_part = sympy.Float(re_part, PRECISION), sympy.Float(im_part, PRECISION)
    except Exception:
        return None
    if not (re_part.is_finite and im_part.is_finite):
        return None
    return re_part, im_part


def _close(x, y) -> bool:
    (xr, xi), (yr, yi) = x, y
    scale = max(abs(xr), abs(xi), abs(yr), abs(yi), sympy.Float(1, PRECISION))
    return abs(xr - yr) <= REL_TOL * scale and abs(xi - yi) <= REL_TOL * scale


_PRIMES = (11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97)
_SMALL_PRIMES = (3, 5, 7)


def _points(symbols, num: int):
    """Fixed pseudo-random points, the same for both sides: ratios of distinct primes, so never
    an integer or a simple fraction where a contest expression would have a removable pole."""
    rng = random.Random(20240607)
    ordered = sorted(symbols, key=lambda s: s.name)
    for _ in range(num):
        yield {s: sympy.Rational(rng.choice((-1, 1)) * rng.choice(_PRIMES), rng.choice(_SMALL_PRIMES)) for s in ordered}


def _infinite(expr) -> int | None:
    if expr in (sympy.oo, -sympy.oo, sympy.zoo):
        return {sympy.oo: 1, -sympy.oo: -1, sympy.zoo: 0}[expr]
    return None


def expr_equal(gold, answer) -> bool:
    if gold == answer:
        return True
    g_inf, a_inf = _infinite(gold), _infinite(answer)
    if g_inf is not None or a_inf is not None:
        return g_inf == a_inf
    symbols = gold.free_symbols | answer.free_symbols
    if not symbols:
        g, a = _number(gold), _number(answer)
        if g is not None and a is not None:
            return _close(g, a)
        return _simplifies_to_zero(gold - answer)
    num_checked = 0
    for point in _points(symbols, NUM_POINTS + 3):
        g, a = _number(gold, point), _number(answer, point)
        if g is None or a is None:
            continue
        if not _close(g, a):
            return False
        num_checked += 1
        if num_checked >= NUM_POINTS:
            return True
    return num_checked > 0 or _simplifies_to_zero(gold - answer)


def _simplifies_to_zero(diff) -> bool:
    try:
        return sympy.simplify(diff) == 0
    except Exception:
        return False


def equation_equal(g_lhs: str, g_rhs: str, a_lhs: str, a_rhs: str) -> bool:
    """Two equations are equal when lhs - rhs of one is a nonzero constant multiple of the other's."""
    parts = [to_sympy(t) for t in (g_lhs, g_rhs, a_lhs, a_rhs)]
    if any(p is None for p in parts):
        return False
    g_diff = parts[0] - parts[1]
    a_diff = parts[2] - parts[3]
    symbols = g_diff.free_symbols | a_diff.free_symbols
    if not symbols:
        return False
    ratio = None
    num_checked = 0
    for point in _points(symbols, NUM_POINTS + 3):
        g, a = _number(g_diff, point), _number(a_diff, point)
        if g is None or a is None:
            continue
        g_c = complex(float(g[0]), float(g[1]))
        a_c = complex(float(a[0]), float(a[1]))
        if abs(a_c) < 1e-30 or abs(g_c) < 1e-30:
            if not (abs(a_c) < 1e-30 and abs(g_c) < 1e-30):
                return False
            continue
        r = (sympy.Float(g[0], PRECISION) + sympy.I * g[1]) / (sympy.Float(a[0], PRECISION) + sympy.I * a[1])
        r = _number(r)
        if r is None:
            continue
        if ratio is None:
            ratio = r
        elif not _close(ratio, r):
            return False
        num_checked += 1
        if num_checked >= NUM_POINTS:
            break
    return num_checked > 0


def full_scalar(gold: str, answer: str) -> bool:
    try:
        return fast_scalar(gold, answer)
    except NeedSympy:
        pass
    g = to_sympy(gold)
    if g is None:
        return False
    a = to_sympy(answer)
    if a is None:
        return False
    return expr_equal(g, a)


def full_equation(g_lhs: str, g_rhs: str, a_lhs: str, a_rhs: str) -> bool:
    try:
        return fast_equation(g_lhs, g_rhs, a_lhs, a_rhs)
    except NeedSympy:
        pass
    return equation_equal(g_lhs, g_rhs, a_lhs, a_rhs)


FULL_OPS = ScalarOps(full_scalar, full_equation)
