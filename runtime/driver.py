"""The driver's side of the plan runtime: deploys an ``ExecutionPlan`` and runs one PPO iteration's calls.

Deployment (``PlanRuntime.start``)::

    one placement group, one bundle per plan device              runtime.placement.DevicePool
    one device process per device (runtime.device.process.DeviceProcess), hosting every model shard
    the plan puts there (runtime.topology.roles_on):
        "actor"      PolicyShard over actor_train's grid or stages (also computes the old logprobs)
        "critic"     CriticShard over critic_train's grid or stages (also critic_inf when the plan gives
                     critic_inf the same devices and layout: sharded forward = inference)
        "critic_inf" CriticShard replicas over critic_inf's pipelines, when its devices or layout differ
        "ref"        ReferenceShard replicas over ref_inf's pipelines
        "reward"     RewardShard replicas over rew_inf's pipelines: the reward function, its reward model
                     sharded like a reference replica (the replica's last stage's first device reports)
    one vLLM engine rank per actor_gen device, a companion process in the same bundle (vLLM builds its
    own torch.distributed world, so it cannot live inside the device process); with tp or pp > 1 the
    companions of a generation replica form one engine (vLLM's external_launcher)

Calls go to the devices of their mesh; a device process runs one call at a time, in submission
order, so calls on disjoint meshes run at the same time and calls on shared devices queue.
Reallocation moves a model between two of its layouts over the union of both meshes (training
shards to the engine ranks' vLLM TP boxes, or to inference replicas' own shards): each destination
receives exactly the bytes it does not hold. Each call reports its start and end per device
(``Event``) for the metrics and the timeline picture.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from planning.execution_plan import Call, CallAllocation, ExecutionPlan
from planning.lifecycle import Kind, MemoryLifecycle, Phase
from ppo.batch import microbatches_per_minibatch, num_rows, select, update_rows, update_seed
from reallocation.layout import Holdings, ModelSpec
from rewards.types import RewardBatch, merge_reward_batches
from runtime.device.process import DeviceProcess
from runtime.device.reward import RewardShard
from runtime.device.shards import CriticShard, PolicyShard, ReferenceShard
from runtime.dispatch import Gather, Split, dispatch_of
from runtime.schedule import Scheduler, Task
from runtime.topology import (
    Role,
    check_supported,
    critic_needs_realloc,
    devices_of_role,
    engine_holdings,
    grid_on,
    mesh_groups,
    replicas,
    reporting_device,
    reward_replicas,
    roles_on,
)

ENGINE = "engine"
"""The companion process beside each generation device: its vLLM engine rank."""


class WorkerLost(RuntimeError):
    """A process of the run died: the message names its device, what it held, the call, and why."""


@dataclass(frozen=True)
class Event:
    """One call on one device: wall-clock start and end (seconds since the epoch)."""

    call: str
    device: int
    start: float
    end: float


Part = tuple[str, int, Any]
"""What a started call waits on: (call name for its span, device, future of (result, start, end))."""


@dataclass
class Scores:
    """What the inference calls make of one batch of rollouts; tensors are [B, T] over the response tokens."""

    reward: RewardBatch
    """rew_inf: success, learned reward and token rewards."""
    old_logprobs: torch.Tensor | None
    """actor_inf: log pi_old of each response token, from the training model (None: no actor_inf, the update
    takes one step and uses its own, ``ppo.config.reuses_update_logprobs``)."""
    ref_logprobs: torch.Tensor | None
    """ref_inf: log pi_ref of each response token (None: the algorithm has no KL term, no ref_inf)."""
    values: torch.Tensor | None
    """critic_inf: V of each response position (None: the algorithm has no critic)."""


@dataclass
class Training:
    """The training calls of an iteration, in flight (the critic's when the algorithm has one)."""

    actor: Task
    critic: Task | None = None


def _recipes(
    plan: ExecutionPlan, common: dict[str, Any], train: dict[str, Any], dirs: dict[str, Any], reward: dict[str, Any]
) -> dict[Role, tuple[type, dict[str, Any]]]:
    """Role -> (worker class, constructor kwargs) for the roles the plan's calls have; ``DeviceProcess`` adds
    the ranks of its grid."""
    from runtime.device.shards import CriticShard, PolicyShard, ReferenceShard

    calls, train = plan.calls, {**train, **common}
    present = {
        Role.actor: True,
        Role.critic: Call.critic_train in calls,
        Role.critic_inf: Call.critic_train in calls,
        Role.ref: Call.ref_inf in calls,
        Role.reward: True,
    }
    recipes: dict[Role, Callable[[], tuple[type, dict[str, Any]]]] = {
        Role.actor: lambda: (
            PolicyShard,
            dict(
                model_dir=dirs["policy_dir"],
                temperature=dirs["temperature"],
                activation_checkpointing=calls["actor_train"].activation_checkpointing,
                algorithm=dirs["algorithm"],
                loss_norm_tokens=dirs["loss_norm_tokens"],
                **train,
            ),
        ),
        Role.critic: lambda: (
            CriticShard,
            dict(
                model_dir=dirs["critic_dir"],
                activation_checkpointing=calls["critic_train"].activation_checkpointing,
                **train,
            ),
        ),
        Role.critic_inf: lambda: (CriticShard, dict(model_dir=dirs["critic_dir"], frozen=True, **train)),
        Role.ref: lambda: (
            ReferenceShard,
            dict(
                model_dir=dirs["policy_dir"],
                temperature=dirs["temperature"],
                offload=calls["ref_inf"].offload,
                **common,
            ),
        ),
        Role.reward: lambda: (
            RewardShard,
            {
                **reward,
                "num_microbatches": calls["rew_inf"].num_microbatches if "rew_inf" in calls else 1,
                "offload": "rew_inf" in calls and calls["rew_inf"].offload,
            },
        ),
    }
    return {role: make() for role, make in recipes.items() if present[role]}


def engine_memory_kwargs(lifecycle: MemoryLifecycle, device: int, on_gpu: bool) -> dict[str, Any]:
    """The engine rank's memory on ``device``, as the plan's lifecycle budgets it: its KV cache exactly
    (``kv_cache_memory_bytes``) and, on a GPU, a ``gpu_memory_utilization`` that covers its weights, KV
    cache, working memory and context, so that vLLM's start-up check (free memory >= utilization x
    total) asks for what the engine will hold and no more (vLLM's default, 0.85, would ask for most of
    a GPU that training shares). On CPU the KV cache alone (vLLM-CPU's own setting). Both get the batch
    limits the engine's working memory is priced at (``planning.lifecycle.engine_batch_limits``)."""
    budget = lifecycle.engine_budget(device)
    kv = int(budget[Kind.kv_cache])
    max_num_seqs, max_num_batched_tokens = lifecycle.engine_batch
    batch = {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens}
    if not on_gpu:
        return {"kv_cache_gib": kv / (1 << 30), **batch}
    utilization = math.ceil(1000 * sum(budget.values()) / lifecycle.capacity_bytes) / 1000
    return {"kv_cache_memory_bytes": kv, "gpu_memory_utilization": min(utilization, 1.0), **batch}


def engine_memory_line(device: int, report: Mapping[str, Any], budget: Mapping[Kind, float]) -> str:
    """One engine rank's memory as vLLM reports it after start (``VLLMEngine.memory_report``) beside what
    the plan's lifecycle gives it (``MemoryLifecycle.engine_budget``), in GiB.

    Example: ``[engine] device 0: vLLM KV cache 2.000 GiB (4096 blocks of 16), weights 2.874 GiB, batch 64
    seqs / 8192 tokens, eager; planned KV 2.000 GiB, weights 2.874 GiB, workspace 1.156 GiB; cuda allocated
    6.1 GiB, reserved 6.3 GiB, free 70.2 of 79.1 GiB``."""
    gib = float(1 << 30)
    line = (
        f"[engine] device {device}: vLLM KV cache {report['kv_cache_bytes'] / gib:.3f} GiB "
        f"({report['num_blocks']} blocks of {report['block_size']}), weights {report['weights_bytes'] / gib:.3f} GiB, "
        f"batch {report['max_num_seqs']} seqs / {report['max_num_batched_tokens']} tokens, "
        f"{'eager' if report['enforce_eager'] else 'CUDA graphs'}; planned KV "
        f"{budget.get(Kind.kv_cache, 0.0) / gib:.3f} GiB, weights {budget.get(Kind.weights, 0.0) / gib:.3f} GiB, "
        f"workspace {budget.get(Kind.activations, 0.0) / gib:.3f} GiB"
    )
    if "cuda_allocated_bytes" in report:
        line += (
            f"; cuda allocated {report['cuda_allocated_bytes'] / gib:.1f} GiB, reserved "
            f"{report['cuda_reserved_bytes'] / gib:.1f} GiB, free {report['cuda_free_bytes'] / gib:.1f} of "
            f"{report['cuda_total_bytes'] / gib:.1f} GiB"
        )
    return line


def _start_engines(
    pool: Any, plan: ExecutionPlan, engine_kwargs: dict[str, Any], lifecycle: MemoryLifecycle, on_gpu: bool
) -> None:
    """One vLLM engine rank beside each generation device (a replica's pp stages of tp devices are
    one engine), each with the memory and batch limits the lifecycle gives it; with sleep mode when the
    lifecycle has the engines sleep between generations. Once started, each prints what vLLM holds beside
    the plan's budget (``engine_memory_line``)."""
    from models.vllm_engine import VLLMEngine

    alloc = plan.calls[Call.actor_gen]
    gen = sorted(alloc.devices)
    common = {
        **engine_kwargs,
        "tensor_parallel_size": alloc.tp,
        "pipeline_parallel_size": alloc.pp,
        **({"enable_sleep_mode": True} if lifecycle.engines_sleep else {}),
    }
    per_device = {d: {**common, **engine_memory_kwargs(lifecycle, d, on_gpu)} for d in gen}
    if alloc.tp * alloc.pp > 1:  # each replica's companions build one engine together, on a port of their own
        for pipe in replicas(alloc):
            master = pool.rendezvous(pipe.devices_in_order[0])  # the engine's rank 0 listens on its own node
            for i, d in enumerate(pipe.devices_in_order):
                per_device[d] = {**per_device[d], "rank": i, "master": master}
    pool.add_companions(ENGINE, gen, VLLMEngine, per_device.__getitem__)
    reports = pool.wait([pool.submit(d, "memory_report", companion=ENGINE, timed=False) for d in gen])
    for d, report in zip(gen, reports):
        print(engine_memory_line(d, report, lifecycle.engine_budget(d)), flush=True)


def _device_process_kwargs(
    plan: ExecutionPlan, pool: Any, recipes: Mapping[Role, tuple[type, dict[str, Any]]], common: dict[str, Any]
) -> Callable[[int], dict[str, Any]]:
    """Device -> its ``DeviceProcess`` arguments: the world's rendezvous (on the node of the first
    device, world rank 0), every process group the plan needs, and the shards of its roles with the
    grid or stages each is sharded over."""
    (master_addr, port), groups = pool.rendezvous(common["devices"][0]), mesh_groups(plan)

    def kwargs_of(device: int) -> dict[str, Any]:
        builders = {}
        for role in roles_on(plan, device):
            shard_cls, kwargs = recipes[role]
            builders[role] = (shard_cls, kwargs, grid_on(plan, role, device))
        return dict(
            device=device, master_addr=master_addr, master_port=port, groups=groups, builders=builders, **common
        )

    return kwargs_of


class PlanRuntime:
    """The driver's side: deploys a plan (``start``) and runs the calls of one PPO iteration.

    Every call goes through ``task``: it reads the shard method's ``Dispatch`` (``runtime.dispatch``) to
    split the input over the call's devices and gather their results, and the ``Scheduler`` starts it by
    readiness (``runtime.schedule``). Every call records an ``Event`` per device in ``events`` (the loop
    drains them each iteration).
    """

    def __init__(self, plan: ExecutionPlan, pool: Any, reward_actor: Any, ppo: Any, seed: int, engine_boxes: Holdings):
        self.plan, self.pool, self.ppo, self.seed = plan, pool, ppo, seed
        self.reward_actor = reward_actor  # the grader alone (no rew_inf): an actor that holds no device
        self.num_reward_calls = 0
        self.events: list[Event] = []
        self.gen_replicas = replicas(plan.calls[Call.actor_gen])
        self.engines_sleep = False
        self.residency_log: list[dict[str, Any]] = []
        """Per phase of each iteration, what every device held at its start (``snapshot``)."""
        self.scheduler = Scheduler(lambda parts: [f for _, _, f in parts], pool.wait_any)
        self.weight_sync = WeightSync(self, engine_boxes)

    @classmethod
    def start(
        cls,
        cluster: Any,
        plan: ExecutionPlan,
        *,
        backend: str,
        dtype: str,
        seed: int,
        ppo: Any,
        num_iterations: int,
        temperature: float,
        policy_dir: str,
        critic_dir: str,
        reward_cfg: Any,
        engine_kwargs: dict[str, Any],
        lifecycle: MemoryLifecycle,
        collective_timeout_s: float = 1800.0,
        algorithm: Any = None,
        loss_norm_tokens: int = 1,
    ) -> PlanRuntime:
        """Place one DeviceProcess per plan device (one placement group), build every model shard (in
        host memory, each putting only its own part on the device), then start the vLLM engines beside
        the generation devices within the budgets of the plan's memory ``lifecycle``, and the reward
        function."""
        from transformers import AutoConfig

        actor_spec = ModelSpec.from_hf_config(AutoConfig.from_pretrained(policy_dir))
        check_supported(plan, {"actor": actor_spec})
        devices = sorted({d for a in plan.calls.values() for d in a.devices})
        pool = cluster.device_pool(devices, plan.gpus_per_node)
        reward_kwargs = dict(reward_cfg=reward_cfg, tokenizer_dir=policy_dir)
        recipes = _recipes(
            plan,
            dict(dtype=dtype, seed=seed),
            dict(ppo=ppo, num_iterations=num_iterations),
            dict(
                policy_dir=policy_dir,
                critic_dir=critic_dir,
                temperature=temperature,
                algorithm=algorithm,
                loss_norm_tokens=loss_norm_tokens,
            ),
            {**reward_kwargs, "device": "cuda" if backend == "nccl" else "cpu", "dtype": dtype},
        )
        process = dict(devices=devices, backend=backend, dtype=dtype, collective_timeout_s=collective_timeout_s)
        kwargs_of = _device_process_kwargs(plan, pool, recipes, process)
        pool.build(DeviceProcess, kwargs_of)
        _start_engines(pool, plan, engine_kwargs, lifecycle, on_gpu=backend == "nccl")
        reward_actor = None
        if Call.rew_inf not in plan.calls:  # the grader alone: no model, no device
            reward_actor = cluster.group(RewardShard, 1, reward_kwargs, name="reward", distributed=False)
        runtime = cls(plan, pool, reward_actor, ppo, seed, engine_holdings(plan, actor_spec))
        runtime.engines_sleep = lifecycle.engines_sleep
        return runtime

    # -- dispatch ------------------------------------------------------------------------------

    def task(
        self,
        call: str,
        role: Role,
        method: Callable[..., Any],
        alloc: CallAllocation | None,
        *args: Any,
        after: tuple[Task, ...] = (),
        record: bool = True,
    ) -> Task:
        """A call of shard ``method`` on ``role``'s devices (``alloc``'s for inference and training),
        its input split as the method's ``Dispatch`` says (``Split``: the first of ``args`` is the data it
        splits) and its result gathered the same way; ``record``: its events go to the timeline.
        ``run``, or ``scheduler.add`` then ``scheduler.wait``, runs it."""
        how = dispatch_of(method)
        per_device, reporters = self._split(how.split, role, alloc, args)

        def start() -> list[Part]:
            return [
                (call, d, self.pool.submit(d, "call", role, method.__name__, *device_args))
                for d, device_args in per_device
            ]

        def finish(parts: list[Part]) -> Any:
            return _gathered(how.gather, self._collect(parts, record), reporters)

        return Task(call, frozenset(d for d, _ in per_device), start, finish, after)

    def run(self, *tasks: Task) -> list[Any]:
        """Add ``tasks`` (in priority order) and wait for them; their results."""
        for t in tasks:
            self.scheduler.add(t)
        return self.wait(*tasks)

    def wait(self, *tasks: Task) -> list[Any]:
        """``scheduler.wait``, with a dead process reported as ``WorkerLost`` naming the call it was in."""
        from runtime.placement import ActorLost

        try:
            return self.scheduler.wait(*tasks)
        except ActorLost as e:
            raise self.lost(e) from None

    def _wait_for(self, futures: list[Any], when: str) -> list[Any]:
        """``pool.wait`` outside a call (``when`` says where: a phase's start, a snapshot)."""
        from runtime.placement import ActorLost

        try:
            return self.pool.wait(futures)
        except ActorLost as e:
            raise self.lost(e, when) from None

    def lost(self, error: Any, when: str = "between calls") -> WorkerLost:
        """``error`` (``runtime.placement.ActorLost``) as one line: device, what it held, call(s), cause."""
        if error.device is None:  # Ray's memory monitor: no one device to name
            running = [t.call for t in self.scheduler.tasks if t.started and not t.done]
            during = f"during {', '.join(running)}" if running else when
            return WorkerLost(f"a worker of the run died {during}: {error.detail}")
        running = [t.call for t in self.scheduler.tasks if t.started and not t.done and error.device in t.devices]
        held: list[str] = [*roles_on(self.plan, error.device)]
        if error.device in self.plan.calls[Call.actor_gen].devices:
            held.append(ENGINE)
        who = error.companion or "device process"
        during = f"during {', '.join(running)}" if running else when
        return WorkerLost(f"device {error.device} ({who}; holds {', '.join(held)}) died {during}: {error.detail}")

    def _split(
        self, split: Split, role: Role, alloc: CallAllocation | None, args: tuple
    ) -> tuple[list[tuple[int, tuple]], list[int]]:
        """(device, its arguments) for every device of the call, and the devices whose results count
        (in order; ``Gather.first`` reads the first)."""
        if split == Split.broadcast:
            return [(d, args) for d in devices_of_role(self.plan, role)], [reporting_device(self.plan, role)]
        assert alloc is not None, f"{split} needs the call's allocation"
        data, args = args[0], args[1:]
        pipes = replicas(alloc)
        if split == Split.replica_rows:
            parts = split_rows(data, len(pipes))
            return [(d, (part, *args)) for pipe, part in zip(pipes, parts) for d in pipe.devices], [
                pipe.leader for pipe in pipes
            ]
        # Split.ppo_shares: data-parallel share i trains on row i of every stage (its tp devices on the same rows).
        shares, sizes = update_rows(
            num_rows(data), self.ppo.num_epochs, self.ppo.num_minibatches, len(pipes), update_seed(self.seed, *args)
        )
        num_micro = microbatches_per_minibatch(alloc.num_microbatches, self.ppo.num_minibatches, sizes)
        per_device = [
            (d, (select(data, shares[i]), sizes[i], num_micro)) for i, pipe in enumerate(pipes) for d in pipe.devices
        ]
        return per_device, [per_device[0][0]]

    def _collect(self, parts: list[Part], record: bool = True) -> dict[tuple[str, int], Any]:
        """Wait for started ``parts``, record their events, and return their results by (call, device)."""
        out = {}
        for (call, device, _), (value, start, end) in zip(parts, self.pool.wait([f for _, _, f in parts])):
            if record:
                self.events.append(Event(call, device, start, end))
            out[call, device] = value
        return out

    def drain_events(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    # -- the calls of an iteration -------------------------------------------------------------

    def generate(self, ids: list[list[int]], **sampling: Any) -> list[list[Any]]:
        """actor_gen: the engine replicas split the prompts (data-parallel generation); every rank
        of a replica (its stages and TP ranks) runs its requests, and only the replica's first device
        sends them back (vLLM's external_launcher gives every stage the sampled tokens)."""
        num = len(self.gen_replicas)
        firsts = [pipe.devices_in_order[0] for pipe in self.gen_replicas]

        def start() -> list[Part]:
            return [
                (
                    Call.actor_gen,
                    d,
                    self.pool.submit(
                        d, "generate", ids[i::num], report=d == firsts[i], companion=ENGINE, **replica_seed(sampling, i)
                    ),
                )
                for i, pipe in enumerate(self.gen_replicas)
                for d in pipe.devices
            ]

        def finish(parts: list[Part]) -> list[list[Any]]:
            outs = self._collect(parts)
            merged: list = [None] * len(ids)
            for i, first in enumerate(firsts):
                merged[i::num] = outs[Call.actor_gen, first]
            return merged

        devices = frozenset(d for pipe in self.gen_replicas for d in pipe.devices)
        self.prepare(Phase.generate)
        (merged,) = self.run(Task(Call.actor_gen, devices, start, finish))
        return merged

    def infer(self, batch: Mapping[str, torch.Tensor], samples: list[Any], old_logprobs: bool = True) -> Scores:
        """rew_inf, actor_inf (the old logprobs on actor_train's layout; not with ``old_logprobs`` False), and
        ref_inf and critic_inf where the algorithm's graph has them, started by readiness: calls on disjoint
        devices run side by side."""
        self.prepare(Phase.infer)
        calls = self.plan.calls
        actor = calls[Call.actor_train] if old_logprobs else None
        critic_role = Role.critic_inf if critic_needs_realloc(self.plan) else Role.critic
        # (call name, role, shard method, allocation) of each model's inference in this plan
        inference: list[tuple[str, Role, Callable[..., Any], CallAllocation | None]] = [
            (Call.actor_inf, Role.actor, PolicyShard.compute_logprobs, actor),
            (Call.ref_inf, Role.ref, ReferenceShard.compute_logprobs, calls.get(Call.ref_inf)),
            (Call.critic_inf, critic_role, CriticShard.compute_values, calls.get(Call.critic_inf)),
        ]
        tasks = [
            self.task(call, role, method, alloc, batch, self._inference_microbatches(alloc, batch))
            for call, role, method, alloc in inference
            if alloc is not None
        ]
        reward, *results = self.run(self._reward_task(samples), *tasks)
        by_call = {t.call: r for t, r in zip(tasks, results)}
        self._share_reward_calibration()
        return Scores(
            reward=reward,
            old_logprobs=by_call.get(Call.actor_inf),
            ref_logprobs=by_call.get(Call.ref_inf),
            values=by_call.get(Call.critic_inf),
        )

    @staticmethod
    def _inference_microbatches(alloc: CallAllocation, batch: Mapping[str, torch.Tensor]) -> int:
        """The micro-batches every replica of an inference call cuts its rows into: the plan's, raised
        where shorter micro-batches compute on less padding (``ppo.batch.throughput_microbatches``), the
        most any replica's rows ask for. Decided here, from the whole batch, so that calls with the same
        layout (the old logprobs on actor_train's, the reference on ref_inf's) cut the same rows the same
        way: their forwards then match bit for bit, and KL is 0 before the first update."""
        from ppo.batch import throughput_microbatches

        parts = split_rows(batch, len(replicas(alloc)))
        return max(throughput_microbatches(part, alloc.num_microbatches) for part in parts)

    def start_training(self, batch: Mapping[str, torch.Tensor], iteration: int) -> Training:
        """actor_train, and critic_train when the algorithm has a critic, started by readiness (side by side on
        disjoint devices); ``finish_training`` waits for them."""
        self.prepare(Phase.train)
        calls = self.plan.calls
        actor = self.task(Call.actor_train, Role.actor, PolicyShard.update, calls[Call.actor_train], batch, iteration)
        critic = None
        if Call.critic_train in calls:
            critic = self.task(
                Call.critic_train, Role.critic, CriticShard.update, calls[Call.critic_train], batch, iteration
            )
        for t in (actor, critic):
            if t is not None:
                self.scheduler.add(t)
        return Training(actor, critic)

    def finish_training(self, training: Training) -> tuple[dict[str, float], dict[str, float]]:
        """(actor stats, critic stats: {} without a critic) of ``start_training``'s calls."""
        if training.critic is None:
            (actor,) = self.wait(training.actor)
            return actor, {}
        actor, critic = self.wait(training.actor, training.critic)
        return actor, critic

    def _reward_task(self, samples: list[Any]) -> Task:
        """rew_inf: the reward replicas each score a contiguous slice of the samples (merged), or the
        grader-only reward actor (device -1: it holds no device).

        The first call goes to the first replica alone, whole, so that a Clip threshold (and the
        control's alpha) calibrated on the first rollouts is calibrated on all of them;
        ``_share_reward_calibration`` then hands it to the others."""
        self.num_reward_calls += 1
        if self.reward_actor is None:
            alloc = self.plan.calls[Call.rew_inf]
            if self.num_reward_calls == 1:
                first = replicas(alloc)[0]
                alloc = CallAllocation(first.devices, pp=alloc.pp, dp=1, tp=alloc.tp)
            return self.task(Call.rew_inf, Role.reward, RewardShard.score, alloc, samples)
        actor = self.reward_actor

        def start() -> list[Part]:
            return [("reward", -1, f) for f in actor.submit_timed("score", samples)]

        return Task("reward", frozenset(), start, lambda parts: self._collect(parts)["reward", -1])

    def _share_reward_calibration(self) -> None:
        """After the first reward call: every replica uses the first replica's calibration (eta, alpha)."""
        if self.reward_actor is None and self.num_reward_calls == 1 and len(reward_replicas(self.plan)) > 1:
            self.on_reward(RewardShard.set_calibration, self.on_reward(RewardShard.calibration))

    # -- whole-model operations ----------------------------------------------------------------

    def on_role(self, role: Role, method: Callable[..., Any], *args: Any) -> Any:
        """``method`` on every device holding ``role`` (collective calls such as checkpoints; they are
        not part of an iteration's timeline)."""
        (result,) = self.run(self.task(f"{role}.{method.__name__}", role, method, None, *args, record=False))
        return result

    def on_reward(self, method: Callable[..., Any], *args: Any) -> Any:
        """``method`` on every reward device; the first replica's reporting device's result."""
        if self.reward_actor is not None:
            return self.reward_actor.call(method.__name__, *args)[0]
        return self.on_role(Role.reward, method, *args)

    def prepare(self, phase: Phase) -> None:
        """Bring the engines to what ``phase`` needs (the lifecycle's rule: awake to generate, asleep
        while other calls use their devices; the weight sync wakes their weights itself), then note what
        every device holds (``residency_log``)."""
        if self.engines_sleep:
            self._on_engines("wake_kv_cache" if phase == Phase.generate else "sleep")
        self.snapshot(phase)

    def sleep_engines(self) -> None:
        """Engines give their memory back now (before a checkpoint loads into the shards beside them;
        the next weight sync wakes and reloads them)."""
        if self.engines_sleep:
            self._on_engines("sleep")

    def snapshot(self, phase: Phase) -> None:
        """Append what every device holds now ("owner/kind" -> "device" | "host", engines included)."""
        devices = self.pool.devices
        gen = self.plan.calls[Call.actor_gen].devices
        when = f"at the start of the {phase} phase"
        held = self._wait_for([self.pool.submit(d, "residency", timed=False) for d in devices], when)
        asked = [self.pool.submit(d, "residency", timed=False, companion=ENGINE) for d in gen]
        engines = dict(zip(gen, self._wait_for(asked, when)))
        for d, h in zip(devices, held):
            engine = {f"engine/{kind}": where for kind, where in engines.get(d, {}).items()}
            self.residency_log.append({"phase": str(phase), "device": d, "held": {**h, **engine}})

    def _on_engines(self, method: str, *args: Any) -> None:
        gen = self.plan.calls[Call.actor_gen].devices
        self._wait_for([self.pool.submit(d, method, *args, companion=ENGINE) for d in gen], f"in the engines' {method}")

    def placement(self) -> dict[str, Any]:
        """Where every device process sits (reported from inside it) and what it hosts."""
        where = self.pool.where()
        gen = self.plan.calls[Call.actor_gen].devices
        return {
            str(d): {**where[d], "roles": [*roles_on(self.plan, d), *([ENGINE] if d in gen else [])]}
            for d in self.pool.devices
        }

    def shutdown(self) -> None:
        self.pool.shutdown()


class WeightSync:
    """Moves trained weights to where the next iteration's calls need them: the one entry of
    ``reallocation.sync`` the runtime uses (``DeviceProcess.reallocate``). Every iteration::

        sync = weight_sync.start(after=training)   # each model's move waits for its own training only
        ...                                        # (the actor's weights go while the critic still trains)
        metrics = weight_sync.finish(sync)         # bytes moved and the lower bound, per model

    The actor's training shards go to the vLLM engine ranks (each destination device hands its boxes to
    the engine beside it, ``VLLMEngine.load_shards``, and frees them once it has loaded them,
    ``DeviceProcess.handoff_done``); the critic's go to its inference replicas when the
    plan gives critic inference a layout of its own. ``run`` does both steps at once (on resume).
    """

    def __init__(self, runtime: PlanRuntime, engine_boxes: Holdings):
        self.runtime, self.engine_boxes = runtime, engine_boxes

    def start(self, after: Training | None = None) -> list[Task]:
        calls, rt = self.runtime.plan.calls, self.runtime
        tasks = [
            self._task(Role.actor, calls[Call.actor_train], calls[Call.actor_gen], (after.actor,) if after else ())
        ]
        if critic_needs_realloc(rt.plan):
            tasks.append(
                self._task(
                    Role.critic,
                    calls[Call.critic_train],
                    calls[Call.critic_inf],
                    (after.critic,) if after and after.critic else (),
                )
            )
        for t in tasks:
            rt.scheduler.add(t)
        return tasks

    def run(self) -> dict[str, float]:
        return self.finish(self.start())

    def finish(self, tasks: list[Task]) -> dict[str, float]:
        out: dict[str, float] = {}
        for metrics in self.runtime.wait(*tasks):
            out.update(metrics)
        self.runtime.snapshot(Phase.reallocate)
        return out

    def _task(self, role: Role, src: CallAllocation, dst: CallAllocation, after: tuple[Task, ...]) -> Task:
        """``role``'s reallocation from ``src``'s layout to ``dst``'s devices, over the union of both;
        to the engines for the actor, to ``critic_inf``'s own shards for the critic."""
        pool, call = self.runtime.pool, f"realloc_{role}"
        union = sorted(set(src.devices) | set(dst.devices))
        to_engine = role == Role.actor
        dst_role, boxes = (ENGINE, self.engine_boxes) if to_engine else (Role.critic_inf, None)

        def start() -> list[Part]:
            parts: list[Part] = []
            if to_engine:  # the engines' weights come back just before they are loaded (queued first)
                parts += [(f"{call}_wake", d, pool.submit(d, "wake_weights", companion=ENGINE)) for d in dst.devices]
            for d in union:
                weights, info = pool.submit(
                    d, "reallocate", role, dst_role, src.devices, dst.devices, boxes, timed=False, num_returns=2
                )
                parts.append((call, d, info))
                if to_engine and d in dst.devices:
                    loaded = pool.submit(d, "load_shards", weights, companion=ENGINE)
                    # The handed-over shards are freed once loaded (the load's result, as an argument, orders
                    # this after it without a round trip through the driver).
                    parts += [
                        (f"{call}_load", d, loaded),
                        (f"{call}_handoff", d, pool.submit(d, "handoff_done", loaded)),
                    ]
            return parts

        def finish(parts: list[Part]) -> dict[str, float]:
            results = self.runtime._collect(parts)
            counts = [v for (c, _), v in results.items() if c == call]
            for (c, d), v in results.items():  # the transient buffers each device held at the move's fullest
                if c == call:
                    self.runtime.residency_log.append(
                        {"phase": "reallocate", "call": call, "device": d, "held": v["held"]}
                    )
            return {
                f"realloc/{role}/bytes_moved": float(sum(c["bytes_received"] for c in counts)),
                f"realloc/{role}/lower_bound_bytes": float(counts[0]["lower_bound"]),
            }

        return Task(call, frozenset(union), start, finish, after)


def _gathered(gather: Gather, values: dict[tuple[str, int], Any], reporters: list[int]) -> Any:
    """One call's result from its devices' results (``values``: by (call, device)) as ``gather`` says."""
    by_device = {device: v for (_, device), v in values.items()}
    if gather == Gather.concat:
        return torch.cat([by_device[d] for d in reporters], dim=0)
    if gather == Gather.merge_rewards:
        return merge_reward_batches([by_device[d] for d in reporters])
    if gather == Gather.first:
        return by_device[reporters[0]]
    return None


def replica_seed(sampling: Mapping[str, Any], replica: int) -> dict[str, Any]:
    """``sampling`` with the seed of generation replica ``replica``: each replica's sampler draws its own
    numbers (one seed per call and engine; the ranks of one replica share it)."""
    seed = sampling.get("seed")
    if seed is None or sampling.get("seed_per_prompt"):  # prompts seed their own requests
        return dict(sampling)
    return {**sampling, "seed": (seed * 1_000_003 + replica) % (1 << 63)}


def split_rows(data: Any, num_parts: int) -> list[Any]:
    """Near-equal contiguous row slices of ``data`` (a dict of [rows, ...] tensors, or a list), in order."""
    if isinstance(data, Mapping):
        rows = next(iter(data.values())).shape[0]
    else:
        rows = len(data)
    if rows < num_parts:
        raise ValueError(f"a batch of {rows} rows cannot feed {num_parts} data-parallel devices")
    bounds = [(int(b[0]), int(b[-1]) + 1) if len(b) else (0, 0) for b in torch.arange(rows).tensor_split(num_parts)]
    if isinstance(data, Mapping):
        return [{k: v[lo:hi] for k, v in data.items()} for lo, hi in bounds]
    return [data[lo:hi] for lo, hi in bounds]
