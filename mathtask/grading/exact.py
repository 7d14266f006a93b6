"""Exact rational arithmetic on plain-number LaTeX, without sympy.

This is the grader's fast path: most gold answers are integers, decimals or fractions, and
comparing those must not need sympy or a worker process. The parser accepts numbers, + - * /,
\\cdot, \\times, \\div, ^ with integer exponents, !, \\frac, \\binom, parentheses and braces, and
mixed numbers (`2\\frac{1}{2}` is 5/2). Anything else (a symbol, \\sqrt, \\pi) returns None and
the caller falls back to sympy. Every operation is size-bounded because this runs in the
caller's process, where nothing can be killed.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

MAX_CHARS = 400
MAX_BITS = 20_000
MAX_EXPONENT = 4096
MAX_FACTORIAL = 400
MAX_BINOM_N = 5000
MAX_DEPTH = 40

_TOKEN_RE = re.compile(
    r"\s*(?:"
    r"(?P<num>\d+(?:\.\d*)?|\.\d+)"
    r"|(?P<cmd>\\(?:frac|binom|cdot|times|div)(?![a-zA-Z]))"
    r"|(?P<op>[-+*/^!(){}\[\]])"
    r")"
)


class NotExact(Exception):
    """The text is not plain rational arithmetic (or is too big to evaluate here)."""


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens = []
    pos = 0
    n = len(text)
    while pos < n:
        m = _TOKEN_RE.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise NotExact(text[pos:])
        kind = m.lastgroup
        assert kind is not None  # every alternative of the pattern is a named group
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    return tokens


def _check_size(x: Fraction) -> Fraction:
    if x.numerator.bit_length() > MAX_BITS or x.denominator.bit_length() > MAX_BITS:
        raise NotExact("too large")
    return x


def _as_int(x: Fraction, limit: int) -> int:
    if x.denominator != 1 or abs(x.numerator) > limit:
        raise NotExact("not a small integer")
    return x.numerator


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value):
            raise NotExact(f"expected {value}")
        self.pos += 1
        return tok

    def parse(self) -> Fraction:
        value = self.expr()
        if self.peek() is not None:
            raise NotExact("trailing tokens")
        return value

    def expr(self) -> Fraction:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise NotExact("too deep")
        value = self.term()
        while (tok := self.peek()) is not None and tok[1] in "+-" and tok[0] == "op":
            self.pos += 1
            rhs = self.term()
            value = _check_size(value + rhs if tok[1] == "+" else value - rhs)
        self.depth -= 1
        return value

    def _starts_atom(self, tok: tuple[str, str] | None) -> bool:
        if tok is None:
            return False
        kind, text = tok
        return kind == "num" or text in ("(", "{", "[", "\\frac", "\\binom")

    def term(self) -> Fraction:
        value = self.unary()
        while True:
            tok = self.peek()
            if tok is None:
                return value
            if tok[1] in ("*", "\\cdot", "\\times"):
                self.pos += 1
                value = _check_size(value * self.unary())
            elif tok[1] in ("/", "\\div"):
                self.pos += 1
                rhs = self.unary()
                if rhs == 0:
                    raise NotExact("division by zero")
                value = _check_size(value / rhs)
            elif self._starts_atom(tok):
                # Implicit multiplication, `2(3)`; a leading number is never a mixed number here
                # because atom() already consumed `2\frac{1}{2}` as one mixed number.
                value = _check_size(value * self.power())
            else:
                return value

    def unary(self) -> Fraction:
        tok = self.peek()
        if tok is not None and tok[0] == "op" and tok[1] in "+-":
            self.pos += 1
            value = self.unary()
            return -value if tok[1] == "-" else value
        return self.power()

    def power(self) -> Fraction:
        base = self.postfix()
        tok = self.peek()
        if tok is None or tok[1] != "^":
            return base
        self.pos += 1
        nxt = self.peek()
        if nxt is None:
            raise NotExact("dangling ^")
        if nxt[0] == "num":
            self.pos += 1
            exponent = Fraction(nxt[1])
        elif nxt[1] == "-":
            # `2^-1` without braces.
            self.pos += 1
            exponent = -self.postfix()
        else:
            exponent = self.postfix()
        return _pow(base, exponent)

    def postfix(self) -> Fraction:
        value = self.atom()
        while (tok := self.peek()) is not None and tok[1] == "!":
            self.pos += 1
            value = Fraction(math.factorial(_nonneg(_as_int(value, MAX_FACTORIAL))))
        return value

    def group(self) -> Fraction:
        tok = self.take()
        closers = {"(": ")", "{": "}", "[": "]"}
        if tok[1] not in closers:
            raise NotExact("expected a group")
        value = self.expr()
        self.take(closers[tok[1]])
        return value

    def atom(self) -> Fraction:
        tok = self.peek()
        if tok is None:
            raise NotExact("unexpected end")
        kind, text = tok
        if kind == "num":
            self.pos += 1
            value = Fraction(text)
            nxt = self.peek()
            if nxt is not None and nxt[1] == "\\frac" and "." not in text:
                mixed = self._mixed_fraction()
                if mixed is not None:
                    return value + mixed
            return value
        if text in ("(", "{", "["):
            return self.group()
        if text == "\\frac":
            self.pos += 1
            num = self.group()
            den = self.group()
            if den == 0:
                raise NotExact("division by zero")
            return _check_size(num / den)
        if text == "\\binom":
            self.pos += 1
            n = _as_int(self.group(), MAX_BINOM_N)
            k = _as_int(self.group(), MAX_BINOM_N)
            if n < 0 or k < 0:
                raise NotExact("negative binomial")
            return Fraction(math.comb(n, k))
        raise NotExact(f"unexpected {text}")

    def _mixed_fraction(self) -> Fraction | None:
        """`\\frac{a}{b}` with integer literals a and b right after an integer: a mixed number."""
        toks = self.tokens[self.pos : self.pos + 7]
        shape = [t[1] if t[0] != "num" else "N" for t in toks]
        if shape != ["\\frac", "{", "N", "}", "{", "N", "}"]:
            return None
        num, den = toks[2][1], toks[5][1]
        if "." in num or "." in den or int(den) == 0:
            return None
        self.pos += 7
        return Fraction(int(num), int(den))


def _nonneg(n: int) -> int:
    if n < 0:
        raise NotExact("negative factorial")
    return n


def _pow(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise NotExact("fractional exponent")
    e = exponent.numerator
    if base in (0, 1) and e >= 0:
        return base
    if base == -1:
        return Fraction(-1 if e % 2 else 1)
    if abs(e) > MAX_EXPONENT:
        raise NotExact("exponent too large")
    bits = max(base.numerator.bit_length(), base.denominator.bit_length())
    if bits * abs(e) > MAX_BITS:
        raise NotExact("power too large")
    if base == 0:
        raise NotExact("zero to a negative power")
    return base**e


def exact_value(text: str) -> Fraction | None:
    """The exact rational value of plain-number LaTeX, or None if it is anything else."""
    if len(text) > MAX_CHARS:
        return None
    try:
        tokens = _tokenize(text)
        if not tokens:
            return None
        return _Parser(tokens).parse()
    except (NotExact, ValueError, ZeroDivisionError, OverflowError, RecursionError):
        return None
