"""train(): the RL loop (PPO, or a critic-free algorithm) on an execution plan deployed by ``runtime/driver.py``.

One iteration (``run_iteration``), each step a function below; the calls are those of the algorithm's dataflow
graph (a critic-free algorithm has no critic_inf, critic_train; beta 0 has no ref_inf)::

    rollouts = generate(run, it)                   # actor_gen: vLLM replicas on the plan's generation devices
    exp = experience(run, *score(run, rollouts), prompt_groups(rollouts))  # rew_inf, actor_inf, ref_inf,
                                                   # critic_inf; then the advantages here
    training = runtime.start_training(...)         # actor_train, critic_train
    sync = runtime.weight_sync.start(...)          # reallocation: trained weights to the engines (and critic_inf)
    stats = finish_training(...)                   # the stats; stops on a non-finite loss; KL coefficient
    metrics, eval every N, checkpoint every N, timeline.png of the iteration (log_iteration)

Calls start by readiness (``runtime.schedule``): each as soon as its inputs are ready and its devices free.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from common.config import to_plain
from common.files import atomic_build_dir, atomic_write_text, is_complete
from mathtask.data import Problem, load_problems
from models.registry import cache_root, max_context, resolve_model_dir
from ppo.advantages import explained_variance, masked_mean
from rewards.types import RewardFunctionError
from runtime.device.reward import RewardShard
from runtime.device.shards import CriticShard, PolicyShard
from runtime.topology import Role
from trainer.checkpoint import latest_checkpoint, load_state, save_checkpoint
from trainer.config import SeedPer, TrainConfig
from trainer.experience import Experience
from trainer.metrics import MetricsWriter, Progress, plot_curves
from trainer.rollout import (
    Rollout,
    iteration_problems,
    pad_batch,
    prompt_groups,
    prompt_ids,
    prompt_text,
    rollout_template,
)

if TYPE_CHECKING:
    from planning.execution_plan import ExecutionPlan
    from planning.lifecycle import MemoryLifecycle
    from ppo.kl import AdaptiveKLController, FixedKLController
    from rewards.types import RewardBatch
    from runtime.driver import Event, PlanRuntime, Scores, Training
    from runtime.placement import RayCluster


class TrainingError(RuntimeError):
    """A run that cannot continue; the last complete checkpoint is kept."""


def _log(msg: str) -> None:
    print(msg, flush=True)


def load_data(cfg: TrainConfig) -> tuple[list[Problem], list[Problem]]:
    d = cfg.data
    common = dict(
        seed=d.seed,
        synthetic_num_train=d.synthetic_num_train,
        synthetic_num_heldout=d.synthetic_num_heldout,
        synthetic_difficulty=d.synthetic_difficulty,
    )
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

    key = json.dumps(
        {
            "base": str(base_dir),
            "sft": asdict(cfg.sft),
            "data": asdict(cfg.data),
            "rollout": [cfg.rollout.system_prompt, cfg.rollout.prompt_suffix],
            "seed": cfg.run.seed,
        },
        sort_keys=True,
        default=str,
    )
    target = cache_root() / "sft" / f"{base_dir.name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    if is_complete(target):
        record = target / "sft.json"
        steps = f" ({json.loads(record.read_text())['num_steps']} steps)" if record.exists() else ""
        _log(f"[sft] reusing warm-up {target}{steps}")
        return target
    until = f", stopping at greedy success >= {cfg.sft.target_success}" if cfg.sft.target_success > 0 else ""
    _log(f"[sft] warm-up: up to {cfg.sft.num_steps} steps on {len(train)} problems{until} -> {target}")
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
    if not cfg.reward.has_model:
        return None
    from rewards.build import RewardModelError, resolve_reward_model
    from rewards.train_rm import ensure_builtin

    try:
        if cfg.reward.model.path.startswith("builtin:"):
            ensure_builtin(cfg.reward.model.path)  # the one training step; building the reward fn only loads
        return resolve_reward_model(cfg.reward.model.path)
    except RewardModelError as e:
        raise TrainingError(str(e)) from None


def execution_plan(
    cfg: TrainConfig, policy_dir: Path, reward_dir: Path | None, run_dir: Path, longest_prompt: int | None = None
) -> tuple[ExecutionPlan, MemoryLifecycle]:
    """The run's plan (``trainer.plan_select.resolve_plan``: heuristic, search, disjoint or a file),
    checked against the cluster and the models and written to ``run_dir/plan.yaml``, and its memory
    lifecycle (``run_dir/memory_lifecycle.json``: per device and phase, what the runtime will hold).
    ``longest_prompt``: the run's longest rendered training prompt (the search prices time at it)."""
    from planning.execution_plan import PlanError
    from runtime.topology import UnsupportedPlan, check_supported
    from trainer.plan_select import model_specs, plan_lifecycle, read_device_memory, resolve_plan

    critic_dir = policy_dir if cfg.critic.from_policy else None
    memory = read_device_memory(cfg.cluster)
    if memory is not None:
        _log(f"[plan] device memory at start: {memory[0] / 2**30:.1f} GiB free of {memory[1] / 2**30:.1f} GiB")
    try:
        specs = model_specs(cfg, actor_dir=policy_dir, critic_dir=critic_dir, reward_dir=reward_dir)
        plan = resolve_plan(cfg, specs, run_dir=run_dir, log=_log, longest_prompt=longest_prompt, device_memory=memory)
        check_supported(plan, specs)
    except (PlanError, UnsupportedPlan) as e:
        raise TrainingError(str(e)) from None
    lifecycle = plan_lifecycle(cfg, plan, specs, memory)
    atomic_write_text(run_dir / "memory_lifecycle.json", json.dumps(lifecycle.to_json(), indent=1))
    return plan, lifecycle


@dataclass
class Run:
    """What the iterations share: config, data, tokenizer, the deployed plan and the run's state."""

    cfg: TrainConfig
    run_dir: Path
    tokenizer: Any
    train_problems: list[Problem]
    heldout: list[Problem]
    prompts: dict[str, str]
    prompt_tokens: dict[str, list[int]]
    runtime: PlanRuntime
    kl_ctl: FixedKLController | AdaptiveKLController
    writer: MetricsWriter | None = None
    reward_calibration: dict[str, float] | None = None
    """Clip's eta and the reward's alpha after the first reward call (kept in checkpoints)."""
    before: float = 0.0
    last_eval: dict[str, float] = field(default_factory=dict)

    @property
    def ckpt_root(self) -> Path:
        return self.run_dir / "checkpoints"


@dataclass
class Prepared:
    """What every attempt of a run shares (a restart after a lost worker reuses it)."""

    train_problems: list[Problem]
    heldout: list[Problem]
    base_dir: Path
    tokenizer: Any
    prompts: dict[str, str]
    prompt_tokens: dict[str, list[int]]
    reward_dir: Path | None


def train(cfg: TrainConfig, run_dir: Path) -> dict[str, Any]:
    """Train; when a device process or engine dies, restart the cluster from the last complete
    checkpoint up to ``run.max_restarts`` times (each restart a row of metrics.jsonl), else stop with
    one line naming the device, the call, the cause and the command that resumes."""
    from transformers import AutoTokenizer

    from runtime.driver import WorkerLost
    from runtime.placement import ActorLost

    check_reward_function(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.run.seed)
    train_problems, heldout = load_data(cfg)
    base_dir = resolve_model_dir(cfg.model)
    check_fits(cfg, base_dir)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    prompts, prompt_tokens = render_prompts(cfg, tokenizer, train_problems + heldout)
    prepared = Prepared(
        train_problems, heldout, base_dir, tokenizer, prompts, prompt_tokens, resolve_reward_model_dir(cfg)
    )
    restarts: list[str] = []
    while True:
        try:
            run = _attempt(cfg, run_dir, prepared, restarts)
            break
        except RewardFunctionError as e:
            raise TrainingError(
                f"{e}; stopping. Last complete checkpoint: {latest_checkpoint(run_dir / 'checkpoints') or 'none'}"
            ) from None
        except (WorkerLost, ActorLost) as e:
            if len(restarts) >= cfg.run.max_restarts:
                raise TrainingError(f"{e}. Resume with: {resume_command(run_dir)}") from None
            restarts.append(str(e))
            _log(f"[restart {len(restarts)}/{cfg.run.max_restarts}] {e}; restarting from the last complete checkpoint")
    # After the shutdown, so that no actor log line can follow the result line.
    _log(f"metrics: {run_dir / 'metrics.jsonl'}  curves: {run_dir / 'curves.png'}")
    _log(f"held-out success: {run.before:.3f} -> {run.last_eval['heldout/success']:.3f}")
    return json.loads((run_dir / "summary.json").read_text())


def check_reward_function(cfg: TrainConfig) -> None:
    """Import the user's reward function (``reward.function``) and check its signature here, in the driver,
    before Ray starts: a typo in the path or the name is one line, not a failed actor."""
    if not cfg.reward.function:
        return
    from rewards.user_fn import FunctionRef, load_function

    try:
        load_function(FunctionRef.parse(cfg.reward.function), cfg.reward.function_batched)
    except RewardFunctionError as e:
        raise TrainingError(str(e)) from None


def resume_command(run_dir: Path) -> str:
    """This process's command line, pointed at ``run_dir`` (a named run resumes there already)."""
    argv = ["python", *sys.argv]
    if not any(a.startswith(("run.name=", "hydra.run.dir=")) for a in argv):
        argv.append(f"hydra.run.dir={run_dir}")
    return " ".join(argv)


def _attempt(cfg: TrainConfig, run_dir: Path, prepared: Prepared, restarts: list[str]) -> Run:
    """One cluster's life: start Ray, deploy the plan, resume or begin, train to the end."""
    from ppo.kl import make_kl_controller
    from runtime.placement import PlacementError, RayCluster
    from trainer.run_dir import PROCESS_RECORD

    cl = cfg.cluster
    try:
        cluster = RayCluster.start(
            cl.address,
            cl.num_cpus,
            num_gpus=cl.devices_per_node if cl.uses_gpus and not cl.address else 0,
            num_cpu_devices=0 if cl.uses_gpus else cl.num_devices,
            record=run_dir / PROCESS_RECORD,
        )
    except PlacementError as e:
        raise TrainingError(str(e)) from None
    run = None
    try:
        policy_dir = warm_start(cfg, prepared.base_dir, prepared.train_problems)
        longest = longest_prompt(prepared.prompt_tokens, prepared.train_problems)
        plan, lifecycle = execution_plan(cfg, policy_dir, prepared.reward_dir, run_dir, longest)
        runtime = deploy(cfg, cluster, plan, lifecycle, policy_dir)
        p = prepared
        kl_ctl = make_kl_controller(cfg.algorithm)
        run = Run(cfg, run_dir, p.tokenizer, p.train_problems, p.heldout, p.prompts, p.prompt_tokens, runtime, kl_ctl)
        atomic_write_text(run_dir / "placement.json", json.dumps(runtime.placement(), indent=2))
        start = resume_or_begin(run)
        if restarts and run.writer is not None:
            run.writer.log_restart(start, len(restarts), restarts[-1])
        run_iterations(run, start)
        summary = {
            "heldout_before": run.before,
            "heldout_after": run.last_eval["heldout/success"],
            "run_dir": str(run_dir),
        }
        atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
        return run
    finally:
        if run is not None and run.writer is not None:
            run.writer.close()
        cluster.shutdown()


def longest_prompt(prompt_tokens: dict[str, list[int]], problems: list[Problem]) -> int:
    """Tokens of the longest of ``problems``' prompts: the cost model prices a run's time at it (its calls
    trim padding to each micro-batch's longest row)."""
    return max(len(prompt_tokens[p.id]) for p in problems)


def render_prompts(
    cfg: TrainConfig, tokenizer: Any, problems: list[Problem]
) -> tuple[dict[str, str], dict[str, list[int]]]:
    """Each problem's prompt text and token ids (problem id -> ...); a prompt over
    ``rollout.max_prompt_tokens`` fails here, naming its problem."""
    r = cfg.rollout
    prompts = {p.id: prompt_text(tokenizer, p.question, r.system_prompt, r.prompt_suffix) for p in problems}
    prompt_tokens = {
        pid: prompt_ids(tokenizer, text, r.max_prompt_tokens, f"problem {pid}") for pid, text in prompts.items()
    }
    return prompts, prompt_tokens


def run_iterations(run: Run, start: int) -> None:
    """Iterations ``start`` .. ``cfg.run.num_iterations - 1``, one progress line each; ``run.last_eval``
    holds the held-out success after the last (evaluated here when a finished run was resumed)."""
    num_iterations = run.cfg.run.num_iterations
    progress = Progress(num_iterations, start)
    for it in range(start, num_iterations):
        metrics = run_iteration(run, it)
        _log(
            progress.line(
                it + 1,
                f"success {metrics['reward/success']:.3f} | learned {metrics['reward/learned']:+.3f} "
                f"| kl {metrics.get('kl/mean', 0.0):.4f} | len {metrics['response/length']:.1f} "
                f"| steps {metrics['response/num_steps']:.2f} | {metrics['throughput/tokens_per_s']:.0f} tok/s",
            )
        )
    if start >= num_iterations:  # resumed a finished run: no iteration evaluated
        run.last_eval = heldout_success(run, run.cfg.run.seed)


def deploy(
    cfg: TrainConfig, cluster: RayCluster, plan: ExecutionPlan, lifecycle: MemoryLifecycle, policy_dir: Path
) -> PlanRuntime:
    """Place the plan's device processes, engines (within ``lifecycle``'s budgets) and reward function
    (``runtime.driver``)."""
    from runtime.driver import PlanRuntime
    from runtime.placement import PlacementError
    from runtime.topology import UnsupportedPlan

    r = cfg.rollout
    critic_dir = policy_dir if cfg.critic.from_policy else resolve_model_dir(cfg.critic.model)
    engine_kwargs = dict(
        model_dir=str(policy_dir),
        dtype=cfg.model.dtype,
        seed=cfg.run.seed,
        max_model_len=r.max_prompt_tokens + r.max_new_tokens,
        enforce_eager=r.enforce_eager,
    )
    _log(f"[plan] {plan.source or 'plan'}: " + "; ".join(f"{c} {a.describe()}" for c, a in plan.calls.items()))
    try:
        return PlanRuntime.start(
            cluster,
            plan,
            backend=cfg.cluster.backend,
            dtype=cfg.model.dtype,
            seed=cfg.run.seed,
            ppo=cfg.ppo,
            num_iterations=cfg.run.num_iterations,
            temperature=r.temperature,
            policy_dir=str(policy_dir),
            critic_dir=str(critic_dir),
            reward_cfg=cfg.reward,
            engine_kwargs=engine_kwargs,
            lifecycle=lifecycle,
            collective_timeout_s=cfg.cluster.collective_timeout_s,
            algorithm=cfg.algorithm,
            loss_norm_tokens=cfg.algorithm.loss_agg_num_tokens or r.max_new_tokens,
        )
    except (PlacementError, UnsupportedPlan) as e:
        raise TrainingError(str(e)) from None


def resume_or_begin(run: Run) -> int:
    """Load the last complete checkpoint (then reallocate its weights to the engines) or measure the
    held-out success before training; returns the first iteration to run."""
    cfg, runtime = run.cfg, run.runtime
    ckpt = latest_checkpoint(run.ckpt_root) if cfg.run.resume else None
    if ckpt is None:
        run.writer = MetricsWriter(run.run_dir)
        run.before = heldout_success(run, cfg.run.seed, iteration=0)["heldout/success"]
        _log(f"[eval] held-out success before training: {run.before:.3f} ({len(run.heldout)} problems)")
        run.writer.log(0, {"heldout/success": run.before})
        run.writer.log_residency(0, run.runtime.residency_log)
        run.runtime.residency_log.clear()
        run.last_eval = {"heldout/success": run.before}
        return 0
    state = load_state(ckpt)
    runtime.sleep_engines()  # the checkpoint loads into shards beside them; the weight sync below wakes them
    runtime.on_role(Role.actor, PolicyShard.load_checkpoint, str(ckpt / "policy"))
    if cfg.algorithm.has_critic:
        runtime.on_role(Role.critic, CriticShard.load_checkpoint, str(ckpt / "critic"))
    run.kl_ctl.load_state_dict(state["kl"])
    run.reward_calibration = state.get("reward_calibration")
    if run.reward_calibration is None and state.get("reward_eta") is not None:  # a checkpoint from before alpha
        run.reward_calibration = {"eta": state["reward_eta"], "alpha": cfg.reward.alpha}
    if run.reward_calibration is not None:
        # A calibrated eta / alpha stays what the first rollouts made it, not the resumed policy's.
        runtime.on_reward(RewardShard.set_calibration, run.reward_calibration)
    runtime.weight_sync.run()
    runtime.drain_events()
    run.before = state["heldout_before"]
    run.last_eval = {"heldout/success": run.before}
    run.writer = MetricsWriter(run.run_dir, resume_from_iteration=state["iteration"])
    _log(f"[resume] from {ckpt} at iteration {state['iteration']}")
    return state["iteration"]


def heldout_success(run: Run, seed: int, iteration: int | None = None) -> dict[str, float]:
    """Greedy (and, if asked, sampled) success on the held-out set through eval.evaluate; with an
    ``iteration``, also each problem's correctness to heldout.jsonl (``MetricsWriter.log_heldout``)."""
    from eval.evaluate import evaluate

    r = run.cfg.rollout
    template = rollout_template(r.system_prompt, r.prompt_suffix)

    def generate_text(
        prompts: list[str], *, n: int, temperature: float, top_p: float, max_new_tokens: int, seed: int, **_: Any
    ):
        ids = [run.tokenizer(t, add_special_tokens=False).input_ids for t in prompts]
        return run.runtime.generate(
            ids,
            n=n,
            temperature=temperature,
            top_p=top_p if temperature > 0 else 1.0,
            max_new_tokens=r.max_new_tokens,
            seed=seed,
            seed_per_prompt=r.seed_per == SeedPer.prompt,
        )

    common = dict(tokenizer=run.tokenizer, max_new_tokens=r.max_new_tokens, seed=seed, log=None)
    greedy = evaluate(generate_text, run.heldout, template, temperature=0.0, **common)
    out = {"heldout/success": greedy.summary["accuracy"]["mean"], "heldout/length": greedy.summary["length"]["mean"]}
    num_correct = {p.id: 0 for p in run.heldout}
    if run.cfg.run.num_heldout_samples > 0:
        sampled = evaluate(
            generate_text,
            run.heldout,
            template,
            num_samples=run.cfg.run.num_heldout_samples,
            temperature=r.temperature,
            top_p=r.top_p,
            **common,
        )
        out["heldout/sampled_success"] = sampled.summary["accuracy"]["mean"]
        for record in sampled.records:
            num_correct[record["id"]] += record["correct"]
    run.runtime.drain_events()  # evaluation is not part of the iteration's timeline
    if iteration is not None and run.writer is not None:
        correct = {record["id"]: record["correct"] for record in greedy.records}
        ids = [p.id for p in run.heldout]
        run.writer.log_heldout(iteration, ids, [correct[i] for i in ids], [num_correct[i] for i in ids])
    return out


def run_iteration(run: Run, it: int) -> dict[str, float]:
    """One PPO iteration, each step a function below; then metrics, evaluation and a checkpoint."""
    t_iter = time.time()
    rollouts = generate(run, it)  # actor_gen: the vLLM replicas sample the responses
    # rew_inf, actor_inf, ref_inf, critic_inf (those the algorithm has); then its advantages here
    exp = experience(run, *score(run, rollouts), prompt_groups(rollouts))
    training = run.runtime.start_training(exp.update_batch(), it)  # actor_train, critic_train
    # Reallocation is its own step, started now: each model's weights move as soon as its own training and
    # the devices they move over are free (the actor's to the engines while the critic may still train).
    sync = run.runtime.weight_sync.start(after=training)
    stats = finish_training(run, training, exp, it)
    metrics = {**iteration_metrics(run, rollouts, exp, *stats), **run.runtime.weight_sync.finish(sync)}
    metrics.update(call_metrics(run, run.runtime.drain_events(), t_iter, it))
    log_iteration(run, it, rollouts, exp, metrics, t_iter)
    return metrics


def log_iteration(
    run: Run, it: int, rollouts: list[Rollout], exp: Experience, metrics: dict[str, float], t_iter: float
) -> None:
    """Held-out evaluation when due, then metrics.jsonl, samples, rollouts, a checkpoint and the curves."""
    cfg = run.cfg
    if cfg.run.eval_every and (it + 1) % cfg.run.eval_every == 0 and it + 1 < cfg.run.num_iterations:
        t = time.time()
        run.last_eval = heldout_success(run, cfg.run.seed, iteration=it + 1)
        metrics.update(run.last_eval)
        metrics["time/eval"] = time.time() - t
    metrics["time/iteration"] = time.time() - t_iter
    metrics["throughput/tokens_per_s"] = metrics.pop("_num_generated") / max(1e-9, metrics["time/iteration"])
    if it + 1 == cfg.run.num_iterations:
        run.last_eval = heldout_success(run, cfg.run.seed, iteration=it + 1)
        metrics.update(run.last_eval)
    writer = run.writer
    assert writer is not None, "resume_or_begin opens the metrics writer"
    writer.log(it + 1, metrics)
    writer.log_residency(it + 1, run.runtime.residency_log)
    run.runtime.residency_log.clear()
    records = rollout_records(rollouts, exp.reward)
    writer.log_samples(it + 1, records[: cfg.run.num_logged_samples])
    if cfg.run.rollouts_every and (it + 1) % cfg.run.rollouts_every == 0:
        writer.write_rollouts(it + 1, records)
    checkpoint(run, it)
    plot_curves(run.run_dir)


def rollout_records(rollouts: list[Rollout], reward: RewardBatch) -> list[dict[str, Any]]:
    """One JSON-ready record per rollout: the response and what the reward made of it (with a user reward
    function, its value under the function's name, as it returned it)."""
    records = [
        {
            "problem_id": x.problem.id,
            "question": x.problem.question,
            "gold": x.problem.answer,
            "response": x.completion.text,
            "finish_reason": x.completion.finish_reason,
            "success": float(reward.success[i]),
            "learned": float(reward.learned[i]),
            "num_steps": int(reward.num_steps[i]),
            "step_scores": [round(c, 4) for c in reward.step_scores[i]],
        }
        for i, x in enumerate(rollouts)
    ]
    if reward.function_name is not None and reward.function_values is not None:
        for record, value in zip(records, reward.function_values):
            record[reward.function_name] = value
    return records


def generate(run: Run, it: int) -> list[Rollout]:
    """actor_gen: this iteration's prompts (seeded order, resumable), n samples each."""
    cfg, r = run.cfg, run.cfg.rollout
    problems = iteration_problems(run.train_problems, it, r.num_prompts, cfg.run.seed)
    outs = run.runtime.generate(
        [run.prompt_tokens[p.id] for p in problems],
        n=r.num_samples_per_prompt,
        temperature=r.temperature,
        top_p=r.top_p,
        max_new_tokens=r.max_new_tokens,
        seed=cfg.run.seed * 100003 + it,
        seed_per_prompt=r.seed_per == SeedPer.prompt,
        # The old logprobs come from the training model (actor_inf), or from the update itself when it takes
        # one step (ppo.config.reuses_update_logprobs); vLLM's own would cost a third of generation on CPU
        # (it detokenizes every sampled token's logprob entry) and go unused.
        logprobs=False,
    )
    return [Rollout(p, run.prompt_tokens[p.id], run.prompts[p.id], c) for p, cs in zip(problems, outs) for c in cs]


def score(run: Run, rollouts: list[Rollout]) -> tuple[dict[str, torch.Tensor], Scores]:
    """The padded batch (``trainer.rollout.pad_batch``) and what the inference calls make of it
    (``PlanRuntime.infer``: rewards, old and reference logprobs, values; no old logprobs when the update takes
    one step and uses its own, ``ppo.config.reuses_update_logprobs``)."""
    from ppo.config import reuses_update_logprobs
    from rewards.build import RewardSample

    samples = [
        RewardSample(
            question=x.problem.question,
            gold=x.problem.answer,
            dataset=x.problem.dataset,
            prompt_text=x.prompt_text,
            response_text=x.completion.text,
            response_token_ids=list(x.completion.token_ids),
            problem_id=x.problem.id,
            truncated=x.completion.finish_reason == "length",
        )
        for x in rollouts
    ]
    batch = pad_batch(
        [x.prompt_ids for x in rollouts], [list(x.completion.token_ids) for x in rollouts], run.tokenizer.pad_token_id
    )
    scores = run.runtime.infer(batch, samples, not reuses_update_logprobs(run.cfg.algorithm, run.cfg.ppo))
    if run.reward_calibration is None:
        run.reward_calibration = run.runtime.on_reward(RewardShard.calibration)
    return batch, scores


def experience(run: Run, batch: dict[str, torch.Tensor], scores: Scores, group: torch.Tensor) -> Experience:
    """The iteration's ``Experience``: the reward's token scores on the batch's response columns, then the
    algorithm's advantages: KL-shaped GAE over the critic's values (``ppo.advantages.compute_advantages``) or a
    critic-free estimator over the prompt groups ``group`` [B] (``ppo.critic_free``)."""
    mask = batch["response_mask"]
    token_scores = torch.zeros_like(mask)
    token_rewards = scores.reward.token_rewards
    token_scores[:, : token_rewards.shape[1]] = token_rewards[:, : mask.shape[1]]
    a = run.cfg.algorithm
    common: dict[str, Any] = dict(
        **batch,
        reward=scores.reward,
        scores=token_scores,
        old_logprobs=scores.old_logprobs,
        ref_logprobs=scores.ref_logprobs,
        values=scores.values,
        group=group,
    )
    if a.has_critic:
        from ppo.advantages import compute_advantages

        # The graph of gae has all three (reuses_update_logprobs is false with a critic).
        assert scores.values is not None and scores.ref_logprobs is not None and scores.old_logprobs is not None
        adv = compute_advantages(
            token_scores,
            scores.old_logprobs,
            scores.ref_logprobs,
            scores.values,
            mask,
            run.kl_ctl.value,
            a.gamma,
            a.lam,
            a.whiten_advantages,
        )
        return Experience(**common, advantages=adv.advantages, returns=adv.returns, kl=adv.kl)
    return critic_free_experience(run, common, token_scores, mask, scores, group)


def critic_free_experience(
    run: Run,
    common: dict[str, Any],
    token_scores: torch.Tensor,
    mask: torch.Tensor,
    scores: Scores,
    group: torch.Tensor,
) -> Experience:
    """A critic-free algorithm's experience: -beta * KL (its estimator) on the rewards when the KL term is in the
    reward, then the estimator's advantages over the groups (``ppo.critic_free.critic_free_advantages``)."""
    from ppo.config import KLPlacement
    from ppo.critic_free import critic_free_advantages
    from ppo.kl import kl_estimate

    a, rewards, kl = run.cfg.algorithm, token_scores, None
    if scores.ref_logprobs is not None and scores.old_logprobs is not None:  # no old ones: the KL is in the loss
        kl = (scores.old_logprobs - scores.ref_logprobs) * mask
        if a.kl_in == KLPlacement.reward:
            penalty = kl_estimate(scores.old_logprobs, scores.ref_logprobs, mask, a.kl_estimator)
            rewards = (token_scores - run.kl_ctl.value * penalty) * mask
    adv = critic_free_advantages(rewards, mask, group, a.estimator, a.group_std, a.gamma)
    return Experience(**common, advantages=adv.advantages, returns=adv.returns, kl=kl)


def finish_training(run: Run, training: Training, exp: Experience, it: int) -> tuple[dict, dict]:
    """The training calls' stats (actor, critic); stops on a non-finite loss, then moves the KL coefficient."""
    actor_stats, critic_stats = run.runtime.finish_training(training)
    for k, v in {**actor_stats, **critic_stats}.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise TrainingError(
                f"iteration {it}: {k} = {v} (non-finite loss); stopping. Last complete checkpoint: "
                f"{latest_checkpoint(run.ckpt_root) or 'none'}"
            )
    mask = exp.response_mask
    if exp.kl is not None:
        run.kl_ctl.update((exp.kl * mask).sum(-1).mean().item(), mask.shape[0])
    return actor_stats, critic_stats


def iteration_metrics(
    run: Run, rollouts: list[Rollout], exp: Experience, actor_stats: dict, critic_stats: dict
) -> dict[str, float]:
    from ppo.critic_free import equal_reward_group_fraction

    rb, mask = exp.reward, exp.response_mask
    metrics: dict[str, float] = {
        "reward/success": rb.success.float().mean().item(),
        "reward/learned": rb.learned.float().mean().item(),
        "reward/total": exp.scores.sum(-1).mean().item(),
        "response/length": mask.sum(-1).float().mean().item(),
        "response/num_steps": rb.num_steps.float().mean().item(),
        "response/truncated": sum(x.completion.finish_reason == "length" for x in rollouts) / len(rollouts),
        "advantages/mean": masked_mean(exp.advantages, mask).item(),
        "returns/mean": masked_mean(exp.returns, mask).item(),
        **{f"actor/{k}": v for k, v in actor_stats.items()},
        **{f"critic/{k}": v for k, v in critic_stats.items()},
        "_num_generated": float(sum(len(x.completion.token_ids) for x in rollouts)),
    }
    if exp.kl is not None:
        metrics |= {"kl/mean": (exp.kl * mask).sum(-1).mean().item(), "kl/coef": run.kl_ctl.value}
    if exp.values is not None:
        metrics["critic/explained_variance"] = explained_variance(exp.values, exp.returns, mask)
    if exp.group is not None:  # groups that teach a group baseline nothing: every response's reward the same
        metrics["advantages/equal_reward_group_fraction"] = equal_reward_group_fraction(exp.scores.sum(-1), exp.group)
    metrics.update({k: float(v) for k, v in rb.metrics.items() if k not in metrics})
    step_scores = [c for s in rb.step_scores for c in s]
    if step_scores:
        metrics["reward/prm_step_score"] = sum(step_scores) / len(step_scores)
    return metrics


def call_metrics(run: Run, events: list[Event], t_iter: float, it: int) -> dict[str, float]:
    """Each call's start/end (``call/<name>/...``), the per-phase times, and the timeline picture."""
    from trainer.timeline import call_spans, plot_timeline

    spans = call_spans(events, t_iter)
    out = dict(spans)
    phases = {
        "generate": ("actor_gen",),
        "inference": ("actor_inf", "ref_inf", "critic_inf", "rew_inf", "reward"),
        "train": ("actor_train", "critic_train"),
        "sync": ("realloc_actor", "realloc_actor_load", "realloc_actor_handoff", "realloc_critic"),
    }
    for phase, calls in phases.items():
        ends = [spans[f"call/{c}/end_s"] for c in calls if f"call/{c}/end_s" in spans]
        starts = [spans[f"call/{c}/start_s"] for c in calls if f"call/{c}/start_s" in spans]
        if ends:
            out[f"time/{phase}"] = max(ends) - min(starts)
    if events:
        plot_timeline(
            events, t_iter, run.run_dir / "timeline.png", title=f"iteration {it + 1} ({run.runtime.plan.source})"
        )
    return out


def checkpoint(run: Run, it: int) -> None:
    cfg = run.cfg
    if not (
        (cfg.run.checkpoint_every and (it + 1) % cfg.run.checkpoint_every == 0) or it + 1 == cfg.run.num_iterations
    ):
        return
    state = {
        "iteration": it + 1,
        "kl": run.kl_ctl.state_dict(),
        "heldout_before": run.before,
        "seed": cfg.run.seed,
        "reward_calibration": run.reward_calibration,
        "config": to_plain(cfg),  # what a relaunch is compared with (trainer.run_dir.check_resume)
    }

    def write_parts(d: Path) -> None:
        run.runtime.on_role(Role.actor, PolicyShard.save_checkpoint, str(d / "policy"))
        if cfg.algorithm.has_critic:
            run.runtime.on_role(Role.critic, CriticShard.save_checkpoint, str(d / "critic"))

    save_checkpoint(run.ckpt_root, it + 1, state, write_parts, keep_last=cfg.run.keep_checkpoints)
