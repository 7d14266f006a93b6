"""A user's reward function (rewards/user_fn.py, reward.function=FILE.py:NAME): loaded, called in worker
processes, placed on the tokens as an outcome or per-step reward on top of the presets, and every failure one
line naming the function, what went wrong and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rewards.build import ShapedReward
from rewards.config import Refinement, RewardConfig, RewardKind, RewardModelConfig
from rewards.types import RewardFunctionError, merge_reward_batches
from rewards.user_fn import FunctionRef, UserRewardFunction, check_value, load_function
from tests.rewards.test_build import ANSWER, QUESTION, STEP_1, STEP_2, FakePRM, fake_grade, sample

HERE = Path(__file__).resolve().parent
FUNCTIONS = HERE / "user_functions_for_tests.py"
EXAMPLES = HERE.parents[1] / "examples" / "reward_functions.py"


def ref(name: str, path: Path = FUNCTIONS) -> FunctionRef:
    return FunctionRef(path, name)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_function_refs_parse_and_bad_ones_name_the_key():
    assert FunctionRef.parse("my_rewards.py:brevity") == FunctionRef(Path("my_rewards.py"), "brevity")
    for bad in ("my_rewards.py", "my_rewards:brevity", "my_rewards.py:", "my_rewards.py:not-a-name"):
        with pytest.raises(ValueError, match=r"reward.function=.*expected FILE.py:NAME"):
            FunctionRef.parse(bad)


def test_a_missing_file_name_or_wrong_signature_is_one_line(tmp_path):
    with pytest.raises(RewardFunctionError, match=r"reward.function=.*nowhere.py:f: no such file"):
        load_function(FunctionRef(tmp_path / "nowhere.py", "f"))
    with pytest.raises(RewardFunctionError, match=r"has no function 'length_bonu' \(did you mean length_bonus\?\)"):
        load_function(ref("length_bonu"))
    with pytest.raises(RewardFunctionError, match=r"two_arguments must take \(prompt, response, answer, metadata\)"):
        load_function(ref("two_arguments"))
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_here\n")
    with pytest.raises(RewardFunctionError, match=r"importing .*broken.py failed: ModuleNotFoundError"):
        load_function(FunctionRef(broken, "f"))


def test_values_are_checked():
    assert check_value(0.5, 3, ref("x"), "p1") == 0.5
    assert check_value([1, 0], 2, ref("x"), "p1") == [1.0, 0.0]
    with pytest.raises(RewardFunctionError, match="returned 1 step rewards for a response of 2 steps"):
        check_value([1.0], 2, ref("x"), "p1")
    with pytest.raises(RewardFunctionError, match="on problem p1 returned nan"):
        check_value(float("nan"), 2, ref("x"), "p1")
    with pytest.raises(RewardFunctionError, match="returned str 'good'.*expected a float or a list of floats"):
        check_value("good", 2, ref("x"), "p1")


def _calls(n: int) -> tuple[list[tuple], list[str]]:
    calls = [("q", "r" * (10 * (i + 1)), "a", {"steps": ["s"] * (i + 1), "truncated": i == 0}) for i in range(n)]
    return calls, [f"p{i}" for i in range(n)]


@pytest.mark.parametrize(
    "name, batched, message",
    [
        ("raises", False, r"raises raised KeyError: 'b' \(at user_functions_for_tests.py:\d+\) on problem p0"),
        ("sleeps", False, r"sleeps timed out after 1 s \(reward.function_timeout_s\) on problem p0"),
        ("batched_short", True, r"batched_short \(batched\) returned 1 values for 2 responses"),
    ],
)
def test_a_failing_call_is_one_line_naming_the_function_and_the_problem(name, batched, message):
    fn = UserRewardFunction(ref(name), timeout_s=1.0, batched=batched, num_workers=1)
    try:
        with pytest.raises(RewardFunctionError, match=message):
            fn(*_calls(2))
    finally:
        fn.close()


def test_the_worker_pool_calls_per_response_and_batched():
    fn = UserRewardFunction(ref("echo_metadata"), timeout_s=10.0, num_workers=2)
    batched = UserRewardFunction(ref("batched_lengths"), timeout_s=10.0, batched=True, num_workers=2)
    try:
        assert fn(*_calls(3)) == [11.0, 20.0, 30.0]  # steps * 10 + truncated
        assert batched(*_calls(3)) == [10.0, 20.0, 30.0]
        assert fn([], []) == []
    finally:
        fn.close()
        batched.close()


def _reward(tok, cfg: RewardConfig, name: str, path: Path = FUNCTIONS) -> ShapedReward:
    prm = FakePRM() if cfg.kind == RewardKind.prm else None
    return ShapedReward(cfg, tok, prm, fake_grade, UserRewardFunction(ref(name, path), 10.0, num_workers=1))


def test_an_outcome_function_weighted_on_top_of_success(tok):
    """success + 0.5 * len(response) / 100 on the last token."""
    cfg = RewardConfig(function=f"{FUNCTIONS}:length_bonus", function_weight=0.5)
    right, wrong = sample(tok, [STEP_1, STEP_2, ANSWER]), sample(tok, [STEP_1, "12 * 3 = 35"])
    reward = _reward(tok, cfg, "length_bonus")
    try:
        out = reward([right, wrong])
    finally:
        reward.user_fn.close()
    for b, (s, correct) in enumerate([(right, 1.0), (wrong, 0.0)]):
        bonus = len(s.response_text) / 100
        assert out.token_rewards[b].sum().item() == pytest.approx(correct + 0.5 * bonus)
        assert out.token_rewards[b, len(s.response_token_ids) - 1].item() == pytest.approx(correct + 0.5 * bonus)
    assert out.function_values == pytest.approx([len(right.response_text) / 100, len(wrong.response_text) / 100])
    assert out.metrics["reward/length_bonus"] == pytest.approx(sum(out.function_values) / 2)
    assert out.metrics["reward/length_bonus_nonzero_fraction"] == 1.0
    assert out.learned.tolist() == [0.0, 0.0]  # the learned reward stays the reward model's


def test_a_per_step_function_on_top_of_prm_clip_delta_is_refined_like_the_prm(tok):
    """first_step_only returns [1, 0, 0]; under Clip-Delta with eta 0.5 its steps become
    c~ = min(c - 0.5, 0) = [0, -0.5, -0.5] -> Delta: [0 - (-0.5), -0.5 - 0, 0] = [0.5, -0.5, 0] (sum c~_1 = 0),
    weighted 2: [1, -1, 0] on the three steps' last tokens, beside the PRM's own Clip-Delta rewards."""
    cfg = RewardConfig(
        kind=RewardKind.prm,
        refinement=Refinement.clip_delta,
        eta=0.5,
        model=RewardModelConfig(path="builtin:synthetic-prm"),
        function=f"{FUNCTIONS}:first_step_only",
        function_weight=2.0,
    )
    s = sample(tok, [STEP_1, STEP_2, ANSWER])
    without = ShapedReward(RewardConfig(**{**cfg.__dict__, "function": ""}), tok, FakePRM(), fake_grade)([s])
    reward = _reward(tok, cfg, "first_step_only")
    try:
        out = reward([s])
    finally:
        reward.user_fn.close()
    from rewards.segment import segment_response

    ends = segment_response(s.response_token_ids, tok).end_token_index
    added = out.token_rewards[0] - without.token_rewards[0]
    assert [added[e].item() for e in ends] == pytest.approx([1.0, -1.0, 0.0])
    assert added.sum().item() == pytest.approx(0.0, abs=1e-6)
    assert out.function_values == [[1.0, 0.0, 0.0]] and out.metrics["reward/first_step_only_nonzero_fraction"] == 1 / 3


def test_the_function_alone_puts_no_success_on_the_tokens(tok):
    cfg = RewardConfig(kind=RewardKind.function, function=f"{EXAMPLES}:boxed_format")
    right = sample(tok, [STEP_1, STEP_2, ANSWER])
    reward = _reward(tok, cfg, "boxed_format", EXAMPLES)
    try:
        out = reward([right])
    finally:
        reward.user_fn.close()
    assert out.success.tolist() == [1.0]  # still graded and logged
    assert out.token_rewards.sum().item() == pytest.approx(1.0)  # the format reward alone: one \boxed{} at the end


def test_the_examples_work_as_documented():
    examples = load_function(FunctionRef(EXAMPLES, "boxed_format"))
    assert examples("q", "2 + 2 = 4\n\nSo \\boxed{4}.", "4", {"truncated": False}) == 1.0
    assert examples("q", "\\boxed{4}\n\n\\boxed{5}", "4", {"truncated": False}) == 0.0
    assert examples("q", "\\boxed{4}\n\nDone.", "4", {"truncated": False}) == 0.0
    assert examples("q", "So \\boxed{4}", "4", {"truncated": True}) == 0.0
    brevity = load_function(FunctionRef(EXAMPLES, "step_brevity"))
    assert brevity("q", "", "4", {"steps": ["1 + 2 = 3", "a" * 50]}) == pytest.approx([0.0, -0.1])


def test_replicas_merge_the_function_metrics_over_all_responses(tok):
    cfg = RewardConfig(function=f"{FUNCTIONS}:length_bonus")
    reward = _reward(tok, cfg, "length_bonus")
    try:
        parts = [reward([sample(tok, [ANSWER])]), reward([sample(tok, [STEP_1, ANSWER]), sample(tok, [ANSWER])])]
    finally:
        reward.user_fn.close()
    merged = merge_reward_batches(parts)
    values = [v for p in parts for v in p.function_values]
    assert merged.function_values == values
    assert merged.metrics["reward/length_bonus"] == pytest.approx(sum(values) / 3)
    assert torch.equal(merged.success, torch.cat([p.success for p in parts]))
    assert QUESTION  # the samples' question: the function's prompt argument
