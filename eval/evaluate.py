"""``evaluate``: generate -> grade -> metrics, for the CLI and for the trainer's periodic evaluation.

Evaluation takes a *generate function* and knows nothing about how generation happens (vLLM in
this process, a Ray group of engines inside the trainer, a fake in tests)::

    from eval.evaluate import evaluate
    from mathtask.prompts import TEMPLATES

    result = evaluate(engine.generate_fn(), problems, TEMPLATES["qwen_math_cot"], tokenizer=tok)
    result.summary["accuracy"]["mean"], result.records[0]["response"]

With ``samples_path``, every graded sample is appended to a JSONL file as soon as its chunk is
done, and a later call with the same path skips the problems already there (resume after a kill).
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from common.files import atomic_write_text
from common.progress import Progress
from eval.metrics import summarize
from mathtask.data import Problem
from mathtask.prompts import PromptTemplate


class CompletionLike(Protocol):
    """What a generate function returns per sample (``models.vllm_engine.Completion`` fits)."""

    text: str
    token_ids: Sequence[int]
    finish_reason: str


class GenerateFn(Protocol):
    """prompts -> for each prompt, ``n`` completions. ``temperature=0`` means greedy.

    ``stop`` is passed only when the template has stop strings. A completion may also be a plain
    ``str`` (then its length is counted in characters and finish_reason is "stop").
    """

    def __call__(
        self,
        prompts: list[str],
        *,
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int,
        **kwargs: Any,
    ) -> list[list[CompletionLike | str]]: ...


class GradeManyFn(Protocol):
    """``mathtask.grade.grade_many``'s signature (results have .correct, .extracted, .reason)."""

    def __call__(self, responses: Sequence[str], golds: Sequence[str], datasets: Sequence[str]) -> list[Any]: ...


class ResumeError(ValueError):
    """The samples file belongs to a different evaluation (other prompts or sample count)."""


@dataclass
class EvalResult:
    summary: dict[str, Any]
    """Metrics (see ``eval.metrics.summarize``) plus the settings that produced them."""
    records: list[dict[str, Any]] = field(repr=False)
    """One dict per sample, in problem order then sample order."""


def _default_grade_many(responses, golds, datasets):
    from mathtask.grade import grade_many

    return grade_many(responses, golds, datasets)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def read_samples(path: Path) -> list[dict[str, Any]]:
    """Records of a samples JSONL file; a torn last line (killed mid-write) is ignored."""
    if not path.exists():
        return []
    records = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # the process died while writing this line
            if line.strip():
                records.append(json.loads(line))
    return records


def _append(path: Path, records: list[dict[str, Any]]) -> None:
    with path.open("a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _rewrite(path: Path, records: list[dict[str, Any]]) -> None:
    """Atomically replace ``path`` with exactly ``records`` (drops torn lines and partial problems)."""
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def _as_completion(c: CompletionLike | str) -> tuple[str, int, str]:
    if isinstance(c, str):
        return c, len(c), "stop"
    return c.text, len(c.token_ids), c.finish_reason


def evaluate(
    generate_fn: GenerateFn,
    problems: Sequence[Problem],
    template: PromptTemplate,
    *,
    tokenizer: Any = None,
    num_samples: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    max_new_tokens: int = 1024,
    seed: int = 0,
    ks: Sequence[int] | None = None,
    samples_path: str | Path | None = None,
    chunk_size: int = 64,
    grade_many_fn: GradeManyFn | None = None,
    grader_name: str = "realm",
    other_graders: Mapping[str, GradeManyFn] | None = None,
    log: Callable[[str], None] | None = _stderr,
) -> EvalResult:
    """Generate ``num_samples`` responses per problem, grade them, and compute the metrics.

    ``tokenizer`` renders chat templates (any object with ``apply_chat_template``).
    ``chunk_size`` problems are generated at a time, in a seeded random order: the unit of progress
    reports and of resume.
    ``log`` gets progress lines (rate, ETA); None for silence.
    ``grade_many_fn`` (named ``grader_name``) decides ``correct``; each of ``other_graders`` also
    grades every sample (``correct_by`` in the records) and the summary's ``graders`` block gives
    each grader's accuracy and the fraction of samples on which all agree.
    """
    _check_arguments(problems, num_samples, temperature)
    grade_many_fn = grade_many_fn or _default_grade_many
    prompts = {p.id: template.render(p.question, tokenizer) for p in problems}
    path = Path(samples_path) if samples_path else None
    done = _resume(path, problems, prompts, num_samples, log or (lambda _: None))

    todo = _generation_order(problems, done, seed)
    gen_kwargs = _generation_kwargs(template, num_samples, temperature, top_p, max_new_tokens, seed)

    def grade(chunk: list[Problem], outs: list[list[CompletionLike | str]]) -> list[dict[str, Any]]:
        new = _graded_records(chunk, outs, prompts, num_samples, grade_many_fn)
        _grade_again(new, grader_name, other_graders or {})
        return new

    timing = _generate_in_chunks(
        generate_fn, todo, prompts, gen_kwargs, grade, chunk_size, path, done, len(problems), log
    )
    per_problem = [sorted(done[p.id], key=lambda r: r["sample_index"]) for p in problems]
    records = [r for samples in per_problem for r in samples]
    if path is not None and todo:
        _rewrite(path, records)  # finished: the file in problem order, like the records
    summary = summarize(per_problem, ks=ks, seed=seed)
    if other_graders:
        summary["graders"] = grader_agreement(records, [grader_name, *other_graders])
    summary["settings"] = _settings_record(template, gen_kwargs, grader_name)
    summary["timing"] = timing
    return EvalResult(summary=summary, records=records)


def _generation_order(problems: Sequence[Problem], done: Mapping[str, Any], seed: int) -> list[Problem]:
    """The problems not yet done, in a seeded random order.

    Why random: the problems finished when a long run is stopped are then a uniform random subset
    of the set (a valid estimate), not its first (often easiest) part. Records and metrics stay in
    problem order.
    """
    todo = [p for p in problems if p.id not in done]
    random.Random(seed).shuffle(todo)
    return todo


def _generation_kwargs(
    template: PromptTemplate, num_samples: int, temperature: float, top_p: float, max_new_tokens: int, seed: int
) -> dict[str, Any]:
    """The generate function's keyword arguments (``stop`` only when the template has stop strings)."""
    kwargs: dict[str, Any] = dict(
        n=num_samples, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed
    )
    if template.stop:
        kwargs["stop"] = list(template.stop)
    return kwargs


def _settings_record(template: PromptTemplate, gen_kwargs: Mapping[str, Any], grader_name: str) -> dict[str, Any]:
    """The summary's ``settings``: what produced the samples (top_p is 1 when greedy: it was not used)."""
    temperature = gen_kwargs["temperature"]
    return {
        "template": template.record(),
        "num_samples": gen_kwargs["n"],
        "temperature": temperature,
        "top_p": gen_kwargs["top_p"] if temperature > 0 else 1.0,
        "max_new_tokens": gen_kwargs["max_new_tokens"],
        "seed": gen_kwargs["seed"],
        "grader": grader_name,
    }


def _generate_in_chunks(
    generate_fn: GenerateFn,
    todo: list[Problem],
    prompts: Mapping[str, str],
    gen_kwargs: dict[str, Any],
    grade: Callable[[list[Problem], list[list[CompletionLike | str]]], list[dict[str, Any]]],
    chunk_size: int,
    path: Path | None,
    done: dict[str, list[dict[str, Any]]],
    num_problems: int,
    log: Callable[[str], None] | None,
) -> dict[str, Any]:
    """Generate and grade ``todo``, ``chunk_size`` problems at a time; returns the summary's ``timing``.

    Each chunk's records go to ``path`` (the unit of resume) and into ``done`` as soon as they are
    graded. The default log (stderr) gets a progress bar on a terminal, lines elsewhere; a given
    log gets lines.
    """
    progress = Progress(
        num_problems,
        "[eval]",
        unit="problem",
        initial=num_problems - len(todo),
        log=None if log is _stderr else (log or (lambda _: None)),
    )
    num_tokens = 0
    for start in range(0, len(todo), chunk_size):
        chunk = todo[start : start + chunk_size]
        new = grade(chunk, generate_fn([prompts[p.id] for p in chunk], **gen_kwargs))
        if path is not None:
            _append(path, new)
        for r in new:
            done.setdefault(r["id"], []).append(r)
        num_tokens += sum(r["num_tokens"] for r in new)
        progress.update(len(chunk), f"{num_tokens / max(progress.elapsed(), 1e-9):.0f} tokens/s")
    progress.close()
    return {
        "num_problems_generated": len(todo),
        "num_problems_resumed": num_problems - len(todo),
        "generate_and_grade_seconds": progress.elapsed(),
        "num_tokens_generated": num_tokens,
    }


def _load_done(path: Path, prompts: dict[str, str], num_samples: int) -> dict[str, list[dict[str, Any]]]:
    """Complete problems (all ``num_samples`` samples present) from an earlier run's samples file."""
    by_id: dict[str, dict[int, dict[str, Any]]] = {}
    for r in read_samples(path):
        pid = r.get("id")
        if pid not in prompts:
            continue  # a problem outside this subset: keep nothing of it
        if r.get("prompt") != prompts[pid]:
            raise ResumeError(
                f"{path}: problem {pid!r} was generated with a different prompt; "
                "use another output directory (or resume=false to start over)"
            )
        if r["sample_index"] >= num_samples:
            raise ResumeError(
                f"{path}: has sample_index {r['sample_index']} but num_samples={num_samples}; "
                "use another output directory (or resume=false to start over)"
            )
        by_id.setdefault(pid, {})[r["sample_index"]] = r
    return {pid: [s[i] for i in range(num_samples)] for pid, s in by_id.items() if len(s) == num_samples}


def _check_arguments(problems: Sequence[Problem], num_samples: int, temperature: float) -> None:
    if not problems:
        raise ValueError("no problems to evaluate")
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples}: need >= 1")
    if temperature <= 0 and num_samples > 1:
        raise ValueError(
            f"num_samples={num_samples} with temperature={temperature}: greedy samples are identical; "
            "set temperature > 0 for sampling metrics"
        )
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"problem ids must be unique (resume and reports key on them); {dup!r} repeats")


def _graded_records(
    chunk: Sequence[Problem],
    outs: Sequence[Sequence[CompletionLike | str]],
    prompts: dict[str, str],
    num_samples: int,
    grade_many_fn: GradeManyFn,
) -> list[dict[str, Any]]:
    """One record per (problem, sample) of a generated chunk, graded in one batch."""
    if len(outs) != len(chunk) or any(len(o) != num_samples for o in outs):
        raise RuntimeError(
            f"generate_fn returned {[len(o) for o in outs]} completions for {len(chunk)} prompts "
            f"x {num_samples} samples"
        )
    flat = [(p, i, *_as_completion(c)) for p, cs in zip(chunk, outs) for i, c in enumerate(cs)]
    grades = grade_many_fn([f[2] for f in flat], [f[0].answer for f in flat], [f[0].dataset for f in flat])
    records = []
    for (p, i, text, num_tokens, finish), g in zip(flat, grades):
        record = {
            "id": p.id,
            "sample_index": i,
            "question": p.question,
            "prompt": prompts[p.id],
            "response": text,
            "extracted": g.extracted,
            "correct": bool(g.correct),
            "reason": g.reason,
            "gold": p.answer,
            "dataset": p.dataset,
            "num_tokens": num_tokens,
            "finish_reason": finish,
        }
        record.update({k: p.metadata[k] for k in ("subject", "level") if k in p.metadata})
        records.append(record)
    return records


def _grade_again(records: list[dict[str, Any]], grader_name: str, other_graders: Mapping[str, GradeManyFn]) -> None:
    """Add ``correct_by`` {grader: correct} to each record: the primary grade plus each other grader's."""
    if not other_graders:
        return
    for r in records:
        r["correct_by"] = {grader_name: r["correct"]}
    for name, fn in other_graders.items():
        grades = fn([r["response"] for r in records], [r["gold"] for r in records], [r["dataset"] for r in records])
        for r, g in zip(records, grades):
            r["correct_by"][name] = bool(g.correct)


def grader_agreement(records: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Each grader's accuracy over all samples and the fraction of samples all graders agree on.

    Worked example: correct_by = {a: 1, b: 1}, {a: 1, b: 0}, {a: 0, b: 0}, {a: 0, b: 0} gives
    accuracy a 0.5, b 0.25, agreement 0.75, a_only 1 (a says correct, b not), b_only 0.
    """
    graded = [r["correct_by"] for r in records if all(n in r.get("correct_by", {}) for n in names)]
    num = len(graded)
    out: dict[str, Any] = {
        "names": list(names),
        "num_samples": num,
        "accuracy": {n: sum(g[n] for g in graded) / num if num else 0.0 for n in names},
        "agreement": sum(len({g[n] for n in names}) == 1 for g in graded) / num if num else 0.0,
    }
    if len(names) == 2:
        a, b = names
        out[f"{a}_only"] = sum(g[a] and not g[b] for g in graded)
        out[f"{b}_only"] = sum(g[b] and not g[a] for g in graded)
    return out


def _resume(
    path: Path | None,
    problems: Sequence[Problem],
    prompts: dict[str, str],
    num_samples: int,
    log: Callable[[str], None],
) -> dict[str, list[dict[str, Any]]]:
    """Finished problems from ``path`` (which is rewritten to hold exactly those), or {}."""
    if path is None:
        return {}
    done = _load_done(path, prompts, num_samples)
    _rewrite(path, [r for p in problems if p.id in done for r in done[p.id]])
    if done:
        log(f"[eval] resuming: {len(done)}/{len(problems)} problems already in {path}")
    return done
