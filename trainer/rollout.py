"""Prompts in, sampled responses out, and the padded tensors every model call shares.

Sequence layout (verl/OpenRLHF convention): prompts are left-padded to P, responses right-padded
to T, so response token j of every row sits at column P + j and its logprob is read from the
logits at column P + j - 1::

    input_ids      [B, P + T]   <pad><pad> prompt... | response... <pad>
    attention_mask [B, P + T]   0 on padding
    position_ids   [B, P + T]   cumsum(attention_mask) - 1, so left padding does not shift positions
    response_mask  [B, T]       1 on real response tokens
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mathtask.data import Problem
from mathtask.prompts import PromptTemplate

if TYPE_CHECKING:
    from models.vllm_engine import Completion


@dataclass
class Rollout:
    problem: Problem
    prompt_ids: list[int]
    prompt_text: str
    completion: Completion


def rollout_template(system_prompt: str = "", prompt_suffix: str = "") -> PromptTemplate:
    """The chat prompt the policy is trained on; held-out evaluation renders the same one."""
    user = "{question}" if not prompt_suffix else "{question}\n" + prompt_suffix
    return PromptTemplate(name="rollout", system=system_prompt, user=user)


def prompt_text(tokenizer, question: str, system_prompt: str = "", prompt_suffix: str = "") -> str:
    return rollout_template(system_prompt, prompt_suffix).render(question, tokenizer)


def prompt_ids(tokenizer, text: str, max_prompt_tokens: int, where: str) -> list[int]:
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) > max_prompt_tokens:
        raise ValueError(f"{where}: prompt has {len(ids)} tokens > rollout.max_prompt_tokens={max_prompt_tokens}")
    return ids


def iteration_problems(problems: Sequence[Problem], iteration: int, num_prompts: int, seed: int) -> list[Problem]:
    """The prompts of ``iteration``: a fresh seeded permutation per epoch, so order depends only on
    (seed, iteration) and a resumed run sees exactly the prompts the uninterrupted run would."""
    num = len(problems)
    out = []
    for pos in range(iteration * num_prompts, (iteration + 1) * num_prompts):
        epoch, offset = divmod(pos, num)
        order = list(range(num))
        random.Random(f"{seed}/{epoch}").shuffle(order)
        out.append(problems[order[offset]])
    return out


def pad_batch(prompts: Sequence[list[int]], responses: Sequence[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-pad prompts, right-pad responses; see the module docstring for the layout."""
    assert len(prompts) == len(responses) and prompts
    num_prompt_cols = max(len(p) for p in prompts)
    num_response_cols = max(1, max(len(r) for r in responses))
    B = len(prompts)
    input_ids = torch.full((B, num_prompt_cols + num_response_cols), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros((B, num_response_cols), dtype=torch.float32)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        input_ids[b, num_prompt_cols - len(p) : num_prompt_cols] = torch.tensor(p)
        attention_mask[b, num_prompt_cols - len(p) : num_prompt_cols] = 1
        if r:
            input_ids[b, num_prompt_cols : num_prompt_cols + len(r)] = torch.tensor(r)
            attention_mask[b, num_prompt_cols : num_prompt_cols + len(r)] = 1
            response_mask[b, : len(r)] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
    }


def prompt_groups(rollouts: Sequence[Rollout]) -> torch.Tensor:
    """Each rollout's prompt group, [B] long: the responses to one problem share an id (0, 1, ... in order of
    first appearance). Worked example: problems a, a, b, b, a -> [0, 0, 1, 1, 0]."""
    ids: dict[str, int] = {}
    return torch.tensor([ids.setdefault(x.problem.id, len(ids)) for x in rollouts], dtype=torch.long)
