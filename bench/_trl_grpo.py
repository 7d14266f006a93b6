"""TRL's GRPO trainer on realm's benchmark workload; run by ``bench/ppo_iteration.py --algorithm grpo`` in a subprocess.

    python bench/_trl_grpo.py SPEC.json OUT.json

Not for direct use: ``ppo_iteration.py`` writes SPEC.json (model dir, the exact prompt token ids, gold answers and
datasets of every iteration, the GRPO settings of ``trl_grpo_settings``) and puts a private TRL install and the
repository on PYTHONPATH. From realm this process imports only the grader (``mathtask.grade``): TRL's reward
function is realm's success reward, the same grader on the same decoded response text.

The iteration is realm's: one generation batch of prompts x num_generations rows, generated at once by TRL's own
``transformers.generate`` path (no vLLM), then ``num_iterations`` passes over it in ``steps_per_generation /
gradient_accumulation_steps`` optimizer steps each. A sampler replaces TRL's shuffled one so that every generation
batch holds realm's prompts of that iteration, in realm's order.

What is timed (``time.monotonic``), per iteration (one generation batch):

- ``generate``: ``_generate_single_turn`` (``transformers.generate``, sampled, KV cache);
- ``inference``: from the end of generation to the end of ``_generate_and_score_completions``: the old and
  reference logprobs, decoding, the reward function (the grader), the group advantages;
- ``train``: from there to the ``on_step_end`` of the iteration's last optimizer step (every forward, backward
  and AdamW step of the iteration's passes);
- ``iteration``: between consecutive iteration ends (the first from ``on_train_begin``).

Generated tokens per response are counted like realm counts them: up to and including the first EOS, else the
whole response (TRL's completion ids are cut after the first EOS already). Model loading and trainer construction
are outside every timer.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    t_start = time.monotonic()
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from torch.utils.data import Sampler
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mathtask.grade import grade_many

    torch.manual_seed(spec["seed"])
    model_dir = spec["model_dir"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    dtype = getattr(torch, spec["dtype"])
    policy = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)

    iterations = spec["iterations"]  # per iteration: [{"ids", "text", "gold", "dataset"}] for each prompt
    num_generations = spec["num_generations"]
    rows = [dict(p, prompt=f"{i}:{k}") for i, prompts in enumerate(iterations) for k, p in enumerate(prompts)]
    ids_of = {r["prompt"]: r["ids"] for r in rows}
    dataset = Dataset.from_list([{"prompt": r["prompt"], "gold": r["gold"], "dataset": r["dataset"]} for r in rows])
    layout = spec["layout"]
    batch_rows = len(iterations[0]) * num_generations
    passes = layout["num_iterations"] * layout["steps_per_generation"]  # micro-steps per generation batch
    steps_per_iteration = passes // layout["gradient_accumulation_steps"]

    def success_reward(prompts, completions, completion_ids, gold, dataset, **_):
        """realm's success reward: 1 when the grader finds the response's answer equal to the gold, else 0."""
        return [float(g.correct) for g in grade_many(completions, gold, datasets=dataset)]

    class RealmOrder(Sampler):
        """Each iteration's prompts in realm's order, each ``num_generations`` times, the whole generation batch
        repeated once per micro-step that reuses it (what TRL's ``RepeatSampler`` yields, without shuffling)."""

        def __iter__(self):
            first = 0
            for prompts in iterations:
                batch = [first + k for k in range(len(prompts)) for _ in range(num_generations)]
                first += len(prompts)
                for _ in range(passes):
                    yield from batch

        def __len__(self):
            return sum(len(p) for p in iterations) * num_generations * passes

    timings: list[dict] = []
    cur: dict = {}
    marks = {"t_prev": 0.0}

    class Timed(GRPOTrainer):
        def _get_train_sampler(self, dataset=None):
            return RealmOrder()

        def _tokenize_prompts(self, prompts):
            """The exact prompt token ids realm rolls out (its chat template, its truncation)."""
            return [list(ids_of[p]) for p in prompts], None, {}

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields):
            t = time.monotonic()
            completion_ids, logprobs, extra = super()._generate_single_turn(prompt_ids, images, multimodal_fields)
            cur["t_gen_start"], cur["t_gen_end"] = t, time.monotonic()
            cur["tokens"] = sum(len(c) for c in completion_ids)
            cur["stopped_at_eos"] = sum(bool(c) and c[-1] == tok.eos_token_id for c in completion_ids)
            cur["rows"] = len(completion_ids)
            cur["response_width"] = max((len(c) for c in completion_ids), default=0)
            return completion_ids, logprobs, extra

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            cur["t_scored"] = time.monotonic()
            return out

    class Timer(TrainerCallback):
        def on_train_begin(self, *_, **__):
            marks["t_prev"] = time.monotonic()

        def on_step_end(self, args, state, *_, **__):
            if state.global_step % steps_per_iteration:
                return
            now = time.monotonic()
            row = {
                "iteration": len(timings) + 1,
                "generate": cur["t_gen_end"] - cur["t_gen_start"],
                "inference": cur["t_scored"] - cur["t_gen_end"],
                "train": now - cur["t_scored"],
                "iteration_s": now - marks["t_prev"],
                **{k: cur[k] for k in ("tokens", "rows", "stopped_at_eos", "response_width")},
            }
            row["tokens_per_s"] = row["tokens"] / row["iteration_s"]
            timings.append(row)
            marks["t_prev"] = now
            cur.clear()
            print(
                f"[trl iter {row['iteration']}/{len(iterations)}] {row['iteration_s']:.1f} s | gen "
                f"{row['generate']:.1f} s | {row['tokens']} tokens | {row['tokens_per_s']:.0f} tok/s",
                flush=True,
            )

    args = GRPOConfig(
        output_dir=spec["output_dir"],
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_steps=steps_per_iteration,
        disable_tqdm=True,
        use_cpu=True,
        seed=spec["seed"],
        data_seed=spec["seed"],
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=spec["max_grad_norm"],
        max_steps=steps_per_iteration * len(iterations),
        per_device_train_batch_size=layout["per_device_train_batch_size"],
        gradient_accumulation_steps=layout["gradient_accumulation_steps"],
        steps_per_generation=layout["steps_per_generation"],
        num_iterations=layout["num_iterations"],
        num_generations=num_generations,
        max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"],
        top_p=spec["top_p"],
        beta=spec["beta"],
        epsilon=spec["clip_eps"],
        loss_type=spec["loss_type"],
        scale_rewards=spec["scale_rewards"],
        disable_dropout=True,  # realm's models run in eval mode (no dropout) everywhere
        use_vllm=False,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        model_init_kwargs={"dtype": spec["dtype"]},  # TRL builds the reference model from the same directory
    )
    trainer = Timed(
        model=policy,
        reward_funcs=[success_reward],
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[Timer()],
    )
    setup_s = time.monotonic() - t_start
    print(
        f"[trl] models loaded and trainer built in {setup_s:.1f} s; {len(iterations)} iterations of {batch_rows} "
        f"rollouts x {spec['max_new_tokens']} tokens, {steps_per_iteration} optimizer steps each",
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
        "optimizer": type(
            trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
        ).__name__,
        "optim": str(args.optim),
        "setup_s": setup_s,
        "train_s": train_s,
        "optimizer_steps": trainer.state.global_step,
        "iterations": timings,
    }
    tmp = Path(out_path).with_name(f".{Path(out_path).name}.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, out_path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.split("\n\n")[1])
    main(sys.argv[1], sys.argv[2])
