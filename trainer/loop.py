"""train(): the PPO loop, composed from workers placed by Ray.

One iteration::

    problems = iteration_problems(train, it)                        # seeded order, resumable
    completions = engine.generate(prompts, n)                       # vLLM, generation layout
    rewards = reward_fn(samples)                                    # success + alpha * refined ORM/PRM on tokens
    old, ref, values = policy/ref/critic forward                    # training layout (FSDP2)
    scores -> kl_shaped_rewards -> gae -> whiten                    # trainer/advantages.py
    policy.update(batch); critic.update(batch)                      # PPO epochs x minibatches
    engine.load_weights(sync(policy))                               # reallocation: training -> generation layout
    metrics, eval every N, checkpoint every N
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from eval.data import Problem, load_problems
from eval.files import atomic_build_dir, atomic_write_text, is_complete
from models.registry import cache_root, max_context, resolve_model_dir
from trainer.checkpoint import latest_checkpoint, load_state, save_checkpoint
from rewards.config import RewardKind
from trainer.config import TrainConfig
from trainer.metrics import MetricsWriter, Progress, plot_curves
from trainer.rollout import Rollout, iteration_problems, pad_batch, prompt_ids, prompt_text, rollout_template


class TrainingError(RuntimeError):
    """A run that cannot continue; the last complete checkpoint is kept."""


def _log(msg: str) -> None:
    print(msg, flush=True)


def _split(batch: dict[str, torch.Tensor], num_parts: int) -> list[dict[str, torch.Tensor]]:
    """Row slices of a batch, one per data-parallel rank (rows must divide evenly)."""
    num_rows = next(iter(batch.values())).shape[0]
    if num_rows % num_parts:
        raise TrainingError(f"batch of {num_rows} rows does not split over {num_parts} ranks")
    size = num_rows // num_parts
    return [{k: v[i * size : (i + 1) * size] for k, v in batch.items()} for i in range(num_parts)]


def _data_parallel(group, method: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    parts = group.call_each(method, [(p,) for p in _split(batch, group.num_ranks)])
    return torch.cat(parts, dim=0)


class RewardWorker:
    """Holds the reward function (grader pool, ORM/PRM) next to its models."""

    def __init__(self, reward_cfg, tokenizer_dir: str):
        from transformers import AutoTokenizer

        from rewards.build import build_reward_fn

        self.fn = build_reward_fn(reward_cfg, AutoTokenizer.from_pretrained(tokenizer_dir))

    def score(self, samples):
        return self.fn(samples)

    def set_eta(self, eta: float) -> None:
        self.fn.set_eta(eta)


def load_data(cfg: TrainConfig) -> tuple[list[Problem], list[Problem]]:
    d = cfg.data
    common = dict(seed=d.seed, synthetic_num_train=d.synthetic_num_train,
                  synthetic_num_heldout=d.synthetic_num_heldout, synthetic_difficulty=d.synthetic_difficulty)
    train = load_problems(d.name, limit=d.limit, synthetic_split="train", **common)
    heldout = load_problems(d.heldout, limit=d.heldout_limit, synthetic_split="heldout", **common)
    if not train:
        raise TrainingError(f"data.name={d.name!r} gave no training prompts")
    if not heldout:
        raise TrainingError(f"data.heldout={d.heldout!r} gave no held-out problems")
    return train, heldout


def check_fits(cfg: TrainConfig, model_dir: Path) -> None:
    """Fail before any work if prompts + responses cannot fit the model's context."""
    max_len = max_context(model_dir)
    need = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
    if max_len and need > max_len:
        raise TrainingError(
            f"rollout.max_prompt_tokens + rollout.max_new_tokens = {need} > the model's context "
            f"({max_len}, {model_dir}/config.json max_position_embeddings)"
        )


def warm_start(cfg: TrainConfig, base_dir: Path, train: list[Problem]) -> Path:
    """The policy's starting weights: the base model, or a cached SFT warm-up of it."""
    if cfg.sft.num_steps <= 0:
        return base_dir
    from trainer.sft import run_sft

    key = json.dumps({"base": str(base_dir), "sft": asdict(cfg.sft), "data": asdict(cfg.data),
                      "rollout": [cfg.rollout.system_prompt, cfg.rollout.prompt_suffix], "seed": cfg.run.seed},
                     sort_keys=True, default=str)
    target = cache_root() / "sft" / f"{base_dir.name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if is_complete(target):
        _log(f"[sft] reusing warm-up {target}")
        return target
    _log(f"[sft] warm-up: {cfg.sft.num_steps} steps on {len(train)} problems -> {target}")
    # One intra-op thread: OpenMP threads that outnumber free cores spin and run several times
    # slower (the Ray workers get OMP_NUM_THREADS=1 for the same reason).
    num_threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    try:
        return atomic_build_dir(target, lambda d: run_sft(cfg, base_dir, train, d, log=_log))
    finally:
        torch.set_num_threads(num_threads)


def resolve_reward_model_dir(cfg: TrainConfig) -> Path | None:
    """Find (or train, for built-ins) the reward model in the driver before Ray starts, so that a
    missing one fails at start with one message and a built-in is not trained inside an actor."""
    if cfg.reward.kind == RewardKind.success:
        return None
    from rewards.build import RewardModelError, resolve_reward_model
    from rewards.train_rm import ensure_builtin

    try:
        if cfg.reward.model.path.startswith("builtin:"):
            ensure_builtin(cfg.reward.model.path)  # the one training step; building the reward fn only loads
        return resolve_reward_model(cfg.reward.model.path)
    except RewardModelError as e:
        raise TrainingError(str(e)) from None


def train(cfg: TrainConfig, run_dir: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from reallocation.ray_workers import RayCluster
    from trainer import advantages as adv
    from trainer.kl import make_kl_controller
    from trainer.workers import CriticWorker, PolicyWorker, RefWorker
    from models.vllm_engine import VLLMEngine
    from rewards.build import RewardSample

    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.run.seed)
    train_problems, heldout = load_data(cfg)
    base_dir = resolve_model_dir(cfg.model)
    check_fits(cfg, base_dir)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    r = cfg.rollout
    prompts = {p.id: prompt_text(tokenizer, p.question, r.system_prompt, r.prompt_suffix) for p in train_problems + heldout}
    prompt_tokens = {pid: prompt_ids(tokenizer, text, r.max_prompt_tokens, f"problem {pid}") for pid, text in prompts.items()}

    resolve_reward_model_dir(cfg)
    cl = cfg.cluster
    num_gpus = cl.devices_per_node if cl.uses_gpus and not cl.address else 0
    cluster = RayCluster.start(cl.address, cl.num_cpus, num_gpus=num_gpus)
    writer = None
    try:
        policy_dir = warm_start(cfg, base_dir, train_problems)
        gpu = 1.0 if cl.backend == "nccl" else 0.0
        common = dict(backend=cl.backend, dtype=cfg.model.dtype, seed=cfg.run.seed)
        # One rank per role until the plan runtime deploys cfg.cluster.plan (issue 15).
        num_ranks, num_engines, gen_tp_size = 1, 1, 1
        policy = cluster.group(PolicyWorker, num_ranks, dict(model_dir=str(policy_dir), ppo=cfg.ppo,
                               num_iterations=cfg.run.num_iterations, temperature=r.temperature, **common),
                               name="policy", num_gpus=gpu)
        critic_dir = policy_dir if cfg.critic.from_policy else resolve_model_dir(cfg.critic.model)
        critic = cluster.group(CriticWorker, num_ranks, dict(model_dir=str(critic_dir), ppo=cfg.ppo,
                               num_iterations=cfg.run.num_iterations, **common), name="critic", num_gpus=gpu)
        ref = cluster.group(RefWorker, 1, dict(model_dir=str(policy_dir), temperature=r.temperature, **common),
                            name="ref", num_gpus=gpu)
        engine = cluster.group(
            VLLMEngine, num_engines,
            dict(model_dir=str(policy_dir), dtype=cfg.model.dtype, seed=cfg.run.seed,
                 max_model_len=r.max_prompt_tokens + r.max_new_tokens, tensor_parallel_size=gen_tp_size),
            name="engine", distributed=False, num_gpus=float(gen_tp_size) if gpu else 0.0,
        )
        reward = cluster.group(RewardWorker, 1, dict(reward_cfg=cfg.reward, tokenizer_dir=str(policy_dir)),
                               name="reward", distributed=False)

        def generate(ids: list[list[int]], n: int, temperature: float, seed: int):
            # Engine replicas split the prompts (data-parallel generation).
            num = len(engine.actors)
            chunks = [ids[i::num] for i in range(num)]
            outs = engine.call_each("generate", [(c,) for c in chunks], n=n, temperature=temperature,
                                    top_p=r.top_p if temperature > 0 else 1.0, max_new_tokens=r.max_new_tokens, seed=seed)
            merged: list = [None] * len(ids)
            for i, out in enumerate(outs):
                merged[i::num] = out
            return merged

        def sync_weights() -> None:
            full = [s for s in policy.call("state_dict_for_sync") if s is not None][0]
            engine.call("load_weights", full)

        template = rollout_template(r.system_prompt, r.prompt_suffix)

        def generate_text(texts: list[str], *, n: int, temperature: float, top_p: float, max_new_tokens: int,
                          seed: int, **_: Any):
            ids = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
            return generate(ids, n=n, temperature=temperature, seed=seed)

        def heldout_success(seed: int) -> dict[str, float]:
            """Greedy (and, if asked, sampled) success on the held-out set through eval.evaluate."""
            from eval.evaluate import evaluate

            greedy = evaluate(generate_text, heldout, template, tokenizer=tokenizer, temperature=0.0,
                              max_new_tokens=r.max_new_tokens, seed=seed, log=None).summary
            out = {"heldout/success": greedy["accuracy"]["mean"], "heldout/length": greedy["length"]["mean"]}
            if cfg.run.num_heldout_samples > 0:
                sampled = evaluate(generate_text, heldout, template, tokenizer=tokenizer,
                                   num_samples=cfg.run.num_heldout_samples, temperature=r.temperature, top_p=r.top_p,
                                   max_new_tokens=r.max_new_tokens, seed=seed, log=None).summary
                out["heldout/sampled_success"] = sampled["accuracy"]["mean"]
            return out

        ckpt_root = run_dir / "checkpoints"
        ckpt = latest_checkpoint(ckpt_root) if cfg.run.resume else None
        kl_ctl = make_kl_controller(cfg.ppo)
        if ckpt is not None:
            state = load_state(ckpt)
            policy.call("load_checkpoint", str(ckpt / "policy"))
            critic.call("load_checkpoint", str(ckpt / "critic"))
            kl_ctl.load_state_dict(state["kl"])
            reward_eta = state.get("reward_eta")
            if reward_eta is not None and cfg.reward.eta_zero_fraction is not None:
                # A calibrated Clip threshold stays what the first rollouts made it, not the resumed policy's.
                reward.call("set_eta", reward_eta)
            sync_weights()
            start = state["iteration"]
            before = state["heldout_before"]
            _log(f"[resume] from {ckpt} at iteration {start}")
        else:
            start, reward_eta = 0, None
            before = heldout_success(cfg.run.seed)["heldout/success"]
            _log(f"[eval] held-out success before training: {before:.3f} ({len(heldout)} problems)")
        writer = MetricsWriter(run_dir, resume_from_iteration=start if ckpt else None)
        if ckpt is None:
            writer.log(0, {"heldout/success": before})
        progress = Progress(cfg.run.num_iterations, start)
        last_eval: dict[str, float] = {"heldout/success": before}

        for it in range(start, cfg.run.num_iterations):
            t_iter = time.monotonic()
            times: dict[str, float] = {}
            problems = iteration_problems(train_problems, it, r.num_prompts, cfg.run.seed)
            t = time.monotonic()
            outs = generate([prompt_tokens[p.id] for p in problems], n=r.num_samples_per_prompt,
                            temperature=r.temperature, seed=cfg.run.seed * 100003 + it)
            times["generate"] = time.monotonic() - t
            rollouts = [Rollout(p, prompt_tokens[p.id], prompts[p.id], c) for p, cs in zip(problems, outs) for c in cs]
            num_generated = sum(len(x.completion.token_ids) for x in rollouts)

            t = time.monotonic()
            samples = [RewardSample(question=x.problem.question, gold=x.problem.answer, dataset=x.problem.dataset,
                                    prompt_text=x.prompt_text, response_text=x.completion.text,
                                    response_token_ids=list(x.completion.token_ids)) for x in rollouts]
            rb = reward.call("score", samples)[0]
            reward_eta = rb.metrics.get("reward/eta", reward_eta)
            times["reward"] = time.monotonic() - t

            batch = pad_batch([x.prompt_ids for x in rollouts], [list(x.completion.token_ids) for x in rollouts],
                              tokenizer.pad_token_id)
            t = time.monotonic()
            old_logprobs = _data_parallel(policy, "compute_logprobs", batch)
            ref_logprobs = _data_parallel(ref, "compute_logprobs", batch)
            values = _data_parallel(critic, "compute_values", batch)
            times["inference"] = time.monotonic() - t

            mask = batch["response_mask"]
            T = mask.shape[1]
            scores = torch.zeros_like(mask)
            scores[:, : rb.token_rewards.shape[1]] = rb.token_rewards[:, :T]
            token_rewards, kl = adv.kl_shaped_rewards(scores, old_logprobs, ref_logprobs, mask, kl_ctl.value)
            advantages, returns = adv.gae(token_rewards, values, mask, cfg.ppo.gamma, cfg.ppo.lam)
            if cfg.ppo.whiten_advantages:
                advantages = adv.masked_whiten(advantages, mask)
            batch.update(old_logprobs=old_logprobs, ref_logprobs=ref_logprobs, values=values,
                         advantages=advantages, returns=returns)

            t = time.monotonic()
            policy_stats = policy.call_each("update", [(p,) for p in _split(batch, policy.num_ranks)])[0]
            critic_stats = critic.call_each("update", [(p,) for p in _split(batch, critic.num_ranks)])[0]
            times["train"] = time.monotonic() - t
            for k, v in {**policy_stats, **critic_stats}.items():
                if isinstance(v, float) and not math.isfinite(v):
                    raise TrainingError(
                        f"iteration {it}: {k} = {v} (non-finite loss); stopping. Last complete checkpoint: "
                        f"{latest_checkpoint(ckpt_root) or 'none'}"
                    )
            t = time.monotonic()
            sync_weights()
            times["sync"] = time.monotonic() - t

            mean_kl = (kl * mask).sum(-1).mean().item()
            kl_ctl.update(mean_kl, len(rollouts))
            num_tokens = mask.sum(-1)
            metrics: dict[str, float] = {
                "reward/success": rb.success.float().mean().item(),
                "reward/learned": rb.learned.float().mean().item(),
                "reward/total": scores.sum(-1).mean().item(),
                "response/length": num_tokens.mean().item(),
                "response/num_steps": rb.num_steps.float().mean().item(),
                "response/truncated": sum(x.completion.finish_reason == "length" for x in rollouts) / len(rollouts),
                "kl/mean": mean_kl,
                "kl/coef": kl_ctl.value,
                "advantages/mean": adv.masked_mean(advantages, mask).item(),
                "returns/mean": adv.masked_mean(returns, mask).item(),
                "critic/explained_variance": adv.explained_variance(values, returns, mask),
                **{f"actor/{k}": v for k, v in policy_stats.items()},
                **{f"critic/{k}": v for k, v in critic_stats.items()},
                **{f"time/{k}": v for k, v in times.items()},
            }
            metrics.update({k: float(v) for k, v in rb.metrics.items() if k not in metrics})
            step_scores = [c for s in rb.step_scores for c in s]
            if step_scores:
                metrics["reward/prm_step_score"] = sum(step_scores) / len(step_scores)
            if cfg.run.eval_every and (it + 1) % cfg.run.eval_every == 0 and it + 1 < cfg.run.num_iterations:
                t = time.monotonic()
                last_eval = heldout_success(cfg.run.seed)
                metrics.update(last_eval)
                metrics["time/eval"] = time.monotonic() - t
            metrics["time/iteration"] = time.monotonic() - t_iter
            metrics["throughput/tokens_per_s"] = num_generated / max(1e-9, metrics["time/iteration"])
            if it + 1 == cfg.run.num_iterations:
                last_eval = heldout_success(cfg.run.seed)
                metrics.update(last_eval)
            writer.log(it + 1, metrics)
            writer.log_samples(it + 1, [
                {"question": x.problem.question, "gold": x.problem.answer, "response": x.completion.text,
                 "success": float(rb.success[i]), "num_steps": int(rb.num_steps[i])}
                for i, x in enumerate(rollouts[: cfg.run.num_logged_samples])
            ])
            _log(progress.line(it + 1, f"success {metrics['reward/success']:.3f} | learned {metrics['reward/learned']:+.3f} "
                                      f"| kl {mean_kl:.4f} | len {metrics['response/length']:.1f} "
                                      f"| steps {metrics['response/num_steps']:.2f} | {metrics['throughput/tokens_per_s']:.0f} tok/s"))
            if (cfg.run.checkpoint_every and (it + 1) % cfg.run.checkpoint_every == 0) or it + 1 == cfg.run.num_iterations:
                state = {"iteration": it + 1, "kl": kl_ctl.state_dict(), "heldout_before": before, "seed": cfg.run.seed,
                         "reward_eta": reward_eta}

                def write_parts(d: Path) -> None:
                    policy.call("save_checkpoint", str(d / "policy"))
                    critic.call("save_checkpoint", str(d / "critic"))

                save_checkpoint(ckpt_root, it + 1, state, write_parts)
            plot_curves(run_dir)

        if start >= cfg.run.num_iterations:  # resumed a finished run: no iteration evaluated
            last_eval = heldout_success(cfg.run.seed)
        after = last_eval["heldout/success"]
        summary = {"heldout_before": before, "heldout_after": after, "run_dir": str(run_dir)}
        atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    finally:
        if writer is not None:
            writer.close()
        cluster.shutdown()
    # After the shutdown, so that no actor log line can follow the result line.
    _log(f"metrics: {run_dir / 'metrics.jsonl'}  curves: {run_dir / 'curves.png'}")
    _log(f"held-out success: {before:.3f} -> {after:.3f}")
    return summary
