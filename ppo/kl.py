"""The KL term: per-token estimators of KL(pi || pi_ref), and the controllers of its coefficient beta.

The controllers have the same two methods (``update`` after each iteration, ``value`` to read beta) and a
state dict for checkpoints, so the loop never asks which one it holds.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from ppo.config import AlgorithmConfig, KLController, KLEstimator


def kl_estimate(logprobs_BT: Tensor, ref_logprobs_BT: Tensor, mask_BT: Tensor, estimator: KLEstimator) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) at the sampled tokens, [B, T] -> [B, T], 0 on padding.

    With x = log pi - log pi_ref:  k1 = x,  k2 = x^2 / 2,  k3 = exp(-x) - 1 + x (computed as expm1(-x) + x, exact
    near x = 0). Differentiable in ``logprobs_BT`` (the KL loss term). Worked example: x = log 2 -> k1 = 0.6931,
    k2 = 0.2402, k3 = 0.5 - 1 + 0.6931 = 0.1931.
    """
    x = logprobs_BT - ref_logprobs_BT
    if estimator == KLEstimator.k1:
        kl = x
    elif estimator == KLEstimator.k2:
        kl = 0.5 * x * x
    else:
        kl = torch.expm1(-x) + x
    return kl * mask_BT


class KLControl(Protocol):
    value: float

    def update(self, kl: float, num_steps: int) -> None: ...

    def state_dict(self) -> dict[str, float]: ...

    def load_state_dict(self, state: dict[str, float]) -> None: ...


class FixedKLController:
    """beta stays at its initial value."""

    def __init__(self, kl_coef: float) -> None:
        self.value = kl_coef

    def update(self, kl: float, num_steps: int) -> None:
        pass

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Ziegler et al. 2019, eq. 2: a proportional controller that steers the observed KL to a target.

        e     = clip(KL / target - 1, -0.2, 0.2)
        beta <- beta * (1 + e * n_steps / horizon)

    ``kl`` is the iteration's mean per-response KL (sum over tokens of log pi - log pi_ref, averaged
    over responses); ``num_steps`` is the number of responses it was measured on, so ``horizon``
    is counted in responses, as in the paper and TRL.
    """

    def __init__(self, kl_coef: float, target: float, horizon: int) -> None:
        if target <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL needs kl_target > 0 and kl_horizon > 0 (got {target}, {horizon})")
        self.value = kl_coef
        self.target = target
        self.horizon = horizon

    def update(self, kl: float, num_steps: int) -> None:
        proportional_error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * num_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


def make_kl_controller(cfg: AlgorithmConfig) -> FixedKLController | AdaptiveKLController:
    match cfg.kl_controller:
        case KLController.fixed:
            return FixedKLController(cfg.kl_coef)
        case KLController.adaptive:
            return AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon)
    raise AssertionError(cfg.kl_controller)
