"""The optimisation settings of training: PPO (epochs, clipping, GAE, KL penalty, learning rates) and the
SFT warm-up. Plain dataclasses, part of the run's typed config (``trainer.config.TrainConfig``), read by
the math in this package and by the device processes that run the updates."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from common.schedule import LRSchedule


class KLController(Enum):
    fixed = "fixed"
    adaptive = "adaptive"
    """Ziegler et al. 2019: beta moves so that the observed KL tracks kl_target."""


class ValueClip(Enum):
    none = "none"
    """Plain regression on the returns."""
    raw = "raw"
    """PPO's clipped value loss with a range of value_clip_eps in reward units."""
    return_std = "return_std"
    """Clipped, with a range of value_clip_eps times the iteration's return standard deviation."""


@dataclass
class PPOConfig:
    num_epochs: int = 2
    """Passes over each iteration's rollouts."""
    num_minibatches: int = 4
    clip_eps: float = 0.2
    value_clip: ValueClip = ValueClip.none
    """No value clipping by default: the critic head starts at 0 and the returns' scale differs by reward
    (about 0.2 for success only, 1-5 for raw PRM), so a fixed clip range holds back the large-return
    critics (docs/rewards.md, "The critic's value loss"; docs/mini_repro.md: explained variance per option)."""
    value_clip_eps: float = 0.2
    """The value-clip range when value_clip is raw or return_std (ppo.losses.value_clip_range)."""
    gamma: float = 1.0
    lam: float = 1.0
    kl_coef: float = 0.01
    """beta: every response token gets -beta * (log pi - log pi_ref)."""
    kl_controller: KLController = KLController.fixed
    kl_target: float = 0.1
    kl_horizon: int = 10000
    whiten_advantages: bool = True
    entropy_coef: float = 0.0
    max_grad_norm: float = 1.0
    actor_lr: float = 1e-4
    critic_lr: float = 1e-3
    lr_schedule: LRSchedule = LRSchedule.constant
    num_warmup_iterations: int = 0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"ppo.gamma={self.gamma}, ppo.lam={self.lam}: both must lie in [0, 1]")
        if self.num_epochs < 1 or self.num_minibatches < 1:
            raise ValueError("ppo.num_epochs and ppo.num_minibatches must be >= 1")
        if not self.clip_eps > 0 or not self.value_clip_eps > 0:
            raise ValueError("ppo.clip_eps and ppo.value_clip_eps must be > 0")


@dataclass
class SFTConfig:
    """Supervised warm-up on reference solutions before PPO (used by the tiny-model default run)."""

    num_steps: int = 1000
    """The most the warm-up trains (exactly this many with ``target_success`` 0)."""
    batch_size: int = 32
    lr: float = 1e-3
    lr_schedule: LRSchedule = LRSchedule.constant
    num_warmup_steps: int = 0
    lr_floor: float = 0.0
    """The schedule's final multiplier (``common/schedule.py``)."""
    target_success: float = 0.4
    """Stop the warm-up at the first check where greedy success on the held-back check problems reaches
    this (``num_steps`` is then the most it trains). 0: train exactly ``num_steps``. A capability target
    instead of a step count, because the same step count lands far apart across seeds and CPUs."""
    check_every: int = 25
    num_check_problems: int = 200
    """Training problems held back from the warm-up to check it on (never the held-out set)."""

    def __post_init__(self) -> None:
        if self.num_steps < 0:
            raise ValueError(f"sft.num_steps={self.num_steps}: must be >= 0")
        if not 0.0 <= self.target_success <= 1.0:
            raise ValueError(f"sft.target_success={self.target_success}: must lie in [0, 1]")
        if self.target_success > 0 and (self.check_every < 1 or self.num_check_problems < 1):
            raise ValueError(
                f"sft.check_every={self.check_every}, sft.num_check_problems={self.num_check_problems}: "
                "both must be >= 1 when sft.target_success > 0"
            )
