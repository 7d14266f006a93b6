"""tests/tolerance.py's rule, as worked examples a person can check, and what it lets through and not."""

from __future__ import annotations

import math

import pytest
import torch

from tests import tolerance as tol

TINY = tol.Reductions(num_layers=2, hidden=128, intermediate=384, head_dim=64, vocab=326)


def test_rule_one_counts_the_sums_of_a_forward_pass_and_a_gradient(tiny_model_dir):
    assert tol.EPS == 2.0**-23
    assert tol.rounding(128) == pytest.approx(1.526e-5, rel=1e-3)  # a 128-term dot product, terms summing to 1
    assert tol.Reductions.of(tiny_model_dir) == TINY
    assert TINY.forward(16) == 2 * (5 * 128 + 64 + 2 * 16 + 384) + 2 * 128 + 326 == 2822
    assert TINY.forward(16, lm_head=False) == 2496
    assert TINY.gradient(16, 128, num_ranks=2) == 2 * 2822 + 128 + 2 == 5774


def test_adams_largest_step_and_the_fraction_rounding_can_change():
    # Step 2: m weighs the gradients 0.09 / 0.19 and 0.1 / 0.19, v 0.000999 / 0.001999 and 0.001 / 0.001999.
    a, b = (0.09 / 0.19, 0.1 / 0.19), (0.000999 / 0.001999, 0.001 / 0.001999)
    assert tol.adam_step_limit(1) == 1.0
    assert tol.adam_step_limit(2) == pytest.approx(math.sqrt(a[0] ** 2 / b[0] + a[1] ** 2 / b[1]))
    assert tol.adam_step_limit(2) == pytest.approx(1.0014, abs=1e-4)
    assert tol.adam_max([1e-3, 1e-3]) == pytest.approx(2e-3 * (1 + 1.0014), rel=1e-4)
    rho = tol.rounding(5774)
    assert tol.adam_fraction(rho) == pytest.approx(rho * (1 + math.log(2 / rho))) == pytest.approx(6.18e-3, rel=0.01)
    assert tol.trained(2.1e-3, rho, 4e-3) == pytest.approx(2.1e-3 + 6.18e-3 * 4e-3, rel=0.01)
    stats = tol.trained_scalars({"loss": -0.5, "lr": 1e-3}, rho, num_steps=2)
    assert stats["lr"] == 0.0 and stats["loss"] == pytest.approx(rho + tol.adam_fraction(rho) * 1.0)


@pytest.mark.equivalence
def test_trained_weights_pass_with_a_flipped_element_and_fail_with_a_wrong_update():
    """Two Adam steps at lr 1e-3 from equal weights: one element flipped both steps (4e-3 away) and
    the rest rounding apart passes; half the elements moved the other way (what a gradient that
    missed its all-reduce does) fails, and so does any element beyond 2 lr a step."""
    rho, lrs = tol.rounding(5774), [1e-3, 1e-3]
    torch.manual_seed(0)
    want = torch.randn(64, 128)
    flipped = want + 1e-7 * torch.randn(64, 128)
    flipped[3, 5] += 4e-3
    tol.assert_trained_close({"w": flipped}, {"w": want}, lrs, rho)
    wrong = want.clone()
    wrong[:32] += 2e-3
    with pytest.raises(AssertionError, match="summed"):
        tol.assert_trained_close({"w": wrong}, {"w": want}, lrs, rho)
    flipped[3, 5] += 1e-3
    with pytest.raises(AssertionError, match="max"):
        tol.assert_trained_close({"w": flipped}, {"w": want}, lrs, rho)


@pytest.mark.equivalence
def test_bounds_are_absolute_and_name_what_is_beyond():
    tol.assert_close(torch.tensor([0.0, 1.0]), torch.tensor([1e-6, 1.0]), bound=1e-6)
    with pytest.raises(AssertionError):  # absolute: a near-zero reference gets no relative slack
        tol.assert_close(torch.tensor([0.0, 1.0]), torch.tensor([3e-6, 1.0]), bound=1e-6)
    with pytest.raises(AssertionError, match="tp plan: .*'kl/mean': \\(0.1, 0.0, 0.01\\)"):
        tol.assert_scalars_close({"kl/mean": 0.1}, {"kl/mean": 0.0}, {"kl/mean": 0.01}, context="tp plan")
    assert tol.scale_of(torch.tensor([-6.5, 0.1])) == 6.5 and tol.scale_of(0.01) == 1.0
