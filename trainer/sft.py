"""Supervised warm-up on reference solutions, so that PPO starts from a policy that sometimes succeeds.

Each example is the rollout prompt (``trainer.rollout.prompt_text``: the chat template with the
generation prompt, exactly what the policy is sampled from) followed by the reference solution
and the EOS token (``<|im_end|>`` for the chat models here). Batches use the rollout layout
(``trainer/batch.py``): the solution + EOS is the "response", so ``response_mask`` is the label
mask and the loss is the mean NLL of response tokens; prompt and padding are never trained on.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from eval.data import Problem
from eval.progress import Progress
from trainer.config import RolloutConfig, TrainConfig
from trainer.rollout import pad_batch, prompt_ids, prompt_text


def sft_example(tokenizer, problem: Problem, rollout: RolloutConfig) -> tuple[list[int], list[int]]:
    """(prompt ids, solution ids + EOS) for one problem."""
    if not problem.solution:
        raise ValueError(f"problem {problem.id} has no reference solution: cannot use it for SFT")
    text = prompt_text(tokenizer, problem.question, rollout.system_prompt, rollout.prompt_suffix)
    prompt = prompt_ids(tokenizer, text, rollout.max_prompt_tokens, f"problem {problem.id}")
    response = tokenizer(problem.solution, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    return prompt, response


def sft_batches(
    problems: Sequence[Problem], tokenizer, rollout: RolloutConfig, batch_size: int, seed: int
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless batches of ``batch_size`` examples: a fresh seeded shuffle per epoch, no example
    repeated within an epoch (the last partial batch of an epoch is filled from the next one)."""
    if not problems:
        raise ValueError("SFT needs at least one problem")
    examples = [sft_example(tokenizer, p, rollout) for p in problems]
    pending: list[int] = []
    epoch = 0
    while True:
        while len(pending) < batch_size:
            order = list(range(len(examples)))
            random.Random(f"{seed}/sft/{epoch}").shuffle(order)
            pending += order
            epoch += 1
        chosen, pending = pending[:batch_size], pending[batch_size:]
        yield pad_batch([examples[i][0] for i in chosen], [examples[i][1] for i in chosen], tokenizer.pad_token_id)


def run_sft(
    cfg: TrainConfig,
    base_dir: Path,
    train: Sequence[Problem],
    out_dir: Path,
    log: Callable[[str], None] | None = None,
) -> None:
    """``cfg.sft.num_steps`` SFT steps from ``base_dir`` on ``train``; writes an HF directory to ``out_dir``.

    Runs in the calling process on one rank (the warm-up is small; the run caches its result).
    """
    from transformers import AutoTokenizer

    from trainer.workers import PolicyWorker

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    worker = PolicyWorker(model_dir=str(base_dir), dtype=cfg.model.dtype, ppo=cfg.ppo, sft=cfg.sft, seed=cfg.run.seed)
    batches = sft_batches(train, tokenizer, cfg.rollout, cfg.sft.batch_size, cfg.run.seed)
    num_steps = cfg.sft.num_steps
    recent: list[float] = []
    with Progress(num_steps, "[sft]", unit="step", every=max(1, num_steps // 10), log=log) as progress:
        for _ in range(num_steps):
            recent = [*recent[-9:], worker.sft_step(next(batches))]
            progress.update(1, f"loss {sum(recent) / len(recent):.4f}")
    worker.save_pretrained(out_dir)
