"""The unit every dataset loader yields: a question with its gold answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One question with its gold final answer."""

    id: str
    question: str
    answer: str
    """Gold final answer (a number for GSM8K, LaTeX for MATH)."""
    dataset: str
    """Grader policy to use: "math" or "gsm8k"."""
    solution: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    """E.g. subject and level for MATH, difficulty for the synthetic task."""
