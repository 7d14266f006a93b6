"""From answer text to a small structural tree, without sympy.

`parse_answer` turns a gold answer or an extracted model answer into a `Node`: a scalar (LaTeX
text for one value), a word, a multiple-choice letter, a base-n numeral, an ordered sequence
(tuple, point, interval), a set, an unordered list of solutions, a union of intervals, a matrix,
an equation or an assignment (`x = 5`). Presentation that carries no value (dollars, \\left,
\\text, units, degree signs, `%`, thousands separators, spacing) is removed here, so both sides
of a comparison reach `compare` in the same form. Inputs are bounded (MAX_ANSWER_CHARS) and all
scans are linear or close to it: this runs in the caller's process.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from fractions import Fraction

from mathtask.grading.extract import match_brace

MAX_ANSWER_CHARS = 1000
MAX_DEPTH = 10
MAX_ITEMS = 64
ROW_SEP = "\x01"  # stands in for the LaTeX row separator `\\`


@dataclass(frozen=True)
class Scalar:
    latex: str


@dataclass(frozen=True)
class Text:
    words: str


@dataclass(frozen=True)
class Choice:
    letter: str


@dataclass(frozen=True)
class Based:
    digits: str
    base: int


@dataclass(frozen=True)
class Seq:
    """Ordered: tuples, points, vectors, intervals. Brackets are part of the value."""

    items: tuple
    left: str
    right: str


@dataclass(frozen=True)
class SetOf:
    items: tuple


@dataclass(frozen=True)
class Items:
    """A bare list (`1, -2`, `3 or 5`): the solutions of a problem, in no particular order."""

    items: tuple


@dataclass(frozen=True)
class Union:
    parts: tuple


@dataclass(frozen=True)
class Matrix:
    rows: tuple


@dataclass(frozen=True)
class Equation:
    lhs: str
    rhs: str


@dataclass(frozen=True)
class Assignment:
    """`x = 5`, `(a, b) = (4, 5)`, `y = 2x + 3`: a label and the value it is given."""

    lhs: str
    value: Node  # the union of every node type, defined below


@dataclass(frozen=True)
class Raw:
    """Text that did not parse (or was too long): equal only to the same text."""

    text: str


Node = Scalar | Text | Choice | Based | Seq | SetOf | Items | Union | Matrix | Equation | Assignment | Raw

# ---------------------------------------------------------------------------------------------
# Text-level cleaning

_UNICODE = {
    "\u2212": "-",
    "\u2013": "-",
    "\u2014": "-",
    "\u2010": "-",
    "\u2011": "-",
    "\u00d7": r" \times ",
    "\u22c5": r" \cdot ",
    "\u00b7": r" \cdot ",
    "\u00f7": r" \div ",
    "\u03c0": r" \pi ",
    "\u221e": r" \infty ",
    "\u221a": r"\sqrt",
    "\u2264": r" \le ",
    "\u2265": r" \ge ",
    "\u2260": r" \ne ",
    "\u00b1": r" \pm ",
    "\u2213": r" \mp ",
    "\u222a": r" \cup ",
    "\u2229": r" \cap ",
    "\u2208": r" \in ",
    "\u2205": r" \emptyset ",
    "\u00b0": r"^\circ",
    "\u03b8": r" \theta ",
    "\u03b1": r" \alpha ",
    "\u03b2": r" \beta ",
    "\u00b2": "^2",
    "\u00b3": "^3",
    "\u00b9": "^1",
    "\u2070": "^0",
    "\u2074": "^4",
    "\u2075": "^5",
    "\u2076": "^6",
    "\u2077": "^7",
    "\u2078": "^8",
    "\u2079": "^9",
    "\u00bd": r"\frac{1}{2}",
    "\u00bc": r"\frac{1}{4}",
    "\u00be": r"\frac{3}{4}",
    "\u2153": r"\frac{1}{3}",
    "\u2154": r"\frac{2}{3}",
    "\u00a0": " ",
    "\u2009": " ",
    "\u202f": " ",
    "\u200b": "",
    "\u200c": "",
    "\u200d": "",
    "\ufeff": "",
    "\u20ac": "",
    "\u00a3": "",
    "\u00a5": "",
    "\u20b9": "",
    "\u2032": "'",
}
_UNICODE_RE = re.compile("|".join(map(re.escape, _UNICODE)))

_SUBS = [
    # Delimiters of math mode and spacing carry no value.
    (re.compile(r"\\\(|\\\)|\\\[|\\\]|\$"), " "),
    (re.compile(r"(\d)\s*(?:,\\!|\{,\})\s*(?=\d{3}(?!\d))"), r"\1"),
    (re.compile(r"\\[,;:! ]|~|\\q?quad(?![a-zA-Z])|\\enspace(?![a-zA-Z])"), " "),
    (re.compile(r"\\(?:displaystyle|textstyle|scriptstyle|limits|nolimits|mathstrut)(?![a-zA-Z])"), ""),
    (re.compile(r"\\(?:hspace|vspace|phantom|hphantom|vphantom)\*?\s*\{[^{}]*\}"), ""),
    (re.compile(r"\\(?:left|right)\s*\.|\\middle(?![a-zA-Z])"), ""),
    (re.compile(r"\\(?:left|right|[bB]igg?[lr]?)(?![a-zA-Z])"), ""),
    (re.compile(r"\\[dtc]frac(?![a-zA-Z])"), r"\\frac"),
    (re.compile(r"\\[dt]binom(?![a-zA-Z])"), r"\\binom"),
    (re.compile(r"\\(?:leqslant|leq|le)(?![a-zA-Z])|<=|=<"), r" \\le "),
    (re.compile(r"\\(?:geqslant|geq|ge)(?![a-zA-Z])|>=|=>"), r" \\ge "),
    (re.compile(r"\\(?:neq|ne)(?![a-zA-Z])|!=|<>"), r" \\ne "),
    (re.compile(r"\\lt(?![a-zA-Z])"), "<"),
    (re.compile(r"\\gt(?![a-zA-Z])"), ">"),
    (re.compile(r"\\lbrace(?![a-zA-Z])"), r"\\{"),
    (re.compile(r"\\rbrace(?![a-zA-Z])"), r"\\}"),
    (re.compile(r"\\lbrack(?![a-zA-Z])"), "["),
    (re.compile(r"\\rbrack(?![a-zA-Z])"), "]"),
    (re.compile(r"\\[lr]?vert(?![a-zA-Z])|\\[lr]Vert(?![a-zA-Z])"), "|"),
    (re.compile(r"\\ast(?![a-zA-Z])"), "*"),
    (re.compile(r"\\(?:varnothing|O)(?![a-zA-Z])"), r"\\emptyset"),
    (re.compile(r"\\infin(?:ity)?(?![a-zA-Z])"), r"\\infty"),
    (re.compile(r"\\(?:varepsilon)(?![a-zA-Z])"), r"\\epsilon"),
    (re.compile(r"\\(?:varphi)(?![a-zA-Z])"), r"\\phi"),
    # Degrees and percent are labels of the number (25\% equals 25, 30^\circ equals 30).
    (
        re.compile(
            r"(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![a-zA-Z])|\\circ(?![a-zA-Z])|\\degree(?![a-zA-Z]))(?:\s*[CF](?![a-zA-Z]))?"
        ),
        " ",
    ),
    (re.compile(r"\\%|%|\\\$|\\euro(?![a-zA-Z])|\\pounds(?![a-zA-Z])"), " "),
]
_TEXT_CMD_RE = re.compile(
    r"\\(?:text|textbf|textit|textrm|textsf|texttt|textnormal|textup|mathrm|mathbf|mathit|"
    r"mathsf|mathtt|mathnormal|mbox|hbox|boldsymbol|bm|emph|mathbb|mathcal|mathscr|mathfrak)"
    r"\s*\{"
)
_ANSWER_PHRASE_RE = re.compile(r"^\s*(?:the\s+)?(?:final\s+)?answer\s*(?:is\b|:)\s*:?", re.IGNORECASE)
_SCIENTIFIC_RE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*[eE]\s*([+-]?\d+)(?![\w.])")
_OVERLINE_RE = re.compile(r"(\d*)\.(\d*)\\(?:overline|bar|dot)\s*(?:\{(\d+)\}|(\d))")
_REPEATING_PAREN_RE = re.compile(r"(?<![\d)])(\d*)\.(\d*)\((\d+)\)(?![\d(])")


_TRIG_RE = re.compile(r"\\(?:sin|cos|tan|cot|sec|csc)(?![a-zA-Z])")
_TRIG_DEGREE_RE = re.compile(
    r"(\d+(?:\.\d+)?)\s*(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![a-zA-Z])|\u00b0|\\degree(?![a-zA-Z]))"
)
_UNIT_TEXT_RE = re.compile(r"^\s*[A-Za-z][A-Za-z. ]*$")
_UNIT_TAIL_RE = re.compile(r"\s*(?:\^\s*\{?\s*\d\s*\}?)?\s*\.?\s*$")
_VALUE_END_RE = re.compile(r"[\d})]\s*$")
_CHOOSE_RE = re.compile(r"\{\s*([^{}]*?)\s*\\choose(?![a-zA-Z])\s*([^{}]*?)\s*\}")
_PLAIN_MIXED_RE = re.compile(r"(?<![\d.,/])(\d+)\s+(\d+)\s*/\s*(\d+)(?![\d./])")


def _unwrap_text_commands(s: str) -> str:
    """`\\text{ cm}` -> ` cm `; `\\mathbb{R}` keeps a marker because it names a set."""
    for _ in range(64):
        m = _TEXT_CMD_RE.search(s)
        if m is None:
            break
        open_index = m.end() - 1
        close = match_brace(s, open_index)
        if close < 0:
            s = s[: m.start()] + s[m.end() :]
            continue
        inner = s[open_index + 1 : close]
        if m.group(0).startswith("\\mathbb"):
            inner = "\\mathbb" + inner.strip()
        elif _UNIT_TEXT_RE.match(inner) and _UNIT_TAIL_RE.match(s, close + 1) and _VALUE_END_RE.search(s[: m.start()]):
            # A word in \text after a value, ending the answer, is its unit: `5 \text{ m}`.
            s = s[: m.start()]
            break
        s = s[: m.start()] + " " + inner + " " + s[close + 1 :]
    return s


def _repeating(m: re.Match) -> str:
    whole, fixed, rep = m.group(1), m.group(2), m.group(3) or m.group(4)
    if len(whole) + len(fixed) + len(rep) > 40:
        return m.group(0)
    value = Fraction(int(whole or "0"))
    if fixed:
        value += Fraction(int(fixed), 10 ** len(fixed))
    value += Fraction(int(rep), 10 ** len(fixed) * (10 ** len(rep) - 1))
    return "{\\frac{%d}{%d}}" % (value.numerator, value.denominator)


def clean(text: str) -> str:
    """Removes presentation that carries no value; keeps everything that could."""
    s = text.replace("\\\\", ROW_SEP)
    s = _UNICODE_RE.sub(lambda m: _UNICODE[m.group(0)], s)
    s = unicodedata.normalize("NFKC", s)
    s = "".join(c if c.isprintable() or c == ROW_SEP else " " for c in s)
    if _TRIG_RE.search(s):
        # Inside trigonometry a degree sign is a unit to convert, not a label to drop.
        s = _TRIG_DEGREE_RE.sub(r"{(\1\\pi/180)}", s)
    for pattern, repl in _SUBS:
        s = pattern.sub(repl, s)
    s = _unwrap_text_commands(s)
    s = _CHOOSE_RE.sub(r"\\binom{\1}{\2}", s)
    s = re.sub(r"\\mathbb\s*R(?![a-zA-Z])|\\R(?![a-zA-Z])", r"\\mathbbR", s)
    s = _ANSWER_PHRASE_RE.sub("", s, count=1)
    s = _SCIENTIFIC_RE.sub(r"\1\\times10^{\2}", s)
    s = _PLAIN_MIXED_RE.sub(r"\1\\frac{\2}{\3}", s)
    s = _OVERLINE_RE.sub(_repeating, s)
    s = _REPEATING_PAREN_RE.sub(_repeating, s)
    s = re.sub(r"\s+", " ", s).strip()
    return s


# ---------------------------------------------------------------------------------------------
# Top-level scanning (outside any bracket)

_COMMAND_RE = re.compile(r"\\[a-zA-Z]+|\\.")
_OPEN_CMDS = ("\\{", "\\langle")
_CLOSE_CMDS = ("\\}", "\\rangle")


def _bracket_at(s: str, i: int) -> tuple[int, int]:
    """(+1 open / -1 close / 0, token length) for the token at i."""
    c = s[i]
    if c in "([{":
        return 1, 1
    if c in ")]}":
        return -1, 1
    if c == "\\":
        for tok in _OPEN_CMDS:
            if s.startswith(tok, i):
                return 1, len(tok)
        for tok in _CLOSE_CMDS:
            if s.startswith(tok, i):
                return -1, len(tok)
        m = _COMMAND_RE.match(s, i)
        return 0, (m.end() - i) if m else 1
    return 0, 1


def split_top(s: str, sep: re.Pattern) -> list[str]:
    """Splits s at matches of sep that lie outside all brackets."""
    parts = []
    depth = 0
    start = 0
    i = 0
    n = len(s)
    while i < n:
        if depth == 0:
            m = sep.match(s, i)
            if m is not None and m.end() > i:
                parts.append(s[start:i])
                start = i = m.end()
                continue
        delta, length = _bracket_at(s, i)
        depth = max(0, depth + delta)
        i += length
    parts.append(s[start:])
    return parts


def _wrapped(s: str) -> tuple[str, str, str] | None:
    """(left, inner, right) if the first bracket of s closes at its very end."""
    if not s:
        return None
    delta, first_len = _bracket_at(s, 0)
    if delta != 1:
        return None
    depth = 0
    i = 0
    n = len(s)
    while i < n:
        delta, length = _bracket_at(s, i)
        depth += delta
        if depth == 0:
            if i + length == n:
                return s[:first_len], s[first_len:i], s[i:]
            return None
        i += length
    return None


# ---------------------------------------------------------------------------------------------
# Scalars

_CMD_ARGS = {"\\frac": 2, "\\binom": 2, "\\sqrt": 1}
_CMD_ARGS_RE = re.compile(r"\\(frac|binom|sqrt)(?![a-zA-Z])")
_SINGLE_ARG_RE = re.compile(r"\\[a-zA-Z]+|[^\s{}\\]")


def _brace_arguments(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\sqrt3` -> `\\sqrt{3}`: TeX's one-token arguments, made explicit."""
    inserts: list[tuple[int, str]] = []
    for m in _CMD_ARGS_RE.finditer(s):
        i = m.end()
        num_args = _CMD_ARGS["\\" + m.group(1)]
        if m.group(1) == "sqrt":
            j = i
            while j < len(s) and s[j] == " ":
                j += 1
            if j < len(s) and s[j] == "[":
                close = s.find("]", j)
                if close < 0:
                    break
                i = close + 1
        for _ in range(num_args):
            while i < len(s) and s[i] == " ":
                i += 1
            if i >= len(s):
                break
            if s[i] == "{":
                close = match_brace(s, i)
                if close < 0:
                    break
                i = close + 1
                continue
            tok = _SINGLE_ARG_RE.match(s, i)
            if tok is None:
                break
            inserts.append((tok.start(), "{"))
            inserts.append((tok.end(), "}"))
            i = tok.end()
    if not inserts:
        return s
    out = []
    prev = 0
    for pos, brace in sorted(inserts, key=lambda t: t[0]):
        out.append(s[prev:pos])
        out.append(brace)
        prev = pos
    out.append(s[prev:])
    return "".join(out)


_SCRIPT_RE = re.compile(r"([\^_])\s*(-\s*\d+|\d+|[A-Za-z]|\\(?!(?:frac|sqrt|binom)(?![a-zA-Z]))[a-zA-Z]+)")


def canon_scalar(s: str) -> str:
    s = _brace_arguments(s)
    # One-token super/subscripts get explicit braces so that removing spaces cannot merge
    # `\log_2 8` into `\log_28`; a digit run is one exponent (`2^10` means 2^{10}).
    s = _SCRIPT_RE.sub(lambda m: m.group(1) + "{" + m.group(2).replace(" ", "") + "}", s)
    s = re.sub(r"(?<![a-zA-Z\\])(?:pi)(?![a-zA-Z])", r"\\pi", s)
    s = re.sub(r"(?<![a-zA-Z\\])(?:infinity|inf)(?![a-zA-Z])", r"\\infty", s)
    # Spaces matter only where they end a command name (`\pi r`).
    s = re.sub(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z0-9])", "\\1\x00", s)
    s = re.sub(r"\s+", "", s).replace("\x00", " ")
    s = s.replace("{}", "")
    for _ in range(8):
        w = _wrapped(s)
        if w is None or w[0] != "{":
            break
        s = w[1]
    if s.startswith("+"):
        s = s[1:]
    if s == "+\\infty":
        s = "\\infty"
    return s


_UNIT_WORD_RE = re.compile(
    r"(?:(?<=[\s})])|^)([A-Za-z]{2,})\.?(?:\s*\^\{?[234]\}?)?\s*$|(?:(?<=[\s})])|^)[A-Za-z]+/[A-Za-z]+\s*$"
)
# Words that are values, not labels.
_NOT_UNITS = {"pi", "inf", "infinity", "sqrt", "cis", "or", "and", "mod", "sin", "cos", "tan", "log", "ln", "exp"}
# Units written right after a digit with no space (`5cm`): only well-known ones.
_GLUED_UNIT_RE = re.compile(
    r"(?<=\d)(?:km/h|m/s|ft/s|mi/h|cm|mm|km|kg|mg|ml|mL|lbs?|oz|ft|yd|mph|sec|hrs?|mins?|m|g|s|L)(?:\^\{?[23]\}?)?\s*$"
)
_CHOICE_RE = re.compile(r"^(?:(?i:option|choice)\s*)?(?:\(([A-Z])\)(?:$|\s|[.:]|\\)|([A-Z])$|([A-Z])\))")
_BASED_RE = re.compile(r"^\(?([0-9A-Za-z]+)\)?\s*_\s*\{?\(?(\d{1,2})\)?\}?$")
_TEXT_RE = re.compile(r"^[A-Za-z][A-Za-z' ]*[A-Za-z.]?$")
_ARTICLES_RE = re.compile(r"^(?:the|a|an)\s+")


def _strip_units(s: str) -> str:
    for _ in range(6):
        m = _UNIT_WORD_RE.search(s) or _GLUED_UNIT_RE.search(s)
        if m is None or (m.lastindex and m.group(1).lower() in _NOT_UNITS):
            break
        prefix = s[: m.start()].rstrip()
        # Only a label on something that has a value: `5 cm`, not the word answer `east`.
        if not prefix or not re.search(r"[\d}\\)]", prefix) or prefix[-1] in "+-*/^_=":
            break
        s = prefix
    return s


def _valid_digits(digits: str, base: int) -> bool:
    if not 2 <= base <= 36:
        return False
    try:
        int(digits, base)
    except ValueError:
        return False
    return True


def _atom(s: str) -> Node:
    s = _strip_units(s).strip().rstrip(".").strip()
    if not s:
        return Raw("")
    m = _CHOICE_RE.match(s)
    if m is not None:
        return Choice(m.group(1) or m.group(2) or m.group(3))
    m = _BASED_RE.match(s)
    if m is not None and _valid_digits(m.group(1), int(m.group(2))):
        base = int(m.group(2))
        digits = m.group(1).upper().lstrip("0") or "0"
        return Scalar(digits) if base == 10 else Based(digits, base)
    if _TEXT_RE.match(s) and re.search(r"[A-Za-z]{3,}", s) and s.lower() not in ("pi", "infinity", "inf"):
        words = _ARTICLES_RE.sub("", s.lower().rstrip(".")).strip()
        return Text(re.sub(r"\s+", " ", words))
    if "\\pm" in s or "\\mp" in s:
        return _plus_minus(s)
    return Scalar(canon_scalar(s))


def _plus_minus(s: str) -> Node:
    """`1 \\pm \\sqrt{19}` is the list of both values."""
    variants = [s]
    for _ in range(2):
        nxt = []
        for v in variants:
            m = re.search(r"\\(pm|mp)(?![a-zA-Z])", v)
            if m is None:
                nxt.append(v)
                continue
            first, second = ("+", "-") if m.group(1) == "pm" else ("-", "+")
            nxt.append(v[: m.start()] + first + v[m.end() :])
            nxt.append(v[: m.start()] + second + v[m.end() :])
        variants = nxt
    if any(re.search(r"\\(pm|mp)(?![a-zA-Z])", v) for v in variants):
        return Raw(canon_scalar(s))
    return Items(tuple(Scalar(canon_scalar(v)) for v in variants))


# ---------------------------------------------------------------------------------------------
# Structure

_THOUSANDS_RE = re.compile(r"^([-+]?)(\d{1,3}(?:,\d{3})+)(\.\d+)?$")
_LABEL_PREFIX_RE = re.compile(r"^[A-Za-z]\w*\s*=\s*")
_CONNECTOR_RE = re.compile(r"\s*[,;]\s*(?:(?:and|or)\s+)?|\s+(?:and|or)\s+")
_OR_RE = re.compile(r"\bor\b")
_AND_RE = re.compile(r"\band\b")
_COMMA_RE = re.compile(r"\s*[,;]\s*")
_CUP_RE = re.compile(r"\s*\\cup(?![a-zA-Z])\s*|\s+U\s+")
_SET_BUILDER_RE = re.compile(r"\s*(?:\||\\mid(?![a-zA-Z])|:)\s*")
_EQ_RE = re.compile(r"\s*==?\s*")
_COMPARE_RE = re.compile(r"\s*(<|>|\\le(?![a-zA-Z])|\\ge(?![a-zA-Z])|\\ne(?![a-zA-Z]))\s*")
_IN_RE = re.compile(r"^([A-Za-z]|\\[a-zA-Z]+)\s*\\in(?![a-zA-Z])\s*")
_LABEL_RE = re.compile(r"^(?:[A-Za-z]+|\\[a-zA-Z]+)(?:_\{?[A-Za-z0-9]+\}?)?'*(?:\([A-Za-z,\s]*\))?$")
_VARIABLE_RE = re.compile(
    r"^(?:[A-Za-z]|\\(?:alpha|beta|gamma|theta|phi|lambda|mu|omega|rho|sigma|tau|psi))(?:_\{?[A-Za-z0-9]+\}?)?$"
)
_MATRIX_RE = re.compile(r"^\\begin\{([pbBvV]?matrix|smallmatrix|array)\}(?:\{[^{}]*\})?(.*)\\end\{\1\}$", re.DOTALL)
_NOT_LABELS = {"\\pi", "\\infty", "e", "i", "\\emptyset"}
_INF = Scalar("\\infty")
_NEG_INF = Scalar("-\\infty")


def _is_label(s: str) -> bool:
    s = s.strip()
    if s in _NOT_LABELS:
        return False
    if _LABEL_RE.match(s):
        return True
    w = _wrapped(s)
    if w is not None and w[0] in "([" and w[1].strip():
        parts = split_top(w[1], _COMMA_RE)
        return len(parts) > 1 and all(_LABEL_RE.match(p.strip()) for p in parts)
    return False


def _has_variable(s: str) -> bool:
    return re.search(r"[A-Za-z]", re.sub(r"\\[a-zA-Z]+", "", s)) is not None


def _flatten(nodes) -> tuple:
    out: list[Node] = []
    for node in nodes:
        if isinstance(node, Items):
            out.extend(node.items)
        else:
            out.append(node)
    return tuple(out)


def is_interval(node: Node) -> bool:
    return isinstance(node, Union) or (isinstance(node, Seq) and len(node.items) == 2)


def _half_line_intersection(items: tuple) -> Node | None:
    """`x > 2 and x \\le 5` is (2, 5]."""
    if len(items) != 2 or not all(isinstance(i, Seq) and len(i.items) == 2 for i in items):
        return None
    a, b = items
    if a.items[1] == _INF and b.items[0] == _NEG_INF:
        a, b = b, a
    if a.items[0] == _NEG_INF and b.items[1] == _INF and a.items[1] != _INF and b.items[0] != _NEG_INF:
        return Seq((b.items[0], a.items[1]), b.left, a.right)
    return None


_ABS_RE = re.compile(r"^\|\s*([A-Za-z])\s*(?:([-+])\s*([^|]+?))?\s*\|$")


def _absolute_inequality(terms: list[str], op: str) -> Node | None:
    """`|x - a| < c` is (a - c, a + c); `|x| \\ge c` is (-oo, -c] U [c, oo)."""
    flip = {"<": ">", ">": "<", "\\le": "\\ge", "\\ge": "\\le"}
    if op not in flip:
        return None
    m = _ABS_RE.match(terms[0])
    bound = terms[1]
    if m is None:
        m, bound, op = _ABS_RE.match(terms[1]), terms[0], flip[op]
        if m is None:
            return None
    if _has_variable(bound):
        return None
    center = "" if m.group(2) is None else ("-" if m.group(2) == "+" else "") + "(" + m.group(3) + ")"
    lo = _atom(f"{center}-({bound})") if center else _atom(f"-({bound})")
    hi = _atom(f"{center}+({bound})") if center else _atom(bound)
    closed = op in ("\\le", "\\ge")
    if op in ("<", "\\le"):
        return Seq((lo, hi), "[" if closed else "(", "]" if closed else ")")
    return Union((Seq((_NEG_INF, lo), "(", "]" if closed else ")"), Seq((hi, _INF), "[" if closed else "(", ")")))


def _inequality(s: str, parts: list[str]) -> Node:
    """`-2 \\le x < 7` -> [-2, 7); `x \\ne 3` -> (-oo, 3) U (3, oo). Anything else stays raw."""
    terms = [p.strip() for p in parts[0::2]]
    ops = [p.strip() for p in parts[1::2]]
    if len(terms) == 2:
        absolute = _absolute_inequality(terms, ops[0])
        if absolute is not None:
            return absolute
    labels = [k for k, t in enumerate(terms) if _VARIABLE_RE.match(t)]
    if len(labels) != 1 or any(not t for t in terms):
        return Raw(canon_scalar(s))
    k = labels[0]
    lo: Node = _NEG_INF
    hi: Node = _INF
    lo_closed = hi_closed = False
    flip = {"<": ">", ">": "<", "\\le": "\\ge", "\\ge": "\\le", "\\ne": "\\ne"}
    for j, op in enumerate(ops):
        if j == k:  # x op c
            bound, rel = terms[j + 1], op
        elif j + 1 == k:  # c op x  ==  x flip(op) c
            bound, rel = terms[j], flip[op]
        else:
            continue
        value = _atom(bound)
        if rel == "\\ne":
            if len(ops) != 1:
                return Raw(canon_scalar(s))
            return Union((Seq((_NEG_INF, value), "(", ")"), Seq((value, _INF), "(", ")")))
        if rel in ("<", "\\le"):
            hi, hi_closed = value, rel == "\\le"
        else:
            lo, lo_closed = value, rel == "\\ge"
    return Seq((lo, hi), "[" if lo_closed else "(", "]" if hi_closed else ")")


def _parse(s: str, depth: int) -> Node:
    """The structure of an answer: the first reading below that applies, in this order, else an atom."""
    s = s.strip().rstrip(".,;:").strip()
    if depth > MAX_DEPTH or not s:
        return Raw(s)
    for reading in (
        _as_number,
        _as_union,
        _as_items,
        _as_equation,
        _as_comparison,
        _as_matrix,
        _as_named_set,
        _as_bracketed,
    ):
        node = reading(s, depth)
        if node is not None:
            return node
    return _atom(s)


def _as_number(s: str, depth: int) -> Node | None:
    """`1,000` / `x = 1,000` (thousands separators), or what follows a leading `x \\in`."""
    m = _THOUSANDS_RE.match(_LABEL_PREFIX_RE.sub("", s, count=1))
    if m is not None:
        return Scalar(canon_scalar(m.group(1) + m.group(2).replace(",", "") + (m.group(3) or "")))
    m = _IN_RE.match(s)
    if m is not None and s[m.end() :].strip():
        return _parse(s[m.end() :], depth + 1)
    return None


def _as_union(s: str, depth: int) -> Node | None:
    parts = split_top(s, _CUP_RE)
    if len(parts) <= 1:
        return None
    if len(parts) > MAX_ITEMS:
        return Raw(s)
    return Union(tuple(_parse(p, depth + 1) for p in parts))


def _as_items(s: str, depth: int) -> Node | None:
    """Answers joined by commas / `and` / `or`: items, a union of intervals, or an intersection."""
    parts = split_top(s, _CONNECTOR_RE)
    nonempty = [p for p in parts if p.strip()]
    if len(nonempty) > 1:
        if len(nonempty) > MAX_ITEMS:
            return Raw(s)
        items = _flatten(_parse(p, depth + 1) for p in nonempty)
        if _OR_RE.search(s) and all(is_interval(i) for i in items):
            return Union(items)
        if _AND_RE.search(s) and not _OR_RE.search(s):
            both = _half_line_intersection(items)
            if both is not None:
                return both
        return Items(items)
    if len(nonempty) == 1 and len(parts) > 1:
        return _parse(nonempty[0], depth + 1)
    return None


def _as_equation(s: str, depth: int) -> Node | None:
    parts = split_top(s, _EQ_RE)
    if len(parts) <= 1:
        return None
    lhs, rhs = parts[0].strip(), parts[-1].strip()
    if _is_label(lhs) and rhs:
        return Assignment(canon_scalar(lhs), _parse(rhs, depth + 1))
    if len(parts) == 2 and _is_label(rhs) and lhs and not _has_variable(lhs):
        return Assignment(canon_scalar(rhs), _parse(lhs, depth + 1))
    if len(parts) > 2 or (rhs and not _has_variable(lhs + rhs)):
        # `2 + 3 = 5`, `a = b = 5`: a computation ending in its value.
        return _parse(rhs, depth + 1)
    if len(parts) == 2 and lhs and rhs:
        return Equation(canon_scalar(lhs), canon_scalar(rhs))
    return Raw(canon_scalar(s))


def _as_comparison(s: str, depth: int) -> Node | None:
    parts = split_top(s, _COMPARE_RE)
    if len(parts) <= 1:
        return None
    # split_top drops the separators; recover them for the chain.
    ops = [m.group(1) for m in _top_matches(s, _COMPARE_RE)]
    chain = []
    for k, term in enumerate(parts):
        chain.append(term)
        if k < len(ops):
            chain.append(ops[k])
    return _inequality(s, chain)


def _as_matrix(s: str, depth: int) -> Node | None:
    m = _MATRIX_RE.match(s)
    if m is None:
        return None
    rows = [r for r in m.group(2).split(ROW_SEP) if r.strip() and r.strip() != "\\hline"]
    if not rows or len(rows) > MAX_ITEMS:
        return Raw(s)
    return Matrix(tuple(tuple(_parse(c, depth + 1) for c in split_top(r, re.compile("&"))) for r in rows))


def _as_named_set(s: str, depth: int) -> Node | None:
    if s in ("\\emptyset", "\\{\\}"):
        return SetOf(())
    if s == "\\mathbbR" or re.match(r"^(?:all\s+)?real\s+numbers$|^all\s+reals$", s, re.IGNORECASE):
        return Seq((_NEG_INF, _INF), "(", ")")
    return None


def _as_bracketed(s: str, depth: int) -> Node | None:
    """A set `\\{...\\}` (or set-builder), a tuple or interval, `\\langle...\\rangle`, or redundant brackets."""
    w = _wrapped(s)
    if w is None:
        return None
    left, inner, right = w
    if left == "\\{" and right == "\\}":
        builder = split_top(inner, _SET_BUILDER_RE)
        if len(builder) > 1:
            # {x | x <= 2}: the set its condition describes.
            return _parse(builder[-1], depth + 1)
        items = split_top(inner, _COMMA_RE)
        return SetOf(_flatten(_parse(p, depth + 1) for p in items if p.strip()))
    if left == "\\langle" and right == "\\rangle":
        items = split_top(inner, _COMMA_RE)
        return Seq(tuple(_parse(p, depth + 1) for p in items), "(", ")")
    if left in "([" and right in ")]":
        items = split_top(inner, _COMMA_RE)
        if len(items) > 1:
            if len(items) > MAX_ITEMS:
                return Raw(s)
            return Seq(tuple(_parse(p, depth + 1) for p in items), left, right)
        if left + right in ("()", "[]"):
            # Redundant brackets; `(C)` comes out as the choice C.
            return _parse(inner, depth + 1)
    if left == "{" and right == "}":
        return _parse(inner, depth + 1)
    return None


def _top_matches(s: str, sep: re.Pattern) -> list[re.Match]:
    found = []
    depth = 0
    i = 0
    n = len(s)
    while i < n:
        if depth == 0:
            m = sep.match(s, i)
            if m is not None and m.end() > i:
                found.append(m)
                i = m.end()
                continue
        delta, length = _bracket_at(s, i)
        depth = max(0, depth + delta)
        i += length
    return found


@functools.lru_cache(maxsize=8192)
def _parse_cached(text: str) -> Node:
    return _parse(clean(text), 0)


def parse_answer(text: str) -> Node:
    """The structural form of an answer (never raises)."""
    if len(text) > MAX_ANSWER_CHARS:
        return Raw(re.sub(r"\s+", "", text))
    try:
        return _parse_cached(text)
    except RecursionError:
        return Raw(re.sub(r"\s+", "", text))
