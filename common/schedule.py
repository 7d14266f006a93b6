"""Learning-rate schedules as LambdaLR multipliers: one per optimizer step (a PPO iteration for the
policy and critic, a batch for reward-model training).

With w warm-up steps, n steps in all and a floor f (0 unless given), the multiplier at step s (0-based) is

    s < w:   (s + 1) / (w + 1)                       ramps up; never 0, so no step is wasted
    s >= w:  constant  1
             linear    f + (1 - f) (1 - p)           p = (s - w) / (n - w), the decay progress
             cosine    f + (1 - f) (1 + cos(pi * p)) / 2

so the first post-warm-up step runs at the full rate and the multiplier reaches f only at s = n,
one past the last step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


class LRSchedule(Enum):
    constant = "constant"
    linear = "linear"
    cosine = "cosine"


def lr_multiplier(schedule: LRSchedule, num_warmup: int, num_total: int, floor: float = 0.0) -> Callable[[int], float]:
    """The multiplier function of the module docstring, for ``LambdaLR(lr_lambda=...)``."""
    if num_warmup < 0 or num_total < 1:
        raise ValueError(f"lr schedule needs num_warmup >= 0 and num_total >= 1 (got {num_warmup}, {num_total})")
    if not 0.0 <= floor < 1.0:
        raise ValueError(f"lr schedule floor={floor}: must lie in [0, 1)")

    def multiplier(step: int) -> float:
        if step < num_warmup:
            return (step + 1) / (num_warmup + 1)
        progress = min((step - num_warmup) / max(num_total - num_warmup, 1), 1.0)
        match schedule:
            case LRSchedule.constant:
                return 1.0
            case LRSchedule.linear:
                return floor + (1.0 - floor) * (1.0 - progress)
            case LRSchedule.cosine:
                return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
        raise AssertionError(schedule)

    return multiplier


def build_lr_scheduler(
    optimizer: Optimizer, schedule: LRSchedule, num_warmup: int, num_total: int, floor: float = 0.0
) -> LambdaLR:
    """A LambdaLR over ``optimizer``; call ``.step()`` once per optimizer step."""
    return LambdaLR(optimizer, lr_lambda=lr_multiplier(schedule, num_warmup, num_total, floor))
