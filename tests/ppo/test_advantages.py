"""KL-shaped rewards, GAE and whitening against numbers worked out by hand."""

import pytest
import torch

from ppo.advantages import (
    compute_advantages,
    explained_variance,
    gae,
    kl_shaped_rewards,
    masked_mean,
    masked_var,
    masked_whiten,
)


def test_masked_mean_and_var_ignore_padding():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert masked_mean(x, mask).item() == pytest.approx(2.0)
    # (1 + 0 + 1) / (3 - 1) = 1 (Bessel), or / 3 = 2/3 (biased)
    assert masked_var(x, mask).item() == pytest.approx(1.0)
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(2 / 3)
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0  # empty slice: 0, not NaN


def test_masked_mean_along_dim():
    x = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([2.0, 5.0]))


def test_masked_whiten():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # mean 2, std 1 -> [-1, 0, 1], padding -> 0
    torch.testing.assert_close(masked_whiten(x, mask), torch.tensor([[-1.0, 0.0, 1.0, 0.0]]), atol=1e-6, rtol=0)
    # rescale only: [-1, 0, 1] + 2
    torch.testing.assert_close(
        masked_whiten(x, mask, shift_mean=False), torch.tensor([[1.0, 2.0, 3.0, 0.0]]), atol=1e-6, rtol=0
    )


def test_kl_shaped_rewards():
    scores = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    logprobs = torch.tensor([[-1.0, -2.0, -0.5, -9.0]])
    ref_logprobs = torch.tensor([[-1.5, -2.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    rewards, kl = kl_shaped_rewards(scores, logprobs, ref_logprobs, mask, kl_coef=0.1)
    # kl = [0.5, 0, 0.5, (pad) 0]; r = score - 0.1 * kl = [-0.05, 0, 0.95, 0]
    torch.testing.assert_close(kl, torch.tensor([[0.5, 0.0, 0.5, 0.0]]))
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.0, 0.95, 0.0]]))


def test_gae_three_tokens_by_hand():
    # gamma = 1, lam = 0.5, reward 1 on the last token, V = [0.5, 0.6, 0.7]
    #   delta_2 = 1 + 0   - 0.7 = 0.3    A_2 = 0.3
    #   delta_1 = 0 + 0.7 - 0.6 = 0.1    A_1 = 0.1 + 0.5 * 0.3  = 0.25
    #   delta_0 = 0 + 0.6 - 0.5 = 0.1    A_0 = 0.1 + 0.5 * 0.25 = 0.225
    # Row 2 ends after two tokens (reward 1 there); its third column is padding with junk in it:
    #   delta_1 = 1 - 0.6 = 0.4          A_1 = 0.4
    #   delta_0 = 0.6 - 0.5 = 0.1        A_0 = 0.1 + 0.5 * 0.4 = 0.3
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 5.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.5, 0.6, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    torch.testing.assert_close(advantages, torch.tensor([[0.225, 0.25, 0.3], [0.3, 0.4, 0.0]]))
    # R = A + V: [0.725, 0.85, 1.0] and [0.8, 1.0, (pad) 0]
    torch.testing.assert_close(returns, torch.tensor([[0.725, 0.85, 1.0], [0.8, 1.0, 0.0]]))


def test_gae_gamma_lam_one_is_reward_to_go_minus_value():
    torch.manual_seed(0)
    rewards, values = torch.randn(4, 6), torch.randn(4, 6)
    lengths = torch.tensor([6, 4, 1, 3])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).float()
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    reward_to_go = (rewards * mask).flip(1).cumsum(1).flip(1)
    torch.testing.assert_close(advantages, (reward_to_go - values) * mask)
    torch.testing.assert_close(returns, reward_to_go * mask)


def test_gae_lam_zero_is_one_step_td():
    # lam = 0: A_t = r_t + gamma * V_{t+1} - V_t, with V after the end = 0
    rewards = torch.tensor([[1.0, 2.0, 3.0]])
    values = torch.tensor([[10.0, 20.0, 30.0]])
    mask = torch.ones(1, 3)
    advantages, _ = gae(rewards, values, mask, gamma=0.5, lam=0.0)
    # [1 + 10 - 10, 2 + 15 - 20, 3 + 0 - 30]
    torch.testing.assert_close(advantages, torch.tensor([[1.0, -3.0, -27.0]]))


def test_gae_discounted_return():
    # gamma = 0.5, lam = 1, V = 0: A_t is the discounted reward-to-go: [1 + 0.5 * 2, 0 + 0.5 * 4, 4]
    rewards = torch.tensor([[1.0, 0.0, 4.0]])
    advantages, _ = gae(rewards, torch.zeros(1, 3), torch.ones(1, 3), gamma=0.5, lam=1.0)
    torch.testing.assert_close(advantages, torch.tensor([[2.0, 2.0, 4.0]]))


def test_compute_advantages_whitens_but_returns_stay_raw():
    scores = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    zeros = torch.zeros(2, 2)
    mask = torch.ones(2, 2)
    out = compute_advantages(scores, zeros, zeros, zeros, mask, kl_coef=0.1, gamma=1.0, lam=1.0, whiten=True)
    # raw advantages = reward-to-go = [[1, 1], [0, 0]] -> mean 0.5, std sqrt(1/3) (Bessel over 4 tokens)
    torch.testing.assert_close(out.returns, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
    expected = (torch.tensor([[1.0, 1.0], [0.0, 0.0]]) - 0.5) / (1 / 3) ** 0.5
    torch.testing.assert_close(out.advantages, expected, atol=1e-5, rtol=0)
    assert masked_mean(out.advantages, mask).abs().item() < 1e-6


def test_explained_variance_by_hand():
    # R = 1, 2, 3, 4 and V = 1, 2, 3, 3: Var(R - V) = 0.25, Var(R) = 5/3 (Bessel) -> 1 - 0.15 = 0.85
    returns = torch.tensor([[1.0, 2.0, 0.0], [3.0, 4.0, 0.0]])
    values = torch.tensor([[1.0, 2.0, 7.0], [3.0, 3.0, -7.0]])  # padding (7, -7) is left out
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    assert explained_variance(values, returns, mask) == pytest.approx(0.85)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros_like(returns), returns, mask) == pytest.approx(
        0.0
    )  # a constant explains nothing
    assert explained_variance(-returns, returns, mask) == pytest.approx(-3.0)  # Var(2R) = 4 Var(R)
    assert explained_variance(values, torch.ones_like(returns), mask) == 0.0  # nothing to explain
