"""The fixed cost of each model function call: the plan runtime's calls on an (almost) empty batch.

Used by ``bench/ppo_iteration.py`` after the realm run: the same config and plan deployed again (Ray,
device processes, vLLM engines), then each call run ``repeats`` times on a batch of one prompt token and
one response token per row, as few rows as the plan's data-parallel replicas and PPO minibatches allow.
What such a call costs is what every call pays whatever its batch: the driver's dispatch, Ray's
serialization and scheduling, the device process's dispatch, FSDP's gathers, and for the updates the
optimizer steps (``ppo.num_epochs x ppo.num_minibatches`` AdamW steps over every parameter).
"""

from __future__ import annotations

import copy
import statistics
from pathlib import Path
from typing import Any

import torch


def empty_batch(num_rows: int, token: int, pad_id: int) -> dict[str, torch.Tensor]:
    """``num_rows`` rows of one prompt and one response token, with the update's keys at zero."""
    from trainer.rollout import pad_batch

    batch = pad_batch([[token]] * num_rows, [[token]] * num_rows, pad_id)
    zeros = torch.zeros_like(batch["response_mask"])
    batch.update(old_logprobs=zeros, ref_logprobs=zeros, values=zeros, advantages=zeros, returns=zeros)
    return batch


def min_rows(plan: Any, num_minibatches: int) -> int:
    """The fewest rows every call of ``plan`` accepts: each training call needs a row per minibatch per
    data-parallel replica, each inference call a row per replica."""
    return max(a.dp * (num_minibatches if name.endswith("_train") else 1) for name, a in plan.calls.items())


def call_seconds(events: list[Any]) -> dict[str, float]:
    """Each call's span over its devices (first start to last end), from the runtime's events."""
    spans: dict[str, tuple[float, float]] = {}
    for e in events:
        lo, hi = spans.get(e.call, (e.start, e.end))
        spans[e.call] = (min(lo, e.start), max(hi, e.end))
    return {call: hi - lo for call, (lo, hi) in spans.items()}


def run_calls(runtime: Any, batch: dict[str, torch.Tensor], samples: list[Any], token: int) -> dict[str, float]:
    """One round: one new token for each row's one-token prompt, the inference calls, the updates (with the
    reallocations that follow them)."""
    runtime.drain_events()
    prompts = [[token]] * batch["input_ids"].shape[0]  # at least a row per generation replica
    runtime.generate(prompts, n=1, temperature=1.0, top_p=1.0, max_new_tokens=1, seed=0, logprobs=False)
    runtime.infer({k: batch[k] for k in ("input_ids", "attention_mask", "position_ids", "response_mask")}, samples)
    training = runtime.start_training(batch, 0)
    sync = runtime.weight_sync.start(after=training)
    runtime.finish_training(training)
    runtime.weight_sync.finish(sync)
    return call_seconds(runtime.drain_events())


def measure(cfg: Any, run_dir: Path, repeats: int = 3, plan_path: Path | None = None) -> dict[str, Any]:
    """Deploy ``cfg``'s plan (``plan_path``: that plan YAML instead, e.g. the measured run's own, so that a
    searched plan is not searched again for a different batch) and time each call on an empty batch
    ``repeats`` times (the first round, with its warm-up, is dropped); returns the median seconds per call
    and the rounds."""
    if plan_path is not None:
        cfg = copy.deepcopy(cfg)
        cfg.cluster.plan = str(plan_path)
    from transformers import AutoTokenizer

    from models.registry import resolve_model_dir
    from rewards.types import RewardSample
    from runtime.placement import RayCluster
    from trainer.loop import deploy, execution_plan, load_data, resolve_reward_model_dir, warm_start

    train_problems, _ = load_data(cfg)
    base_dir = resolve_model_dir(cfg.model)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    reward_dir = resolve_reward_model_dir(cfg)
    cl = cfg.cluster
    cluster = RayCluster.start(cl.address, cl.num_cpus, num_cpu_devices=0 if cl.uses_gpus else cl.num_devices)
    try:
        policy_dir = warm_start(cfg, base_dir, train_problems)
        plan, lifecycle = execution_plan(cfg, policy_dir, reward_dir, run_dir)
        runtime = deploy(cfg, cluster, plan, lifecycle, policy_dir)
        token = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        batch = empty_batch(min_rows(plan, cfg.ppo.num_minibatches), token, tokenizer.pad_token_id or 0)
        problem = train_problems[0]
        sample = RewardSample(problem.question, problem.answer, problem.dataset, "", "", [token])
        rounds = [run_calls(runtime, batch, [sample] * batch["input_ids"].shape[0], token) for _ in range(repeats + 1)]
    finally:
        cluster.shutdown()
    timed = rounds[1:]
    median = {call: statistics.median(r[call] for r in timed if call in r) for call in timed[0]}
    return {"rows": int(batch["input_ids"].shape[0]), "repeats": repeats, "median_s": median, "rounds": rounds}


TRAINING_CALLS = ("actor_train", "critic_train")
"""Their empty-batch time is mostly the optimizer's steps, which the cost model prices on its own."""


def call_overhead(median_s: dict[str, float]) -> float:
    """The fixed seconds of one call for the cost model: the median empty-batch time of the calls other
    than training (generation, the inference calls, the reallocation's parts)."""
    return statistics.median(t for call, t in median_s.items() if call not in TRAINING_CALLS)


def step_overhead(median_s: dict[str, float], num_steps: int) -> float:
    """The fixed seconds of one optimizer step: an empty training call's time (the median of the two)
    beyond ``call_overhead``, over its ``num_steps`` optimizer steps."""
    train = statistics.median(median_s[c] for c in TRAINING_CALLS if c in median_s)
    return max(0.0, train - call_overhead(median_s)) / num_steps


def main(argv: list[str] | None = None) -> int:
    """``python bench/empty_calls.py --profile PROFILE.json [KEY=VALUE ...]``: time the default config's
    plan (with the Hydra overrides given) on empty batches and write the fixed per-call cost into the
    profile (``planning.profile``), where the CPU cost model reads it."""
    import argparse
    import json
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from common.files import atomic_write_text
    from planning.profile import Profile

    parser = argparse.ArgumentParser(description="the fixed per-call cost, written into a cost-model profile")
    parser.add_argument("--profile", required=True, help="PROFILE.json from python -m planning.profile (updated)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the measurement here")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of configs/train.yaml")
    args = parser.parse_args(argv)
    from hydra import compose, initialize_config_dir

    from trainer.compose import to_train_config
    from trainer.config import register_configs

    profile = Profile.load(args.profile)
    register_configs()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "configs"), version_base="1.3"):
        cfg = to_train_config(compose(config_name="train", overrides=["sft.num_steps=0", *args.overrides]))
    with tempfile.TemporaryDirectory(prefix="empty-calls-") as tmp:
        result = measure(cfg, Path(tmp), args.repeats)
    for call, seconds in result["median_s"].items():
        print(f"  {call:<20} {seconds * 1e3:8.1f} ms")
    profile.call_overhead_s = call_overhead(result["median_s"])
    profile.step_overhead_s = step_overhead(result["median_s"], cfg.ppo.num_epochs * cfg.ppo.num_minibatches)
    profile.save(args.profile)
    print(
        f"call overhead {profile.call_overhead_s * 1e3:.1f} ms, optimizer step overhead "
        f"{profile.step_overhead_s * 1e3:.1f} ms -> {args.profile}"
    )
    if args.json:
        overheads = {"call_overhead_s": profile.call_overhead_s, "step_overhead_s": profile.step_overhead_s}
        atomic_write_text(Path(args.json), json.dumps({**result, **overheads}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
