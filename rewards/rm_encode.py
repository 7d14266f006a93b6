"""Reward-model training data: examples -> token ids with read positions and labels, batches, the LM loss.

Inputs are built exactly as ``rewards.reward_model.RewardModel`` builds them when scoring, so that what
is trained is what is read.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rewards.reward_model import RMFormat, encode_with_reads, rm_input, window_ids
from rewards.rm_config import RMKind, RMTrainConfig
from rewards.rm_data import RMExample, load_examples, synthetic_examples
from rewards.segment import Step


def load_data(cfg: RMTrainConfig) -> tuple[list[RMExample], list[RMExample]]:
    """(train, held-out) examples; held-out questions never appear in training."""
    if cfg.data == "synthetic":
        return _synthetic_data(cfg)
    examples = load_examples(cfg.data, cfg.data_format)
    if cfg.heldout_data:
        return examples, load_examples(cfg.heldout_data, cfg.data_format)
    questions = sorted({ex.question for ex in examples})
    random.Random(cfg.seed).shuffle(questions)
    heldout_questions = set(questions[: max(1, int(len(questions) * cfg.heldout_fraction))])
    return (
        [ex for ex in examples if ex.question not in heldout_questions],
        [ex for ex in examples if ex.question in heldout_questions],
    )


def _grade(responses: list[str], golds: list[str]) -> list[bool]:
    from mathtask.grade import grade_many

    return [r.correct for r in grade_many(responses, golds, datasets="math")]


def _synthetic_data(cfg: RMTrainConfig) -> tuple[list[RMExample], list[RMExample]]:
    from mathtask.config import DataConfig
    from mathtask.synthetic import generate_problems, split_problems

    s = cfg.synthetic
    ppo = DataConfig()
    _, ppo_heldout = split_problems(
        ppo.synthetic_num_train, ppo.synthetic_num_heldout, seed=ppo.seed, difficulty=s.difficulty
    )
    excluded = {p.question for p in ppo_heldout}
    num_total = s.num_train_problems + s.num_heldout_problems
    problems = [
        p
        for p in generate_problems(num_total + len(excluded), seed=s.seed, difficulty=s.difficulty)
        if p.question not in excluded
    ][:num_total]
    train, heldout = problems[: s.num_train_problems], problems[s.num_train_problems :]
    return (
        synthetic_examples(train, s.seed, s.num_corrupted, s.num_junk, _grade),
        synthetic_examples(heldout, s.seed + 1, s.num_corrupted, s.num_junk, _grade),
    )


@dataclass
class Encoded:
    ids: list[int]
    reads: list[int]
    """Token positions where the score is read: one per step (PRM) or the last token (ORM)."""
    labels: list[float]
    source: str
    final_label: int
    lm_start: int | None = None
    """First response token of a correct solution (the auxiliary LM loss trains on tokens from here); else None."""
    is_last_window: bool = True
    """False for all but the last window of an input split to fit max_length: its last read is not the final one."""


def encode(cfg: RMTrainConfig, tokenizer, examples: Sequence[RMExample]) -> list[Encoded]:
    """RM inputs exactly as ``rewards.reward_model.RewardModel`` builds them when scoring: an input longer
    than ``max_length`` becomes several windows that each start with the question (``plan_windows``)."""
    out = []
    for ex in examples:
        steps = [Step(s, cfg.step_delimiter) for s in ex.steps[:-1]] + [Step(ex.steps[-1], "")]
        prefix = cfg.question_template.replace("{question}", ex.question)
        if cfg.kind == RMKind.prm:
            if ex.step_labels is None:
                raise ValueError(f"PRM training needs step labels; a {ex.source!r} example has none")
            text, read_chars = rm_input(cfg.fmt, ex.question, steps)
            labels = [float(x) for x in ex.step_labels]
        else:
            if ex.final_label is None:
                raise ValueError(f"ORM training needs final labels; a {ex.source!r} example has none")
            text, _ = rm_input(RMFormat(cfg.question_template), ex.question, [Step("".join(s.text for s in steps), "")])
            read_chars, labels = [len(text)], [float(ex.final_label)]
        ids, reads, num_kept = encode_with_reads(tokenizer, text, read_chars, len(prefix))
        if cfg.kind == RMKind.orm:
            reads = [len(ids) - 1]
        if ex.final_label is not None:
            final_label = int(ex.final_label)
        elif ex.step_labels is not None:
            final_label = int(ex.step_labels[-1])
        else:
            raise ValueError(f"a {ex.source!r} example has neither a final label nor step labels")
        windows = window_ids(ids, reads, num_kept, cfg.max_length)
        position = 0
        for w, (window, window_reads) in enumerate(windows):
            lm_start = None
            if w == 0 and is_correct_solution(ex):  # the LM loss imitates the first window's response tokens
                lm_start = num_kept if num_kept < len(window) else None
            out.append(
                Encoded(
                    window,
                    window_reads,
                    labels[position : position + len(window_reads)],
                    ex.source,
                    final_label,
                    lm_start,
                    is_last_window=w == len(windows) - 1,
                )
            )
            position += len(window_reads)
    return out


def lm_loss(reader, hidden: torch.Tensor, ids: torch.Tensor, batch: Sequence[Encoded]) -> torch.Tensor:
    """Mean next-token NLL over the response tokens of the batch's correct solutions (0 if none).

    hidden [B, L, H], ids [B, L]: position t predicts token t + 1. Read positions are left out: a
    step-tag PRM reads its good/bad logits there.
    """
    rows, cols = [], []
    for b, e in enumerate(batch):
        if e.lm_start is not None:
            positions = [t for t in range(e.lm_start - 1, len(e.ids) - 1) if t not in e.reads]
            rows += [b] * len(positions)
            cols += positions
    if not rows:
        return hidden.new_zeros(())
    rows_t, cols_t = torch.tensor(rows, device=ids.device), torch.tensor(cols, device=ids.device)
    logits = reader.lm_logits(hidden[rows_t, cols_t])  # [M, vocab]
    return torch.nn.functional.cross_entropy(logits.float(), ids[rows_t, cols_t + 1])


def collate(
    batch: Sequence[Encoded], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, mask [B, L]; rows, cols, labels [N] of every read."""
    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    rows, cols, labels = [], [], []
    for b, e in enumerate(batch):
        ids[b, : len(e.ids)] = torch.tensor(e.ids)
        mask[b, : len(e.ids)] = 1
        rows += [b] * len(e.reads)
        cols += e.reads
        labels += e.labels
    return ids, mask, torch.tensor(rows), torch.tensor(cols), torch.tensor(labels)


def is_correct_solution(ex: RMExample) -> bool:
    """Every step good and the final answer right: the text the auxiliary LM loss imitates."""
    return ex.final_label == 1 and (ex.step_labels is None or all(ex.step_labels))
