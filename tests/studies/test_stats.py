"""studies/hacking/stats.py against values from statistical tables."""

from __future__ import annotations

import pytest

from studies.hacking.stats import (
    binomial_cdf,
    clopper_pearson,
    fisher_exact,
    holm,
    incomplete_beta,
    student_t_cdf,
    student_t_quantile,
    tost_paired,
)


def test_binomial_and_clopper_pearson_intervals():
    assert binomial_cdf(0, 5, 0.5) == pytest.approx(1 / 32)
    assert clopper_pearson(1, 5) == pytest.approx((0.0051, 0.7164), abs=1e-4)  # round 2's raw PRM: 1 of 5
    assert clopper_pearson(0, 5) == pytest.approx((0.0, 0.5218), abs=1e-4)
    assert clopper_pearson(5, 5) == pytest.approx((0.4782, 1.0), abs=1e-4)
    assert clopper_pearson(4, 5) == pytest.approx((0.2836, 0.9949), abs=1e-4)


def test_fisher_exact_two_sided():
    assert fisher_exact(5, 0, 0, 5) == pytest.approx(2 / 252)
    assert fisher_exact(4, 1, 0, 5) == pytest.approx(12 / 252)
    assert fisher_exact(1, 4, 0, 5) == pytest.approx(1.0)
    assert fisher_exact(3, 2, 1, 4) == pytest.approx(0.5238, abs=1e-4)


def test_student_t_against_the_table():
    assert incomplete_beta(2, 2, 0.5) == pytest.approx(0.5)
    assert student_t_cdf(2.776, 4) == pytest.approx(0.975, abs=1e-4)
    assert student_t_cdf(2.132, 4) == pytest.approx(0.95, abs=1e-4)
    assert student_t_cdf(-2.132, 4) == pytest.approx(0.05, abs=1e-4)
    assert student_t_cdf(0.0, 4) == pytest.approx(0.5)
    assert student_t_cdf(1.96, 10_000) == pytest.approx(0.975, abs=1e-4)
    assert student_t_quantile(0.95, 4) == pytest.approx(2.1318, abs=1e-4)


def test_tost_by_hand():
    out = tost_paired([1.0, -1.0, 0.0, 2.0, -2.0], margin=3.0)
    assert out["mean"] == 0.0 and out["sd"] == pytest.approx(1.5811, abs=1e-4)
    assert out["p_lower"] == pytest.approx(0.0066, abs=1e-4) and out["p"] == pytest.approx(out["p_lower"])
    assert out["interval"] == pytest.approx((-1.508, 1.508), abs=1e-3) and out["equivalent"]
    wide = tost_paired([5.0, -5.0, 0.0, 10.0, -10.0], margin=3.0)
    assert not wide["equivalent"]
    shifted = tost_paired([4.0, 3.5, 4.5, 4.0, 4.0], margin=3.0)  # close together, but around +4
    assert not shifted["equivalent"] and shifted["p_upper"] > 0.05


def test_holm_step_down():
    adjusted, rejected = holm([0.01, 0.04, 0.03])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06]) and rejected == [True, False, False]
