"""The critic-free estimators (ppo/critic_free.py) on numbers worked out by hand, and the property that makes
process rewards safe in them: appending steps to a response cannot raise its advantage sum under Clip-Delta."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppo.critic_free import (
    Estimator,
    baseline_and_scale,
    critic_free_advantages,
    equal_reward_group_fraction,
    group_mean_std,
    returns_to_go,
)
from rewards.config import Refinement
from rewards.refine import refine

ESTIMATORS = [
    pytest.param(Estimator.grpo, True, id="grpo"),
    pytest.param(Estimator.grpo, False, id="dr_grpo"),
    pytest.param(Estimator.rloo, True, id="rloo"),
    pytest.param(Estimator.reinforce_pp, True, id="reinforce_pp"),
]


def outcome_batch(outcomes: list[float], lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rewards with each response's outcome on its last token, and the mask."""
    T = max(lengths)
    rewards = torch.zeros(len(outcomes), T, dtype=torch.float64)
    mask = torch.zeros_like(rewards)
    for b, (o, n) in enumerate(zip(outcomes, lengths)):
        mask[b, :n] = 1
        rewards[b, n - 1] = o
    return rewards, mask


def test_returns_to_go_by_hand():
    rewards = torch.tensor([[0.0, 0.5, 1.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    torch.testing.assert_close(returns_to_go(rewards, mask), torch.tensor([[1.5, 1.5, 1.0, 0.0]]))
    # gamma 0.5: G_2 = 1, G_1 = 0.5 + 0.5 * 1 = 1, G_0 = 0 + 0.5 * 1 = 0.5
    torch.testing.assert_close(returns_to_go(rewards, mask, gamma=0.5), torch.tensor([[0.5, 1.0, 1.0, 0.0]]))


def test_group_statistics_by_hand():
    mean, std, count = group_mean_std(torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1]))
    assert mean.tolist() == [0.5, 0.5, 0.0, 0.0] and std.tolist() == [0.5, 0.5, 0.0, 0.0]
    assert count.tolist() == [2, 2, 2, 2]


def test_outcome_only_advantages_of_the_four_estimators():
    """One group of four, one right answer: R = [1, 0, 0, 0], mean 1/4, population std sqrt(3)/4 = 0.4330."""
    rewards, mask = outcome_batch([1.0, 0.0, 0.0, 0.0], [3, 2, 4, 1])
    group = torch.zeros(4, dtype=torch.long)
    expected = {
        ("grpo", True): [
            3 / math.sqrt(3),
            -1 / math.sqrt(3),
            -1 / math.sqrt(3),
            -1 / math.sqrt(3),
        ],  # (R - 1/4) / 0.433
        ("grpo", False): [0.75, -0.25, -0.25, -0.25],  # Dr. GRPO: R - 1/4
        ("rloo", True): [1.0, -1 / 3, -1 / 3, -1 / 3],  # R - mean of the other three
        ("reinforce_pp", True): [3 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)],
    }
    for (name, std), per_response in expected.items():
        out = critic_free_advantages(rewards, mask, group, Estimator(name), group_std=std)
        for b, a in enumerate(per_response):  # every real token of response b has its outcome advantage
            torch.testing.assert_close(out.advantages[b], a * mask[b], rtol=0, atol=1e-12)


def test_groups_are_normalised_separately_and_reinforce_pp_over_the_batch():
    rewards, mask = outcome_batch([1.0, 0.0, 1.0, 1.0], [1, 1, 1, 1])
    group = torch.tensor([0, 0, 1, 1])
    grpo = critic_free_advantages(rewards, mask, group, Estimator.grpo).advantages[:, 0]
    assert grpo.tolist() == [1.0, -1.0, 0.0, 0.0]  # group 0: (1 - .5) / .5; group 1 is all right: 0
    batch = critic_free_advantages(rewards, mask, group, Estimator.reinforce_pp).advantages[:, 0]
    s = math.sqrt(3) / 4  # batch mean 3/4, std sqrt(3)/4
    torch.testing.assert_close(batch, torch.tensor([0.25 / s, -0.75 / s, 0.25 / s, 0.25 / s], dtype=torch.float64))


def test_a_group_of_equal_rewards_gives_zero_advantage_and_is_counted():
    rewards, mask = outcome_batch([1.0, 1.0, 1.0, 0.0, 0.0, 1.0], [2, 3, 1, 2, 2, 2])
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    for estimator in (Estimator.grpo, Estimator.rloo):
        out = critic_free_advantages(rewards, mask, group, estimator)
        assert torch.all(out.advantages[:3] == 0), estimator  # exactly 0: no division of 0 by ~0
    assert equal_reward_group_fraction(rewards.sum(1), group) == 0.5
    assert equal_reward_group_fraction(torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1])) == 0.5


def test_process_rewards_give_each_token_its_own_step_and_the_steps_after():
    """Two responses to one prompt. Response 0: steps ending on tokens 1 and 3 with step rewards 0.2 and -0.4,
    success 1 on token 3. Response 1: one step ending on token 1, reward 0.1, success 0.
    R = [0.2 - 0.4 + 1, 0.1] = [0.8, 0.1]; Dr. GRPO's baseline 0.45.
    Response 0's rewards-to-go: tokens 0-1: 0.8; tokens 2-3: 0.6 -> advantages 0.35, 0.35, 0.15, 0.15.
    Response 1's: 0.1 on tokens 0-1 -> -0.35, -0.35."""
    rewards = torch.tensor([[0.0, 0.2, 0.0, 0.6], [0.0, 0.1, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    out = critic_free_advantages(rewards, mask, torch.tensor([0, 0]), Estimator.grpo, group_std=False)
    expected = torch.tensor([[0.35, 0.35, 0.15, 0.15], [-0.35, -0.35, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(out.advantages, expected, rtol=0, atol=1e-12)
    # GRPO divides by the group's std of totals, 0.35: [1, 1, 3/7, 3/7] and [-1, -1].
    grpo = critic_free_advantages(rewards, mask, torch.tensor([0, 0]), Estimator.grpo)
    torch.testing.assert_close(grpo.advantages, expected / 0.35, rtol=0, atol=1e-12)


def test_rloo_refuses_a_group_of_one():
    with pytest.raises(ValueError, match="at least 2 responses per prompt"):
        baseline_and_scale(torch.tensor([1.0, 0.0]), torch.tensor([0, 1]), Estimator.rloo)


# -- appending steps: Clip-Delta cannot pay for padding, raw PRM does ------------------------------------------

TOKENS_PER_STEP = 3
ETA = 0.6


def response_rewards(scores: list[float], success: float, refinement: Refinement) -> list[float]:
    """Token rewards of one response of len(scores) steps of TOKENS_PER_STEP tokens: refined step rewards on
    each step's last token, success on the last token (as rewards.build places them)."""
    step = refine(torch.tensor(scores, dtype=torch.float64), refinement, ETA).tolist()
    out = [0.0] * (TOKENS_PER_STEP * len(scores))
    for k, r in enumerate(step):
        out[TOKENS_PER_STEP * (k + 1) - 1] += r
    out[-1] += success
    return out


def advantage_sum(responses: list[list[float]], group: list[int], estimator: Estimator, std: bool) -> float:
    """Response 0's A_b0: the sum of the normalised rewards its first token's advantage is built from."""
    T = max(len(r) for r in responses)
    rewards = torch.zeros(len(responses), T, dtype=torch.float64)
    mask = torch.zeros_like(rewards)
    for b, r in enumerate(responses):
        rewards[b, : len(r)] = torch.tensor(r, dtype=torch.float64)
        mask[b, : len(r)] = 1
    out = critic_free_advantages(rewards, mask, torch.tensor(group), estimator, group_std=std)
    return float(out.advantages[0, 0])


GROUP = [([0.7, 0.5, 0.8], 1.0), ([0.4, 0.9], 0.0), ([0.8, 0.3, 0.6, 0.9], 1.0), ([0.2], 0.0)]
"""Four responses to one prompt: step scores and success; response 0 gets the appended steps."""


@pytest.mark.parametrize("estimator, std", ESTIMATORS)
def test_appending_steps_cannot_raise_the_advantage_sum_under_clip_delta_and_does_under_raw_prm(estimator, std):
    def a0(refinement: Refinement, extra_scores: list[float]) -> float:
        (scores0, success0), *rest = GROUP
        responses = [response_rewards(scores0 + extra_scores, success0, refinement)]
        responses += [response_rewards(s, o, refinement) for s, o in rest]
        return advantage_sum(responses, [0, 0, 0, 0], estimator, std)

    padding = [0.9, 0.9, 0.9]  # three well-scored steps appended
    before, after = a0(Refinement.clip_delta, []), a0(Refinement.clip_delta, padding)
    assert after <= before + 1e-12  # the telescoped sum min(c_1 - eta, 0) is the same: nothing to gain
    raw_before, raw_after = a0(Refinement.none, []), a0(Refinement.none, padding)
    assert raw_after > raw_before + 0.1  # raw PRM pays 0.9 a step: the hack's incentive


def test_centring_every_step_reward_would_pay_for_padding_under_clip():
    """DeepSeekMath's normalisation, r~_k = (r_k - mean) / std over the group's step rewards, summed over a
    response's steps: under Clip every r_k <= 0, so the mean is negative and each appended step adds -mean/std > 0.
    The normalisation of ppo.critic_free subtracts one baseline per response instead (test above)."""
    step_rewards = [refine(torch.tensor(s, dtype=torch.float64), Refinement.clip, ETA) for s, _ in GROUP]

    def centred_sum(extra: int) -> float:
        rewards = [torch.cat([step_rewards[0], torch.zeros(extra, dtype=torch.float64)]), *step_rewards[1:]]
        pooled = torch.cat(rewards)
        mean, std = pooled.mean(), pooled.std(correction=0)
        assert mean < 0
        return float(((rewards[0] - mean) / std).sum())

    assert centred_sum(3) > centred_sum(0) + 0.5  # three clipped-to-zero steps appended: a bonus


@settings(max_examples=200, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5), st.sampled_from([0.0, 1.0])),
        min_size=2,
        max_size=6,
    ),
    extra=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4),
    which=st.sampled_from(
        [(Estimator.grpo, True), (Estimator.grpo, False), (Estimator.rloo, True), (Estimator.reinforce_pp, True)]
    ),
)
def test_clip_delta_padding_never_pays_for_any_group(data, extra, which):
    """Any group, any appended steps with any PRM scores: response 0's advantage sum does not rise. Its total
    under Clip-Delta is success + min(c_1 - eta, 0) once it has 2 steps (and success alone with 1), so appending
    either keeps it or lowers it, and each estimator's A_b0 is non-decreasing in the response's own total."""
    estimator, std = which
    responses = [response_rewards(s, o, Refinement.clip_delta) for s, o in data]
    padded = [response_rewards(data[0][0] + extra, data[0][1], Refinement.clip_delta), *responses[1:]]
    group = [0] * len(data)
    assert advantage_sum(padded, group, estimator, std) <= advantage_sum(responses, group, estimator, std) + 1e-9
