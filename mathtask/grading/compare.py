"""Comparison of parsed answers (see `normalize`) under the grading policy.

The structure rules live here; the value of a single scalar or equation is decided by a
`ScalarOps`. `FAST_OPS` decides only what plain rational arithmetic can (and raises
`NeedSympy` otherwise), so a comparison runs first in the caller's process and goes to a
worker with sympy only when it must.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mathtask.grading.exact import exact_value
from mathtask.grading.normalize import (
    MAX_ITEMS,
    Assignment,
    Based,
    Choice,
    Equation,
    Items,
    Matrix,
    Node,
    Raw,
    Scalar,
    Seq,
    SetOf,
    Text,
    Union,
    parse_answer,
)


class NeedSympy(Exception):
    """The fast path cannot decide this comparison."""


@dataclass(frozen=True)
class ScalarOps:
    scalar: Callable[[str, str], bool]
    equation: Callable[[str, str, str, str], bool]


def fast_scalar(gold: str, answer: str) -> bool:
    if gold == answer:
        return True
    g = exact_value(gold)
    if g is not None:
        a = exact_value(answer)
        if a is not None:
            return g == a
    raise NeedSympy


def fast_equation(g_lhs: str, g_rhs: str, a_lhs: str, a_rhs: str) -> bool:
    if (g_lhs, g_rhs) in ((a_lhs, a_rhs), (a_rhs, a_lhs)):
        return True
    raise NeedSympy


FAST_OPS = ScalarOps(fast_scalar, fast_equation)


def _single(node: Node) -> Node:
    """A one-element list or union is its element."""
    for _ in range(8):
        if isinstance(node, (Items, Union)):
            items = node.items if isinstance(node, Items) else node.parts
            if len(items) == 1:
                node = items[0]
                continue
        return node
    return node


def _flat(items: tuple) -> tuple:
    out: list[Node] = []
    for item in items:
        if isinstance(item, Items):
            out.extend(item.items)
        else:
            out.append(item)
    return tuple(out)


def _is_vector(m: Matrix) -> tuple | None:
    if len(m.rows) == 1:
        return m.rows[0]
    if all(len(r) == 1 for r in m.rows):
        return tuple(r[0] for r in m.rows)
    return None


def _ordered(gs: tuple, as_: tuple, ops: ScalarOps) -> bool:
    return len(gs) == len(as_) and all(nodes_equal(g, a, ops) for g, a in zip(gs, as_))


def _unordered(gs: tuple, as_: tuple, ops: ScalarOps) -> bool:
    """Equal as sets: every gold item is answered and every answered item is in the gold."""
    gs, as_ = _flat(gs), _flat(as_)
    if not gs or not as_:
        return not gs and not as_
    if len(gs) > MAX_ITEMS or len(as_) > MAX_ITEMS:
        return gs == as_
    matched_answers = set()
    pending: NeedSympy | None = None
    for g in gs:
        found = False
        for j, a in enumerate(as_):
            try:
                if nodes_equal(g, a, ops):
                    matched_answers.add(j)
                    found = True
            except NeedSympy as e:
                pending = e
        if not found and pending is None:
            return False
    if pending is not None:
        raise pending
    return len(matched_answers) == len(as_)


def _interval_parts(node: Node) -> tuple | None:
    if isinstance(node, Union):
        return node.parts
    if isinstance(node, Seq) and len(node.items) == 2:
        return (node,)
    return None


def _text_key(node: Node) -> str | None:
    if isinstance(node, Text):
        return node.words.replace(" ", "")
    if isinstance(node, Scalar):
        return node.latex.lower()
    return None


def nodes_equal(gold: Node, answer: Node, ops: ScalarOps) -> bool:
    """Whether ``answer`` states ``gold`` under the grading policy.

    Kept whole: it is one ordered table of cases over the pair of node kinds, and the
    order is the policy (an assignment is unwrapped before sets, sets before sequences, ...); split
    up, the order would be spread over several functions.
    """
    g, a = _single(gold), _single(answer)

    # `x = 5` answers `5`; `y = 2x + 3` and `2x - y + 3 = 0` are the same line.
    if isinstance(g, Assignment) and isinstance(a, Assignment):
        return nodes_equal(g.value, a.value, ops)
    if isinstance(g, Assignment) and isinstance(a, Equation):
        return isinstance(g.value, Scalar) and ops.equation(g.lhs, g.value.latex, a.lhs, a.rhs)
    if isinstance(a, Assignment) and isinstance(g, Equation):
        return isinstance(a.value, Scalar) and ops.equation(g.lhs, g.rhs, a.lhs, a.value.latex)
    if isinstance(g, Assignment):
        return nodes_equal(g.value, a, ops)
    if isinstance(a, Assignment):
        return nodes_equal(g, a.value, ops)

    if isinstance(g, Raw) or isinstance(a, Raw):
        return isinstance(g, Raw) and isinstance(a, Raw) and g.text == a.text
    if isinstance(g, Choice):
        return isinstance(a, Choice) and a.letter == g.letter
    if isinstance(g, Text):
        return _text_key(a) == _text_key(g)
    if isinstance(g, Based):
        if isinstance(a, Based):
            return a.base == g.base and a.digits == g.digits
        return isinstance(a, Scalar) and (a.latex.upper().lstrip("0") or "0") == g.digits
    if isinstance(a, Based):
        # Digits in another base than the gold's: only the same digit string can match.
        return isinstance(g, Scalar) and (g.latex.upper().lstrip("0") or "0") == a.digits

    if isinstance(g, Scalar):
        if isinstance(a, Scalar):
            return ops.scalar(g.latex, a.latex)
        if isinstance(a, SetOf) and len(a.items) == 1:
            return nodes_equal(g, a.items[0], ops)
        if isinstance(a, Text):
            return _text_key(a) == _text_key(g)
        return False

    if isinstance(g, Equation):
        return isinstance(a, Equation) and ops.equation(g.lhs, g.rhs, a.lhs, a.rhs)

    if isinstance(g, Seq):
        if isinstance(a, Seq):
            return (a.left, a.right) == (g.left, g.right) and _ordered(g.items, a.items, ops)
        if isinstance(a, Union):
            return False
        if isinstance(a, Items):
            # A point written without its parentheses keeps its order.
            return (g.left, g.right) == ("(", ")") and _ordered(g.items, a.items, ops)
        if isinstance(a, Matrix):
            vec = _is_vector(a)
            return vec is not None and (g.left, g.right) == ("(", ")") and _ordered(g.items, vec, ops)
        return False

    if isinstance(g, (SetOf, Items)):
        if isinstance(a, (SetOf, Items)):
            return _unordered(g.items, a.items, ops)
        if isinstance(a, Seq) and isinstance(g, Items):
            return (a.left, a.right) == ("(", ")") and _ordered(g.items, a.items, ops)
        if isinstance(g, SetOf) and len(g.items) == 1:
            return nodes_equal(g.items[0], a, ops)
        return False

    if isinstance(g, Union):
        parts = _interval_parts(a)
        return parts is not None and _unordered(g.parts, parts, ops)

    if isinstance(g, Matrix):
        if isinstance(a, Matrix):
            return len(a.rows) == len(g.rows) and all(_ordered(gr, ar, ops) for gr, ar in zip(g.rows, a.rows))
        vec = _is_vector(g)
        if vec is not None and isinstance(a, (Seq, Items)):
            if isinstance(a, Seq) and (a.left, a.right) != ("(", ")"):
                return False
            return _ordered(vec, a.items, ops)
        return False
    return False


def judge(answer: str, gold: str, ops: ScalarOps) -> bool:
    return nodes_equal(parse_answer(gold), parse_answer(answer), ops)
