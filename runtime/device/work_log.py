"""What each forward of a device shard computed on, for ``bench/ppo_iteration.py``'s FLOP accounting.

Off unless the ``REALM_WORK_LOG`` environment variable names a directory (the benchmark sets it, the
Ray workers inherit it); then every forward through ``runtime.device.shards.response_logprobs`` and
``response_values`` appends one JSON line to ``<dir>/work-<pid>.jsonl``: its wall-clock span, whether it
kept a graph (a training pass) and the counts its FLOPs follow from (``forward_counts``), real tokens and
the padding computed on apart. The benchmark turns counts into FLOPs with the model's shapes
(``bench/flops.py``) and attributes lines to calls by process (``placement.json``) and kind.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

WORK_LOG_ENV = "REALM_WORK_LOG"


def forward_counts(attention_mask_BL: Tensor, response_mask_BT: Tensor, num_head_positions: int) -> dict[str, int]:
    """The counts one forward's FLOPs follow from (pure).

    ``tokens``/``pairs``: real tokens and causal attention pairs (a row of n real tokens has n (n + 1) / 2);
    ``computed_tokens``/``computed_pairs``: the same over the rows x columns the forward ran on, padding
    included; ``head_tokens``: real response tokens; ``head_positions``: positions the LM head ran on (0 for
    a value model, whose scalar head is counted with the tokens).

    Example: rows of 2 and 3 real tokens in 4 columns, 1 and 2 response tokens, the head on those 3 ->
    tokens 5, pairs 3 + 6 = 9, computed_tokens 8, computed_pairs 2 x 10 = 20, head_tokens 3.
    """
    num_rows, num_columns = attention_mask_BL.shape
    lengths = attention_mask_BL.sum(-1).long()
    return {
        "rows": num_rows,
        "columns": num_columns,
        "tokens": int(lengths.sum()),
        "pairs": int((lengths * (lengths + 1) // 2).sum()),
        "computed_tokens": num_rows * num_columns,
        "computed_pairs": num_rows * num_columns * (num_columns + 1) // 2,
        "head_tokens": int(response_mask_BT.sum()),
        "head_positions": num_head_positions,
    }


class ForwardRecord:
    """Times one forward and, when the log is on, appends its line (``record`` after the forward)."""

    def __init__(self, model: nn.Module, kind: str):
        self.directory = os.environ.get(WORK_LOG_ENV, "")
        self.model, self.kind = model, kind
        self.start = time.time()

    def record(self, batch: Mapping[str, Tensor], num_head_positions: int) -> None:
        if not self.directory:
            return
        line: dict[str, Any] = {
            "kind": self.kind,
            "model": id(self.model),
            "grad": torch.is_grad_enabled(),
            "threads": torch.get_num_threads(),
            "start": self.start,
            "end": time.time(),
            **forward_counts(batch["attention_mask"], batch["response_mask"], num_head_positions),
        }
        path = os.path.join(self.directory, f"work-{os.getpid()}.jsonl")
        with open(path, "a", encoding="utf-8") as f:  # one line per forward, appended: a log, not a result file
            f.write(json.dumps(line) + "\n")
