"""Learning-rate schedules as LambdaLR multipliers, stepped once per PPO iteration.

With w warm-up iterations and n iterations in all, the multiplier at iteration s (0-based) is

    s < w:   (s + 1) / (w + 1)                       ramps up; never 0, so no iteration is wasted
    s >= w:  constant  1
             linear    1 - p                         p = (s - w) / (n - w), the decay progress
             cosine    (1 + cos(pi * p)) / 2

so the first post-warm-up iteration runs at the full rate and the multiplier reaches 0 only at
s = n, one past the last iteration.
"""
from __future__ import annotations

import math
from typing import Callable

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from trainer.config import LRSchedule


def lr_multiplier(schedule: LRSchedule, num_warmup: int, num_total: int) -> Callable[[int], float]:
    """The multiplier function of the module docstring, for ``LambdaLR(lr_lambda=...)``."""
    if num_warmup < 0 or num_total < 1:
        raise ValueError(f"lr schedule needs num_warmup >= 0 and num_total >= 1 (got {num_warmup}, {num_total})")

    def multiplier(step: int) -> float:
        if step < num_warmup:
            return (step + 1) / (num_warmup + 1)
        progress = min((step - num_warmup) / max(num_total - num_warmup, 1), 1.0)
        match schedule:
            case LRSchedule.constant:
                return 1.0
            case LRSchedule.linear:
                return 1.0 - progress
            case LRSchedule.cosine:
                return 0.5 * (1.0 + math.cos(math.pi * progress))
        raise AssertionError(schedule)

    return multiplier


def build_lr_scheduler(optimizer: Optimizer, schedule: LRSchedule, num_warmup: int, num_total: int) -> LambdaLR:
    """A LambdaLR over ``optimizer``; call ``.step()`` once per iteration."""
    return LambdaLR(optimizer, lr_lambda=lr_multiplier(schedule, num_warmup, num_total))
