"""Tolerances of the equivalence tests, all from one rule (docs/development.md, "Tolerances").

An equivalence test runs the same math two ways (sharded and unsharded, plan and plan, pipeline and one
process, micro-batches and one pass) and compares. The two differ only in the order, blocking and vector
width of their fp32 sums, and so do two machines' kernels (AVX2, AVX-512), so every bound here follows from
fp32's machine epsilon and the lengths of the sums, never from what one CPU happened to show:

1. Before any optimizer step, ``rounding(num_terms, scale)``: two orders of an n-term sum are within
   ``n * EPS * sum|terms|`` of each other (each is within ``gamma_(n-1) * sum|terms|`` of the exact sum,
   gamma_k = k u / (1 - k u), u = EPS / 2: Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd
   ed., section 4.2), whatever the order, blocking, FMA or vector width. Through several sums (a forward
   pass) the lengths add, to first order (a pre-norm residual block passes a relative error on with gain
   about 1); ``Reductions`` counts them for a transformer's forward pass and a weight's gradient.
2. A quantity zero by construction (a whitened mean, KL between equal policies) is compared absolutely,
   by rule 1 at the scale of its terms; never relatively.
3. After Adam steps: Adam divides each gradient element by its own running magnitude, so a gradient
   rounded by a fraction ``rho`` of its terms' scale G moves a weight by up to ``min(2, rho G / |g|) lr``
   per step: 2 lr where rounding flips a near-zero gradient's sign, next to nothing where the gradient
   stands clear of its rounding. So each weight is within ``adam_max(lrs)``, and each tensor's mean
   difference within ``phi * sum(lrs)``, ``phi = adam_fraction(rho)``, plus one flipped element
   (``assert_trained_close``); a quantity computed from trained weights within its rule-1 bound plus
   ``phi`` times how far the steps moved it (``trained``, ``trained_scalars``).

Tests that need identical results (resume, restart after a lost worker, dry run = run) compare with
``==``: one machine runs the same sums in the same order on every kernel set.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

EPS = torch.finfo(torch.float32).eps
"""2**-23, fp32's machine epsilon (twice the unit roundoff)."""


def rounding(num_terms: int, scale: float = 1.0) -> float:
    """Rule 1: the most two fp32 evaluations of a quantity can differ before any optimizer step, when
    the sums along its path have ``num_terms`` terms in all and ``scale`` is the magnitude of each sum's
    terms (their absolute values' sum: the quantity's own magnitude where they do not cancel).

    Worked example: a 128-term dot product whose terms' magnitudes sum to 1: 128 * 2**-23 = 1.53e-5.
    """
    return num_terms * EPS * scale


@dataclass(frozen=True)
class Reductions:
    """The sum lengths of a decoder-only transformer (Qwen2 / Llama), which rule 1 counts."""

    num_layers: int
    hidden: int
    intermediate: int
    head_dim: int
    vocab: int

    @classmethod
    def of(cls, model_dir: str | Path) -> Reductions:
        """Read from an HF model directory's config.json."""
        c = json.loads((Path(model_dir) / "config.json").read_text())
        head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        return cls(c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"], head_dim, c["vocab_size"])

    def forward(self, num_tokens: int, lm_head: bool = True) -> int:
        """Terms summed along one output of a forward pass over sequences of ``num_tokens``: per layer
        two RMSNorms, the q/k/v and o projections and gate/up (``hidden`` each), q.k (``head_dim``),
        softmax and the weighted sum of values (``num_tokens`` each), down (``intermediate``); then
        the final norm, the head (``hidden`` each) and, for an LM head, log-softmax over the vocabulary.

        Worked example, the tiny model (2 layers, hidden 128, intermediate 384, head_dim 64, vocab 326)
        at 16 tokens: 2 * (5 * 128 + 64 + 2 * 16 + 384) + 2 * 128 + 326 = 2822.
        """
        per_layer = 5 * self.hidden + self.head_dim + 2 * num_tokens + self.intermediate
        return self.num_layers * per_layer + 2 * self.hidden + (self.vocab if lm_head else 0)

    def gradient(self, num_tokens: int, num_batch_tokens: int, num_ranks: int = 1) -> int:
        """Terms summed into one weight's gradient: its input from below and the error from above (at
        most a forward pass each), times each other over the batch's tokens, then the ranks' partial
        sums. Tiny model, 16-token rows, 128 tokens, 2 ranks: 2 * 2822 + 128 + 2 = 5774."""
        return 2 * self.forward(num_tokens) + num_batch_tokens + num_ranks


def adam_step_limit(step: int, betas: tuple[float, float] = (0.9, 0.999)) -> float:
    """The most Adam's bias-corrected ``|m / sqrt(v)|`` can be at step ``step`` (1-based), for any
    gradients: by Cauchy-Schwarz, ``sqrt(sum_i a_i**2 / b_i)`` over the weights ``a_i``, ``b_i`` that
    m and v give step i's gradient. 1 at step 1, 1.0014 at step 2, 1.028 at step 8, 1.156 at step 20."""
    b1, b2 = betas
    a = [(1 - b1) * b1 ** (step - i) / (1 - b1**step) for i in range(1, step + 1)]
    b = [(1 - b2) * b2 ** (step - i) / (1 - b2**step) for i in range(1, step + 1)]
    return math.sqrt(sum(x * x / y for x, y in zip(a, b)))


def adam_max(lrs: Sequence[float]) -> float:
    """Rule 3's bound on one weight after Adam steps from a fresh optimizer with learning rates
    ``lrs``: each step can move it the most either way, ``2 * limit * lr``. Two steps at 1e-3:
    2 * (1 + 1.0014) * 1e-3 = 4.003e-3."""
    return sum(2 * adam_step_limit(step) * lr for step, lr in enumerate(lrs, start=1))


def adam_fraction(gradient_rounding: float) -> float:
    """Rule 3's ``phi``: the fraction of Adam's update that the gradients' relative rounding ``rho``
    can change, on average over a tensor: ``rho * (1 + ln(2 / rho))``.

    Worked example: rho = 6.88e-4 (the tiny model's 5774 gradient terms) gives 6.88e-4 * (1 + 7.98) = 6.18e-3.
    """
    rho = gradient_rounding
    return rho * (1.0 + math.log(2.0 / rho))


def trained(before: float, gradient_rounding: float, moved: float) -> float:
    """Rule 3 for a quantity computed from trained weights (a later minibatch's loss, logprobs after an
    update, the next iteration's KL): its rule-1 bound ``before``, plus ``phi`` times how far the Adam
    steps moved it (``moved``: the reference's change where the test sees it, else the quantity's
    scale), since the two runs' updates agree up to a fraction ``phi``.

    Worked example: logprobs within 2.1e-3 before, moved 4e-3 by the steps, rho = 6.88e-4:
    2.1e-3 + 6.18e-3 * 4e-3 = 2.125e-3.
    """
    return before + adam_fraction(gradient_rounding) * moved


num_comparisons = 0
"""Comparisons made by the running test (tests/conftest.py checks that such a test is marked ``equivalence``)."""


def _record(what: str, observed: float, bound: float) -> None:
    """Count a comparison; with REALM_TOLERANCE_LOG=path, also append its observed difference and bound
    as a JSON line (the test, what, both numbers): how far below its bounds a test runs on a machine."""
    global num_comparisons
    num_comparisons += 1
    path = os.environ.get("REALM_TOLERANCE_LOG")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
        with open(path, "a") as f:
            f.write(json.dumps({"test": test, "what": what, "observed": observed, "bound": bound}) + "\n")


def scale_of(want: torch.Tensor | float) -> float:
    """The scale of a reference's terms, for rule 1: the larger of 1 (normalized activations: an
    RMSNorm's output has RMS 1; the tiny models' logits stay within 2) and the largest |value|."""
    largest = want.detach().abs().max().item() if isinstance(want, torch.Tensor) and want.numel() else abs(want)
    return max(1.0, float(largest))


def trained_scalars(
    want: Mapping[str, float], gradient_rounding: float, num_steps: int, exact: Iterable[str] = ("lr",)
) -> dict[str, float]:
    """Rule-3 bounds for a training call's stats, means over its ``num_steps`` optimizer steps (all but
    the first after a step): rule 1 at the gradient's length, ``rho * scale_of(value)`` (the gradient
    norm's path is the longest), plus ``phi`` times how far the steps moved the stat, at most
    ``num_steps * |value|``: a stat that starts at 0 (PPO's loss, clip fraction and approximate KL at
    ratio 1) or keeps one sign (a norm, an entropy, a squared error) began within that of its mean.
    The keys in ``exact`` (settings such as the learning rate) must be equal."""
    rho = gradient_rounding
    return {k: 0.0 if k in exact else trained(rho * scale_of(v), rho, num_steps * abs(v)) for k, v in want.items()}


def assert_close(got: torch.Tensor, want: torch.Tensor, bound: float, msg: str = "") -> None:
    """Elementwise ``|got - want| <= bound`` (absolute: the rules give absolute bounds), shapes equal."""
    if got.shape == want.shape and got.numel():
        _record(msg or "tensor", float((got.detach().double() - want.detach().double()).abs().max()), bound)
    torch.testing.assert_close(got, want, atol=bound, rtol=0, msg=lambda m: f"{msg}\n{m}" if msg else m)


def assert_scalars_close(
    got: Mapping[str, float], want: Mapping[str, float], bound: Mapping[str, float], context: str = ""
) -> None:
    """The same keys, and each value within its key's absolute bound."""
    assert got.keys() == want.keys(), (sorted(got), sorted(want))
    for k in want:
        _record(k, abs(got[k] - want[k]), bound[k])
    far = {k: (got[k], want[k], bound[k]) for k in want if not abs(got[k] - want[k]) <= bound[k]}
    assert not far, f"{context}{': ' if context else ''}(got, want, bound) beyond their bounds: {far}"


def assert_trained_close(
    got: Mapping[str, torch.Tensor],
    want: Mapping[str, torch.Tensor],
    lrs: Sequence[float],
    gradient_rounding: float,
    names: Iterable[str] | None = None,
) -> None:
    """Rule 3 for weights that started equal and took Adam steps from a fresh optimizer with learning
    rates ``lrs``: each element within ``adam_max(lrs)`` (about ``2 * sum(lrs)``), and each tensor's
    summed difference within ``numel * phi * sum(lrs) + adam_max(lrs)`` (its share of changed updates,
    plus one flipped element)."""
    total_lr, most = sum(lrs), adam_max(lrs)
    phi = adam_fraction(gradient_rounding)
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    for name in names if names is not None else want:
        a, b = got[name].detach().float(), want[name].detach().float()
        assert a.shape == b.shape, (name, a.shape, b.shape)
        diff = (a - b).abs()
        assert diff.max() <= most, f"{name}: max |difference| {diff.max():.3g} > adam_max(lrs) = {most:.3g}"
        summed, limit = float(diff.sum()), a.numel() * phi * total_lr + most
        _record(f"{name} max", float(diff.max()), most)
        _record(f"{name} sum", summed, limit)
        assert summed <= limit, (
            f"{name}: summed |difference| {summed:.3g} > numel {a.numel()} * phi {phi:.3g} * sum(lr) + adam_max = {limit:.3g}"
        )
