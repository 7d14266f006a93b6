"""CPU cost of the device shards' forward and training passes on SmolLM2-135M (or the tiny model), one thread.

    .venv/bin/python bench/forward_cost.py --json docs/bench/forward_cost_smollm2.json

Times are CPU seconds of this process (``time.process_time``), not wall time: on a machine shared with
other jobs a one-thread process's CPU time barely moves with the load, its wall time does. Three parts:

1. ``per_token``: CPU microseconds per token of a logprob forward (no graph) and of a training pass
   (forward + backward through the logprobs and entropy) against the micro-batch's size, rows of equal
   length (no padding): where small micro-batches stop paying (``ppo.batch.MICROBATCH_OVERHEAD_TOKENS``).
2. ``inference``: the old logprobs (one rank's 32-row slice of the 16 x 4 workload: one 256-token response
   among short ones): the model's own LM head over every response column then ``logprobs_from_logits``,
   in the plan's 1 micro-batch, against ``response_logprobs`` (the head on real tokens in row blocks) in 1
   and in ``throughput_microbatches``' count.
3. ``training``: one rank's 8-row minibatch share, policy loss forward + backward, the same two paths, in
   the plan's 2 micro-batches and in ``throughput_microbatches``' count.

Response lengths are drawn like the workload's (exponential, mean 60, one row at 256; prompts of 51 tokens).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def load(model_name: str):
    import torch
    from hydra import compose, initialize_config_dir
    from transformers import AutoModelForCausalLM

    from models.registry import resolve_model_dir
    from trainer.compose import to_train_config
    from trainer.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = to_train_config(compose(config_name="train", overrides=[f"model={model_name}"]))
    return AutoModelForCausalLM.from_pretrained(resolve_model_dir(cfg.model), dtype=torch.float32).eval()


def make_batch(num_rows: int, vocab: int, seed: int, response_lengths: list[int] | None = None):
    from trainer.rollout import pad_batch

    rng = random.Random(seed)
    lengths = response_lengths or [256] + [min(256, max(5, int(rng.expovariate(1 / 60)))) for _ in range(num_rows - 1)]
    prompts = [[rng.randrange(5, vocab) for _ in range(51)] for _ in range(num_rows)]
    return pad_batch(prompts, [[rng.randrange(5, vocab) for _ in range(n)] for n in lengths], 2)


def old_logprobs(model, batch, with_entropy: bool):
    """Before issue 28: the model's own head on every response column, then the full-vocabulary losses."""
    import torch

    from ppo import batch as B
    from ppo.losses import entropy_from_logits, logprobs_from_logits
    from runtime.device.shards import response_logits

    logits = response_logits(model, batch)
    logprobs = logprobs_from_logits(logits, B.response_tokens(batch)) * batch["response_mask"]
    if with_entropy:
        with torch.no_grad():
            entropy_from_logits(logits)
    return logprobs


def new_logprobs(model, batch, with_entropy: bool):
    from runtime.device.shards import response_logprobs

    logprobs, entropy = response_logprobs(model, batch, 1.0, with_entropy=with_entropy)
    return logprobs if entropy is None else logprobs + 0 * entropy.detach()


def cpu_seconds(model, batch, path, num_micro: int, train: bool) -> float:
    import torch

    from ppo import batch as B

    start = time.process_time()
    for rows in B.microbatch_rows(batch, num_micro):
        micro = B.trim_padding(B.select(batch, rows))
        with torch.set_grad_enabled(train):
            logprobs = path(model, micro, with_entropy=train)
        if train:
            logprobs.sum().backward()
    model.zero_grad(set_to_none=True)
    return time.process_time() - start


def per_token(model, rows_list: list[int]) -> list[dict]:
    out = []
    for rows in rows_list:
        batch = make_batch(rows, model.config.vocab_size, seed=0, response_lengths=[67] * rows)
        tokens = int(batch["attention_mask"].sum())
        for train in (False, True):
            cpu_seconds(model, batch, new_logprobs, 1, train)  # warm-up
            best = min(cpu_seconds(model, batch, new_logprobs, 1, train) for _ in range(2))
            out.append({"rows": rows, "tokens": tokens, "train": train, "cpu_us_per_token": 1e6 * best / tokens})
            print(out[-1], flush=True)
    return out


def compare(model, num_rows: int, plan_micro: int, train: bool, seed: int) -> dict:
    """The old path at the plan's count against the new one at the plan's and at the throughput count,
    each twice in turn (best of two)."""
    from ppo import batch as B

    batch = make_batch(num_rows, model.config.vocab_size, seed)
    wanted = B.throughput_microbatches(batch, plan_micro)
    cases = {
        f"old_mb{plan_micro}": (old_logprobs, plan_micro),
        f"new_mb{plan_micro}": (new_logprobs, plan_micro),
        f"new_mb{wanted}": (new_logprobs, wanted),
    }
    times: dict[str, float] = {}
    for _ in range(2):
        for name, (path, k) in cases.items():
            t = cpu_seconds(model, batch, path, k, train)
            times[name] = min(times.get(name, t), t)
            print(name, f"{t:.2f} cpu-s", flush=True)
    lengths = batch["response_mask"].sum(-1).long().tolist()
    return {"rows": num_rows, "response_lengths": lengths, "throughput_microbatches": wanted, "cpu_s": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rows", default="1,2,4,8,16", help="micro-batch sizes of the per-token sweep")
    args = parser.parse_args()
    import torch

    from common.files import atomic_write_json

    torch.set_num_threads(1)
    model = load(args.model)
    result = {
        "model": args.model,
        "threads": 1,
        "per_token": per_token(model, [int(r) for r in args.rows.split(",")]),
        "inference": compare(model, 32, 1, train=False, seed=0),
        "training": compare(model, 8, 2, train=True, seed=1),
    }
    atomic_write_json(Path(args.json), result)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
