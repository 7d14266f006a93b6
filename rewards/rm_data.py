"""Reward-model training data: labelled step-by-step solutions from files or the synthetic task.

One record is one solution: a question, its steps, per-step labels (1 = good) and/or a final label
(1 = the final answer is correct). Readers:

- realm jsonl:        {"question": str, "steps": [str], "step_labels": [0|1], "final_label": 0|1}
                      (either label field may be missing; a missing final label is the last step's)
- Math-Shepherd:      {"input": "<question> Step 1: ... ки\\nStep 2: ... ки", "label": "... +\\n... -"}
                      (the label text is the input with each step tag replaced by + or -)
- PRM800K:            {"question": {"problem": ...}, "label": {"steps": [{"completions": [{"text",
                      "rating"}], "chosen_completion": i|null, "human_completion": {...}|null}],
                      "finish_reason": ...}}; rating -1 is a bad step, 0 and 1 are good; the solution
                      stops at its first bad step; final label 1 iff finish_reason == "solution" and
                      no step is bad.

The synthetic generator (``synthetic_examples``) labels like Math-Shepherd: a step is good iff the
correct answer is still reachable from the prefix ending there. Besides the correct and corrupted
solutions of ``mathtask.synthetic`` it adds degenerate responses a policy produces (cut off, no box,
a step repeated) with the labels they naturally have; final labels of those come from the shared
grader. Nothing rewards or punishes padding on purpose.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mathtask.data import Problem, iter_jsonl

MATH_SHEPHERD_TAG = "ки"


@dataclass(frozen=True)
class RMExample:
    question: str
    steps: tuple[str, ...]
    step_labels: tuple[int, ...] | None
    """One 0/1 label per step (1 = good), or None if the source has none."""
    final_label: int | None
    """1 if the final answer is correct, or None if the source has none."""
    source: str = ""
    """What kind of solution this is (clean, corrupted, truncated, ...): accuracy is reported per kind."""

    def __post_init__(self) -> None:
        if self.step_labels is not None and len(self.step_labels) != len(self.steps):
            raise ValueError(f"{len(self.steps)} steps but {len(self.step_labels)} step labels")


class RMDataError(ValueError):
    """A training file that cannot be read; the message names the file and line."""


# ---------------------------------------------------------------------------------------------- files


def _from_realm(obj: dict[str, Any]) -> RMExample:
    steps = obj["steps"]
    if not isinstance(steps, list) or not steps or not all(isinstance(s, str) for s in steps):
        raise ValueError("'steps' must be a non-empty list of strings")
    step_labels = obj.get("step_labels")
    final = obj.get("final_label", obj.get("label"))
    if final is None:
        if step_labels is None:
            raise ValueError("needs 'step_labels' and/or 'final_label'")
        final = step_labels[-1]
    return RMExample(
        str(obj["question"]),
        tuple(steps),
        tuple(int(x) for x in step_labels) if step_labels is not None else None,
        int(final),
        obj.get("source", "file"),
    )


def _from_math_shepherd(obj: dict[str, Any], tag: str = MATH_SHEPHERD_TAG) -> RMExample:
    text, labelled = obj["input"], obj["label"]
    segments = text.split(tag)
    if len(segments) < 2:
        raise ValueError(f"no step tag {tag!r} in 'input'")
    labels, position = [], 0
    for segment in segments[:-1]:
        if labelled[position : position + len(segment)] != segment:
            raise ValueError("'label' is not 'input' with each step tag replaced by + or -")
        position += len(segment)
        mark = labelled[position : position + 1]
        if mark not in ("+", "-"):
            raise ValueError(f"expected + or - where the step tag is, found {mark!r}")
        labels.append(1 if mark == "+" else 0)
        position += 1
    first = segments[0]
    match = re.search(r"Step 1\s*:", first)
    question, first_step = (first[: match.start()], first[match.start() :]) if match else ("", first)
    steps = [first_step.strip()] + [s.strip() for s in segments[1:-1]]
    return RMExample(question.strip(), tuple(steps), tuple(labels), labels[-1], "math_shepherd")


def _from_prm800k(obj: dict[str, Any]) -> RMExample:
    question = obj["question"]["problem"]
    label = obj["label"]
    steps, step_labels = [], []
    for step in label["steps"]:
        completions = step.get("completions") or []
        if step.get("chosen_completion") is not None:
            chosen = completions[step["chosen_completion"]]
        elif step.get("human_completion"):
            chosen = step["human_completion"]
        elif completions:
            chosen = completions[0]  # no choice recorded: the step where the labeller stopped
        else:
            continue
        rating = chosen.get("rating")
        steps.append(chosen["text"])
        step_labels.append(0 if rating == -1 else 1)  # 0 (neutral) is not an error
        if rating == -1:
            break
    if not steps:
        raise ValueError("no steps")
    final = int(label.get("finish_reason") == "solution" and all(step_labels))
    return RMExample(question, tuple(steps), tuple(step_labels), final, "prm800k")


READERS: dict[str, Callable[[dict[str, Any]], RMExample]] = {
    "realm": _from_realm,
    "math_shepherd": _from_math_shepherd,
    "prm800k": _from_prm800k,
}


def detect_format(obj: dict[str, Any]) -> str:
    if "steps" in obj:
        return "realm"
    if "input" in obj and "label" in obj:
        return "math_shepherd"
    if isinstance(obj.get("question"), dict) and isinstance(obj.get("label"), dict):
        return "prm800k"
    raise ValueError(f"unknown record format (keys: {sorted(obj)}); expected realm, math_shepherd or prm800k")


def load_examples(path: str | Path, data_format: str = "auto") -> list[RMExample]:
    """Every record of a jsonl file in ``data_format`` (auto: detected per record)."""
    if data_format != "auto" and data_format not in READERS:
        raise RMDataError(f"data_format={data_format!r}: expected auto or one of {sorted(READERS)}")
    examples = []
    for lineno, obj in iter_jsonl(path, RMDataError):
        try:
            examples.append(READERS[detect_format(obj) if data_format == "auto" else data_format](obj))
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise RMDataError(f"{path}:{lineno}: {type(e).__name__}: {e}") from None
    if not examples:
        raise RMDataError(f"{path}: no records")
    return examples


def write_examples(path: str | Path, examples: Sequence[RMExample]) -> None:
    """The realm jsonl format (what ``load_examples`` reads back)."""
    with Path(path).open("w", encoding="utf-8") as f:
        for ex in examples:
            f.write(
                json.dumps(
                    {
                        "question": ex.question,
                        "steps": list(ex.steps),
                        "step_labels": list(ex.step_labels or []) or None,
                        "final_label": ex.final_label,
                        "source": ex.source,
                    }
                )
                + "\n"
            )


# ------------------------------------------------------------------------------------------ synthetic

GradeFn = Callable[[list[str], list[str]], list[bool]]
"""(responses, golds) -> correct? per response: the shared grader in training, a stub in some tests."""


def _junk(
    rng: random.Random, steps: list[str], labels: list[int], answer: str
) -> tuple[str, list[str], list[int], bool]:
    """One degenerate variant of a solution: (kind, steps, step labels, has a final-answer step).

    The last step of ``steps`` is the answer line; the others are arithmetic.
    """
    num_arith = len(steps) - 1
    kind = rng.choice(["truncated", "no_box", "repeated"])
    if kind == "truncated" and num_arith >= 1:  # generation cut off at a step boundary: no answer line
        keep = rng.randint(1, num_arith)
        return kind, steps[:keep], labels[:keep], False
    if kind == "no_box":  # the right number for this solution, not in \boxed{}
        value = re.search(r"\\boxed\{([^}]*)\}", steps[-1])
        return kind, steps[:-1] + [f"The answer is {value.group(1) if value else answer}."], labels, True
    # A step said again right after itself: the copy has the label of the step it repeats.
    k = rng.randrange(max(num_arith, 1))
    copies = rng.randint(1, 3)
    return (
        "repeated",
        steps[: k + 1] + [steps[k]] * copies + steps[k + 1 :],
        labels[: k + 1] + [labels[k]] * copies + labels[k + 1 :],
        True,
    )


def synthetic_examples(
    problems: Sequence[Problem], seed: int, num_corrupted: int, num_junk: int, grade: GradeFn
) -> list[RMExample]:
    """Per problem: the correct solution, ``num_corrupted`` corrupted ones, ``num_junk`` degenerate ones.

    Degenerate responses start from the correct or a corrupted solution; their final label is the
    grader's verdict, and a final-answer step is labelled like the final answer (Math-Shepherd: the
    completion from there is the response itself).
    """
    from mathtask.synthetic import labeled_solutions

    rng = random.Random(f"realm-rm-junk/{seed}")
    examples: list[RMExample] = []
    pending: list[tuple[Problem, str, list[str], list[int], bool]] = []
    for problem in problems:
        solutions = labeled_solutions(problem, seed, num_corrupted)
        for i, sol in enumerate(solutions):
            examples.append(
                RMExample(
                    problem.question, sol.steps, sol.step_labels, sol.final_label, "clean" if i == 0 else "corrupted"
                )
            )
        for _ in range(num_junk):
            base = rng.choice(solutions)
            kind, steps, labels, has_answer = _junk(rng, list(base.steps), list(base.step_labels), problem.answer)
            pending.append((problem, kind, steps, labels, has_answer))
    if pending:
        from mathtask.synthetic import STEP_DELIMITER

        verdicts = grade([STEP_DELIMITER.join(p[2]) for p in pending], [p[0].answer for p in pending])
        for (problem, kind, steps, labels, has_answer), correct in zip(pending, verdicts):
            if has_answer:
                labels = labels[:-1] + [int(correct)]
            examples.append(RMExample(problem.question, tuple(steps), tuple(labels), int(correct), kind))
    return examples
