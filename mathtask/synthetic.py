"""A synthetic multi-step arithmetic task, deterministic by seed, with a difficulty knob.

Each problem is a chain of operations on a start value. The reference solution has one step per
paragraph (steps separated by a blank line) and ends with the answer in ``\\boxed{}``::

    Start with 7. Add 5, then multiply by 3, then subtract 4. What is the result?

    7 + 5 = 12

    12 * 3 = 36

    36 - 4 = 32

    The answer is \\boxed{32}.

Corrupted solutions make one arithmetic slip at step j and carry the wrong value forward
consistently; their per-step labels follow the Math-Shepherd convention (a step is good iff the
correct answer is still reachable from the prefix ending there): 1 before j, 0 from j on.
This data trains the small ORM/PRM and powers the CPU default run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from mathtask.problem import Problem

STEP_DELIMITER = "\n\n"

_OP_WORDS = {"+": "add", "-": "subtract", "*": "multiply by"}


@dataclass(frozen=True)
class Difficulty:
    """How hard a problem is: chain length and operand size."""

    num_ops: int
    max_start: int
    max_addend: int
    max_factor: int
    max_value: int
    """Intermediate values stay in [0, max_value]: keeps numbers short enough for tiny models."""


DIFFICULTIES = {
    1: Difficulty(num_ops=1, max_start=9, max_addend=9, max_factor=3, max_value=99),
    2: Difficulty(num_ops=2, max_start=20, max_addend=9, max_factor=4, max_value=99),
    3: Difficulty(num_ops=3, max_start=30, max_addend=20, max_factor=5, max_value=199),
    4: Difficulty(num_ops=4, max_start=50, max_addend=50, max_factor=9, max_value=999),
    5: Difficulty(num_ops=6, max_start=99, max_addend=99, max_factor=9, max_value=9999),
}


@dataclass(frozen=True)
class LabeledSolution:
    """A solution split into steps with one 0/1 label per step and a final-answer label."""

    steps: tuple[str, ...]
    step_labels: tuple[int, ...]
    final_label: int

    @property
    def text(self) -> str:
        return STEP_DELIMITER.join(self.steps)


def _apply(value: int, op: str, operand: int) -> int:
    if op == "+":
        return value + operand
    if op == "-":
        return value - operand
    return value * operand


def _pick_op(rng: random.Random, value: int, d: Difficulty) -> tuple[str, int]:
    """An operation that keeps the running value in [0, d.max_value]."""
    while True:
        op = rng.choice("+-*")
        if op == "*":
            operand = rng.randint(2, d.max_factor)
        else:
            operand = rng.randint(1, d.max_addend)
        if 0 <= _apply(value, op, operand) <= d.max_value:
            return op, operand


def _question(start: int, ops: list[tuple[str, int]]) -> str:
    phrases = [f"{_OP_WORDS[op]} {operand}" for op, operand in ops]
    chain = ", then ".join(phrases)
    return f"Start with {start}. {chain[0].upper()}{chain[1:]}. What is the result?"


def _steps(start: int, ops: list[tuple[str, int]], slip_at: int | None, slip: int) -> tuple[list[str], int]:
    steps, value = [], start
    for k, (op, operand) in enumerate(ops):
        result = _apply(value, op, operand)
        if k == slip_at:
            result += slip
        steps.append(f"{value} {op} {operand} = {result}")
        value = result
    steps.append(f"The answer is \\boxed{{{value}}}.")
    return steps, value


def make_problem(seed: int, index: int, difficulty: int = 2) -> tuple[Problem, list[tuple[str, int]], int]:
    """Problem number ``index`` of the stream for ``seed``; returns (problem, ops, start)."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"synthetic difficulty={difficulty}: expected one of {sorted(DIFFICULTIES)}")
    d = DIFFICULTIES[difficulty]
    rng = random.Random(f"realm-synthetic/{seed}/{difficulty}/{index}")
    start = rng.randint(1, d.max_start)
    ops, value = [], start
    for _ in range(d.num_ops):
        op, operand = _pick_op(rng, value, d)
        ops.append((op, operand))
        value = _apply(value, op, operand)
    steps, answer = _steps(start, ops, slip_at=None, slip=0)
    problem = Problem(
        id=f"synthetic-d{difficulty}-s{seed}-{index}",
        question=_question(start, ops),
        answer=str(answer),
        dataset="math",
        solution=STEP_DELIMITER.join(steps),
        metadata={"difficulty": difficulty, "num_ops": d.num_ops},
    )
    return problem, ops, start


def generate_problems(num_problems: int, seed: int = 0, difficulty: int = 2) -> list[Problem]:
    """``num_problems`` distinct problems (by question text), deterministic in (seed, difficulty)."""
    problems: list[Problem] = []
    seen: set[str] = set()
    index = 0
    while len(problems) < num_problems:
        if index > 50 * num_problems + 1000:
            raise ValueError(f"synthetic difficulty={difficulty} has fewer than {num_problems} distinct problems")
        problem, _, _ = make_problem(seed, index, difficulty)
        index += 1
        if problem.question in seen:
            continue
        seen.add(problem.question)
        problems.append(problem)
    return problems


def split_problems(
    num_train: int, num_heldout: int, seed: int = 0, difficulty: int = 2
) -> tuple[list[Problem], list[Problem]]:
    """Disjoint train and held-out sets (no question text in both)."""
    pool = generate_problems(num_train + num_heldout, seed=seed, difficulty=difficulty)
    return pool[:num_train], pool[num_train:]


def labeled_solutions(problem: Problem, seed: int, num_corrupted: int = 1) -> list[LabeledSolution]:
    """The correct solution plus ``num_corrupted`` corrupted ones, each with per-step labels.

    Labels for a slip at step j (0-based, among the K-1 arithmetic steps): steps < j are 1,
    steps >= j (including the final answer step) are 0; final_label is 0.
    """
    difficulty = int(problem.metadata["difficulty"])
    index = int(problem.id.rsplit("-", 1)[1])
    _, ops, start = make_problem(int(problem.id.split("-s")[1].split("-")[0]), index, difficulty)
    rng = random.Random(f"realm-synthetic-corrupt/{seed}/{problem.id}")
    correct_steps, _ = _steps(start, ops, slip_at=None, slip=0)
    out = [LabeledSolution(tuple(correct_steps), tuple([1] * len(correct_steps)), 1)]
    for _ in range(num_corrupted):
        slip_at = rng.randrange(len(ops))
        slip = rng.choice([-1, 1]) * rng.randint(1, 9)
        steps, _ = _steps(start, ops, slip_at=slip_at, slip=slip)
        labels = [1 if k < slip_at else 0 for k in range(len(steps))]
        out.append(LabeledSolution(tuple(steps), tuple(labels), 0))
    return out


def corpus(num_lines: int = 4000, seed: int = 12345) -> list[str]:
    """Text in the task's format (questions and solutions of every difficulty), for tokenizer training."""
    lines = []
    for k in range(num_lines):
        problem, _, _ = make_problem(seed, k, difficulty=1 + k % len(DIFFICULTIES))
        lines.append(problem.question)
        lines.append(problem.solution or "")
    return lines
