"""What an execution plan means for the devices, as data: pure, no Ray and no torch.distributed.

For a plan (``planning.execution_plan``) and a device it says which model shards the device hosts
(``roles_on``), the grid or pipeline stages each model instance is sharded over (``model_grids``,
built from ``runtime.meshes``), the process groups every device process creates at start
(``mesh_groups``), what each generation rank of a vLLM engine holds of the actor
(``engine_holdings``), and which plans the runtime can run at all (``check_supported``). The
driver (``runtime.driver``) and the device processes (``runtime.device``) both read it, so they
agree on every group and shard without talking.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from planning.estimator import LayoutLimits
from planning.execution_plan import CALL_MODEL, Call, CallAllocation, ExecutionPlan
from reallocation.layout import Holdings, ModelSpec
from runtime.meshes import Grid, Pipeline, grid_groups, grid_of, pipeline_groups, pipelines_of, staged_grid


class Role(StrEnum):
    """A model shard a device process hosts (``runtime.topology.roles_on``)."""

    actor = "actor"
    """The policy's training shard (actor_train's grid or stages; also computes the old logprobs)."""
    critic = "critic"
    """The critic's training shard (also critic inference when the plan gives it the same layout)."""
    critic_inf = "critic_inf"
    """Critic inference replicas of their own, filled by reallocation after each update."""
    ref = "ref"
    """Reference-policy replicas (frozen)."""
    reward = "reward"
    """The reward function and its reward-model replica (rew_inf)."""


class UnsupportedPlan(ValueError):
    """A plan the runtime cannot run (named call and field)."""


# What check_supported lets through, for the plan search (``cluster.plan=search`` looks only at these):
# pipeline stages in every call (``runtime.device.pipeline``; generation as vLLM's), TP dividing the kv heads
# outside generation, offload of whole (unsharded) frozen replicas only.
RUNTIME_LIMITS = LayoutLimits(pipeline_calls=None, generation_tp=True, kv_replication=False, offload_sharded=False)


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
        if name == Call.actor_gen and spec is not None:
            from reallocation.names import vllm_local_shapes

            try:
                vllm_local_shapes(spec, alloc.tp)
            except ValueError as e:
                raise UnsupportedPlan(f"{where}: calls.actor_gen.tp={alloc.tp}: {e} (vLLM's sharding)") from None
        if alloc.offload and (alloc.tp > 1 or alloc.pp > 1):
            raise UnsupportedPlan(
                f"{where}: calls.{name}.offload with tp={alloc.tp}, pp={alloc.pp}: the runtime offloads whole "
                "replicas only (tp = pp = 1); drop offload or the sharding"
            )
        if name in SHARDED_CALLS and spec is not None and spec.num_kv_heads % alloc.tp:
            raise UnsupportedPlan(
                f"{where}: calls.{name}.tp={alloc.tp} does not divide num_key_value_heads={spec.num_kv_heads}: "
                "training and inference TP shard k/v by head (no kv-head replication, as in Megatron-LM)"
            )


# Calls whose model the runtime shards itself (FSDP x TP, apply_tp's rule for k/v).
SHARDED_CALLS = (Call.actor_train, Call.critic_train, Call.ref_inf, Call.critic_inf, Call.rew_inf)


def grid(alloc: CallAllocation) -> Grid:
    """A call's devices as dp rows of tp devices (``runtime.meshes.grid_of``)."""
    return grid_of(alloc.devices, alloc.tp)


def engine_holdings(plan: ExecutionPlan, spec: ModelSpec) -> Holdings:
    """What each generation device's engine rank holds of the actor (HF name -> world rank -> box;
    a device's world rank is its index in the plan's sorted devices): vLLM's TP boxes of its stage's
    blocks, the replicas (``replicas``: pp stages of tp devices) being copies. A tp=1, pp=1 engine
    holds every parameter in full."""
    from reallocation.names import vllm_layout

    devices = sorted({d for a in plan.calls.values() for d in a.devices})
    alloc = plan.calls[Call.actor_gen]
    # Layout's rank order (pp, dp, tp) over the sorted devices is the order pipelines_of reads them in.
    ranks = tuple(devices.index(d) for d in sorted(alloc.devices))
    return vllm_layout(alloc.tp, alloc.dp, ranks, alloc.pp).holdings(spec)


def reward_replicas(plan: ExecutionPlan) -> list[Pipeline]:
    """rew_inf's replicas (none without rew_inf: the grader alone needs no device)."""
    return replicas(plan.calls[Call.rew_inf]) if Call.rew_inf in plan.calls else []


def replicas(alloc: CallAllocation) -> list[Pipeline]:
    """An inference call's replicas, each pp stages of tp devices (``runtime.meshes.pipelines_of``;
    with pp = 1, one per grid row)."""
    return pipelines_of(alloc.devices, alloc.pp, alloc.tp)


def training_mesh(alloc: CallAllocation) -> Grid | Pipeline:
    """A training call's mesh: its grid, or with pp > 1 its stages' grids (``staged_grid``)."""
    return grid(alloc) if alloc.pp == 1 else staged_grid(alloc.devices, alloc.pp, alloc.tp)


def model_grids(plan: ExecutionPlan) -> dict[Role, list[Grid | Pipeline]]:
    """Role -> the meshes its model instances are sharded over: one grid per training model (with
    pp > 1 its stages' grids), one pipeline per inference replica (pp stages, each one TP group)."""
    calls = plan.calls
    grids: dict[Role, list[Grid | Pipeline]] = {Role.actor: [training_mesh(calls[Call.actor_train])]}
    if Call.critic_train in calls:  # the algorithm's dataflow graph has a critic
        grids[Role.critic] = [training_mesh(calls[Call.critic_train])]
    if Call.ref_inf in calls:  # and a KL term
        grids[Role.ref] = list(replicas(calls[Call.ref_inf]))
    if critic_needs_realloc(plan):
        grids[Role.critic_inf] = list(replicas(calls[Call.critic_inf]))
    if Call.rew_inf in calls:
        grids[Role.reward] = list(reward_replicas(plan))
    return grids


def _devices_of(mesh: Grid | Pipeline) -> tuple[int, ...]:
    return mesh.devices if isinstance(mesh, Pipeline) else tuple(sorted(d for row in mesh for d in row))


def grid_on(plan: ExecutionPlan, role: Role, device: int) -> Grid | Pipeline:
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
    groups.add(_union(calls[Call.actor_train], calls[Call.actor_gen]))
    if critic_needs_realloc(plan):
        groups.add(_union(calls[Call.critic_train], calls[Call.critic_inf]))
    return sorted(groups)


def critic_needs_realloc(plan: ExecutionPlan) -> bool:
    """Critic inference runs on replicas of its own unless the plan gives it critic training's
    devices and layout (then it is FSDP/TP forward on the training shards); never without a critic."""
    if Call.critic_train not in plan.calls:
        return False
    inf, train = plan.calls[Call.critic_inf], plan.calls[Call.critic_train]
    return (sorted(inf.devices), inf.pp, inf.dp, inf.tp) != (sorted(train.devices), train.pp, train.dp, train.tp)


def _union(a: CallAllocation, b: CallAllocation) -> tuple[int, ...]:
    return tuple(sorted(set(a.devices) | set(b.devices)))


def roles_on(plan: ExecutionPlan, device: int) -> list[Role]:
    """The model shards ``device`` hosts (its DeviceProcess builds them in this order)."""
    calls = plan.calls
    roles = []
    if device in calls[Call.actor_train].devices:
        roles.append(Role.actor)
    if Call.critic_train in calls and device in calls[Call.critic_train].devices:
        roles.append(Role.critic)
    if critic_needs_realloc(plan) and device in calls[Call.critic_inf].devices:
        roles.append(Role.critic_inf)
    if Call.ref_inf in calls and device in calls[Call.ref_inf].devices:
        roles.append(Role.ref)
    if Call.rew_inf in calls and device in calls[Call.rew_inf].devices:
        roles.append(Role.reward)
    return roles


def devices_of_role(plan: ExecutionPlan, role: Role) -> list[int]:
    """Every device holding a shard of ``role`` (its collective calls, such as checkpoints, run there)."""
    return sorted({d for meshes in [model_grids(plan).get(role, [])] for m in meshes for d in _devices_of(m)})


def reporting_device(plan: ExecutionPlan, role: Role) -> int:
    """The device whose result a call on every shard of ``role`` reports: the first instance's leader
    (a pipeline's last stage's first device; a grid's first device)."""
    first = model_grids(plan)[role][0]
    return first.leader if isinstance(first, Pipeline) else min(_devices_of(first))
