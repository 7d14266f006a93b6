"""The dataset config (training's `data` group): which problems a run trains on and reports on."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DataConfig:
    name: str = "synthetic"
    """A built-in dataset name (see mathtask.data), a .jsonl/.json/.parquet path, or hf:<id>[:<split>]."""
    heldout: str = "synthetic"
    """The held-out set the trainer reports success on (for `synthetic`: its held-out split)."""
    limit: int = 0
    """Use a fixed-seed subset of this many prompts (0 = all)."""
    heldout_limit: int = 0
    seed: int = 0
    synthetic_difficulty: int = 2
    synthetic_num_train: int = 2000
    synthetic_num_heldout: int = 200
