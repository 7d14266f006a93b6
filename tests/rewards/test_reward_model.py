"""Reward models on the tiny backbone (random heads): counts, ranges, batching, and the readouts by hand."""

from __future__ import annotations

import pytest
import torch

from rewards.config import Readout, RewardKind, RewardModelConfig
from rewards.reward_model import (
    RewardModelError,
    RMFormat,
    encode_with_reads,
    load_reward_model,
    plan_windows,
    rm_input,
    window_ids,
)
from rewards.segment import Step, split_steps
from tests import tolerance as tol

QUESTION = "Start with 7. Add 5, then multiply by 3. What is the result?"
RESPONSES = [
    "The answer is \\boxed{36}.",  # K = 1
    "7 + 5 = 12\n\nThe answer is \\boxed{12}.",  # K = 2
    "7 + 5 = 12\n\n12 * 3 = 36\n\nStep ready.\n\nThe answer is \\boxed{36}.",  # K = 4, a junk step
]


def score_bound(model_dir, num_tokens: int = 2 * (len(QUESTION) + max(map(len, RESPONSES)))) -> float:
    """Rule 1 of tests/tolerance.py for scores in [0, 1] read from inputs of up to ``num_tokens``
    (by default the question and a response with its step tags: at most twice their characters): one
    forward pass, through the LM head's softmax for a step-tag PRM."""
    return tol.rounding(tol.Reductions.of(model_dir).forward(num_tokens))


@pytest.fixture(scope="module")
def rm_dirs(tiny_model_dir, tmp_path_factory):
    """A value-head PRM and an ORM: the tiny backbone with fresh (seeded) heads; no realm_rm.json."""
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    dirs = {}
    for name, cls in [("prm", AutoModelForTokenClassification), ("orm", AutoModelForSequenceClassification)]:
        torch.manual_seed(0)
        out = tmp_path_factory.mktemp(name)
        cls.from_pretrained(tiny_model_dir, num_labels=1).save_pretrained(out)
        tok.save_pretrained(out)
        dirs[name] = out
    dirs["lm"] = tiny_model_dir
    return dirs


def steps_of(text: str) -> list[Step]:
    return split_steps(text, "\n\n")


def test_rm_input_and_read_positions(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text, reads = rm_input(RMFormat(), "Q?", steps_of("1 + 1 = 2\n\nThe answer is \\boxed{2}."))
    assert text == "Q?\n\n1 + 1 = 2\n\nThe answer is \\boxed{2}."
    assert reads == [15, len(text)]  # after step 1's blank line; the end
    ids, positions, num_question = encode_with_reads(tok, text, reads, keep_chars=len("Q?\n\n"))
    assert tok.convert_ids_to_tokens([ids[p] for p in positions]) == ["ĊĊ", "}."]
    assert tok.decode(ids[:num_question]).endswith("Q?\n\n") and not tok.decode(ids[num_question:]).startswith("\n")
    tagged, tag_reads = rm_input(RMFormat("{question} ", " ки"), "Q?", steps_of("1 + 1 = 2\n\nThe answer is 2."))
    assert tagged == "Q? 1 + 1 = 2 ки\n\nThe answer is 2. ки"
    assert [tagged[:r][-3:] for r in tag_reads] == [" ки", " ки"]
    # Truncation keeps the question in every window; the last step is read at the window's end.
    (first, first_reads), (last, last_reads) = window_ids(ids, positions, num_question, max_length=10)
    assert first[:num_question] == last[:num_question] == ids[:num_question]
    assert first[first_reads[0]] == ids[positions[0]] and last[last_reads[0]] == ids[positions[1]]
    assert len(first) <= 10 and len(last) <= 10


def test_plan_windows_worked_example():
    # 20 tokens, question = tokens 0..3, reads at 6, 12, 19, max_length 10 (6 tokens of response per window)
    assert plan_windows(20, [6, 12, 19], 4, 10) == [(4, 7, [6]), (10, 13, [12]), (14, 20, [19])]
    assert plan_windows(20, [6, 7, 9], 4, 10) == [(4, 10, [6, 7, 9])]
    assert plan_windows(8, [6, 7], 4, 10) == [(4, 8, [6, 7])]  # fits: one window, nothing cut
    assert plan_windows(20, [19], 4, 10) == [(14, 20, [19])]  # ORM: the question and the response's end
    assert plan_windows(30, [29], 12, 10) == [(25, 30, [29])]  # a long question keeps at most half the window


@pytest.mark.equivalence
def test_truncated_prm_keeps_the_question_and_c1(rm_dirs):
    """Inputs longer than max_length used to lose their start (question, step 1): c_1 was wrong. Now
    it is the untruncated one's, up to the rounding of a shorter input's sums (tests/tolerance.py)."""
    steps = steps_of("\n\n".join(f"{i} + {i} = {2 * i}" for i in range(1, 30)))
    full = load_reward_model(rm_dirs["prm"], RewardModelConfig(), RewardKind.prm)
    text, reads = rm_input(full.fmt, QUESTION, steps)
    num_tokens = len(full.tokenizer(text).input_ids)
    short = load_reward_model(rm_dirs["prm"], RewardModelConfig(max_length=num_tokens // 3), RewardKind.prm)
    exact, cut = full.score_steps([QUESTION], [steps])[0], short.score_steps([QUESTION], [steps])[0]
    assert len(cut) == len(exact) == len(steps)
    tol.assert_close(torch.tensor(cut[0]), torch.tensor(exact[0]), score_bound(rm_dirs["prm"], num_tokens))
    windows = short._windows(QUESTION, text, reads)
    assert len(windows) >= 3 and all(len(ids) <= num_tokens // 3 for ids, _ in windows)
    assert sum(len(r) for _, r in windows) == len(steps)
    orm_text = rm_input(RMFormat(), QUESTION, [Step(text, "")])[0]
    ((ids, (read,)),) = short._windows(QUESTION, orm_text, None)
    assert short.tokenizer.decode(ids).startswith(QUESTION) and read == len(ids) - 1


@pytest.mark.equivalence
def test_value_head_prm_scores(rm_dirs):
    prm = load_reward_model(rm_dirs["prm"], RewardModelConfig(batch_size=2), RewardKind.prm)
    assert prm.readout == Readout.value_head
    scores = prm.score_steps([QUESTION] * 3, [steps_of(r) for r in RESPONSES])
    assert [len(s) for s in scores] == [1, 2, 4]
    assert all(0.0 <= c <= 1.0 for s in scores for c in s)
    one_by_one = [prm.score_steps([QUESTION], [steps_of(r)])[0] for r in RESPONSES]
    bound = score_bound(rm_dirs["prm"])
    tol.assert_close(torch.tensor(sum(scores, [])), torch.tensor(sum(one_by_one, [])), bound)  # padding is inert
    # A causal model reads step k from the prefix only: appending steps does not move earlier scores.
    longer = prm.score_steps([QUESTION], [steps_of(RESPONSES[1] + "\n\nmore\n\nsteps")])[0]
    tol.assert_close(torch.tensor(longer[:1]), torch.tensor(scores[1][:1]), bound)


@pytest.mark.equivalence
def test_plan_micro_batches_split_each_call_and_batch_size_caps_them(rm_dirs):
    """3 responses: one forward by default; 2 with num_microbatches=2 (2 rows + 1 row); 3 with
    num_microbatches=2 and batch_size=1 (the cap wins). Same scores every time (tests/tolerance.py)."""
    steps = [steps_of(r) for r in RESPONSES]
    expected = load_reward_model(rm_dirs["prm"], RewardModelConfig(), RewardKind.prm).score_steps([QUESTION] * 3, steps)
    for batch_size, num_microbatches, sizes in [(16, 1, [3]), (16, 2, [2, 1]), (1, 2, [1, 1, 1])]:
        cfg = RewardModelConfig(batch_size=batch_size)
        prm = load_reward_model(rm_dirs["prm"], cfg, RewardKind.prm, num_microbatches=num_microbatches)
        seen = []

        def counting(ids, mask, prm=prm, seen=seen):
            seen.append(ids.shape[0])
            return prm.reader.hidden(ids, mask)

        prm.reader.body = counting
        scores = prm.score_steps([QUESTION] * 3, steps)
        assert seen == sizes
        tol.assert_close(torch.tensor(sum(scores, [])), torch.tensor(sum(expected, [])), score_bound(rm_dirs["prm"]))


@pytest.mark.equivalence
def test_step_tag_prm_reads_good_over_good_plus_bad(rm_dirs):
    from transformers import AutoModelForCausalLM

    prm = load_reward_model(rm_dirs["lm"], RewardModelConfig(readout=Readout.step_tag), RewardKind.prm)
    steps = steps_of(RESPONSES[2])
    scores = prm.score_steps([QUESTION], [steps])[0]
    assert len(scores) == 4
    # By hand: full-vocabulary logits at each tag token, then P(+) / (P(+) + P(-)).
    text, reads = rm_input(RMFormat(step_tag=" ки"), QUESTION, steps)
    ids, positions, _ = encode_with_reads(prm.tokenizer, text, reads)
    model = AutoModelForCausalLM.from_pretrained(rm_dirs["lm"])
    with torch.no_grad():
        probs = model(torch.tensor([ids])).logits[0].softmax(-1)
    good, bad = prm.tokenizer.convert_tokens_to_ids(["+", "-"])
    expected = [(probs[p, good] / (probs[p, good] + probs[p, bad])).item() for p in positions]
    tol.assert_close(torch.tensor(scores), torch.tensor(expected), score_bound(rm_dirs["lm"], len(ids)))


@pytest.mark.equivalence
def test_orm_scores_one_per_response(rm_dirs):
    from transformers import AutoModelForSequenceClassification

    orm = load_reward_model(rm_dirs["orm"], RewardModelConfig(batch_size=2), RewardKind.orm)
    scores = orm.score_outcomes([QUESTION] * 3, RESPONSES)
    assert len(scores) == 3 and all(0.0 <= s <= 1.0 for s in scores)
    model = AutoModelForSequenceClassification.from_pretrained(rm_dirs["orm"])
    ids = orm.tokenizer(f"{QUESTION}\n\n{RESPONSES[0]}").input_ids
    with torch.no_grad():
        expected = torch.sigmoid(model(torch.tensor([ids])).logits[0, 0]).item()
    tol.assert_close(torch.tensor(scores[0]), torch.tensor(expected), score_bound(rm_dirs["orm"], len(ids)))


def test_readout_that_does_not_fit_the_kind_fails(rm_dirs):
    with pytest.raises(RewardModelError, match="sequence classifier"):
        load_reward_model(rm_dirs["orm"], RewardModelConfig(), RewardKind.prm)
    with pytest.raises(RewardModelError, match="good_token='plus' is 4 tokens"):
        load_reward_model(rm_dirs["lm"], RewardModelConfig(readout=Readout.step_tag, good_token="plus"), RewardKind.prm)


@pytest.mark.equivalence
def test_policy_and_reward_model_with_different_tokenizers(rm_dirs):
    """The RM re-tokenizes the text; its K scores land on the policy's K step-end tokens (their sum
    over a row is an fp32 sum of the K scores: rule 1 of tests/tolerance.py)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rewards.build import ShapedReward
    from rewards.config import Refinement, RewardConfig
    from rewards.types import RewardSample

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(
        RESPONSES * 20,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<eos>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    policy_tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>")
    prm = load_reward_model(rm_dirs["prm"], RewardModelConfig(), RewardKind.prm)
    cfg = RewardConfig(
        kind=RewardKind.prm, refinement=Refinement.none, model=RewardModelConfig(path="builtin:synthetic-prm")
    )

    class Grade:
        correct, extracted = False, None

    reward = ShapedReward(cfg, policy_tok, prm, lambda r, g, d: [Grade()] * len(r))
    samples = [RewardSample(QUESTION, "36", "math", "", r, policy_tok(r).input_ids) for r in RESPONSES]
    out = reward(samples)
    expected = prm.score_steps([QUESTION] * 3, [steps_of(r) for r in RESPONSES])
    assert out.step_scores == expected and out.num_steps.tolist() == [1, 2, 4]
    sums = torch.tensor([sum(c) for c in expected])
    tol.assert_close(out.token_rewards.sum(dim=1), sums, tol.rounding(max(map(len, expected)), tol.scale_of(sums)))
