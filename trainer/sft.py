"""Supervised warm-up on reference solutions, so that PPO starts from a policy that sometimes succeeds.

Each example is the rollout prompt (``trainer.rollout.prompt_text``: the chat template with the
generation prompt, exactly what the policy is sampled from) followed by the reference solution
and the EOS token (``<|im_end|>`` for the chat models here). Batches use the rollout layout
(``ppo/batch.py``): the solution + EOS is the "response", so ``response_mask`` is the label
mask and the loss is the mean NLL of response tokens; prompt and padding are never trained on.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from common.files import atomic_write_text
from common.progress import Progress
from mathtask.data import Problem
from ppo.config import SFTConfig
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


def greedy_success(
    model, tokenizer, problems: Sequence[Problem], rollout: RolloutConfig, batch_size: int = 64
) -> float:
    """Fraction of ``problems`` whose greedy completion (HF ``generate``, at most ``rollout.max_new_tokens``
    new tokens, from the rollout prompt) grades correct."""
    from mathtask.grade import grade_many

    was_training = model.training
    model.eval()
    responses: list[str] = []
    try:
        for i in range(0, len(problems), batch_size):
            chunk = problems[i : i + batch_size]
            prompts = [
                prompt_ids(
                    tokenizer,
                    prompt_text(tokenizer, p.question, rollout.system_prompt, rollout.prompt_suffix),
                    rollout.max_prompt_tokens,
                    f"problem {p.id}",
                )
                for p in chunk
            ]
            width = max(len(p) for p in prompts)
            input_ids = torch.full((len(prompts), width), tokenizer.pad_token_id, dtype=torch.long)
            attention_mask = torch.zeros_like(input_ids)
            for row, ids in enumerate(prompts):
                input_ids[row, width - len(ids) :] = torch.tensor(ids)
                attention_mask[row, width - len(ids) :] = 1
            with torch.no_grad():
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    max_new_tokens=rollout.max_new_tokens,
                    do_sample=False,
                    eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id,
                )
            responses += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    finally:
        model.train(was_training)
    grades = grade_many(responses, [p.answer for p in problems], [p.dataset for p in problems])
    return sum(g.correct for g in grades) / len(grades)


def split_check_problems(train: Sequence[Problem], sft: SFTConfig) -> tuple[list[Problem], list[Problem]]:
    """(problems to train on, problems to check the warm-up on): the last ``sft.num_check_problems``
    are held back when the warm-up has a target, so its stopping point is not judged on what it fits."""
    if sft.target_success <= 0:
        return list(train), []
    if sft.num_check_problems >= len(train):
        raise ValueError(
            f"sft.num_check_problems={sft.num_check_problems} leaves nothing to train on "
            f"({len(train)} training problems): lower it or set sft.target_success=0"
        )
    return list(train[: -sft.num_check_problems]), list(train[-sft.num_check_problems :])


def run_sft(
    cfg: TrainConfig,
    base_dir: Path,
    train: Sequence[Problem],
    out_dir: Path,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """SFT from ``base_dir`` on ``train``; writes an HF directory and ``sft.json`` (steps trained, checks)
    to ``out_dir`` and returns that record.

    ``cfg.sft.num_steps`` steps, or fewer with ``cfg.sft.target_success``: every ``check_every`` steps
    greedy success on the held-back check problems, stopping at the first that reaches the target.
    Runs in the calling process on one rank (the warm-up is small; the run caches its result).
    """
    from transformers import AutoTokenizer

    from runtime.device.shards import PolicyShard

    sft = cfg.sft
    say = log or (lambda _: None)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    worker = PolicyShard(model_dir=str(base_dir), dtype=cfg.model.dtype, ppo=cfg.ppo, sft=sft, seed=cfg.run.seed)
    fit, check = split_check_problems(train, sft)
    batches = sft_batches(fit, tokenizer, cfg.rollout, sft.batch_size, cfg.run.seed)
    record: dict[str, Any] = {"num_steps": 0, "target_success": sft.target_success, "checks": []}
    recent: list[float] = []
    with Progress(sft.num_steps, "[sft]", unit="step", every=max(1, sft.num_steps // 10), log=log) as progress:
        for step in range(1, sft.num_steps + 1):
            recent = [*recent[-9:], worker.sft_step(next(batches))]
            progress.update(1, f"loss {sum(recent) / len(recent):.4f}")
            record["num_steps"] = step
            if check and step % sft.check_every == 0:
                success = greedy_success(worker.model, tokenizer, check, cfg.rollout)
                record["checks"].append({"step": step, "success": success})
                say(f"[sft] step {step}: greedy success {success:.3f} on {len(check)} held-back training problems")
                if success >= sft.target_success:
                    break
    if check and record["checks"] and record["checks"][-1]["success"] < sft.target_success:
        say(f"[sft] target {sft.target_success} not reached in sft.num_steps={sft.num_steps}; using the last step")
    worker.save_pretrained(out_dir)
    atomic_write_text(out_dir / "sft.json", json.dumps(record, indent=1) + "\n")
    return record
