"""KL controllers and learning-rate schedules with hand-checked numbers."""

import math

import pytest
import torch

from common.schedule import LRSchedule, build_lr_scheduler, lr_multiplier
from ppo.config import AlgorithmConfig, KLController
from ppo.kl import AdaptiveKLController, FixedKLController, make_kl_controller


def test_fixed_kl_controller_never_moves():
    ctl = FixedKLController(0.05)
    ctl.update(kl=10.0, num_steps=1000)
    assert ctl.value == 0.05


def test_adaptive_kl_controller_by_hand():
    # target 0.1, horizon 100, 10 responses per update: beta *= 1 + clip(KL/0.1 - 1, -0.2, 0.2) * 10/100
    ctl = AdaptiveKLController(kl_coef=0.1, target=0.1, horizon=100)
    ctl.update(kl=0.11, num_steps=10)  # error 0.1 -> * 1.01
    assert ctl.value == pytest.approx(0.101)
    ctl.update(kl=1.0, num_steps=10)  # error 9 clipped to 0.2 -> * 1.02
    assert ctl.value == pytest.approx(0.101 * 1.02)
    ctl.update(kl=0.0, num_steps=10)  # error -1 clipped to -0.2 -> * 0.98
    assert ctl.value == pytest.approx(0.101 * 1.02 * 0.98)
    restored = AdaptiveKLController(kl_coef=0.5, target=0.1, horizon=100)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == ctl.value


def test_make_kl_controller():
    assert isinstance(make_kl_controller(AlgorithmConfig()), FixedKLController)
    adaptive = make_kl_controller(AlgorithmConfig(kl_controller=KLController.adaptive, kl_coef=0.2))
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.value == 0.2


def test_lr_multipliers_by_hand():
    # 2 warm-up iterations of 6: (s + 1) / 3 for s < 2, then p = (s - 2) / 4
    assert [lr_multiplier(LRSchedule.constant, 2, 6)(s) for s in range(6)] == pytest.approx([1 / 3, 2 / 3, 1, 1, 1, 1])
    assert [lr_multiplier(LRSchedule.linear, 2, 6)(s) for s in range(6)] == pytest.approx(
        [1 / 3, 2 / 3, 1.0, 0.75, 0.5, 0.25]
    )
    c = math.cos(math.pi / 4)
    assert [lr_multiplier(LRSchedule.cosine, 2, 6)(s) for s in range(6)] == pytest.approx(
        [1 / 3, 2 / 3, 1.0, (1 + c) / 2, 0.5, (1 - c) / 2]
    )
    assert lr_multiplier(LRSchedule.linear, 0, 4)(10) == 0.0  # past the end: stays at 0


def test_lr_floor_by_hand():
    # reward-model training decays to 10%: f + (1 - f) * decay, with f = 0.1
    assert [lr_multiplier(LRSchedule.linear, 0, 4, floor=0.1)(s) for s in range(5)] == pytest.approx(
        [1.0, 0.775, 0.55, 0.325, 0.1]
    )
    assert lr_multiplier(LRSchedule.cosine, 0, 4, floor=0.1)(2) == pytest.approx(0.55)
    with pytest.raises(ValueError, match="floor"):
        lr_multiplier(LRSchedule.cosine, 0, 4, floor=1.0)


def test_build_lr_scheduler_steps_per_iteration():
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scheduler = build_lr_scheduler(optimizer, LRSchedule.linear, num_warmup=0, num_total=4)
    lrs = []
    for _ in range(4):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([1.0, 0.75, 0.5, 0.25])
    with pytest.raises(ValueError):
        lr_multiplier(LRSchedule.linear, -1, 4)


def test_kl_estimators_by_hand():
    """x = log pi - log pi_ref = log 2 on one token, -log 2 on another, padding after: k1 = x, k2 = x^2 / 2,
    k3 = exp(-x) - 1 + x (>= 0 for either sign)."""
    from ppo.config import KLEstimator
    from ppo.kl import kl_estimate

    logp = torch.tensor([[math.log(2.0), -math.log(2.0), 5.0]])
    ref = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    x = math.log(2.0)
    torch.testing.assert_close(kl_estimate(logp, ref, mask, KLEstimator.k1), torch.tensor([[x, -x, 0.0]]))
    torch.testing.assert_close(
        kl_estimate(logp, ref, mask, KLEstimator.k2), torch.tensor([[x * x / 2, x * x / 2, 0.0]])
    )
    k3 = [0.5 - 1 + x, 2.0 - 1 - x, 0.0]
    torch.testing.assert_close(kl_estimate(logp, ref, mask, KLEstimator.k3), torch.tensor([k3]))
