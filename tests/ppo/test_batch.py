"""ppo.batch.trim_padding: a worked example, and the edge cases that must keep their columns."""

from __future__ import annotations

import torch

from ppo.batch import microbatch_rows, pad_response_columns, throughput_microbatches, trim_padding
from trainer.rollout import pad_batch


def test_trim_padding_worked_example():
    # Prompts of 2 and 3 tokens and responses of 1 and 2 tokens, laid out in P = 5, T = 4 columns
    # (as a minibatch cut from a batch whose longest prompt and response were 5 and 4).
    batch = pad_batch([[11, 12, 13, 14, 15], [21, 22, 23]], [[31, 32, 33, 34], [41, 42]], pad_id=0)
    minibatch = {k: v[1:] for k, v in batch.items()}  # row 1 only: prompt 3 of 5, response 2 of 4
    minibatch["advantages"] = torch.tensor([[0.5, -1.0, 0.0, 0.0]])
    minibatch["scalar_per_row"] = torch.tensor([7.0])
    out = trim_padding(minibatch)
    assert out["input_ids"].tolist() == [[21, 22, 23, 41, 42]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 1]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 3, 4]]
    assert out["response_mask"].tolist() == [[1.0, 1.0]]
    assert out["advantages"].tolist() == [[0.5, -1.0]]
    assert out["scalar_per_row"].tolist() == [7.0]
    assert pad_response_columns(out["advantages"], 4).tolist() == [[0.5, -1.0, 0.0, 0.0]]


def test_trim_padding_keeps_what_any_row_uses():
    batch = pad_batch([[11, 12, 13, 14, 15], [21, 22, 23]], [[31, 32, 33, 34], [41, 42]], pad_id=0)
    out = trim_padding(batch)  # the longest prompt and response reach both edges: nothing to cut
    assert all(torch.equal(out[k], batch[k]) for k in batch)
    empty = pad_batch([[1, 2]], [[]], pad_id=0)  # no response tokens: one (masked) column stays
    assert trim_padding(empty)["response_mask"].shape == (1, 1)
    assert trim_padding(empty)["input_ids"].tolist() == [[1, 2, 0]]


def test_microbatches_group_rows_of_similar_length():
    # Response lengths 1, 4, 2, 3 (prompts of 2 tokens): 2 micro-batches take rows [1, 3] and [2, 0],
    # which trim to 4 and 2 response columns instead of 4 and 4; every row appears once.
    batch = pad_batch([[7, 7]] * 4, [[5], [5, 5, 5, 5], [5, 5], [5, 5, 5]], pad_id=0)
    parts = microbatch_rows(batch, 2)
    assert [p.tolist() for p in parts] == [[1, 3], [2, 0]]
    widths = [trim_padding({k: v[p] for k, v in batch.items()})["response_mask"].shape[1] for p in parts]
    assert widths == [4, 2]
    # Equal responses: the longer prompt first; one micro-batch keeps the rows in order.
    batch = pad_batch([[7], [7, 7, 7], [7, 7]], [[5, 5]] * 3, pad_id=0)
    assert [p.tolist() for p in microbatch_rows(batch, 3)] == [[1], [2], [0]]
    assert [p.tolist() for p in microbatch_rows(batch, 1)] == [[0, 1, 2]]
    assert sorted(torch.cat(microbatch_rows(batch, 5)).tolist()) == [0, 1, 2]  # at most one per row


def test_throughput_microbatches_worked_example():
    # Responses of 200, 10, 10, 10 tokens after 5-token prompts, 64 tokens' worth per pass: one micro-batch
    # 4 x 205 + 64 = 884; two 2 x 205 + 2 x 15 + 128 = 568; three (2, 1, 1 rows) 410 + 30 + 192 = 632;
    # four 205 + 45 + 256 = 506 -> 4.
    batch = pad_batch([[7] * 5] * 4, [[5] * 200, [5] * 10, [5] * 10, [5] * 10], pad_id=0)
    assert throughput_microbatches(batch, 1) == 4
    # A pass costing 300 tokens' worth: 884 + 300 - 64 = 1120 against 568 + 600 - 128 = 1040 -> 2.
    assert throughput_microbatches(batch, 1, overhead_tokens=300) == 2
    # Rows of one length: nothing to gain, the plan's count stays (never fewer than it).
    even = pad_batch([[7] * 5] * 4, [[5] * 10] * 4, pad_id=0)
    assert throughput_microbatches(even, 1) == 1 and throughput_microbatches(even, 3) == 3
