"""runtime/device/work_log.py: the counts a forward's FLOPs follow from, and the log a device process writes."""

from __future__ import annotations

import json

import torch

from runtime.device.work_log import WORK_LOG_ENV, ForwardRecord, forward_counts
from trainer.rollout import pad_batch


def test_forward_counts_worked_example():
    # Rows of 2 and 3 real tokens in 4 columns (1 and 2 response tokens), the head on those 3 (the docstring's).
    batch = pad_batch([[7], [7]], [[5], [5, 5]], pad_id=0)
    batch["attention_mask"] = torch.nn.functional.pad(batch["attention_mask"], (1, 0))  # a column of padding
    counts = forward_counts(batch["attention_mask"], batch["response_mask"], num_head_positions=3)
    assert counts == {
        "rows": 2,
        "columns": 4,
        "tokens": 5,
        "pairs": 3 + 6,
        "computed_tokens": 8,
        "computed_pairs": 2 * 10,
        "head_tokens": 3,
        "head_positions": 3,
    }


def test_a_record_is_one_line_per_forward_only_when_the_log_is_on(tmp_path, monkeypatch):
    batch = pad_batch([[7, 7]], [[5, 5, 5]], pad_id=0)
    model = torch.nn.Linear(1, 1)
    monkeypatch.delenv(WORK_LOG_ENV, raising=False)
    ForwardRecord(model, "values").record(batch, num_head_positions=0)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(WORK_LOG_ENV, str(tmp_path))
    for kind in ("logprobs", "values"):
        with torch.no_grad():
            ForwardRecord(model, kind).record(batch, num_head_positions=3 if kind == "logprobs" else 0)
    (log,) = tmp_path.iterdir()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["logprobs", "values"]
    assert lines[0]["tokens"] == 5 and lines[0]["head_positions"] == 3 and lines[0]["grad"] is False
    assert lines[0]["model"] == id(model) and lines[0]["end"] >= lines[0]["start"]
