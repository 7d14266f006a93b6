"""TRL's PPO trainer on realm's benchmark workload; run by ``bench/ppo_iteration.py`` in a subprocess.

    python bench/_trl_ppo.py SPEC.json OUT.json

Not for direct use: ``ppo_iteration.py`` writes SPEC.json (model dir, the exact prompt token ids of
every iteration, PPO settings) and puts a private TRL install on PYTHONPATH, so that the project's
virtual environment never gets TRL. This process imports nothing from realm.

What is timed (``time.monotonic``), per PPO iteration of ``trl.experimental.ppo.PPOTrainer.train``:

- ``generate``: TRL's ``batch_generation`` (``transformers.generate``, sampled, KV cache);
- ``inference``: from the end of generation to the first training forward: reference logprobs,
  value and reward model forwards, KL-shaped rewards, GAE, whitening;
- ``train``: from the first training forward to the step's ``on_step_end`` callback (PPO epochs x
  minibatches on the joint policy+value wrapper, then TRL's per-step metrics and logging);
- ``iteration``: between consecutive ``on_step_end`` callbacks (the first from ``on_train_begin``).

Generated tokens per response are counted like realm counts them: up to and including the first
EOS, else the whole response. Model loading and trainer construction are outside every timer.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def _count_tokens(responses, eos_id: int) -> tuple[int, int]:
    """(generated tokens up to and including the first EOS of each row, rows that stopped at EOS)."""
    total = stopped = 0
    width = responses.shape[1]
    for row in responses.tolist():
        if eos_id in row:
            total += row.index(eos_id) + 1
            stopped += 1
        else:
            total += width
    return total, stopped


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    t_start = time.monotonic()
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from torch.utils.data import DataLoader
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    from trl.experimental.ppo import ppo_trainer as ppo_mod

    torch.manual_seed(spec["seed"])
    model_dir = spec["model_dir"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"  # TRL's queries are left-padded: responses start at one column for all rows
    dtype = getattr(torch, spec["dtype"])
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    # Value and reward models from the same tiny backbone (score head initialized fresh): the reward
    # values do not matter for throughput, the forward passes do.
    value = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=dtype)
    reward = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=dtype)

    rows = [{"input_ids": ids} for it_ids in spec["iteration_prompt_ids"] for ids in it_ids]
    dataset = Dataset.from_list(rows)
    batch_size = len(spec["iteration_prompt_ids"][0])
    num_iterations = len(spec["iteration_prompt_ids"])
    micro = spec.get("microbatch_rows") or 0
    if micro:
        # TRL 0.29.1: rollout batch = per_device_train_batch_size x gradient_accumulation_steps, the
        # micro-batch = per_device_train_batch_size, one optimizer step per gradient_accumulation_steps
        # micro-batches. Smaller micro-batches with one rollout batch are only possible as one minibatch.
        if batch_size % micro:
            raise SystemExit(f"microbatch_rows={micro} must divide the rollout batch {batch_size}")
        layout = dict(
            per_device_train_batch_size=micro, gradient_accumulation_steps=batch_size // micro, num_mini_batches=1
        )
    else:
        layout = dict(
            per_device_train_batch_size=batch_size,  # one rollout batch = prompts x samples
            gradient_accumulation_steps=1,  # so every minibatch is one optimizer step, as in realm
            num_mini_batches=spec["num_minibatches"],
        )
    args = PPOConfig(
        output_dir=spec["output_dir"],
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        use_cpu=True,
        seed=spec["seed"],
        learning_rate=spec["lr"],
        local_rollout_forward_batch_size=batch_size,  # generate the whole batch at once, as vLLM does
        **layout,
        num_ppo_epochs=spec["num_epochs"],
        total_episodes=batch_size * num_iterations,
        response_length=spec["max_new_tokens"],
        stop_token="eos",
        temperature=spec["temperature"],
        kl_coef=spec["kl_coef"],
        gamma=spec["gamma"],
        lam=spec["lam"],
        cliprange=spec["clip_eps"],
        # None: realm's plain-regression critic; an infinite range makes TRL's clamp a no-op.
        cliprange_value=float("inf") if spec["cliprange_value"] is None else spec["cliprange_value"],
        whiten_rewards=False,
        num_sample_generations=0,
        dataloader_num_workers=0,
    )

    timings: list[dict] = []
    cur: dict = {}
    marks = {"t_prev": 0.0}

    orig_generation = ppo_mod.batch_generation
    orig_forward = ppo_mod.forward

    def timed_generation(*a, **kw):
        t = time.monotonic()
        query_responses, logits = orig_generation(*a, **kw)
        cur["generate"] = time.monotonic() - t
        cur["t_gen_end"] = time.monotonic()
        queries = a[1] if len(a) > 1 else kw["queries"]
        responses = query_responses[:, queries.shape[1] :]
        cur["tokens"], cur["stopped_at_eos"] = _count_tokens(responses, tok.eos_token_id)
        cur["rows"], cur["response_width"] = responses.shape
        return query_responses, logits

    def timed_forward(model, *a, **kw):
        if model is not ref and "t_train_start" not in cur:  # the first PPO-epoch forward (policy + value)
            cur["t_train_start"] = time.monotonic()
        return orig_forward(model, *a, **kw)

    ppo_mod.batch_generation = timed_generation
    ppo_mod.forward = timed_forward

    class Timer(TrainerCallback):
        def on_train_begin(self, *_, **__):
            marks["t_prev"] = time.monotonic()

        def on_step_end(self, *_, **__):
            now = time.monotonic()
            row = {
                "iteration": len(timings) + 1,
                "generate": cur["generate"],
                "inference": cur["t_train_start"] - cur["t_gen_end"],
                "train": now - cur["t_train_start"],
                "iteration_s": now - marks["t_prev"],
                "tokens": cur["tokens"],
                "rows": cur["rows"],
                "stopped_at_eos": cur["stopped_at_eos"],
                "response_width": cur["response_width"],
            }
            row["tokens_per_s"] = row["tokens"] / row["iteration_s"]
            timings.append(row)
            marks["t_prev"] = now
            cur.clear()
            print(
                f"[trl iter {row['iteration']}/{num_iterations}] {row['iteration_s']:.1f} s | gen {row['generate']:.1f} s "
                f"| {row['tokens']} tokens | {row['tokens_per_s']:.0f} tok/s",
                flush=True,
            )

    trainer = PPOTrainer(
        args=args,
        processing_class=tok,
        model=policy,
        ref_model=ref,
        reward_model=reward,
        value_model=value,
        train_dataset=dataset,
        eval_dataset=dataset.select(range(batch_size)),
        callbacks=[Timer()],
    )
    # Same prompts per iteration as realm, in realm's order: replace TRL's shuffled loader with a
    # sequential one over [iteration 1's rows, iteration 2's rows, ...].
    trainer.dataloader = trainer.accelerator.prepare(
        DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=trainer.data_collator, drop_last=True)
    )
    setup_s = time.monotonic() - t_start
    print(
        f"[trl] models loaded and trainer built in {setup_s:.1f} s; {num_iterations} iterations of "
        f"{batch_size} rollouts x {spec['max_new_tokens']} tokens",
        flush=True,
    )
    t = time.monotonic()
    trainer.train()
    train_s = time.monotonic() - t
    result = {
        "status": "ok",
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "setup_s": setup_s,
        "train_s": train_s,
        "iterations": timings,
    }
    tmp = Path(out_path).with_name(f".{Path(out_path).name}.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, out_path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.split("\n\n")[1])
    main(sys.argv[1], sys.argv[2])
