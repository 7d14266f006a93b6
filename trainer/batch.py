"""The dict-of-tensors batch that training workers consume, and how it is cut into minibatches.

Sequence layout (built by ``trainer.rollout.pad_batch``): prompts left-padded to P columns,
responses right-padded to T columns, L = P + T. Response token t of every row sits at column
P + t, so the logits that predict it are at column P + t - 1, and "the last T columns" are the
response whatever P is. Keys (a worker reads only the ones it needs):

=================  ========  ===================================================================
key                shape     meaning
=================  ========  ===================================================================
input_ids          [B, L]    prompt + response token ids, pad id on padding
attention_mask     [B, L]    1 on real tokens
position_ids       [B, L]    cumsum(attention_mask) - 1 (optional: derived if absent), so left
                             padding does not shift RoPE positions (vLLM sees no padding)
response_mask      [B, T]    1 on real response tokens (a prefix of each row)
old_logprobs       [B, T]    log pi_old(a_t | s_t) at rollout time (policy update)
advantages         [B, T]    GAE advantages, already whitened if asked (policy update)
values             [B, T]    V_old(s_t) at rollout time (critic update)
returns            [B, T]    GAE returns, the critic's targets (critic update)
=================  ========  ===================================================================

Data parallelism: the caller gives each rank an equal row slice of the global batch. Every rank
shuffles its slice with the same seeded generator and cuts it into ``num_minibatches``; global
minibatch m is the union of the ranks' m-th minibatches.
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor


def num_rows(batch: Mapping[str, Tensor]) -> int:
    return next(iter(batch.values())).shape[0]


def position_ids(batch: Mapping[str, Tensor]) -> Tensor:
    """``batch["position_ids"]`` if present, else cumsum(attention_mask) - 1 (0 on left padding), [B, L]."""
    if "position_ids" in batch:
        return batch["position_ids"]
    return (batch["attention_mask"].long().cumsum(-1) - 1).clamp(min=0)


def response_tokens(batch: Mapping[str, Tensor]) -> Tensor:
    """The response token ids: the last T columns of ``input_ids``, [B, T]."""
    T = batch["response_mask"].shape[1]
    return batch["input_ids"][:, -T:]


def select(batch: Mapping[str, Tensor], rows: Tensor) -> dict[str, Tensor]:
    """The rows ``rows`` of every tensor in ``batch``."""
    return {key: value[rows] for key, value in batch.items()}


def minibatch_rows(num_rows: int, num_minibatches: int, generator: torch.Generator) -> list[Tensor]:
    """A seeded random permutation of ``range(num_rows)`` cut into ``num_minibatches`` near-equal parts."""
    if num_rows < num_minibatches:
        raise ValueError(
            f"{num_rows} rows per rank cannot make ppo.num_minibatches={num_minibatches} minibatches: "
            "use more prompts/samples per iteration or fewer minibatches"
        )
    return list(torch.randperm(num_rows, generator=generator).tensor_split(num_minibatches))
