"""Token-level rewards from ShapedReward, with a stand-in PRM/ORM whose scores are written below."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from rewards.build import ShapedReward, build_reward_fn, place_token_rewards, step_layout
from rewards.config import Refinement, RewardConfig, RewardKind, RewardModelConfig
from rewards.reward_model import RewardModelError
from rewards.segment import SegmentedResponse, Step
from rewards.types import RewardSample
from tests import tolerance as tol

QUESTION = "Start with 7. Add 5, then multiply by 3. What is the result?"
STEP_1, STEP_2, ANSWER = "7 + 5 = 12", "12 * 3 = 36", "The answer is \\boxed{36}."
# What the stand-in PRM says about each step, whatever came before it.
SCORES = {STEP_1: 0.9, STEP_2: 0.8, ANSWER: 0.95, "": 0.5, "12 * 3 = 35": 0.3}


@dataclass
class Graded:
    correct: bool
    extracted: str | None
    reason: str = ""


def fake_grade(responses, golds, datasets):
    """Correct iff the text has \\boxed{gold} (what the real grader says on these responses)."""
    return [Graded(f"\\boxed{{{g}}}" in r, g if f"\\boxed{{{g}}}" in r else None) for r, g in zip(responses, golds)]


class FakePRM:
    def score_steps(self, questions, steps):
        return [[SCORES[s.content] for s in response] for response in steps]


class FakeORM:
    def score_outcomes(self, questions, responses):
        return [0.25 if "35" in r else 0.75 for r in responses]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def sample(tok, steps, eos=True) -> RewardSample:
    text = "\n\n".join(steps)
    ids = tok(text).input_ids + ([tok.eos_token_id] if eos else [])
    return RewardSample(QUESTION, "36", "math", f"<|im_start|>user\n{QUESTION}<|im_end|>\n", text, ids)


def prm_reward(tok, refinement, alpha=1.0, eta=0.85) -> ShapedReward:
    cfg = RewardConfig(
        kind=RewardKind.prm,
        refinement=refinement,
        alpha=alpha,
        eta=eta,
        model=RewardModelConfig(path="builtin:synthetic-prm"),
    )
    return ShapedReward(cfg, tok, FakePRM(), fake_grade)


def test_place_token_rewards_worked_example():
    # Two responses of 5 and 3 tokens (T = 5). Row 0: steps end on tokens 1 and 4, success 1.
    # Row 1: one step ending on token 2, success 0. Padding steps (mask false) carry garbage.
    out = place_token_rewards(
        lengths=torch.tensor([5, 3]),
        final_rewards=torch.tensor([1.0, 0.0]),
        step_rewards=torch.tensor([[0.5, -0.25], [0.125, 7.0]]),
        step_end_index=torch.tensor([[1, 4], [2, 4]]),
        step_mask=torch.tensor([[True, True], [True, False]]),
        num_tokens=5,
    )
    assert torch.equal(out, torch.tensor([[0.0, 0.5, 0.0, 0.0, 0.75], [0.0, 0.0, 0.125, 0.0, 0.0]]))


def test_padding_with_repeated_steps(tok):
    """Repeat step 2 (PRM score 0.8 < eta 0.85) n times before the answer; success stays 1.

    return = sum of the [B, T] token rewards:
    raw:        1 + 0.9 + 0.8 (n + 1) + 0.95  -> grows by 0.8 per copy
    clip:       1 - 0.05 (n + 1)               -> falls
    delta:      1 + c1 = 1.9                    -> unchanged
    clip-delta: 1 + min(0.9 - 0.85, 0) = 1     -> unchanged
    """
    batch = [sample(tok, [STEP_1] + [STEP_2] * (n + 1) + [ANSWER]) for n in range(4)]
    returns = {r: prm_reward(tok, r)(batch).token_rewards.sum(dim=1).tolist() for r in Refinement}
    assert returns[Refinement.none] == pytest.approx([3.65, 4.45, 5.25, 6.05])
    assert returns[Refinement.clip] == pytest.approx([0.95, 0.90, 0.85, 0.80])
    assert returns[Refinement.delta] == pytest.approx([1.9] * 4)
    assert returns[Refinement.clip_delta] == pytest.approx([1.0] * 4)


@pytest.mark.equivalence
@pytest.mark.parametrize("refinement", [Refinement.delta, Refinement.clip_delta])
@pytest.mark.parametrize("correct", [True, False])
def test_return_to_go_from_step_k_is_alpha_c_k_plus_correct(tok, refinement, correct):
    """gamma = 1: summing token rewards from step k's first token on gives alpha * c~_k + Correct (k < K),
    up to the fp32 rounding of that sum over the response's tokens (rule 1 of tests/tolerance.py).

    Steps score 0.9, 0.3, 0.8, 0.95 (K = 4), alpha 0.5, eta 0.85:
    delta:      c~ = c                         -> 0.45, 0.15, 0.40 (+ Correct)
    clip-delta: c~ = 0.05, -0.55, -0.05 -> 0  -> 0, -0.275, -0.025 (+ Correct)
    """
    answer = ANSWER if correct else ANSWER.replace("36", "35")
    SCORES.setdefault(answer, 0.95)
    s = sample(tok, [STEP_1, "12 * 3 = 35", STEP_2, answer])
    out = prm_reward(tok, refinement, alpha=0.5)([s])
    rewards = out.token_rewards[0]
    ends = [-1] + [int(i) for i in out_step_ends(tok, s)]
    c = torch.tensor([0.9, 0.3, 0.8, 0.95])
    c_tilde = c if refinement == Refinement.delta else (c - 0.85).clamp(max=0.0)
    bound = tol.rounding(len(rewards), 2.0)  # |rewards| sum to at most 2: Correct, and alpha * (|c~| <= 1) twice
    for k in range(3):  # steps 1..K-1
        return_to_go = rewards[ends[k] + 1 :].sum()
        tol.assert_close(return_to_go, torch.tensor(0.5 * c_tilde[k].item() + float(correct)), bound, msg=str(k))
    assert rewards[ends[3] + 1 :].sum().item() == pytest.approx(float(correct))  # from step K: Correct
    assert ends[4] == len(s.response_token_ids) - 1  # which sits on the final token


def out_step_ends(tok, s):
    from rewards.segment import segment_response

    return segment_response(s.response_token_ids, tok).end_token_index


def test_padded_batch_shapes_and_masks(tok):
    """Responses with K = 1, K = 2, K = 3 and an empty one, different lengths: T = the longest."""
    batch = [
        sample(tok, [ANSWER]),
        sample(tok, [STEP_1, ANSWER], eos=False),
        sample(tok, [STEP_1, STEP_2, ANSWER]),
        RewardSample(QUESTION, "36", "math", "", "", []),
    ]
    lengths = [len(s.response_token_ids) for s in batch]
    out = prm_reward(tok, Refinement.none)(batch)
    assert out.token_rewards.shape == (4, max(lengths)) and out.token_rewards.dtype == torch.float32
    assert out.num_steps.tolist() == [1, 2, 3, 0]
    assert out.success.tolist() == [1.0, 1.0, 1.0, 0.0]
    assert out.step_scores == [[0.95], [0.9, 0.95], [0.9, 0.8, 0.95], []]
    assert out.learned.tolist() == pytest.approx([0.95, 1.85, 2.65, 0.0])
    for b, length in enumerate(lengths):
        assert torch.all(out.token_rewards[b, length:] == 0)  # nothing past the response
        if length:
            assert out.token_rewards[b, length - 1].item() == pytest.approx(1.0 + 0.95)  # success + last step
    assert torch.all(out.token_rewards[3] == 0)
    assert out.token_rewards.sum(dim=1).tolist() == pytest.approx([1.95, 2.85, 3.65, 0.0])
    for refinement in (Refinement.delta, Refinement.clip_delta):  # K = 1: the only step gets 0
        assert prm_reward(tok, refinement)(batch[:1]).token_rewards.sum().item() == pytest.approx(1.0)
    assert out.metrics["reward/num_steps"] == pytest.approx(1.5)


def test_success_and_orm_on_the_final_token(tok):
    right, wrong = sample(tok, [STEP_1, STEP_2, ANSWER]), sample(tok, [STEP_1, "12 * 3 = 35", "\\boxed{35}"], eos=False)
    cfg = RewardConfig(kind=RewardKind.orm, alpha=0.5, model=RewardModelConfig(path="builtin:synthetic-orm"))
    out = ShapedReward(cfg, tok, FakeORM(), fake_grade)([right, wrong])
    assert out.success.tolist() == [1.0, 0.0]
    assert out.learned.tolist() == pytest.approx([0.375, 0.125])  # 0.5 * 0.75, 0.5 * 0.25
    assert out.step_scores == [[], []] and out.num_steps.tolist() == [3, 3]
    for b, s in enumerate([right, wrong]):
        last = len(s.response_token_ids) - 1
        assert out.token_rewards[b, last].item() == pytest.approx([1.375, 0.125][b])
        assert out.token_rewards[b].sum().item() == pytest.approx([1.375, 0.125][b])
    success_only = ShapedReward(RewardConfig(), tok, None, fake_grade)([right, wrong])
    assert success_only.token_rewards.sum(dim=1).tolist() == [1.0, 0.0]
    assert success_only.learned.tolist() == [0.0, 0.0] and success_only.extracted == ["36", None]


def test_eta_is_calibrated_on_the_first_call(tok):
    cfg = RewardConfig(
        kind=RewardKind.prm,
        refinement=Refinement.clip,
        eta_zero_fraction=0.75,
        model=RewardModelConfig(path="builtin:synthetic-prm"),
    )
    reward = ShapedReward(cfg, tok, FakePRM(), fake_grade)
    # Steps score 0.9, 0.8, 0.95 and 0.95: three of four at or above eta = 0.9; only the 0.8 step pays.
    out = reward([sample(tok, [STEP_1, STEP_2, ANSWER]), sample(tok, [ANSWER])])
    assert reward.eta == pytest.approx(0.9) and out.metrics["reward/eta"] == pytest.approx(0.9)
    assert out.metrics["reward/zero_clip_fraction"] == pytest.approx(0.75)
    assert out.learned.tolist() == pytest.approx([-0.1, 0.0])
    reward([sample(tok, [STEP_2])])  # later calls keep it
    assert reward.eta == pytest.approx(0.9)


@pytest.mark.equivalence
def test_alpha_matched_to_clip_delta_gives_raw_prm_its_spread(tok):
    """The hacking study's control: raw PRM rewards, scaled to Clip-Delta's spread on the same rollouts."""
    import statistics

    cfg = RewardConfig(
        kind=RewardKind.prm,
        alpha_matched_to=Refinement.clip_delta,
        eta_zero_fraction=0.75,
        model=RewardModelConfig(path="builtin:synthetic-prm"),
    )
    reward = ShapedReward(cfg, tok, FakePRM(), fake_grade)
    batch = [sample(tok, [STEP_1, STEP_2, ANSWER]), sample(tok, [ANSWER]), sample(tok, [STEP_2, ANSWER])]
    out = reward(batch)
    # Scores 0.9 0.8 0.95 | 0.95 | 0.8 0.95: four of six at or above eta = 0.9. Clip-Delta's per-response sum
    # is min(c_1 - eta, 0) for K >= 2 and 0 for K = 1: [0, 0, -0.1]; the raw sums are [2.65, 0.95, 1.75].
    alpha = statistics.pstdev([0.0, 0.0, -0.1]) / statistics.pstdev([2.65, 0.95, 1.75])
    assert reward.eta == pytest.approx(0.9) and reward.alpha == pytest.approx(alpha)
    assert out.metrics["reward/alpha"] == pytest.approx(alpha)
    assert out.learned.tolist() == pytest.approx([alpha * 2.65, alpha * 0.95, alpha * 1.75])
    want_std = statistics.pstdev([0.0, 0.0, -0.1])  # fp32 sums of 3 squares against exact: rule 1 at their scale
    tol.assert_scalars_close(
        {"std": out.metrics["reward/learned_std"]}, {"std": want_std}, {"std": tol.rounding(6, 0.1)}
    )
    reward([sample(tok, [STEP_2])])  # later calls keep it; a resumed run or another replica loads it
    assert reward.calibration() == pytest.approx({"eta": 0.9, "alpha": alpha})
    fresh = ShapedReward(cfg, tok, FakePRM(), fake_grade)
    fresh.set_calibration(reward.calibration())
    assert fresh(batch[:1]).learned.tolist() == pytest.approx([alpha * 2.65])


def test_clip_delta_matched_to_raw_prm_gets_the_raw_spread(tok):
    """Round 3's arm: Clip-Delta with alpha scaled up to raw PRM's spread on the first rollouts."""
    import statistics

    cfg = RewardConfig(
        kind=RewardKind.prm,
        refinement=Refinement.clip_delta,
        alpha_matched_to=Refinement.none,
        eta_zero_fraction=0.75,
        model=RewardModelConfig(path="builtin:synthetic-prm"),
    )
    reward = ShapedReward(cfg, tok, FakePRM(), fake_grade)
    batch = [sample(tok, [STEP_1, STEP_2, ANSWER]), sample(tok, [ANSWER]), sample(tok, [STEP_2, ANSWER])]
    out = reward(batch)
    # The same rollouts as above, the other way round: alpha = std(raw sums) / std(Clip-Delta sums).
    alpha = statistics.pstdev([2.65, 0.95, 1.75]) / statistics.pstdev([0.0, 0.0, -0.1])
    assert reward.alpha == pytest.approx(alpha) and out.metrics["reward/alpha"] == pytest.approx(alpha)
    assert out.learned.tolist() == pytest.approx([0.0, 0.0, -0.1 * alpha])
    assert out.metrics["reward/learned_std"] == pytest.approx(statistics.pstdev([2.65, 0.95, 1.75]), rel=1e-5)
    # eta 0.9: 0.9 0.8 0.95 -> c~ = 0, -0.1, 0 -> r = +0.1, -0.1, 0 (sum 0); 0.95 -> r = 0; 0.8 0.95 -> c~ = -0.1, 0
    # -> r = -0.1, 0. Three of six steps are paid, one of three responses in total.
    assert out.metrics["reward/nonzero_step_fraction"] == pytest.approx(3 / 6)
    assert out.metrics["reward/nonzero_response_fraction"] == pytest.approx(1 / 3)


def test_nonzero_fractions_of_raw_prm_and_success(tok):
    batch = [sample(tok, [STEP_1, ANSWER]), sample(tok, [ANSWER])]
    out = prm_reward(tok, Refinement.none)(batch)
    assert out.metrics["reward/nonzero_step_fraction"] == 1.0
    assert out.metrics["reward/nonzero_response_fraction"] == 1.0
    success_only = ShapedReward(RewardConfig(), tok, None, fake_grade)(batch)
    assert "reward/nonzero_response_fraction" not in success_only.metrics  # no learned reward to reach


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (
            dict(kind=RewardKind.prm, refinement=Refinement.clip, eta=1.5, model=RewardModelConfig(path="x")),
            "reward.eta",
        ),
        (
            dict(kind=RewardKind.prm, refinement=Refinement.clip, eta=-0.1, model=RewardModelConfig(path="x")),
            "reward.eta",
        ),
        (dict(kind=RewardKind.prm), "reward.model.path"),
        (
            dict(kind=RewardKind.orm, refinement=Refinement.delta, model=RewardModelConfig(path="x")),
            "only applies to reward.kind=prm",
        ),
        (
            dict(
                kind=RewardKind.prm,
                refinement=Refinement.delta,
                eta_zero_fraction=0.8,
                model=RewardModelConfig(path="x"),
            ),
            "eta_zero_fraction",
        ),
        (
            dict(
                kind=RewardKind.prm,
                refinement=Refinement.clip_delta,
                alpha_matched_to=Refinement.clip_delta,
                model=RewardModelConfig(path="x"),
            ),
            "alpha_matched_to",
        ),
        (
            dict(kind=RewardKind.orm, alpha_matched_to=Refinement.none, model=RewardModelConfig(path="x")),
            "alpha_matched_to",
        ),
    ],
)
def test_bad_configs_fail_at_construction(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment.replace(".", r"\.")):
        RewardConfig(**kwargs)
    with pytest.raises(ValueError, match="builtin:synthetic-ppm"):
        RewardModelConfig(path="builtin:synthetic-ppm")


def test_unknown_refinement_names_it():
    from omegaconf import OmegaConf

    with pytest.raises(Exception, match="clipp"):
        OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RewardConfig), {"refinement": "clipp"}))


def test_missing_reward_model_fails_when_building(tok, tmp_path):
    cfg = RewardConfig(kind=RewardKind.prm, model=RewardModelConfig(path=str(tmp_path / "no-such-prm")))
    with pytest.raises(RewardModelError, match="no-such-prm: no such reward-model directory"):
        build_reward_fn(cfg, tok)
    cfg = RewardConfig(kind=RewardKind.orm, model=RewardModelConfig(path=str(tmp_path)))
    with pytest.raises(RewardModelError, match="no config.json"):
        build_reward_fn(cfg, tok)


def test_building_never_trains_a_missing_builtin(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("REALM_CACHE_DIR", str(tmp_path))  # an empty cache
    cfg = RewardConfig(kind=RewardKind.prm, model=RewardModelConfig(path="builtin:synthetic-prm"))
    with pytest.raises(RewardModelError, match=r"not trained yet .*python -m rewards.train_rm kind=prm"):
        build_reward_fn(cfg, tok)
    assert not any(tmp_path.rglob("*"))  # nothing was built


def test_step_layout_pads_to_the_most_steps():
    def seg(ends: list[int]) -> SegmentedResponse:
        return SegmentedResponse([Step("s", "\n\n") for _ in ends], ends, "s\n\n" * len(ends))

    num_steps, end_index, mask = step_layout([seg([2, 5]), seg([4]), seg([])])
    assert num_steps.tolist() == [2, 1, 0]
    assert end_index.tolist() == [[2, 5], [4, 0], [0, 0]]
    assert mask.tolist() == [[True, True], [True, False], [False, False]]
    assert [t.shape for t in step_layout([])] == [(0,), (0, 0), (0, 0)]


@pytest.mark.equivalence
@pytest.mark.parametrize("refinement", [Refinement.none, Refinement.clip_delta])
def test_reward_replicas_merged_equal_one_reward_call(tok, refinement):
    """The plan runtime splits a batch over rew_inf replicas and merges their RewardBatches: the merge
    equals scoring the whole batch at once (token rewards padded to the longest response overall, means
    re-weighted by responses or, for the step metrics, by steps). The tensors are copies, equal
    exactly; a re-weighted mean sums its terms in another order (rule 1 of tests/tolerance.py)."""
    from rewards.types import merge_reward_batches

    batch = [
        sample(tok, [STEP_1, STEP_2, ANSWER]),
        sample(tok, [ANSWER]),
        sample(tok, [STEP_1, "12 * 3 = 35", ANSWER]),
        sample(tok, [STEP_1]),
        sample(tok, [STEP_2, ANSWER]),
    ]
    whole = prm_reward(tok, refinement)(batch)
    reward = prm_reward(tok, refinement)
    merged = merge_reward_batches([reward(batch[:1]), reward(batch[1:4]), reward(batch[4:])])
    assert torch.equal(merged.token_rewards, whole.token_rewards)
    for field in ("success", "learned", "num_steps"):
        assert torch.equal(getattr(merged, field), getattr(whole, field)), field
    assert merged.step_scores == whole.step_scores and merged.extracted == whole.extracted
    assert merged.metrics.keys() == whole.metrics.keys()
    num_terms = 2 * (len(batch) + int(whole.num_steps.sum())) + 3  # each replica's sums, then the 3 re-weighted
    bounds = {key: tol.rounding(num_terms, tol.scale_of(value)) for key, value in whole.metrics.items()}
    tol.assert_scalars_close(merged.metrics, whole.metrics, bounds)


def test_merge_reward_batches_worked_example_and_disagreeing_eta():
    from rewards.types import RewardBatch, merge_reward_batches

    def part(success, eta):
        n = len(success)
        return RewardBatch(
            torch.zeros(n, 2),
            torch.tensor(success),
            torch.zeros(n),
            [[]] * n,
            torch.ones(n),
            [None] * n,
            {"reward/success": sum(success) / n, "reward/eta": eta},
        )

    merged = merge_reward_batches([part([1.0], 0.5), part([0.0, 0.0, 0.0], 0.5)])
    assert merged.metrics == {"reward/success": 0.25, "reward/eta": 0.5}
    with pytest.raises(ValueError, match="disagree on reward/eta"):
        merge_reward_batches([part([1.0], 0.5), part([0.0], 0.6)])
