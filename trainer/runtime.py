"""The plan runtime: deploys an ``ExecutionPlan`` on Ray and runs one PPO iteration's calls on it.

Deployment (``PlanRuntime.start``)::

    one placement group, one bundle per plan device         reallocation.ray_workers.DevicePool
    one DeviceWorker process per device, hosting every model shard the plan puts there:
        "actor"      PolicyWorker, FSDP over actor_train's devices (also computes the old logprobs)
        "critic"     CriticWorker, FSDP over critic_train's devices (also critic_inf when the plan
                     gives critic_inf the same devices: FSDP forward = data-parallel inference)
        "critic_inf" CriticWorker replica per critic_inf device, when critic_inf has devices of its own
        "ref"        RefWorker replica per ref_inf device (data-parallel inference)
        "reward"     the reward function with its reward model, on rew_inf's first device
    one vLLM engine per actor_gen device, a companion process in the same bundle (vLLM builds its
    own torch.distributed world, so it cannot live inside the device worker's)

All device workers form one torch.distributed world (rank = index in the sorted device list) with
one process group per device mesh the plan needs. Calls go to the devices of their mesh; a device
worker runs one call at a time, in submission order, so calls on disjoint meshes run at the same
time and calls on overlapping meshes queue. Reallocation (``reallocate``) moves a model between two
of its layouts with ``reallocation.sync``'s planned resharding over the union of both meshes: each
destination device receives exactly the bytes it does not hold (the lower bound). Each call reports
its start and end per device (``Event``) for the metrics and the timeline picture.

Supported layouts: dp only (FSDP for training, replicas for inference and generation); a plan with
tp > 1 or pp > 1 is rejected at start naming the call.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from reallocation.execution_plan import CallAllocation, ExecutionPlan

# Runtime steps that the plan does not name: old logprobs run on actor_train's devices.
ACTOR_INF = "actor_inf"


class UnsupportedPlan(ValueError):
    """A plan the runtime cannot run (named call and field)."""


@dataclass(frozen=True)
class Event:
    """One call on one device: wall-clock start and end (seconds since the epoch)."""

    call: str
    device: int
    start: float
    end: float


def check_supported(plan: ExecutionPlan) -> None:
    """Reject layouts the runtime does not run yet, naming the call and field."""
    for name, alloc in plan.calls.items():
        for knob in ("tp", "pp"):
            if getattr(alloc, knob) != 1:
                raise UnsupportedPlan(
                    f"{plan.origin or 'plan'}: calls.{name}.{knob}={getattr(alloc, knob)}: the plan "
                    "runtime runs dp layouts only (FSDP training, replicated inference/generation)"
                )


def mesh_groups(plan: ExecutionPlan) -> list[tuple[int, ...]]:
    """Every device set that needs a process group, sorted: training meshes and reallocation unions."""
    calls = plan.calls
    groups = {
        tuple(sorted(calls["actor_train"].devices)),
        tuple(sorted(calls["critic_train"].devices)),
        _union(calls["actor_train"], calls["actor_gen"]),
    }
    if critic_needs_realloc(plan):
        groups.add(_union(calls["critic_train"], calls["critic_inf"]))
    return sorted(groups)


def critic_needs_realloc(plan: ExecutionPlan) -> bool:
    return sorted(plan.calls["critic_inf"].devices) != sorted(plan.calls["critic_train"].devices)


def _union(a: CallAllocation, b: CallAllocation) -> tuple[int, ...]:
    return tuple(sorted(set(a.devices) | set(b.devices)))


def roles_on(plan: ExecutionPlan, device: int) -> list[str]:
    """The model shards ``device`` hosts (its DeviceWorker builds them in this order)."""
    calls = plan.calls
    roles = []
    if device in calls["actor_train"].devices:
        roles.append("actor")
    if device in calls["critic_train"].devices:
        roles.append("critic")
    if critic_needs_realloc(plan) and device in calls["critic_inf"].devices:
        roles.append("critic_inf")
    if device in calls["ref_inf"].devices:
        roles.append("ref")
    if "rew_inf" in calls and device == calls["rew_inf"].devices[0]:
        roles.append("reward")
    return roles


class RewardWorker:
    """Holds the reward function (grader pool, ORM/PRM) next to its models; ``device``: where the
    reward model computes (the rew_inf device's GPU, or CPU)."""

    def __init__(self, reward_cfg, tokenizer_dir: str, device: str = "cpu"):
        from transformers import AutoTokenizer

        from rewards.build import build_reward_fn

        self.fn: Any = build_reward_fn(reward_cfg, AutoTokenizer.from_pretrained(tokenizer_dir), device)

    def score(self, samples):
        return self.fn(samples)

    def set_eta(self, eta: float) -> None:
        self.fn.set_eta(eta)


class DeviceWorker:
    """Everything one device holds (no Ray here: ``reallocation.ray_workers`` hosts it).

    Joins the world of all device workers, creates the process group of every mesh in ``groups``
    (all workers, same order: ``new_group`` is collective), then builds the workers of its roles.
    """

    def __init__(
        self,
        device: int,
        devices: Sequence[int],
        master_addr: str,
        master_port: int,
        backend: str,
        groups: Sequence[tuple[int, ...]],
        dtype: str,
        builders: Mapping[str, tuple[type, dict, tuple[int, ...] | None]],
    ):
        import torch.distributed as dist

        from trainer.workers import Ranks

        self.device, self.devices = device, tuple(devices)
        self.rank_of = {d: i for i, d in enumerate(self.devices)}
        dist.init_process_group(
            backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=self.rank_of[device],
            world_size=len(self.devices),
        )
        self.groups = {g: dist.new_group([self.rank_of[d] for d in g]) for g in groups}
        self.backend, self.dtype = backend, dtype
        self.workers: dict[str, Any] = {}
        for role, (cls, kwargs, mesh) in builders.items():
            if mesh is None:  # not a sharded model (the reward function)
                self.workers[role] = cls(**kwargs)
                continue
            group = self.groups[tuple(sorted(mesh))] if len(mesh) > 1 else None
            self.workers[role] = cls(Ranks(group, dtype, backend), **kwargs)

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.workers[role], method)(*args, **kwargs)

    def reallocate(
        self, src_role: str, dst_role: str, src_devices: Sequence[int], dst_devices: Sequence[int], to_engine: bool
    ) -> tuple[Any, tuple[dict[str, int], float, float]]:
        """Move ``src_role``'s training shards to full replicas on ``dst_devices`` (collective over
        the union of both meshes). A destination keeps what it already holds and receives the rest.

        Returns (weights for the engine or None, ({bytes_received, bytes_sent, lower_bound}, start, end)).
        With ``to_engine`` a destination returns its (HF name, tensor) pairs for the vLLM engine beside
        it; otherwise it copies them into its ``dst_role`` worker's parameters.
        """
        from reallocation.layout import full_box
        from reallocation.plan import lower_bound_bytes
        from reallocation.reshard import ReshardStats
        from reallocation.sync import clean_name, iter_plan_weights, plan_sync, source_shards

        start = time.time()
        group = self.groups[tuple(sorted(set(src_devices) | set(dst_devices)))]
        src_worker = self.workers.get(src_role) if self.device in src_devices else None
        src = source_shards(src_worker.model if src_worker is not None else {}, group)
        dst = {name: {self.rank_of[d]: full_box(shape) for d in dst_devices} for name, shape in src.shapes.items()}
        plan = plan_sync(src, dst)
        # The engine computes in the run's dtype; a critic replica keeps the exact training weights.
        wire = {n: (self.workers_dtype() if to_engine else src.dtypes[n]) for n in src.shapes}
        stats = ReshardStats()
        pairs = iter_plan_weights(plan, src.tensors, dtype=wire, group=group, stats=stats)
        weights = None
        if self.device not in dst_devices:
            for _ in pairs:
                pass
        elif to_engine:
            weights = [(name, tensor.cpu()) for name, tensor in pairs]
        else:
            params = {clean_name(n): p for n, p in self.workers[dst_role].model.named_parameters()}
            with torch.no_grad():
                for name, tensor in pairs:
                    params[name].copy_(tensor)
        itemsizes = {n: wire[n].itemsize for n in wire}
        counts = {
            "bytes_received": stats.bytes_received,
            "bytes_sent": stats.bytes_sent,
            "lower_bound": lower_bound_bytes(src.holdings, dst, src.shapes, itemsizes),
        }
        return weights, (counts, start, time.time())

    def workers_dtype(self) -> torch.dtype:
        from trainer.workers import _DTYPES

        return _DTYPES[self.dtype]

    def ready(self) -> dict[str, Any]:
        return {"device": self.device, "roles": sorted(self.workers), "pid": os.getpid()}


class PlanRuntime:
    """The driver's side: deploys a plan (``start``) and runs the calls of one PPO iteration.

    Every call records an ``Event`` per device in ``events`` (the loop drains them each iteration).
    """

    def __init__(self, plan: ExecutionPlan, pool: Any, reward: tuple[str, Any], ppo: Any, seed: int):
        self.plan, self.pool, self.ppo, self.seed = plan, pool, ppo, seed
        self._reward_where, self._reward = reward
        self.events: list[Event] = []
        self.gen_devices = list(plan.calls["actor_gen"].devices)
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
        """Place one DeviceWorker per plan device (one placement group), build every model shard,
        start the vLLM engines beside the generation devices and the reward function."""
        from models.vllm_engine import VLLMEngine
        from trainer.workers import CriticWorker, PolicyWorker, RefWorker

        check_supported(plan)
        calls = plan.calls
        devices = sorted({d for a in calls.values() for d in a.devices})
        pool = cluster.device_pool(devices, plan.gpus_per_node)
        common = dict(dtype=dtype, seed=seed)
        train_kw = dict(ppo=ppo, num_iterations=num_iterations, **common)
        reward_kwargs = dict(reward_cfg=reward_cfg, tokenizer_dir=policy_dir)
        recipes: dict[str, tuple[type, dict, tuple[int, ...] | None]] = {
            "actor": (
                PolicyWorker,
                dict(
                    model_dir=policy_dir,
                    temperature=temperature,
                    **train_kw,
                    activation_checkpointing=calls["actor_train"].activation_checkpointing,
                ),
                calls["actor_train"].devices,
            ),
            "critic": (
                CriticWorker,
                dict(
                    model_dir=critic_dir,
                    **train_kw,
                    activation_checkpointing=calls["critic_train"].activation_checkpointing,
                ),
                calls["critic_train"].devices,
            ),
            "critic_inf": (CriticWorker, dict(model_dir=critic_dir, **train_kw), ()),
            "ref": (
                RefWorker,
                dict(model_dir=policy_dir, temperature=temperature, offload=calls["ref_inf"].offload, **common),
                (),
            ),
            "reward": (RewardWorker, {**reward_kwargs, "device": "cuda" if backend == "nccl" else "cpu"}, None),
        }
        port, groups = pool.free_port(), mesh_groups(plan)

        def kwargs_of(device: int) -> dict[str, Any]:
            builders = {}
            for role in roles_on(plan, device):
                worker_cls, kwargs, mesh = recipes[role]
                builders[role] = (worker_cls, kwargs, (device,) if mesh == () else mesh)
            return dict(
                device=device,
                devices=devices,
                master_addr=pool.master_addr,
                master_port=port,
                backend=backend,
                groups=groups,
                dtype=dtype,
                builders=builders,
            )

        pool.build(DeviceWorker, kwargs_of)
        gen = set(calls["actor_gen"].devices)
        if backend != "nccl":  # CPU: the engines share the 1 GiB KV cache one engine would have had
            engine_kwargs = {**engine_kwargs, "kv_cache_gib": max(0.25, 1.0 / len(gen))}
        # On GPUs that training also uses, vLLM frees its memory between generations (sleep mode).
        sleeps = backend == "nccl" and any(gen & set(a.devices) for c, a in calls.items() if c != "actor_gen")
        pool.add_companions(
            "engine", sorted(gen), VLLMEngine, {**engine_kwargs, "enable_sleep_mode": True} if sleeps else engine_kwargs
        )
        if "rew_inf" in calls:
            reward: tuple[str, Any] = ("device", calls["rew_inf"].devices[0])
        else:  # the grader alone: no model, no device
            reward = ("actor", cluster.group(RewardWorker, 1, reward_kwargs, name="reward", distributed=False))
        runtime = cls(plan, pool, reward, ppo, seed)
        runtime.engines_sleep = sleeps
        return runtime

    # -- bookkeeping ---------------------------------------------------------------------------

    def _gather(self, call: str, devices: Sequence[int], futures: Sequence[Any]) -> list[Any]:
        from reallocation.ray_workers import wait

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
        """actor_gen: the engine replicas split the prompts (data-parallel generation)."""
        from reallocation.ray_workers import wait

        num = len(self.gen_devices)
        chunks = [ids[i::num] for i in range(num)]
        futures = [
            self.pool.submit_companion("engine", d, "generate", chunk, **sampling)
            for d, chunk in zip(self.gen_devices, chunks)
        ]
        outs = self._gather("actor_gen", self.gen_devices, futures)
        if self.engines_sleep:  # GPU only: give the memory back to training until the next call
            wait([self.pool.submit_companion("engine", d, "sleep") for d in self.gen_devices])
        merged: list = [None] * len(ids)
        for i, out in enumerate(outs):
            merged[i::num] = out
        return merged

    def submit_reward(self, samples: list[Any]) -> tuple[str, list[int], list[Any]]:
        """rew_inf on its device, or the grader-only reward actor (device -1: it holds no device)."""
        if self._reward_where == "device":
            return "rew_inf", [self._reward], [self.pool.submit(self._reward, "call", "reward", "score", samples)]
        return "reward", [-1], self._reward.submit_timed("score", samples)

    def _data_parallel(self, call: str, role: str, method: str, alloc: CallAllocation, batch: Mapping[str, Any]):
        """Submit ``method`` on each device of ``alloc`` with its row slice of ``batch``."""
        devices = list(alloc.devices)
        parts = _row_slices(batch, len(devices))
        return (
            call,
            devices,
            [
                self.pool.submit(d, "call", role, method, part, alloc.num_microbatches)
                for d, part in zip(devices, parts)
            ],
        )

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
        for key, (call, devices, futures) in pending.items():
            parts = self._gather(call, devices, futures)
            out[key] = parts[0] if key == "reward" else torch.cat(parts, dim=0)
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
            realloc.append(self._submit_realloc("critic", calls["critic_train"], calls["critic_inf"], to_engine=False))
        actor_stats, critic_stats = (self._gather(*p)[0] for p in pending)
        metrics: dict[str, float] = {}
        for name, gathered in realloc:
            metrics.update(self._finish_realloc(name, *gathered))
        return actor_stats, critic_stats, metrics

    def _submit_update(
        self, call: str, role: str, alloc: CallAllocation, batch: Mapping[str, torch.Tensor], iteration: int
    ):
        from trainer.batch import num_rows, select, update_rows, update_seed

        devices = list(alloc.devices)
        rows, sizes = update_rows(
            num_rows(batch),
            self.ppo.num_epochs,
            self.ppo.num_minibatches,
            len(devices),
            update_seed(self.seed, iteration),
        )
        # Every rank runs the same number of micro-batches (FSDP's collectives pair up), at most one per row.
        num_micro = min([alloc.num_microbatches] + [n for s in sizes for n in s])
        return (
            call,
            devices,
            [
                self.pool.submit(d, "call", role, "update", select(batch, r), s, num_micro)
                for d, r, s in zip(devices, rows, sizes)
            ],
        )

    def _submit_realloc(self, role: str, src: CallAllocation, dst: CallAllocation, *, to_engine: bool):
        """Start ``role``'s reallocation from ``src``'s layout to replicas on ``dst``'s devices; with
        ``to_engine`` each destination passes its weights straight to its own vLLM engine."""
        union = sorted(set(src.devices) | set(dst.devices))
        dst_role = "engine" if to_engine else f"{role}_inf"
        infos, loads = [], []
        for d in union:
            weights, info = self.pool.submit_split(d, "reallocate", role, dst_role, src.devices, dst.devices, to_engine)
            infos.append(info)
            if to_engine and d in dst.devices:
                loads.append((d, self.pool.submit_companion_with("engine", d, "load_weights", weights)))
        return role, (union, infos, loads)

    def _finish_realloc(self, role: str, union: list[int], infos: list[Any], loads: list[Any]) -> dict[str, float]:
        from reallocation.ray_workers import wait

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
        from reallocation.ray_workers import wait

        devices = [d for d in self.pool.devices if role in roles_on(self.plan, d)]
        return [v for v, _, _ in wait([self.pool.submit(d, "call", role, method, *args) for d in devices])]

    def on_reward(self, method: str, *args: Any) -> Any:
        if self._reward_where == "device":
            return self.on_role("reward", method, *args)[0]
        return self._reward.call(method, *args)[0]

    def sync_engines(self) -> dict[str, float]:
        """Reallocate the actor's (and critic's) training weights to where the calls need them."""
        calls = self.plan.calls
        out: dict[str, float] = {}
        role, gathered = self._submit_realloc("actor", calls["actor_train"], calls["actor_gen"], to_engine=True)
        out.update(self._finish_realloc(role, *gathered))
        if critic_needs_realloc(self.plan):
            role, gathered = self._submit_realloc("critic", calls["critic_train"], calls["critic_inf"], to_engine=False)
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
