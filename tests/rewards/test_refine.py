"""Clip, Delta and Clip-Delta on worked examples a person can check by hand."""

from __future__ import annotations

import pytest
import torch

from rewards.config import Refinement
from rewards.eta import eta_for_zero_fraction, zero_fraction
from rewards.refine import clip, clip_delta, delta, refine, refine_batched


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float32)


def test_clip_worked_example():
    # eta 0.5: 0.9 and 0.7 are above it (reward 0); 0.3 is 0.2 below it.
    assert torch.allclose(clip(t(0.9, 0.3, 0.7), 0.5), t(0.0, -0.2, 0.0))


def test_delta_worked_example_telescopes_to_c1():
    # c = 0.9 0.3 0.7 0.6: r1 = 0.9 - 0.3, r2 = 0.3 - 0.7, r3 = c3 (the last score is dropped), r4 = 0.
    r = delta(t(0.9, 0.3, 0.7, 0.6))
    assert torch.allclose(r, t(0.6, -0.4, 0.7, 0.0))
    assert r.sum().item() == pytest.approx(0.9)


def test_clip_delta_worked_example():
    # clip at 0.5: c~ = 0 -0.2 0 0; delta: r1 = 0 - (-0.2), r2 = -0.2 - 0, r3 = c~3 = 0, r4 = 0. Sum = c~1 = 0.
    r = clip_delta(t(0.9, 0.3, 0.7, 0.6), 0.5)
    assert torch.allclose(r, t(0.2, -0.2, 0.0, 0.0))
    assert r.sum().item() == pytest.approx(0.0)


def test_one_and_two_steps():
    assert torch.equal(delta(t(0.8)), t(0.0))  # K = 1: the only step is the final one: success judges it
    assert torch.equal(clip_delta(t(0.2), 0.5), t(0.0))
    assert torch.allclose(delta(t(0.8, 0.4)), t(0.8, 0.0))  # K = 2: r1 = c1, r2 = 0
    assert torch.allclose(clip_delta(t(0.2, 0.9), 0.5), t(-0.3, 0.0))
    assert torch.allclose(clip(t(0.2), 0.5), t(-0.3))


def test_inputs_are_not_modified():
    c = t(0.9, 0.3)
    for refinement in Refinement:
        refine(c, refinement, 0.5)
    assert torch.equal(c, t(0.9, 0.3))


def test_batched_matches_one_row_at_a_time_and_ignores_padding():
    """The batched refinements equal one row at a time exactly, on every CPU kernel set: both are the same
    elementwise subtractions and clamps (no sums), each correctly rounded in IEEE fp32 whatever the
    vector width (rule 1 of tests/tolerance.py with no terms: a bound of 0)."""
    rows = [t(0.8), t(0.8, 0.4), t(0.9, 0.3, 0.7, 0.6)]  # K = 1, 2, 4
    scores = torch.full((3, 4), 9.0)  # garbage in the padding must not leak into any reward
    mask = torch.zeros(3, 4, dtype=torch.bool)
    for b, row in enumerate(rows):
        scores[b, : len(row)] = row
        mask[b, : len(row)] = True
    for refinement in Refinement:
        out = refine_batched(scores, mask, refinement, 0.5)
        assert out.shape == (3, 4)
        for b, row in enumerate(rows):
            assert torch.equal(out[b, : len(row)], refine(row, refinement, 0.5)), refinement
            assert torch.all(out[b, len(row) :] == 0), refinement


def test_padding_with_repeated_steps_returns():
    """The reward paper's hack: repeat a step the PRM likes n times before the answer.

    Steps: c1 = 0.9, the repeated step 0.8 (n + 1 times), the answer 0.95; eta = 0.85.
    raw:        0.9 + 0.8 (n + 1) + 0.95            grows by 0.8 per copy
    clip:       0 + (-0.05)(n + 1) + 0              falls by 0.05 per copy
    delta:      c1 = 0.9                            whatever n is
    clip-delta: c~1 = min(0.9 - 0.85, 0) = 0        whatever n is
    """
    returns = {r: [] for r in Refinement}
    for n in range(4):
        c = t(0.9, *([0.8] * (n + 1)), 0.95)
        for r in Refinement:
            returns[r].append(refine(c, r, 0.85).sum().item())
    assert returns[Refinement.none] == pytest.approx([2.65, 3.45, 4.25, 5.05])
    assert returns[Refinement.clip] == pytest.approx([-0.05, -0.10, -0.15, -0.20])
    assert returns[Refinement.delta] == pytest.approx([0.9] * 4)
    assert returns[Refinement.clip_delta] == pytest.approx([0.0] * 4)


def test_eta_for_zero_fraction_worked_example():
    scores = [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6, 0.7], [0.8, 0.9, 1.0]]
    eta = eta_for_zero_fraction(scores, 0.8)
    assert eta == pytest.approx(0.3)  # 0.3..1.0 are the 8 of 10 steps at or above eta
    assert zero_fraction(scores, eta) == pytest.approx(0.8)
    assert eta_for_zero_fraction(scores, 1.0) == pytest.approx(0.1)  # every step gets 0
    assert eta_for_zero_fraction(scores, 0.0) == 1.0
    with pytest.raises(ValueError, match="zero_fraction"):
        eta_for_zero_fraction(scores, 1.5)
    with pytest.raises(ValueError, match="no step scores"):
        eta_for_zero_fraction([[]], 0.5)


def test_return_to_go_when_a_junk_step_is_inserted_before_the_answer():
    """What the policy sees at the point of choosing between 'one more step' and 'the answer'.

    Total returns do not depend on K under Delta, but the return-to-go *from the choice on* does:
    from a non-final step it is c_k, from the final step 0 (its score is dropped). Steps: 0.9, 0.7,
    then either the answer (0.95) or a junk step the PRM scores 0.6 and then the answer; eta = 0.8.
    delta:      answer now -> 0;  junk first -> 0.6      (a bounded push to keep going)
    clip-delta: answer now -> 0;  junk first -> c~ = min(0.6 - 0.8, 0) = -0.2   (a push to stop)
    """

    def return_to_go_from_step(rewards: torch.Tensor, k: int) -> float:
        return rewards[k:].sum().item()

    answer_now, junk_first = t(0.9, 0.7, 0.95), t(0.9, 0.7, 0.6, 0.95)
    assert return_to_go_from_step(delta(answer_now), 2) == pytest.approx(0.0)
    assert return_to_go_from_step(delta(junk_first), 2) == pytest.approx(0.6)
    assert return_to_go_from_step(clip_delta(answer_now, 0.8), 2) == pytest.approx(0.0)
    assert return_to_go_from_step(clip_delta(junk_first, 0.8), 2) == pytest.approx(-0.2)
    # ... while the whole return is c1 (Delta) or c~1 (Clip-Delta) either way.
    assert delta(answer_now).sum().item() == pytest.approx(delta(junk_first).sum().item())


@pytest.mark.parametrize("refinement", list(Refinement))
@pytest.mark.parametrize("junk", [float("nan"), float("inf"), float("-inf")])
def test_nan_or_inf_in_padding_does_not_leak(refinement, junk):
    # Row 0 has 3 steps and row 1 has 1; the padding holds NaN/inf (0 * NaN is NaN: it must be selected away).
    scores = torch.tensor([[0.9, 0.3, 0.7, junk], [0.6, junk, junk, junk]])
    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    out = refine_batched(scores, mask, refinement, eta=0.5)
    assert torch.isfinite(out).all()
    assert (out[~mask] == 0).all()
    for b in range(2):
        k = int(mask[b].sum())
        assert torch.allclose(out[b, :k], refine(scores[b, :k], refinement, 0.5))


def test_eta_from_a_padded_tensor_counts_only_real_steps():
    # Real steps 0.1..0.5 (5 of them) in a [2, 4] tensor with three padding zeros. Zero fraction 0.6:
    # m = round(0.6 * 5) = 3 -> eta = the 3rd largest real score = 0.3. Counting the padding zeros
    # (8 "steps", m = 5) would give 0.1.
    scores = torch.tensor([[0.1, 0.2, 0.3, 0.0], [0.4, 0.5, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    assert eta_for_zero_fraction(scores, 0.6, mask) == pytest.approx(0.3)
    assert eta_for_zero_fraction(scores, 0.6, mask) == pytest.approx(
        eta_for_zero_fraction([[0.1, 0.2, 0.3], [0.4, 0.5]], 0.6)
    )
    with pytest.raises(ValueError, match="step_mask"):
        eta_for_zero_fraction(scores, 0.6)  # a padded tensor without its mask is refused
    assert eta_for_zero_fraction(torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5]), 0.6) == pytest.approx(0.3)
