"""SFT warm-up: the prompt matches the rollout's, labels cover solution + EOS only, loss goes down."""

from __future__ import annotations

import pytest
import torch

from mathtask.synthetic import generate_problems
from ppo.config import PPOConfig, SFTConfig
from runtime.device.shards import PolicyShard
from trainer.config import RolloutConfig, TrainConfig
from trainer.rollout import prompt_text
from trainer.sft import run_sft, sft_batches, sft_example


def _tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_sft_example_is_rollout_prompt_then_solution_and_eos(tiny_model_dir):
    tok = _tokenizer(tiny_model_dir)
    problem = generate_problems(1, seed=0, difficulty=2)[0]
    rollout = RolloutConfig(prompt_suffix="Answer in \\boxed{}.")
    prompt, response = sft_example(tok, problem, rollout)
    assert tok.decode(prompt) == prompt_text(tok, problem.question, "", rollout.prompt_suffix)
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n")
    assert response[-1] == tok.eos_token_id
    assert tok.decode(response) == problem.solution + "<|im_end|>"


def test_sft_batches_use_each_example_once_per_epoch(tiny_model_dir):
    tok = _tokenizer(tiny_model_dir)
    problems = generate_problems(5, seed=0, difficulty=1)
    batches = sft_batches(problems, tok, RolloutConfig(), batch_size=2, seed=0)
    seen = []
    for batch in (next(batches) for _ in range(5)):  # 10 rows = exactly two epochs
        assert batch["input_ids"].shape[0] == 2
        for ids, mask in zip(batch["input_ids"], batch["attention_mask"]):
            seen.append(tok.decode(ids[mask.bool()]))
    assert len(set(seen[:5])) == 5 and sorted(seen[:5]) == sorted(seen[5:])
    # the label mask (response_mask) covers exactly solution + EOS
    row_mask = batch["response_mask"][0]
    assert tok.decode(batch["input_ids"][0, -row_mask.shape[0] :][row_mask.bool()]).endswith("<|im_end|>")


def test_sft_steps_reduce_loss(tiny_model_dir):
    tok = _tokenizer(tiny_model_dir)
    problems = generate_problems(8, seed=0, difficulty=2)
    batch = next(sft_batches(problems, tok, RolloutConfig(), batch_size=8, seed=0))
    worker = PolicyShard(model_dir=str(tiny_model_dir), sft=SFTConfig(lr=1e-3))
    losses = [worker.sft_step(batch) for _ in range(8)]
    # the random-init model is near uniform over ~326 tokens (log 326 = 5.79); 8 steps: ~3.8
    assert 5.0 < losses[0] < 6.2
    assert losses[-1] < 0.75 * losses[0] and losses[-1] == min(losses)


def test_run_sft_writes_a_loadable_hf_dir(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = TrainConfig(sft=SFTConfig(num_steps=2, batch_size=4, lr=1e-3, target_success=0), ppo=PPOConfig())
    lines = []
    run_sft(cfg, tiny_model_dir, generate_problems(8, seed=0, difficulty=2), tmp_path / "sft", log=lines.append)
    assert lines[-1].startswith("[sft] 2/2 (100%) [") and ", loss " in lines[-1]
    tuned = AutoModelForCausalLM.from_pretrained(tmp_path / "sft")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not torch.equal(tuned.model.embed_tokens.weight, base.model.embed_tokens.weight)
    assert _tokenizer(tmp_path / "sft").eos_token == "<|im_end|>"


def test_check_problems_are_the_last_ones_and_only_with_a_target():
    from trainer.sft import split_check_problems

    problems = generate_problems(10, seed=0, difficulty=2)
    fit, check = split_check_problems(problems, SFTConfig(target_success=0.35, num_check_problems=3))
    assert fit == problems[:7] and check == problems[7:]
    assert split_check_problems(problems, SFTConfig(target_success=0)) == (problems, [])
    with pytest.raises(ValueError, match="sft.num_check_problems=10 leaves nothing to train on"):
        split_check_problems(problems, SFTConfig(target_success=0.35, num_check_problems=10))


@pytest.mark.parametrize("bad", ["target_success=1.5", "num_steps=-1", "check_every=0"])
def test_sft_config_rejects_bad_values_naming_the_key(bad):
    key, value = bad.split("=")
    with pytest.raises(ValueError, match=f"sft.{key}"):
        SFTConfig(**{"target_success": 0.3, key: float(value) if "." in value else int(value)})


class _AnswersEveryOther:
    """A generate() that writes the reference solution for every other row, a wrong answer for the rest,
    and checks the prompt came left-padded with its attention mask covering exactly the prompt."""

    def __init__(self, tokenizer, problems):
        self.tokenizer, self.problems, self.training = tokenizer, problems, True
        self.rows = 0

    def eval(self):
        self.training = False

    def train(self, mode=True):
        self.training = mode

    def generate(self, input_ids, attention_mask, max_new_tokens, **_):
        assert not self.training
        out = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            problem = self.problems[self.rows]
            prompt = self.tokenizer(prompt_text(self.tokenizer, problem.question), add_special_tokens=False).input_ids
            assert ids[len(ids) - len(prompt) :] == prompt and mask == [0] * (len(ids) - len(prompt)) + [1] * len(
                prompt
            )
            text = problem.solution if self.rows % 2 == 0 else "The answer is \\boxed{-12345}."
            new = self.tokenizer(text, add_special_tokens=False).input_ids[:max_new_tokens]
            out.append(ids + new + [self.tokenizer.eos_token_id] * (max_new_tokens - len(new)))
            self.rows += 1
        return torch.tensor(out)


def test_greedy_success_grades_each_completion_and_restores_train_mode(tiny_model_dir):
    from trainer.sft import greedy_success

    tok = _tokenizer(tiny_model_dir)
    problems = generate_problems(5, seed=0, difficulty=2)
    model = _AnswersEveryOther(tok, problems)
    # rows 0, 2, 4 carry the solution (3 of 5); batches of 2 exercise the chunking
    assert greedy_success(model, tok, problems, RolloutConfig(max_new_tokens=64), batch_size=2) == pytest.approx(0.6)
    assert model.training and model.rows == 5


def test_run_sft_stops_at_the_first_check_that_reaches_the_target(tiny_model_dir, tmp_path, monkeypatch):
    import json

    import trainer.sft

    scripted = iter([0.10, 0.30, 0.40, 0.90])
    monkeypatch.setattr(trainer.sft, "greedy_success", lambda *a, **k: next(scripted))
    sft = SFTConfig(num_steps=20, batch_size=4, target_success=0.35, check_every=3, num_check_problems=4)
    lines = []
    record = run_sft(
        TrainConfig(sft=sft), tiny_model_dir, generate_problems(12, seed=0), tmp_path / "sft", lines.append
    )
    # checks at steps 3, 6, 9: 0.40 at step 9 is the first >= 0.35
    assert record == {
        "num_steps": 9,
        "target_success": 0.35,
        "checks": [{"step": 3, "success": 0.1}, {"step": 6, "success": 0.3}, {"step": 9, "success": 0.4}],
    }
    assert json.loads((tmp_path / "sft" / "sft.json").read_text()) == record
    assert "[sft] step 9: greedy success 0.400 on 4 held-back training problems" in lines


def test_run_sft_says_when_the_target_is_not_reached(tiny_model_dir, tmp_path, monkeypatch):
    import trainer.sft

    monkeypatch.setattr(trainer.sft, "greedy_success", lambda *a, **k: 0.0)
    sft = SFTConfig(num_steps=4, batch_size=4, target_success=0.35, check_every=2, num_check_problems=4)
    lines = []
    record = run_sft(
        TrainConfig(sft=sft), tiny_model_dir, generate_problems(12, seed=0), tmp_path / "sft", lines.append
    )
    assert record["num_steps"] == 4 and [c["step"] for c in record["checks"]] == [2, 4]
    assert lines[-1] == "[sft] target 0.35 not reached in sft.num_steps=4; using the last step"
