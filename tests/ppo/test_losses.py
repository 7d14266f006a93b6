"""PPO-clip, clipped value loss, logprobs and entropy: the four clipping cases worked out by hand."""

import math

import pytest
import torch

from ppo.losses import (
    entropy_from_logits,
    head_logprobs,
    logprobs_from_logits,
    policy_loss,
    value_clip_range,
    value_loss,
)
from tests import tolerance as tol


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


def test_entropy_uses_the_sampling_temperature():
    # p = [1/4, 3/4] at temperature 1; at temperature 2 the logits halve: p = [1, sqrt 3] / (1 + sqrt 3)
    two = torch.tensor([[[0.0, math.log(3.0)]]])
    p = math.sqrt(3) / (1 + math.sqrt(3))
    expected = -(p * math.log(p) + (1 - p) * math.log(1 - p))
    assert entropy_from_logits(two, temperature=2.0).item() == pytest.approx(expected)
    # and it is the entropy of the distribution logprobs_from_logits scores at that temperature
    logprobs = logprobs_from_logits(two.expand(1, 2, 2), torch.tensor([[0, 1]]), temperature=2.0)
    assert entropy_from_logits(two, temperature=2.0).item() == pytest.approx(-(logprobs.exp() * logprobs).sum().item())


def test_value_loss_without_clipping_is_plain_regression():
    # same numbers as the clipped case: 0.5 * (0.25 + 0.16 + 2.25) / 3, nothing clipped
    values = torch.tensor([[0.5, 0.1, -0.5]], requires_grad=True)
    returns = torch.tensor([[1.0, 0.5, 1.0]])
    loss, stats = value_loss(values, torch.zeros(1, 3), returns, torch.ones(1, 3), clip_eps=None)
    assert loss.item() == pytest.approx(0.5 * 2.66 / 3)
    assert stats.clip_frac.item() == 0.0
    loss.backward()
    torch.testing.assert_close(values.grad, (values - returns).detach() / 3)


def test_raw_value_clip_stalls_a_zero_critic_on_large_returns_and_return_std_scales_with_them():
    # A zero-initialised head and raw-PRM-sized returns (3.0): once V has moved 0.2 the clipped
    # error is the larger one and the gradient is exactly 0, however far V still is from R.
    returns = torch.full((1, 2), 3.0)
    values = torch.tensor([[0.25, 0.1]], requires_grad=True)
    loss, stats = value_loss(values, torch.zeros(1, 2), returns, torch.ones(1, 2), clip_eps=0.2)
    loss.backward()
    assert values.grad[0, 0].item() == 0.0 and values.grad[0, 1].item() < 0
    assert stats.clip_frac.item() == pytest.approx(0.5)
    # return_std: the range is eps * std(R over real tokens), so it scales with the reward
    returns = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # padding (9) is left out
    assert value_clip_range(returns, mask, 0.5, "return_std") == pytest.approx(0.5 * math.sqrt(1.25))
    assert value_clip_range(10 * returns, mask, 0.5, "return_std") == pytest.approx(5 * math.sqrt(1.25))
    assert value_clip_range(returns, mask, 0.5, "raw") == 0.5
    assert value_clip_range(returns, mask, 0.5, "none") is None
    # two data-parallel halves, summed, give the range of the whole batch
    halves = [(returns[:1], mask[:1]), (returns[1:], mask[1:])]

    def fake_all_reduce(moments):  # this half's moments plus the other half's
        other = [r for r in halves if r[0] is not current[0]][0]
        r, m = other[0].double(), other[1].double()
        return moments + torch.stack([m.sum(), (r * m).sum(), (r * r * m).sum()])

    for current in halves:
        assert value_clip_range(*current, 0.5, "return_std", fake_all_reduce) == pytest.approx(0.5 * math.sqrt(1.25))
    with pytest.raises(ValueError, match="value_clip"):
        value_clip_range(returns, mask, 0.5, "rawr")


def test_logsumexp_in_row_blocks_equals_one_call_values_and_gradients(monkeypatch):
    """Rows in blocks of 2, 2 and 1 give one call's values and gradients bit for bit, on every CPU kernel
    set: each row's logsumexp and its softmax gradient sum only that row's terms, in the same order
    whichever block holds the row (no sum runs across rows)."""
    import ppo.losses as L

    torch.manual_seed(0)
    logits = torch.randn(5, 3, 7, dtype=torch.float64, requires_grad=True)
    whole = torch.logsumexp(logits, dim=-1)
    (grad_whole,) = torch.autograd.grad(whole.sum(), logits)
    monkeypatch.setattr(L, "LOGSUMEXP_BLOCK_ELEMENTS", 2 * 3 * 7)  # blocks of 2 rows: 2 + 2 + 1
    block_rows = []
    one_call = torch.logsumexp
    monkeypatch.setattr(torch, "logsumexp", lambda x, dim: block_rows.append(x.shape[0]) or one_call(x, dim=dim))
    blocks = L.logsumexp_in_row_blocks(logits)
    assert block_rows == [2, 2, 1]
    (grad_blocks,) = torch.autograd.grad(blocks.sum(), logits)
    assert torch.equal(blocks, whole) and torch.equal(grad_blocks, grad_whole)
    assert L.logprobs_from_logits(logits, torch.zeros(5, 3, dtype=torch.long)).shape == (5, 3)


def test_head_logprobs_worked_example():
    # hidden [1, 0], weight rows [1, 0] and [0, 0]: logits [1, 0]. Token 0: 1 - log(e + 1) = -0.3133;
    # entropy log(e + 1) - e / (e + 1) = 0.5822 (the docstring's example).
    hidden, weight = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    logprobs, entropy = head_logprobs(hidden, weight, torch.tensor([0]), with_entropy=True)
    e = math.e
    assert logprobs.item() == pytest.approx(1 - math.log(e + 1))
    assert entropy.item() == pytest.approx(math.log(e + 1) - e / (e + 1))
    assert head_logprobs(hidden, weight, torch.tensor([0]))[1] is None  # no entropy unless asked


def _head_bound(hidden, weight, tokens, temperature, up_logprobs, up_entropy) -> float:
    """Rule 1 of tests/tolerance.py for ``head_logprobs`` in blocks against the full logits, for its values
    and both gradients: the sums along the longest path are the logits' (H = 8 terms), the vocabulary's
    logsumexp and entropy (V = 50 each), then the backward's into the hidden state (V) or the weight
    (N = 10 rows): 8 + 3 * 50 + 10 = 168 terms, at the largest sum of |terms| on the path (computed in float64
    from the reference: |h| |w|^T / T for z, |dL/d(hw)| |w| and |dL/d(hw)|^T |h| for the gradients)."""
    logits = torch.nn.functional.linear(hidden, weight)[None].requires_grad_()
    loss = logprobs_from_logits(logits, tokens[None], temperature)[0] * up_logprobs
    if up_entropy is not None:
        loss = loss + entropy_from_logits(logits, temperature)[0] * up_entropy
    (grad_z,) = torch.autograd.grad(loss.sum(), logits)
    h, w, dz = hidden.double().abs(), weight.double().abs(), grad_z[0].double().abs()
    scale = max(1.0, float((h @ w.T).max()) / temperature, float((dz @ w).max()), float((dz.T @ h).max()))
    num_rows, num_hidden = hidden.shape
    return tol.rounding(num_hidden + 3 * weight.shape[0] + num_rows, scale)


@pytest.mark.equivalence
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_head_logprobs_in_blocks_equal_the_full_logits_values_and_gradients(temperature):
    """10 rows in blocks of 3 (the last block short): the values of the logits path, and the gradients for
    hidden and weight through both the logprobs and the entropy, within rule 1 of tests/tolerance.py (the
    weight's gradient sums the rows a block at a time: another order, ``_head_bound``)."""
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(10, 8, generator=g), torch.randn(50, 8, generator=g)
    tokens = torch.randint(0, 50, (10,), generator=g)
    up_logprobs, up_entropy = torch.randn(10, generator=g), torch.randn(10, generator=g)

    def full(h, w):
        logits = torch.nn.functional.linear(h, w)[None]
        return logprobs_from_logits(logits, tokens[None], temperature)[0], entropy_from_logits(logits, temperature)[0]

    grads = []
    for fn in (full, lambda h, w: head_logprobs(h, w, tokens, temperature, with_entropy=True, block_rows=3)):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        logprobs, entropy = fn(h, w)
        (logprobs * up_logprobs + entropy * up_entropy).sum().backward()
        grads.append((logprobs.detach(), entropy.detach(), h.grad, w.grad))
    bound = _head_bound(hidden, weight, tokens, temperature, up_logprobs, up_entropy)
    for name, want, got in zip(("logprobs", "entropy", "hidden grad", "weight grad"), *grads):
        tol.assert_close(got, want, bound, msg=name)
    # Only the logprobs in the loss: the entropy's gradient is left out, not zero-filled into it.
    h = hidden.clone().requires_grad_()
    logprobs, _ = head_logprobs(h, weight, tokens, temperature, block_rows=4)
    (logprobs * up_logprobs).sum().backward()
    want_h = hidden.clone().requires_grad_()
    (full(want_h, weight)[0] * up_logprobs).sum().backward()
    bound = _head_bound(hidden, weight, tokens, temperature, up_logprobs, None)
    tol.assert_close(h.grad, want_h.grad, bound, msg="hidden grad, logprobs only")


def test_loss_aggregations_by_hand():
    """Per-token losses [[1, 1, 1, 1], [4, -, -, -]]: 5 tokens in 2 responses, Dr. GRPO's constant 4."""
    from ppo.config import LossAgg
    from ppo.losses import Denominators, aggregate

    loss = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    den = Denominators(torch.tensor(5.0), torch.tensor(2.0), 4.0)
    assert aggregate(loss, mask, LossAgg.token_mean, den).item() == pytest.approx(8 / 5)
    assert aggregate(loss, mask, LossAgg.seq_mean_token_mean, den).item() == pytest.approx((1 + 4) / 2)
    assert aggregate(loss, mask, LossAgg.seq_mean_token_sum_norm, den).item() == pytest.approx(8 / (2 * 4))
    # Two data-parallel shares of the same minibatch with the whole minibatch's denominators sum to it.
    for agg in LossAgg:
        halves = sum(aggregate(loss[i : i + 1], mask[i : i + 1], agg, den) for i in range(2))
        assert halves.item() == pytest.approx(aggregate(loss, mask, agg, den).item())
