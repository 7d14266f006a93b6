"""The NCCL communicators a plan creates on each device, and the device memory they take.

A device process creates a process group for every device set the plan needs
(``runtime.topology.mesh_groups``, at start, the same list on every process) beside the world of all
the plan's devices; NCCL builds a communicator for a group at its first collective and keeps it. A vLLM
engine rank joins its engine's tensor-parallel group and, with stages, its pipeline group (vLLM's
``parallel_state.initialize_model_parallel``: a device communicator for each group of more than one rank).

``process_groups`` computes the device process's groups from the plan's layouts alone, as the runtime's
``mesh_groups`` does (``tests/runtime/test_topology.py`` holds the two equal), since the cost model sits
below the runtime and prices plans the search has not built.

The bytes, per device and process:

- ``NCCL_STATE_BYTES`` once, for a process with any communicator: NCCL's own state and device code,
  measured on one H200 as the device memory a one-rank communicator's first all-reduce added outside the
  allocator (``planning/profiles/h200.json``, ``process_memory.nccl_bytes``, ``planning.profile.
  measure_process_memory``);
- ``COMMUNICATOR_BYTES`` for each communicator of two or more ranks: NCCL's buffer for one channel's
  connection, ``NCCL_BUFFSIZE`` (4 MiB, its documented default; NCCL's environment-variable reference),
  times the channels NCCL may build, up to 32 (``MAXCHANNELS`` in NCCL's ``device.h``). That is an estimate
  from NCCL's documented defaults, not a measurement: only one GPU has been lent, and one GPU cannot form a
  communicator of two ranks. The LL and LL128 protocols' buffers and a tree's connections add to it; fewer
  channels (PCIe, ``NCCL_MAX_NCHANNELS``) take less.
"""

from __future__ import annotations

from collections.abc import Mapping

from planning.execution_plan import Call, CallAllocation

NCCL_STATE_BYTES = 585_105_408
"""Measured on one H200 (``process_memory.nccl_bytes`` of ``planning/profiles/h200.json``): 558 MiB."""
NCCL_BUFFSIZE = 4 << 20
NCCL_CHANNELS = 32
COMMUNICATOR_BYTES = NCCL_BUFFSIZE * NCCL_CHANNELS
"""128 MiB a communicator of two or more ranks (estimated, see the module docstring)."""

Group = tuple[int, ...]


def _rows(devices: list[int], tp: int) -> list[Group]:
    return [tuple(devices[i : i + tp]) for i in range(0, len(devices), tp)]


def _grid_groups(rows: list[Group]) -> set[Group]:
    """``runtime.meshes.grid_groups``: the whole grid (more than one device), and with tp > 1 every row and
    every column (a column of one device too)."""
    devices = tuple(sorted(d for row in rows for d in row))
    groups = {devices} if len(devices) > 1 else set()
    if len(rows[0]) > 1:
        groups.update(rows)
        groups.update(tuple(column) for column in zip(*rows))
    return groups


def _pipeline_groups(stages: list[list[Group]]) -> set[Group]:
    """``runtime.meshes.pipeline_groups``: each stage's grid groups and, with pp > 1, the whole model, every
    pipeline column and every column's first and last device."""
    groups = {g for stage in stages for g in _grid_groups(stage)}
    if len(stages) > 1:
        groups.add(tuple(sorted(d for stage in stages for row in stage for d in row)))
        for r, row in enumerate(stages[0]):
            for c in range(len(row)):
                column = [stage[r][c] for stage in stages]
                groups.add(tuple(sorted(column)))
                groups.add(tuple(sorted((column[0], column[-1]))))
    return groups


def _training_groups(alloc: CallAllocation) -> set[Group]:
    """A training model's grid (``runtime.topology.training_mesh``), with pp > 1 its stages' grids."""
    ordered = sorted(alloc.devices)
    size = len(ordered) // alloc.pp
    return _pipeline_groups([_rows(ordered[s * size : (s + 1) * size], alloc.tp) for s in range(alloc.pp)])


def _replica_groups(alloc: CallAllocation) -> set[Group]:
    """An inference call's replicas (``runtime.meshes.pipelines_of``): replica r's stage s is the tp devices
    from index ``(s * dp + r) * tp`` of the sorted devices, one row per stage."""
    ordered, tp, dp = sorted(alloc.devices), alloc.tp, alloc.dp
    out: set[Group] = set()
    for r in range(dp):
        stages = [[tuple(ordered[(s * dp + r) * tp : (s * dp + r + 1) * tp])] for s in range(alloc.pp)]
        out |= _pipeline_groups(stages)
    return out


def _shares_critic_training(calls: Mapping[str, CallAllocation]) -> bool:
    inf, train = calls[Call.critic_inf], calls[Call.critic_train]
    return (sorted(inf.devices), inf.pp, inf.dp, inf.tp) == (sorted(train.devices), train.pp, train.dp, train.tp)


def process_groups(calls: Mapping[str, CallAllocation]) -> list[Group]:
    """Every device set the device processes create a group for (``runtime.topology.mesh_groups``): each
    model instance's groups and the unions reallocation runs over, sorted."""
    groups = _training_groups(calls[Call.actor_train])
    groups.add(tuple(sorted(set(calls[Call.actor_train].devices) | set(calls[Call.actor_gen].devices))))
    if Call.critic_train in calls:
        groups |= _training_groups(calls[Call.critic_train])
        if not _shares_critic_training(calls):
            groups |= _replica_groups(calls[Call.critic_inf])
            groups.add(tuple(sorted(set(calls[Call.critic_train].devices) | set(calls[Call.critic_inf].devices))))
    for call in (Call.ref_inf, Call.rew_inf):
        if call in calls:
            groups |= _replica_groups(calls[call])
    return sorted(groups)


def device_communicators(calls: Mapping[str, CallAllocation], device: int) -> int:
    """Communicators of two or more ranks the device process on ``device`` joins: the world of the plan's
    devices and each of ``process_groups`` that holds ``device``."""
    world = {d for a in calls.values() for d in a.devices}
    groups = {g for g in process_groups(calls) if device in g and len(g) > 1}
    return len(groups | ({tuple(sorted(world))} if len(world) > 1 else set()))


def engine_communicators(alloc: CallAllocation) -> int:
    """Communicators of an engine rank of ``actor_gen``: its tensor-parallel group (tp > 1) and its
    pipeline group (pp > 1)."""
    return int(alloc.tp > 1) + int(alloc.pp > 1)


def communicator_bytes(num_communicators: int) -> float:
    """Device bytes of a process's ``num_communicators`` NCCL communicators (0 for none)."""
    return NCCL_STATE_BYTES + num_communicators * COMMUNICATOR_BYTES if num_communicators else 0.0
