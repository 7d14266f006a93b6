"""Problems from local GSM8K / MATH copies, jsonl/parquet files, HF dataset ids, or the synthetic task.

Every loader returns ``list[Problem]``. Built-in names:

=============  =========================================================================
name           what
=============  =========================================================================
gsm8k          GSM8K test (1,319), ``data/gsm8k/test.jsonl``
gsm8k_train    GSM8K train (7,473), ``data/gsm8k/train.jsonl``
math500        MATH-500 (PRM800K test split), ``data/math/math500_test.jsonl``
math           full MATH test (5,000), ``data/math/test5000.jsonl``
math_train     the 4,500 MATH test problems not in MATH-500 (the PRM800K convention)
synthetic      the synthetic arithmetic task (``mathtask.synthetic``), train or held-out split
=============  =========================================================================

Anything else is a path to a ``.jsonl``/``.json``/``.parquet`` file (fields are detected:
question|problem, answer|solution) or ``hf:<dataset id>[:<split>]`` (needs a reachable hub).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mathtask.problem import Problem
from mathtask.synthetic import split_problems

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


class DataError(ValueError):
    """A data file or dataset name that cannot be loaded; the message names the file and line."""


def last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}``/``\\fbox{...}`` in ``text`` (brace-matched), or None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def _gsm8k_answer(solution: str) -> str:
    return solution.rsplit("####", 1)[1].strip()


def _record_to_problem(obj: dict[str, Any], where: str, default_id: str) -> Problem:
    """Map the known schemas (GSM8K, MATH-500, MATH test, our own) to a Problem."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    question = obj.get("question", obj.get("problem"))
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: missing or empty 'question'/'problem' field (keys: {sorted(obj)})")
    solution = obj.get("solution")
    metadata: dict[str, Any] = {}
    if "subject" in obj or "type" in obj:
        metadata["subject"] = obj.get("subject", obj.get("type"))
    if "level" in obj:
        level = obj["level"]
        m = re.fullmatch(r"(?:Level\s*)?(\d+)", str(level).strip())
        metadata["level"] = int(m.group(1)) if m else level  # "Level 3" -> 3; "Level ?" stays
    answer = obj.get("answer")
    dataset = obj.get("dataset")
    if isinstance(answer, str) and "####" in answer:
        # GSM8K: `answer` is the worked solution ending in `#### N`.
        solution, answer, dataset = answer, _gsm8k_answer(answer), dataset or "gsm8k"
    elif answer is None and isinstance(solution, str):
        answer = last_boxed(solution)
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        raise DataError(f"{where}: no gold answer (no 'answer' field and no \\boxed{{}} in 'solution')")
    pid = obj.get("id", obj.get("unique_id", obj.get("idx", default_id)))
    extra = obj.get("metadata")
    if isinstance(extra, dict):
        metadata.update(extra)
    return Problem(
        id=str(pid),
        question=question,
        answer=str(answer).strip(),
        dataset=dataset or "math",
        solution=solution if isinstance(solution, str) else None,
        metadata=metadata,
    )


def iter_jsonl(path: str | Path, error: type[Exception] = DataError) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for every non-blank line; a missing file or a malformed line
    raises ``error`` naming ``path:line``."""
    path = Path(path)
    if not path.exists():
        raise error(f"{path}: no such file")
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
            yield lineno, obj


def load_jsonl(path: str | Path) -> list[Problem]:
    path = Path(path)
    problems = [
        _record_to_problem(obj, f"{path}:{lineno}", f"{path.stem}-{lineno}") for lineno, obj in iter_jsonl(path)
    ]
    if not problems:
        raise DataError(f"{path}: file has no records")
    return problems


def _load_table(path: Path) -> list[Problem]:
    if path.suffix == ".json":
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None
        if not isinstance(rows, list):
            raise DataError(f"{path}: expected a JSON list of records")
    else:
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    if not rows:
        raise DataError(f"{path}: file has no records")
    return [_record_to_problem(r, f"{path}: record {i}", f"{path.stem}-{i}") for i, r in enumerate(rows)]


def _load_hf(spec: str) -> list[Problem]:
    import datasets

    name, _, split = spec.partition(":")
    try:
        ds = datasets.load_dataset(name, split=split or "test")
    except Exception as e:  # noqa: BLE001 - offline or unknown id: say which and why
        raise DataError(f"hf:{spec}: could not load the HF dataset ({type(e).__name__}: {e})") from None
    return [_record_to_problem(dict(r), f"hf:{spec} row {i}", f"{name}-{i}") for i, r in enumerate(ds)]


def _math_train() -> list[Problem]:
    heldout = {p.question for p in load_jsonl(DATA_DIR / "math" / "math500_test.jsonl")}
    return [p for p in load_jsonl(DATA_DIR / "math" / "test5000.jsonl") if p.question not in heldout]


BUILTIN = {
    "gsm8k": lambda: load_jsonl(DATA_DIR / "gsm8k" / "test.jsonl"),
    "gsm8k_train": lambda: load_jsonl(DATA_DIR / "gsm8k" / "train.jsonl"),
    "math500": lambda: load_jsonl(DATA_DIR / "math" / "math500_test.jsonl"),
    "math": lambda: load_jsonl(DATA_DIR / "math" / "test5000.jsonl"),
    "math_train": _math_train,
}


def load_problems(
    name: str,
    *,
    limit: int = 0,
    seed: int = 0,
    synthetic_split: str = "train",
    synthetic_num_train: int = 2000,
    synthetic_num_heldout: int = 200,
    synthetic_difficulty: int = 2,
) -> list[Problem]:
    """Problems for a built-in name, a file path, or ``hf:<id>[:<split>]``.

    ``limit`` > 0 keeps a fixed-seed random subset of that size (in original order).
    """
    if name == "synthetic":
        train, heldout = split_problems(
            synthetic_num_train, synthetic_num_heldout, seed=seed, difficulty=synthetic_difficulty
        )
        if synthetic_split not in ("train", "heldout"):
            raise DataError(f"synthetic split {synthetic_split!r}: expected 'train' or 'heldout'")
        problems = train if synthetic_split == "train" else heldout
    elif name in BUILTIN:
        problems = BUILTIN[name]()
    elif name.startswith("hf:"):
        problems = _load_hf(name[3:])
    else:
        path = Path(name)
        if path.suffix == ".jsonl":
            problems = load_jsonl(path)
        elif path.suffix in (".json", ".parquet"):
            if not path.exists():
                raise DataError(f"{path}: no such file")
            problems = _load_table(path)
        else:
            known = ", ".join(sorted([*BUILTIN, "synthetic"]))
            raise DataError(
                f"unknown dataset {name!r}: expected one of {known}, a .jsonl/.json/.parquet path, or hf:<id>"
            )
    if limit and limit < len(problems):
        keep = sorted(random.Random(seed).sample(range(len(problems)), limit))
        problems = [problems[i] for i in keep]
    return problems
