"""SFT warm-up: the prompt matches the rollout's, labels cover solution + EOS only, loss goes down."""

from __future__ import annotations

import torch

from eval.synthetic import generate_problems
from trainer.config import PPOConfig, RolloutConfig, SFTConfig, TrainConfig
from trainer.rollout import prompt_text
from trainer.sft import run_sft, sft_batches, sft_example
from trainer.workers import PolicyWorker


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
    worker = PolicyWorker(model_dir=str(tiny_model_dir), sft=SFTConfig(lr=1e-3))
    losses = [worker.sft_step(batch) for _ in range(8)]
    # the random-init model is near uniform over ~326 tokens (log 326 = 5.79); 8 steps: ~3.8
    assert 5.0 < losses[0] < 6.2
    assert losses[-1] < 0.75 * losses[0] and losses[-1] == min(losses)


def test_run_sft_writes_a_loadable_hf_dir(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = TrainConfig(sft=SFTConfig(num_steps=2, batch_size=4, lr=1e-3), ppo=PPOConfig())
    lines = []
    run_sft(cfg, tiny_model_dir, generate_problems(8, seed=0, difficulty=2), tmp_path / "sft", log=lines.append)
    assert lines[-1].startswith("[sft] 2/2 (100%) [") and ", loss " in lines[-1]
    tuned = AutoModelForCausalLM.from_pretrained(tmp_path / "sft")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not torch.equal(tuned.model.embed_tokens.weight, base.model.embed_tokens.weight)
    assert _tokenizer(tmp_path / "sft").eos_token == "<|im_end|>"
