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

Data parallelism: inference calls give each rank an equal row slice of the global batch. A PPO
update orders the rows first (``update_rows``): the global batch is shuffled once per epoch and
cut into ``num_minibatches`` global minibatches, and each of those into one equal share per rank.
Rank r receives its shares in (epoch, minibatch) order and steps through them, so the minibatches
(and so the optimization) are the same whatever the number of ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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


def update_rows(
    num_rows: int, num_epochs: int, num_minibatches: int, num_ranks: int, seed: int
) -> tuple[list[Tensor], list[list[int]]]:
    """The rows each rank trains on in one PPO update, and the size of each of its parts.

    Epoch e shuffles ``range(num_rows)`` (generator seeded with ``seed + e``), cuts it into
    ``num_minibatches`` near-equal global minibatches, and each minibatch into ``num_ranks``
    near-equal shares. Returns ``rows[r]`` (about num_epochs * num_rows / num_ranks row ids: rank
    r's shares concatenated in (epoch, minibatch) order) and ``part_sizes[r]`` (the size of each
    share; every rank steps through num_epochs * num_minibatches parts). Example: 8 rows, 1 epoch,
    2 minibatches, 2 ranks: a permutation [5 1 7 0 | 2 6 4 3] gives rank 0 rows [5 1 2 6] and rank
    1 rows [7 0 4 3], parts [2, 2] each.
    """
    if num_rows < num_minibatches * num_ranks:
        raise ValueError(
            f"{num_rows} rows cannot make ppo.num_minibatches={num_minibatches} minibatches over {num_ranks} "
            "data-parallel ranks: use more prompts/samples per iteration or fewer minibatches/ranks"
        )
    per_rank: list[list[Tensor]] = [[] for _ in range(num_ranks)]
    sizes: list[list[int]] = [[] for _ in range(num_ranks)]
    for epoch in range(num_epochs):
        generator = torch.Generator().manual_seed(seed + epoch)
        for minibatch in torch.randperm(num_rows, generator=generator).tensor_split(num_minibatches):
            for rank, share in enumerate(minibatch.tensor_split(num_ranks)):
                per_rank[rank].append(share)
                sizes[rank].append(len(share))
    return [torch.cat(parts) for parts in per_rank], sizes


def update_seed(seed: int, num_updates: int) -> int:
    """The ``update_rows`` seed of a model's ``num_updates``-th update (resumed runs shuffle the same way)."""
    return seed * 1_000_003 + num_updates * 1_009


def trim_padding(batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The same rows without the columns that are padding in every row.

    Drops the leading prompt columns where ``attention_mask`` is 0 in every row and the trailing
    response columns where ``response_mask`` is 0 in every row (at least one response column is
    kept). [B, L] tensors lose both ends, [B, T] tensors the trailing end, anything else is kept as
    it is. A model computes the same thing for every real token either way: the dropped columns are
    masked out of attention and of every loss, and positions come from ``position_ids`` (sliced,
    or derived from the sliced mask, which left padding does not shift). What changes is the work:
    a minibatch whose longest prompt and longest response are shorter than the whole batch's costs
    less. Example: prompts of 2 and 3 tokens left-padded to P = 5 and responses of 1 and 2 tokens
    right-padded to T = 4 give L = 9 -> 5 columns (3 prompt, 2 response) and T = 4 -> 2.
    """
    mask_BL, mask_BT = batch["attention_mask"], batch["response_mask"]
    L, T = mask_BL.shape[1], mask_BT.shape[1]
    prompt_cols = mask_BL[:, : L - T].any(dim=0).nonzero()
    first = int(prompt_cols[0]) if len(prompt_cols) else L - T
    response_cols = mask_BT.any(dim=0).nonzero()
    num_kept = int(response_cols[-1]) + 1 if len(response_cols) else 1
    if first == 0 and num_kept == T:
        return dict(batch)
    end = L - T + num_kept
    out = {}
    for key, value in batch.items():
        if value.dim() >= 2 and value.shape[1] == L:
            out[key] = value[:, first:end]
        elif value.dim() >= 2 and value.shape[1] == T:
            out[key] = value[:, :num_kept]
        else:
            out[key] = value
    return out


def microbatch_rows(batch: Mapping[str, Tensor], num_microbatches: int) -> list[Tensor]:
    """Row indices of ``num_microbatches`` micro-batches of ``batch`` (at most one per row) that
    group rows of similar length, so that ``trim_padding`` cuts each to its own longest row.

    Rows are sorted by response length, then prompt length, longest first (ties keep their order),
    and cut into contiguous runs of (almost) equal size. The micro-batches together hold every row
    once, so a gradient accumulated over them, or outputs put back in row order, are those of one
    pass over the batch; only the padding computed on changes. One micro-batch: the rows in order.
    Example: response lengths 1, 4, 2, 3 in 2 micro-batches -> rows [1, 3] and [2, 0], trimmed to 4 and
    2 response columns instead of 4 and 4.
    """
    n = num_rows(batch)
    if num_microbatches <= 1 or n <= 1:
        return [torch.arange(n)]
    mask_BL, mask_BT = batch["attention_mask"], batch["response_mask"]
    response_len = mask_BT.sum(dim=1)
    prompt_len = mask_BL.sum(dim=1) - response_len
    key = response_len * (mask_BL.shape[1] + 1) + prompt_len
    order = torch.argsort(key, descending=True, stable=True)
    return list(order.tensor_split(min(num_microbatches, n)))


MICROBATCH_OVERHEAD_TOKENS = 64
"""The fixed cost of one more forward/backward pass, in tokens' worth of compute, measured on one core
(``bench/forward_cost.py``, docs/bench/forward_cost_smollm2.json): SmolLM2-135M's 1-row micro-batches of
118 tokens cost 2.47 ms per token forward and 8.94 forward + backward, 16-row ones 1.90 and 6.10, so a pass
costs about 35-55 tokens' worth more."""


def throughput_microbatches(
    batch: Mapping[str, Tensor], num_microbatches: int, overhead_tokens: int = MICROBATCH_OVERHEAD_TOKENS
) -> int:
    """How many micro-batches ``microbatch_rows`` should cut ``batch`` into: the count k >= num_microbatches
    (at most one per row, at most max(num_microbatches, 64)) with the least work, work being the tokens the
    micro-batches compute on after ``trim_padding`` (rows x (longest prompt + longest response)) plus
    ``overhead_tokens`` per micro-batch. ``num_microbatches`` is the plan's (a memory bound); more only pay
    where rows differ in length.

    Example: response lengths 200, 10, 10, 10 after 5-token prompts, k >= 1: one micro-batch computes
    4 x 205 + 64 = 884 tokens' worth; two (rows [0, 1] and [2, 3]) 2 x 205 + 2 x 15 + 128 = 568; three
    (2, 1 and 1 rows) 2 x 205 + 2 x 15 + 192 = 632; four 205 + 3 x 15 + 256 = 506: k = 4.
    """
    n = num_rows(batch)
    lowest = max(1, num_microbatches)
    if n <= lowest:
        return lowest
    order = torch.cat(microbatch_rows(batch, n))  # microbatch_rows' row order
    response_len = batch["response_mask"].sum(dim=1).long()
    prompt_len = batch["attention_mask"].sum(dim=1).long() - response_len
    responses, prompts = response_len[order].tolist(), prompt_len[order].tolist()
    best_k, best_work = lowest, None
    for k in range(lowest, min(n, max(lowest, 64)) + 1):
        work, lo = k * overhead_tokens, 0
        for part in range(k):  # tensor_split's sizes: the first n % k parts one row longer
            hi = lo + n // k + (part < n % k)
            work += (hi - lo) * (max(prompts[lo:hi]) + max(responses[lo:hi]))
            lo = hi
        if best_work is None or work < best_work:
            best_k, best_work = k, work
    return best_k


def pad_response_columns(x_BT: Tensor, num_response_cols: int) -> Tensor:
    """``x_BT`` [B, T'] zero-padded on the right to [B, num_response_cols] (undoes ``trim_padding``'s cut)."""
    return torch.nn.functional.pad(x_BT, (0, num_response_cols - x_BT.shape[1]))


def microbatches_per_minibatch(num_microbatches: int, num_minibatches: int, sizes: Sequence[Sequence[int]]) -> int:
    """How many micro-batches each PPO minibatch of a training call is cut into. The plan (and the
    cost model that priced it) counts ``num_microbatches`` over the call's whole batch, which the
    update splits into ``num_minibatches``: each minibatch takes ceil(mb / num_minibatches), so a
    micro-batch is as large as priced, never larger. Every rank runs the same number (FSDP's
    collectives pair up), at most one per row of its smallest share (``sizes``: rows per minibatch,
    per rank): 512 micro-batches over 4 minibatches of 1024 rows per rank are 128 of 8 rows each."""
    return min([-(-num_microbatches // num_minibatches)] + [n for s in sizes for n in s])
