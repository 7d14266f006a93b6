"""The reward-model training config (``python -m rewards.train_rm``'s schema) and the built-ins' cache keys."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from common.config import to_plain
from models.config import ModelConfig
from rewards.config import Readout
from rewards.reward_model import DEFAULT_QUESTION_TEMPLATE, DEFAULT_STEP_TAG, RMFormat


class RMKind(Enum):
    prm = "prm"
    orm = "orm"


@dataclass
class SyntheticRMData:
    """RM training data from the synthetic task (mathtask.synthetic)."""

    num_train_problems: int = 2000
    num_heldout_problems: int = 200
    difficulty: int = 2
    """The default PPO run's difficulty (configs/data/synthetic.yaml)."""
    num_corrupted: int = 2
    """Corrupted solutions (one arithmetic slip, Math-Shepherd labels) per problem, besides the correct one."""
    num_junk: int = 1
    """Degenerate responses (cut off, no box, a step repeated) per problem, labelled naturally."""
    seed: int = 1
    """Problem stream; the default PPO held-out questions (mathtask.config.DataConfig) are excluded."""


DEFAULT_NUM_STEPS = {RMKind.prm: 1600, RMKind.orm: 2800}
"""Training steps per kind. The ORM learns from one label per response and needs longer: at 1,600
steps one training seed was still rising; at 2,800 the final-answer AUC of seeds 0, 1, 2 was 0.71, 0.85, 0.77
(torch 2.13, AVX-512 EPYC), all above the slow test's threshold (tests/rewards/test_train_rm.py)."""


@dataclass
class RMTrainConfig:
    kind: RMKind = RMKind.prm
    readout: Readout = Readout.auto
    """auto: value_head for a PRM, seq_cls for an ORM. step_tag trains a causal LM's good/bad tokens."""
    data: str = "synthetic"
    """`synthetic`, or a .jsonl in realm / Math-Shepherd / PRM800K format (rewards.rm_data)."""
    data_format: str = "auto"
    heldout_data: str = ""
    """A held-out .jsonl; empty: hold out `heldout_fraction` of `data` (synthetic: its own held-out problems)."""
    heldout_fraction: float = 0.1
    synthetic: SyntheticRMData = field(default_factory=SyntheticRMData)
    backbone: ModelConfig = field(default_factory=ModelConfig)
    """The model to start from (a causal LM); default: the tiny model, so the policy and RM share a tokenizer."""
    question_template: str = DEFAULT_QUESTION_TEMPLATE
    step_delimiter: str = "\n\n"
    """Joins the steps in the RM input: the delimiter the policy's responses are cut at (reward.step_delimiter)."""
    step_tag: str = DEFAULT_STEP_TAG
    """step_tag readout only: appended after every step."""
    good_token: str = "+"
    bad_token: str = "-"
    lm_loss_weight: float = 1.0
    """Weight of an auxiliary next-token loss on the response tokens of the correct solutions in each batch
    (the classifiers predict tokens through their tied input embeddings). A from-scratch tiny model
    does not learn to check arithmetic from sparse step labels within minutes (held-out step accuracy
    stays near the majority baseline); learning to compute the next step at the same time is what makes
    a verifier possible (real PRMs start from a pretrained math LM for the same reason). Set 0 for a
    backbone that already knows the domain."""
    num_lm_warmup_steps: int = 600
    """The first steps train only the auxiliary next-token loss (a short SFT of the backbone on the correct
    solutions), so that the classifier starts from a model that can already compute the next step (what it
    gained over joint training alone: docs/rewards.md)."""
    num_steps: int = 0
    """All steps, the LM warm-up included; 0: the kind's default (``DEFAULT_NUM_STEPS``)."""
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.01
    num_warmup_steps: int = 50
    max_length: int = 512
    seed: int = 0
    log_every: int = 200
    device: str = "cpu"
    num_threads: int = 1
    """torch CPU threads while training (0: torch's default). One thread: on a small machine shared with
    other work (or a training run's other workers), more threads spin against each other and run slower."""
    output_dir: str = ""
    """Where to save; empty: the cache entry `builtin:synthetic-<kind>` resolves to (for synthetic data)."""

    def __post_init__(self) -> None:
        if self.kind == RMKind.orm and self.readout == Readout.step_tag:
            raise ValueError("readout=step_tag is a PRM readout; an ORM uses seq_cls or value_head")
        if self.kind == RMKind.prm and self.readout == Readout.seq_cls:
            raise ValueError("readout=seq_cls gives one score per response; a PRM uses value_head or step_tag")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction={self.heldout_fraction}: must lie in (0, 1)")
        if self.num_steps == 0:
            self.num_steps = DEFAULT_NUM_STEPS[self.kind]
        if self.num_steps < 1 or self.batch_size < 1:
            raise ValueError("num_steps and batch_size must be >= 1")
        if not 0 <= self.num_lm_warmup_steps < self.num_steps:
            raise ValueError(f"num_lm_warmup_steps={self.num_lm_warmup_steps}: must lie in [0, num_steps)")
        if self.num_lm_warmup_steps and self.lm_loss_weight <= 0:
            raise ValueError("num_lm_warmup_steps > 0 needs lm_loss_weight > 0 (the warm-up trains that loss)")
        if not self.output_dir and self.data != "synthetic":
            raise ValueError("output_dir is required when training on a file")

    @property
    def resolved_readout(self) -> Readout:
        if self.readout != Readout.auto:
            return self.readout
        return Readout.value_head if self.kind == RMKind.prm else Readout.seq_cls

    @property
    def fmt(self) -> RMFormat:
        return RMFormat(self.question_template, self.step_tag if self.resolved_readout == Readout.step_tag else "")


# Fields that do not change the trained model: left out of the cache key.
_NOT_IN_KEY = ("output_dir", "device", "log_every", "num_threads")


def config_key(cfg: RMTrainConfig) -> str:
    blob = {k: v for k, v in to_plain(cfg).items() if k not in _NOT_IN_KEY}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]


def default_output_dir(cfg: RMTrainConfig) -> Path:
    from models.registry import cache_root

    return cache_root() / "reward_models" / f"synthetic-{cfg.kind.value}-{config_key(cfg)}"


def builtin_config(path: str) -> RMTrainConfig:
    """The training config behind `builtin:synthetic-prm` / `builtin:synthetic-orm`."""
    kinds = {"builtin:synthetic-prm": RMKind.prm, "builtin:synthetic-orm": RMKind.orm}
    if path not in kinds:
        raise ValueError(f"unknown built-in reward model {path!r}; expected one of {sorted(kinds)}")
    return RMTrainConfig(kind=kinds[path])
