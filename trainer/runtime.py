"""The plan runtime: deploys an ``ExecutionPlan`` on Ray and runs one PPO iteration's calls on it.

Deployment (``PlanRuntime.start``)::

    one placement group, one bundle per plan device         reallocation.ray_workers.DevicePool
    one DeviceWorker process per device, hosting every model shard the plan puts there:
        "actor"      PolicyWorker over actor_train's grid or stages (also computes the old logprobs)
        "critic"     CriticWorker over critic_train's grid or stages (also critic_inf when the plan gives
                     critic_inf the same devices and layout: sharded forward = inference)
        "critic_inf" CriticWorker replicas over critic_inf's pipelines, when its devices or layout differ
        "ref"        RefWorker replicas over ref_inf's pipelines (one per replica; with pp = 1 a
                     pipeline is one grid row)
        "reward"     RewardWorker replicas over rew_inf's pipelines: the reward function, its reward
                     model sharded like a reference replica (the replica's last stage's first device
                     grades and reports; the other devices run only their part of the forward)
    one vLLM engine rank per actor_gen device, a companion process in the same bundle (vLLM
    builds its own torch.distributed world, so it cannot live inside the device worker's); with
    tp or pp > 1 the companions of a generation replica (pp stages of tp devices) form one engine
    (vLLM's external_launcher)

A call's devices form a grid (``trainer.meshes``): dp rows of tp devices. A training model is
TP-sharded within each row and FSDP-sharded across rows (``reallocation.parallelize``: ``apply_tp``
then ``apply_fsdp`` on a 2-D ("dp", "tp") DeviceMesh made from process groups that every device
worker created at start); an inference replica is one row, TP-sharded. Data follows the rows: the
tp devices of a row see the same batch rows (``batch.update_rows`` cuts minibatches over dp ranks
only) and the row's first device reports inference outputs.

All device workers form one torch.distributed world (rank = index in the sorted device list) with
one process group per device set the plan needs (``mesh_groups``). Calls go to the devices of their
mesh; a device worker runs one call at a time, in submission order, so calls on disjoint meshes run
at the same time and calls on overlapping meshes queue. Reallocation (``reallocate``) moves a model
between two of its layouts with ``reallocation.sync``'s planned resharding over the union of both
meshes (from FSDP x TP training shards to the engine ranks' own vLLM TP boxes, or to the inference
replicas' own shards, pipeline stages included): each destination device receives exactly the bytes it
does not hold (the lower bound), and passes an engine rank's boxes to the engine process beside it
(``VLLMEngine.load_shards``).
Each call reports its start and end per device (``Event``) for the metrics and the timeline picture.

Supported layouts: training and inference pp x dp x tp (tp must divide the kv heads; with pp > 1
the model is cut into stages that pass hidden states on, ``trainer.pipeline``: a training call's
stages are dp x tp grids, ``trainer.meshes.staged_grid``, an inference call's replicas (reward
inference's too) one row per stage, ``pipelines_of``); generation pp x dp x tp, dp vLLM engines of
pp stages of tp ranks (vLLM's rules: tp divides the heads, kv heads are replicated when tp exceeds
them; its stages hold the blocks ``Layout`` gives them). Plans the runtime cannot run are rejected
at start naming the call and field.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from reallocation.estimator import LayoutLimits
from reallocation.execution_plan import CALL_MODEL, CallAllocation, ExecutionPlan
from reallocation.layout import Holdings, ModelSpec
from rewards.types import merge_reward_batches
from trainer.meshes import Grid, Pipeline, grid_groups, grid_of, pipeline_groups, pipelines_of, staged_grid

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


# What check_supported lets through, for the plan search (``cluster.plan=search`` looks only at these):
# pipeline stages in every call (``trainer.pipeline``; generation as vLLM's), TP dividing the kv heads
# outside generation.
RUNTIME_LIMITS = LayoutLimits(pipeline_calls=None, generation_tp=True, kv_replication=False)


def check_supported(plan: ExecutionPlan, specs: Mapping[str, ModelSpec] | None = None) -> None:
    """Reject layouts the runtime does not run, naming the call and field.

    ``specs`` (model name -> shape, as ``ExecutionPlan.validate`` takes them; the actor's stands in
    for the reference and critic, never for the reward model): also check that training and
    inference TP degrees divide the kv heads (``apply_tp`` shards k/v by head and
    does not replicate them, as vLLM does when tp > num_kv_heads), and that vLLM can shard the
    actor with generation's tp.
    """
    where = plan.origin or "plan"
    for name, alloc in plan.calls.items():
        model = CALL_MODEL[name]
        spec = (specs or {}).get(model) or (None if model == "reward" else (specs or {}).get("actor"))
        if name == "actor_gen" and spec is not None:
            from reallocation.names import vllm_local_shapes

            try:
                vllm_local_shapes(spec, alloc.tp)
            except ValueError as e:
                raise UnsupportedPlan(f"{where}: calls.actor_gen.tp={alloc.tp}: {e} (vLLM's sharding)") from None
        if name in SHARDED_CALLS and spec is not None and spec.num_kv_heads % alloc.tp:
            raise UnsupportedPlan(
                f"{where}: calls.{name}.tp={alloc.tp} does not divide num_key_value_heads={spec.num_kv_heads}: "
                "training and inference TP shard k/v by head (no kv-head replication, as in Megatron-LM)"
            )


# Calls whose model the runtime shards itself (FSDP x TP, apply_tp's rule for k/v).
SHARDED_CALLS = ("actor_train", "critic_train", "ref_inf", "critic_inf", "rew_inf")


def grid(alloc: CallAllocation) -> Grid:
    """A call's devices as dp rows of tp devices (``trainer.meshes.grid_of``)."""
    return grid_of(alloc.devices, alloc.tp)


def engine_holdings(plan: ExecutionPlan, spec: ModelSpec) -> Holdings:
    """What each generation device's engine rank holds of the actor (HF name -> world rank -> box;
    a device's world rank is its index in the plan's sorted devices): vLLM's TP boxes of its stage's
    blocks, the replicas (``replicas``: pp stages of tp devices) being copies. A tp=1, pp=1 engine
    holds every parameter in full."""
    from reallocation.names import vllm_layout

    devices = sorted({d for a in plan.calls.values() for d in a.devices})
    alloc = plan.calls["actor_gen"]
    # Layout's rank order (pp, dp, tp) over the sorted devices is the order pipelines_of reads them in.
    ranks = tuple(devices.index(d) for d in sorted(alloc.devices))
    return vllm_layout(alloc.tp, alloc.dp, ranks, alloc.pp).holdings(spec)


def reward_replicas(plan: ExecutionPlan) -> list[Pipeline]:
    """rew_inf's replicas (none without rew_inf: the grader alone needs no device)."""
    return replicas(plan.calls["rew_inf"]) if "rew_inf" in plan.calls else []


def reward_devices(plan: ExecutionPlan) -> list[int]:
    """The device that grades and reports for each reward replica: its last stage's first."""
    return [pipe.leader for pipe in reward_replicas(plan)]


def replicas(alloc: CallAllocation) -> list[Pipeline]:
    """An inference call's replicas, each pp stages of tp devices (``trainer.meshes.pipelines_of``;
    with pp = 1, one per grid row)."""
    return pipelines_of(alloc.devices, alloc.pp, alloc.tp)


def training_mesh(alloc: CallAllocation) -> Grid | Pipeline:
    """A training call's mesh: its grid, or with pp > 1 its stages' grids (``staged_grid``)."""
    return grid(alloc) if alloc.pp == 1 else staged_grid(alloc.devices, alloc.pp, alloc.tp)


def model_grids(plan: ExecutionPlan) -> dict[str, list[Grid | Pipeline]]:
    """Role -> the meshes its model instances are sharded over: one grid per training model (with
    pp > 1 its stages' grids), one pipeline per inference replica (pp stages, each one TP group)."""
    calls = plan.calls
    grids: dict[str, list[Grid | Pipeline]] = {
        "actor": [training_mesh(calls["actor_train"])],
        "critic": [training_mesh(calls["critic_train"])],
        "ref": list(replicas(calls["ref_inf"])),
    }
    if critic_needs_realloc(plan):
        grids["critic_inf"] = list(replicas(calls["critic_inf"]))
    if "rew_inf" in calls:
        grids["reward"] = list(reward_replicas(plan))
    return grids


def _devices_of(mesh: Grid | Pipeline) -> tuple[int, ...]:
    return mesh.devices if isinstance(mesh, Pipeline) else tuple(sorted(d for row in mesh for d in row))


def grid_on(plan: ExecutionPlan, role: str, device: int) -> Grid | Pipeline:
    """The grid or stages (training) or pipeline (inference replica) of the ``role`` instance that
    ``device`` holds a shard of."""
    return next(g for g in model_grids(plan)[role] if device in _devices_of(g))


def mesh_groups(plan: ExecutionPlan) -> list[tuple[int, ...]]:
    """Every device set that needs a process group, sorted: each model instance's grid groups
    (whole grid; with TP its rows and columns), each replica's stage groups and whole pipeline,
    and the unions that reallocation runs over."""
    calls = plan.calls
    groups = {
        g
        for meshes in model_grids(plan).values()
        for m in meshes
        for g in (pipeline_groups(m) if isinstance(m, Pipeline) else grid_groups(m))
    }
    groups.add(_union(calls["actor_train"], calls["actor_gen"]))
    if critic_needs_realloc(plan):
        groups.add(_union(calls["critic_train"], calls["critic_inf"]))
    return sorted(groups)


def critic_needs_realloc(plan: ExecutionPlan) -> bool:
    """Critic inference runs on replicas of its own unless the plan gives it critic training's
    devices and layout (then it is FSDP/TP forward on the training shards)."""
    inf, train = plan.calls["critic_inf"], plan.calls["critic_train"]
    return (sorted(inf.devices), inf.pp, inf.dp, inf.tp) != (sorted(train.devices), train.pp, train.dp, train.tp)


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
    if "rew_inf" in calls and device in calls["rew_inf"].devices:
        roles.append("reward")
    return roles


class RewardWorker:
    """Holds the reward function (grader pool, ORM/PRM) next to its model; ``device``: where the
    reward model computes (the rew_inf device's GPU, or CPU).

    ``ranks``: this device's place in a rew_inf replica (``DeviceWorker._ranks``); the reward model
    is then sharded over the replica (``trainer.workers.shard_replica``). ``num_microbatches``: the
    plan's for rew_inf (each call's share in at least that many forwards, as the cost model prices it).
    ``offload``: an unsharded reward model's weights wait in host memory between calls and come to
    ``device`` for each (as ``RefWorker``'s; on CPU this changes nothing). Only the replica's last
    stage's first device grades and reports; the others run their part of the reward model's forward
    on the same samples and return None.
    """

    def __init__(
        self,
        ranks: Any = None,
        *,
        reward_cfg: Any,
        tokenizer_dir: str,
        device: str = "cpu",
        num_microbatches: int = 1,
        offload: bool = False,
    ):
        from transformers import AutoTokenizer

        from rewards.build import build_reward_fn
        from trainer.workers import shard_replica

        sharded = ranks is not None and ranks.model_sharded
        shard = (lambda model: shard_replica(model, ranks)) if sharded else None
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.fn: Any = build_reward_fn(reward_cfg, tokenizer, device, shard, num_microbatches)
        self.reports = not sharded or ((ranks.pipeline is None or ranks.pipeline.is_last) and ranks.rank == 0)
        reward_model = getattr(self.fn, "reward_model", None)
        self.offloaded = reward_model.model if offload and not sharded and reward_model is not None else None
        self.device = device
        if self.offloaded is not None:
            self.offloaded.to("cpu")

    def score(self, samples):
        if self.offloaded is not None:
            self.offloaded.to(self.device)
        try:
            if self.reports:
                return self.fn(samples)
            self.fn.run_reward_model(samples)
            return None
        finally:
            if self.offloaded is not None:
                self.offloaded.to("cpu")

    def set_calibration(self, state: dict[str, float]) -> None:
        self.fn.set_calibration(state)

    def calibration(self) -> dict[str, float]:
        """Clip's eta and the reward's alpha in use (after the first call: calibrated)."""
        return self.fn.calibration()


class DeviceWorker:
    """Everything one device holds (no Ray here: ``reallocation.ray_workers`` hosts it).

    Joins the world of all device workers, creates the process group of every device set in
    ``groups`` (all workers, same order: ``new_group`` is collective), then builds the workers of
    its roles; a role's grid (``trainer.meshes``) says how its model is sharded: FSDP over the
    rows, TP within each row, its ``DeviceMesh`` made from the groups created here.
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
        builders: Mapping[str, tuple[type, dict, Grid | Pipeline]],
    ):
        import torch.distributed as dist

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
            self.workers[role] = cls(self._ranks(mesh), **kwargs)

    def _ranks(self, mesh: Grid | Pipeline) -> Any:
        """This device's ``Ranks`` in a model sharded over ``mesh``: a grid (dp rows x tp columns),
        or pipeline stages, the stage holding this device being a grid of its own that passes hidden
        states to the device at the same place in the next stage."""
        from trainer.meshes import column_of, global_grid, row_of
        from trainer.pipeline import PipelineStage
        from trainer.workers import Ranks

        pipeline = None
        if isinstance(mesh, Pipeline):
            s, column = mesh.stage_of(self.device), mesh.column(self.device)
            if len(mesh.stages) > 1:  # this device talks to the devices at its place in the other stages
                rank = [self.rank_of[d] for d in column]
                pipeline = PipelineStage(
                    s,
                    len(column),
                    prev=rank[s - 1] if s > 0 else None,
                    next=rank[s + 1] if s + 1 < len(column) else None,
                    first=rank[0],
                    last=rank[-1],
                    group=self.groups[tuple(sorted(column))],
                    tie_group=self.groups[tuple(sorted((column[0], column[-1])))],
                    model_group=self.groups[mesh.devices],
                )
            mesh = mesh.stages[s]
        devices = tuple(sorted(d for row in mesh for d in row))
        if len(devices) == 1:
            return Ranks(None, self.dtype, self.backend, pipeline=pipeline)
        if len(mesh[0]) == 1:  # FSDP (or plain replicas) over the whole group
            return Ranks(self.groups[devices], self.dtype, self.backend, pipeline=pipeline)
        return Ranks(
            self.groups[devices],
            self.dtype,
            self.backend,
            dp_group=self.groups[column_of(mesh, self.device)],
            tp_group=self.groups[row_of(mesh, self.device)],
            grid=global_grid(mesh, self.rank_of),
            pipeline=pipeline,
        )

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.workers[role], method)(*args, **kwargs)

    def reallocate(
        self,
        src_role: str,
        dst_role: str,
        src_devices: Sequence[int],
        dst_devices: Sequence[int],
        engine: Holdings | None = None,
    ) -> tuple[Any, tuple[dict[str, int], float, float]]:
        """Move ``src_role``'s training shards to the replicas on ``dst_devices`` (collective over the
        union of both meshes): the engine ranks' boxes ``engine`` (``engine_holdings``), or the
        ``dst_role`` workers' own (FSDP/TP) shards. A destination keeps what it already holds and
        receives the rest.

        Returns (engine shards or None, ({bytes_received, bytes_sent, lower_bound}, start, end)). For
        an engine a destination returns its ``(HF name, full shape, box, shard)`` for the vLLM engine
        rank beside it (``VLLMEngine.load_shards``); otherwise it copies the shards into its
        ``dst_role`` worker's parameters.
        """
        from reallocation.plan import lower_bound_bytes
        from reallocation.reshard import ReshardStats
        from reallocation.sync import drain, iter_plan_weights, plan_sync, source_shards

        start = time.time()
        group = self.groups[tuple(sorted(set(src_devices) | set(dst_devices)))]
        src_worker = self.workers.get(src_role) if self.device in src_devices else None
        src = source_shards(src_worker.model if src_worker is not None else {}, group)
        to_engine = engine is not None
        dst_model = self.workers[dst_role].model if not to_engine and self.device in dst_devices else None
        if engine is not None:
            if engine.keys() != src.shapes.keys():
                raise ValueError(
                    f"engine layout names {sorted(engine.keys() ^ src.shapes.keys())[:5]} differ from the model's"
                )
            dst = engine
        else:  # whatever the destination replicas' own (FSDP/TP) shards are
            dst = source_shards(dst_model if dst_model is not None else {}, group).holdings
        plan = plan_sync(src, dst)
        # The engine computes in the run's dtype; a critic replica keeps the exact training weights.
        wire = {n: (self.workers_dtype() if to_engine else src.dtypes[n]) for n in src.shapes}
        stats = ReshardStats()
        pairs = iter_plan_weights(plan, src.tensors, dtype=wire, group=group, stats=stats)
        weights = None
        if self.device not in dst_devices:
            drain(pairs)
        elif dst_model is None:  # to the engine rank beside this device
            rank = self.rank_of[self.device]
            weights = [(name, src.shapes[name], dst[name][rank], tensor.cpu()) for name, tensor in pairs]
        else:
            _copy_into(dst_model, pairs)
        itemsizes = {n: wire[n].itemsize for n in wire}
        counts = {
            "bytes_received": stats.bytes_received,
            "bytes_sent": stats.bytes_sent,
            "lower_bound": lower_bound_bytes(src.holdings, dst, src.shapes, itemsizes),
        }
        return weights, (counts, start, time.time())

    def workers_dtype(self) -> torch.dtype:
        from reallocation.dtypes import torch_dtype

        return torch_dtype(self.dtype)

    def ready(self) -> dict[str, Any]:
        return {"device": self.device, "roles": sorted(self.workers), "pid": os.getpid()}


def _copy_into(model: torch.nn.Module, pairs: Any) -> None:
    """Copy received (HF name, tensor) pairs into ``model``'s local shards (a DTensor's local
    tensor, or the plain parameter)."""
    from reallocation.sync import clean_name

    params = {clean_name(n): p for n, p in model.named_parameters()}
    with torch.no_grad():
        for name, tensor in pairs:
            param = params[name]
            (param.to_local() if hasattr(param, "to_local") else param).copy_(tensor)


def _recipes(
    plan: ExecutionPlan, common: dict[str, Any], train: dict[str, Any], dirs: dict[str, Any], reward: dict[str, Any]
) -> dict[str, tuple[type, dict[str, Any]]]:
    """Role -> (worker class, constructor kwargs); ``DeviceWorker`` adds the ranks of its grid."""
    from trainer.workers import CriticWorker, PolicyWorker, RefWorker

    calls, train = plan.calls, {**train, **common}
    return {
        "actor": (
            PolicyWorker,
            dict(
                model_dir=dirs["policy_dir"],
                temperature=dirs["temperature"],
                activation_checkpointing=calls["actor_train"].activation_checkpointing,
                **train,
            ),
        ),
        "critic": (
            CriticWorker,
            dict(
                model_dir=dirs["critic_dir"],
                activation_checkpointing=calls["critic_train"].activation_checkpointing,
                **train,
            ),
        ),
        "critic_inf": (CriticWorker, dict(model_dir=dirs["critic_dir"], **train)),
        "ref": (
            RefWorker,
            dict(
                model_dir=dirs["policy_dir"],
                temperature=dirs["temperature"],
                offload=calls["ref_inf"].offload,
                **common,
            ),
        ),
        "reward": (
            RewardWorker,
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
        """Place one DeviceWorker per plan device (one placement group), build every model shard,
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

        pool.build(DeviceWorker, kwargs_of)
        sleeps = _start_engines(pool, plan, backend, engine_kwargs)
        if "rew_inf" in plan.calls:
            reward: tuple[str, Any] = ("device", reward_replicas(plan))
        else:  # the grader alone: no model, no device
            reward = ("actor", cluster.group(RewardWorker, 1, reward_kwargs, name="reward", distributed=False))
        runtime = cls(plan, pool, reward, ppo, seed, engine_holdings(plan, actor_spec))
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
        """actor_gen: the engine replicas split the prompts (data-parallel generation); every rank
        of a replica (its stages and TP ranks) runs its requests, and only the replica's first device
        sends them back (vLLM's external_launcher gives every stage the sampled tokens)."""
        from reallocation.ray_workers import wait

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
        from trainer.batch import num_rows, select, update_rows, update_seed

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


def microbatches_per_minibatch(num_microbatches: int, num_minibatches: int, sizes: Sequence[Sequence[int]]) -> int:
    """How many micro-batches each PPO minibatch of a training call is cut into. The plan (and the
    cost model that priced it) counts ``num_microbatches`` over the call's whole batch, which the
    update splits into ``num_minibatches``: each minibatch takes ceil(mb / num_minibatches), so a
    micro-batch is as large as priced, never larger. Every rank runs the same number (FSDP's
    collectives pair up), at most one per row of its smallest share (``sizes``: rows per minibatch,
    per rank): 512 micro-batches over 4 minibatches of 1024 rows per rank are 128 of 8 rows each."""
    return min([-(-num_microbatches // num_minibatches)] + [n for s in sizes for n in s])


def _row_slices(batch: Mapping[str, torch.Tensor], num_parts: int) -> list[dict[str, torch.Tensor]]:
    """Near-equal row slices of a batch, one per data-parallel rank, in order."""
    num_rows = next(iter(batch.values())).shape[0]
    if num_rows < num_parts:
        raise ValueError(f"a batch of {num_rows} rows cannot feed {num_parts} data-parallel devices")
    bounds = torch.arange(num_rows).tensor_split(num_parts)
    return [{k: v[int(b[0]) : int(b[-1]) + 1] for k, v in batch.items()} for b in bounds]
