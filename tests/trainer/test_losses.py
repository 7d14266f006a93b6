"""PPO-clip, clipped value loss, logprobs and entropy: the four clipping cases worked out by hand."""
import math

import pytest
import torch

from trainer.losses import entropy_from_logits, logprobs_from_logits, policy_loss, value_loss


def test_policy_loss_four_clipping_cases():
    # clip_eps = 0.2, old logprobs 0, so r = exp(logprob):
    #   A = +1, r = 1.5: max(-1.5, -1.2) = -1.2   clipped (no incentive to push r higher)
    #   A = +1, r = 0.5: max(-0.5, -0.8) = -0.5   unclipped
    #   A = -1, r = 1.5: max( 1.5,  1.2) =  1.5   unclipped
    #   A = -1, r = 0.5: max( 0.5,  0.8) =  0.8   clipped
    # loss = (-1.2 - 0.5 + 1.5 + 0.8) / 4 = 0.15; clip_frac = 2 / 4
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]])).requires_grad_()
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4)
    loss, stats = policy_loss(logprobs, torch.zeros(1, 4), advantages, mask, clip_eps=0.2)
    assert loss.item() == pytest.approx(0.15)
    assert stats.clip_frac.item() == pytest.approx(0.5)
    # k3: (r - 1) - log r = 0.5 - log 1.5 and -0.5 - log 0.5
    expected_kl = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 2
    assert stats.approx_kl.item() == pytest.approx(expected_kl)
    assert stats.ratio.item() == pytest.approx(1.0)
    loss.backward()
    # d/dlogp of -A * r is -A * r / 4 for unclipped tokens; clipped tokens get no gradient
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, -0.5 / 4, 1.5 / 4, 0.0]]))


def test_policy_loss_ignores_padding_and_splits_over_ranks():
    torch.manual_seed(0)
    logprobs, old, adv = torch.randn(4, 5), torch.randn(4, 5), torch.randn(4, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]]).float()
    full, full_stats = policy_loss(logprobs, old, adv, mask, clip_eps=0.2)
    # junk on padding changes nothing
    junk = torch.where(mask.bool(), logprobs, torch.full_like(logprobs, 50.0))
    torch.testing.assert_close(policy_loss(junk, old, adv, mask, clip_eps=0.2)[0], full)
    # two "ranks" with the global token count as denominator sum to the full loss and stats
    num_tokens = mask.sum()
    halves = [policy_loss(logprobs[s], old[s], adv[s], mask[s], 0.2, num_tokens) for s in (slice(0, 2), slice(2, 4))]
    torch.testing.assert_close(halves[0][0] + halves[1][0], full)
    torch.testing.assert_close(halves[0][1].clip_frac + halves[1][1].clip_frac, full_stats.clip_frac)


def test_value_loss_clipping_by_hand():
    # clip_eps = 0.2, V_old = 0:
    #   V =  0.5, R = 1:   unclipped (0.5)^2 = 0.25, clipped V 0.2 -> (0.8)^2 = 0.64   -> 0.64 (clipped)
    #   V =  0.1, R = 0.5: inside the clip range, both 0.16                            -> 0.16
    #   V = -0.5, R = 1:   unclipped (1.5)^2 = 2.25, clipped V -0.2 -> (1.2)^2 = 1.44  -> 2.25
    # loss = 0.5 * (0.64 + 0.16 + 2.25) / 3 = 0.508333...; clip_frac = 1 / 3
    values = torch.tensor([[0.5, 0.1, -0.5]])
    returns = torch.tensor([[1.0, 0.5, 1.0]])
    loss, stats = value_loss(values, torch.zeros(1, 3), returns, torch.ones(1, 3), clip_eps=0.2)
    assert loss.item() == pytest.approx(0.5 * 3.05 / 3)
    assert stats.clip_frac.item() == pytest.approx(1 / 3)
    assert stats.values.item() == pytest.approx(0.1 / 3)


def test_logprobs_from_logits_with_temperature():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])  # p = [1/4, 3/4]
    tokens = torch.tensor([[1]])
    assert logprobs_from_logits(logits, tokens).item() == pytest.approx(math.log(0.75))
    # temperature 2 halves the logits: p_1 = sqrt(3) / (1 + sqrt(3))
    expected = math.log(math.sqrt(3) / (1 + math.sqrt(3)))
    assert logprobs_from_logits(logits, tokens, temperature=2.0).item() == pytest.approx(expected)


def test_entropy_from_logits():
    uniform = torch.zeros(1, 1, 4)
    assert entropy_from_logits(uniform).item() == pytest.approx(math.log(4))
    peaked = torch.tensor([[[0.0, -1e4, -1e4]]])
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)
    # p = [1/4, 3/4]: H = -(0.25 ln 0.25 + 0.75 ln 0.75)
    two = torch.tensor([[[0.0, math.log(3.0)]]])
    assert entropy_from_logits(two).item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
