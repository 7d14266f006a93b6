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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from planning.execution_plan import CallAllocation, ExecutionPlan
from ppo.batch import microbatches_per_minibatch
from reallocation.layout import Holdings, ModelSpec
from rewards.types import merge_reward_batches
from runtime.device.process import DeviceProcess
from runtime.device.reward import RewardShard
from runtime.topology import (
    ACTOR_INF,
    check_supported,
    critic_needs_realloc,
    engine_holdings,
    grid_on,
    mesh_groups,
    replicas,
    reward_replicas,
    roles_on,
)


@dataclass(frozen=True)
class Event:
    """One call on one device: wall-clock start and end (seconds since the epoch)."""

    call: str
    device: int
    start: float
    end: float


def _recipes(
    plan: ExecutionPlan, common: dict[str, Any], train: dict[str, Any], dirs: dict[str, Any], reward: dict[str, Any]
) -> dict[str, tuple[type, dict[str, Any]]]:
    """Role -> (worker class, constructor kwargs); ``DeviceProcess`` adds the ranks of its grid."""
    from runtime.device.shards import CriticShard, PolicyShard, ReferenceShard

    calls, train = plan.calls, {**train, **common}
    return {
        "actor": (
            PolicyShard,
            dict(
                model_dir=dirs["policy_dir"],
                temperature=dirs["temperature"],
                activation_checkpointing=calls["actor_train"].activation_checkpointing,
                **train,
            ),
        ),
        "critic": (
            CriticShard,
            dict(
                model_dir=dirs["critic_dir"],
                activation_checkpointing=calls["critic_train"].activation_checkpointing,
                **train,
            ),
        ),
        "critic_inf": (CriticShard, dict(model_dir=dirs["critic_dir"], **train)),
        "ref": (
            ReferenceShard,
            dict(
                model_dir=dirs["policy_dir"],
                temperature=dirs["temperature"],
                offload=calls["ref_inf"].offload,
                **common,
            ),
        ),
        "reward": (
            RewardShard,
            {
                **reward,
                "num_microbatches": calls["rew_inf"].num_microbatches if "rew_inf" in calls else 1,
                "offload": "rew_inf" in calls and calls["rew_inf"].offload,
            },
        ),
    }


def _start_engines(pool: Any, plan: ExecutionPlan, backend: str, engine_kwargs: dict[str, Any]) -> bool:
    """One vLLM engine rank beside each generation device (a replica's pp stages of tp devices are
    one engine); returns whether they sleep between calls (GPU only: on GPUs that other calls use,
    vLLM gives its memory back to training)."""
    from models.vllm_engine import VLLMEngine

    alloc = plan.calls["actor_gen"]
    gen = set(alloc.devices)
    if backend != "nccl":  # CPU: the engines share the 1 GiB KV cache one engine would have had
        engine_kwargs = {**engine_kwargs, "kv_cache_gib": max(0.25, 1.0 / len(gen))}
    others = {d for c, a in plan.calls.items() if c != "actor_gen" for d in a.devices}
    sleeps = backend == "nccl" and bool(gen & others)
    common = {
        **engine_kwargs,
        "tensor_parallel_size": alloc.tp,
        "pipeline_parallel_size": alloc.pp,
        **({"enable_sleep_mode": True} if sleeps else {}),
    }
    per_device = {d: common for d in gen}
    if alloc.tp * alloc.pp > 1:  # each replica's companions build one engine together, on a port of their own
        for pipe in replicas(alloc):
            master = pool.rendezvous(pipe.devices_in_order[0])  # the engine's rank 0 listens on its own node
            per_device.update({d: {**common, "rank": i, "master": master} for i, d in enumerate(pipe.devices_in_order)})
    pool.add_companions("engine", sorted(gen), VLLMEngine, per_device.__getitem__)
    return sleeps


class PlanRuntime:
    """The driver's side: deploys a plan (``start``) and runs the calls of one PPO iteration.

    Every call records an ``Event`` per device in ``events`` (the loop drains them each iteration).
    """

    def __init__(
        self, plan: ExecutionPlan, pool: Any, reward: tuple[str, Any], ppo: Any, seed: int, engine_boxes: Holdings
    ):
        self.plan, self.pool, self.ppo, self.seed = plan, pool, ppo, seed
        self._reward_where, self._reward = reward
        self._reward_calls = 0
        self.events: list[Event] = []
        self.gen_devices = list(plan.calls["actor_gen"].devices)
        self.gen_replicas = replicas(plan.calls["actor_gen"])
        self.engine_boxes = engine_boxes
        self.engines_sleep = False

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
    ) -> PlanRuntime:
        """Place one DeviceProcess per plan device (one placement group), build every model shard,
        start the vLLM engines beside the generation devices and the reward function."""
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
            dict(policy_dir=policy_dir, critic_dir=critic_dir, temperature=temperature),
            {**reward_kwargs, "device": "cuda" if backend == "nccl" else "cpu"},
        )
        (master_addr, port), groups = pool.rendezvous(devices[0]), mesh_groups(plan)  # devices[0] is rank 0

        def kwargs_of(device: int) -> dict[str, Any]:
            builders = {}
            for role in roles_on(plan, device):
                worker_cls, kwargs = recipes[role]
                builders[role] = (worker_cls, kwargs, grid_on(plan, role, device))
            return dict(
                device=device,
                devices=devices,
                master_addr=master_addr,
                master_port=port,
                backend=backend,
                groups=groups,
                dtype=dtype,
                builders=builders,
            )

        pool.build(DeviceProcess, kwargs_of)
        sleeps = _start_engines(pool, plan, backend, engine_kwargs)
        if "rew_inf" in plan.calls:
            reward: tuple[str, Any] = ("device", reward_replicas(plan))
        else:  # the grader alone: no model, no device
            reward = ("actor", cluster.group(RewardShard, 1, reward_kwargs, name="reward", distributed=False))
        runtime = cls(plan, pool, reward, ppo, seed, engine_holdings(plan, actor_spec))
        runtime.engines_sleep = sleeps
        return runtime

    # -- bookkeeping ---------------------------------------------------------------------------

    def _gather(self, call: str, devices: Sequence[int], futures: Sequence[Any]) -> list[Any]:
        from runtime.placement import wait

        out = []
        for device, (value, start, end) in zip(devices, wait(futures)):
            self.events.append(Event(call, device, start, end))
            out.append(value)
        return out

    def drain_events(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    # -- calls ---------------------------------------------------------------------------------

    def generate(self, ids: list[list[int]], **sampling: Any) -> list[list[Any]]:
        """actor_gen: the engine replicas split the prompts (data-parallel generation); every rank
        of a replica (its stages and TP ranks) runs its requests, and only the replica's first device
        sends them back (vLLM's external_launcher gives every stage the sampled tokens)."""
        from runtime.placement import wait

        num = len(self.gen_replicas)
        chunks = [ids[i::num] for i in range(num)]
        firsts = [pipe.devices_in_order[0] for pipe in self.gen_replicas]
        devices = [d for pipe in self.gen_replicas for d in pipe.devices]
        futures = [
            self.pool.submit_companion("engine", d, "generate", chunk, report=d == first, **sampling)
            for pipe, first, chunk in zip(self.gen_replicas, firsts, chunks)
            for d in pipe.devices
        ]
        outs = dict(zip(devices, self._gather("actor_gen", devices, futures)))
        if self.engines_sleep:  # GPU only: give the memory back to training until the next call
            wait([self.pool.submit_companion("engine", d, "sleep") for d in self.gen_devices])
        merged: list = [None] * len(ids)
        for i, first in enumerate(firsts):
            merged[i::num] = outs[first]
        return merged

    def submit_reward(self, samples: list[Any]) -> tuple[str, list[int], list[Any], list[int]]:
        """rew_inf: the reward replicas each score a contiguous slice of the samples (merged by
        ``merge_reward_batches``), or the grader-only reward actor (device -1: it holds no device).

        The first call goes to the first replica alone, whole, so that a Clip threshold calibrated on the
        first rollouts is calibrated on all of them; ``share_reward_state`` then hands it to the others.
        """
        self._reward_calls += 1
        if self._reward_where == "device":
            pipes = self._reward if self._reward_calls > 1 else self._reward[:1]
            bounds = torch.arange(len(samples)).tensor_split(len(pipes))
            slices = [samples[int(b[0]) : int(b[-1]) + 1] if len(b) else [] for b in bounds]
            # Every device of a replica gets its slice: a sharded reward model's forward is collective.
            devices = [d for pipe in pipes for d in pipe.devices]
            futures = [
                self.pool.submit(d, "call", "reward", "score", part)
                for pipe, part in zip(pipes, slices)
                for d in pipe.devices
            ]
            return "rew_inf", devices, futures, [pipe.leader for pipe in pipes]
        return "reward", [-1], self._reward.submit_timed("score", samples), [-1]

    def share_reward_state(self) -> None:
        """After the first reward call: every replica uses the first replica's calibration (eta, alpha)."""
        if self._reward_where != "device" or self._reward_calls != 1 or len(self._reward) == 1:
            return
        self.on_reward("set_calibration", self.on_reward("calibration"))

    def _data_parallel(self, call: str, role: str, method: str, alloc: CallAllocation, batch: Mapping[str, Any]):
        """Submit ``method`` on each device of ``alloc`` with its replica's row slice of ``batch``
        (every device of a replica, all its stages and tp ranks, gets the same slice); each
        replica's last stage's first device reports."""
        pipes = replicas(alloc)
        parts = _row_slices(batch, len(pipes))
        devices = [d for pipe in pipes for d in pipe.devices]
        futures = [
            self.pool.submit(d, "call", role, method, part, alloc.num_microbatches)
            for pipe, part in zip(pipes, parts)
            for d in pipe.devices
        ]
        return call, devices, futures, [pipe.leader for pipe in pipes]

    def infer(self, batch: Mapping[str, torch.Tensor], samples: list[Any]) -> dict[str, Any]:
        """Reward, old logprobs (actor_train's devices), reference logprobs and values, all submitted
        at once: calls on disjoint meshes run concurrently."""
        calls = self.plan.calls
        critic_role = "critic_inf" if critic_needs_realloc(self.plan) else "critic"
        pending = {
            "reward": self.submit_reward(samples),
            "old_logprobs": self._data_parallel(ACTOR_INF, "actor", "compute_logprobs", calls["actor_train"], batch),
            "ref_logprobs": self._data_parallel("ref_inf", "ref", "compute_logprobs", calls["ref_inf"], batch),
            "values": self._data_parallel("critic_inf", critic_role, "compute_values", calls["critic_inf"], batch),
        }
        out: dict[str, Any] = {}
        for key, (call, devices, futures, keep) in pending.items():
            parts = dict(zip(devices, self._gather(call, devices, futures)))
            if key == "reward":
                out[key] = merge_reward_batches([parts[d] for d in keep])
            else:
                out[key] = torch.cat([parts[d] for d in keep], dim=0)
        self.share_reward_state()
        return out

    def update(self, batch: Mapping[str, torch.Tensor], iteration: int) -> tuple[dict, dict, dict[str, float]]:
        """actor_train and critic_train (concurrent on disjoint meshes), then the reallocations that
        the next iteration's calls need. Returns (actor stats, critic stats, reallocation metrics)."""
        calls = self.plan.calls
        pending = [
            self._submit_update("actor_train", "actor", calls["actor_train"], batch, iteration),
            self._submit_update("critic_train", "critic", calls["critic_train"], batch, iteration),
        ]
        realloc = [self._submit_realloc("actor", calls["actor_train"], calls["actor_gen"], to_engine=True)]
        if critic_needs_realloc(self.plan):
            realloc.append(self._submit_realloc("critic", calls["critic_train"], calls["critic_inf"]))
        actor_stats, critic_stats = (self._gather(*p)[0] for p in pending)
        metrics: dict[str, float] = {}
        for name, gathered in realloc:
            metrics.update(self._finish_realloc(name, *gathered))
        return actor_stats, critic_stats, metrics

    def _submit_update(
        self, call: str, role: str, alloc: CallAllocation, batch: Mapping[str, torch.Tensor], iteration: int
    ):
        from ppo.batch import num_rows, select, update_rows, update_seed

        # Data-parallel share i goes to row i of every stage (its tp devices train on the same rows).
        shards = [pipe.devices for pipe in replicas(alloc)]
        shares, sizes = update_rows(
            num_rows(batch),
            self.ppo.num_epochs,
            self.ppo.num_minibatches,
            len(shards),
            update_seed(self.seed, iteration),
        )
        num_micro = microbatches_per_minibatch(alloc.num_microbatches, self.ppo.num_minibatches, sizes)
        devices = [d for shard in shards for d in shard]
        futures = [
            self.pool.submit(d, "call", role, "update", select(batch, shares[i]), sizes[i], num_micro)
            for i, shard in enumerate(shards)
            for d in shard
        ]
        return call, devices, futures

    def _submit_realloc(self, role: str, src: CallAllocation, dst: CallAllocation, *, to_engine: bool = False):
        """Start ``role``'s reallocation from ``src``'s layout to replicas on ``dst``'s devices; with
        ``to_engine`` each destination passes its boxes straight to the engine rank beside it."""
        union = sorted(set(src.devices) | set(dst.devices))
        dst_role, boxes = ("engine", self.engine_boxes) if to_engine else (f"{role}_inf", None)
        infos, loads = [], []
        for d in union:
            weights, info = self.pool.submit_split(d, "reallocate", role, dst_role, src.devices, dst.devices, boxes)
            infos.append(info)
            if to_engine and d in dst.devices:
                loads.append((d, self.pool.submit_companion_with("engine", d, "load_shards", weights)))
        return role, (union, infos, loads)

    def _finish_realloc(self, role: str, union: list[int], infos: list[Any], loads: list[Any]) -> dict[str, float]:
        from runtime.placement import wait

        call = f"realloc_{role}"
        counts = []
        for device, (count, start, end) in zip(union, wait(infos)):
            self.events.append(Event(call, device, start, end))
            counts.append(count)
        for device, (_, start, end) in zip([d for d, _ in loads], wait([f for _, f in loads])):
            self.events.append(Event(f"{call}_load", device, start, end))
        moved = sum(c["bytes_received"] for c in counts)
        return {
            f"realloc/{role}/bytes_moved": float(moved),
            f"realloc/{role}/lower_bound_bytes": float(counts[0]["lower_bound"]),
        }

    # -- whole-model operations ----------------------------------------------------------------

    def on_role(self, role: str, method: str, *args: Any) -> list[Any]:
        """``method`` on every device holding ``role`` (collective calls such as checkpoints)."""
        from runtime.placement import wait

        devices = [d for d in self.pool.devices if role in roles_on(self.plan, d)]
        return [v for v, _, _ in wait([self.pool.submit(d, "call", role, method, *args) for d in devices])]

    def on_reward(self, method: str, *args: Any) -> Any:
        """``method`` on every reward device; the first replica's reporting device's result."""
        if self._reward_where == "device":
            devices = [d for d in self.pool.devices if "reward" in roles_on(self.plan, d)]
            results = dict(zip(devices, self.on_role("reward", method, *args)))
            return results[self._reward[0].leader]
        return self._reward.call(method, *args)[0]

    def sync_engines(self) -> dict[str, float]:
        """Reallocate the actor's (and critic's) training weights to where the calls need them."""
        calls = self.plan.calls
        out: dict[str, float] = {}
        role, gathered = self._submit_realloc("actor", calls["actor_train"], calls["actor_gen"], to_engine=True)
        out.update(self._finish_realloc(role, *gathered))
        if critic_needs_realloc(self.plan):
            role, gathered = self._submit_realloc("critic", calls["critic_train"], calls["critic_inf"])
            out.update(self._finish_realloc(role, *gathered))
        return out

    def placement(self) -> dict[str, Any]:
        """Where every device worker sits (reported from inside it) and what it hosts."""
        where = self.pool.where()
        return {
            str(d): {**where[d], "roles": roles_on(self.plan, d) + (["engine"] if d in self.gen_devices else [])}
            for d in self.pool.devices
        }

    def shutdown(self) -> None:
        self.pool.shutdown()


def _row_slices(batch: Mapping[str, torch.Tensor], num_parts: int) -> list[dict[str, torch.Tensor]]:
    """Near-equal row slices of a batch, one per data-parallel rank, in order."""
    num_rows = next(iter(batch.values())).shape[0]
    if num_rows < num_parts:
        raise ValueError(f"a batch of {num_rows} rows cannot feed {num_parts} data-parallel devices")
    bounds = torch.arange(num_rows).tensor_split(num_parts)
    return [{k: v[int(b[0]) : int(b[-1]) + 1] for k, v in batch.items()} for b in bounds]
