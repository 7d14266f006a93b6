"""Candidate allocations of one PPO call: device meshes x parallel strategies x knobs.

Meshes follow ReaL's ``DeviceMesh`` rule: 1, 2, 4, ... aligned GPUs inside one node, or a run of
whole contiguous nodes. On a mesh a strategy is ``(pp, dp, tp)`` with TP inside a node and
dividing the heads (kv heads divide it or it divides them), pp dividing the layers, and every
replica getting at least one sequence per micro-batch. Knobs: ``num_microbatches`` (powers of
two), activation checkpointing (training) and offload (reference / reward). A candidate must fit
on its GPUs alone; ``pareto`` then drops the ones another candidate on the same GPUs beats in
time, resident and active memory at once.
"""

from __future__ import annotations

from planning.estimator import Hardware, Workload, evaluator
from planning.execution_plan import CALL_KIND, OFFLOADABLE, TRAIN, CallAllocation

MICROBATCHES = (1, 2, 4, 8, 16, 32, 64)
# Finer splits, tried only for a (call, mesh, layout) that fits with none of the above: a 7B policy's
# 32,768 sequences per iteration over 8 GPUs need hundreds of micro-batches to fit, and the search must not
# give up on it while a rule-based plan fits.
FINE_MICROBATCHES = (128, 256, 512, 1024, 2048, 4096)


def device_meshes(hw: Hardware) -> list[tuple[int, ...]]:
    """Aligned power-of-two blocks inside a node, then runs of whole nodes."""
    meshes = []
    size = 1
    while size <= hw.gpus_per_node:
        if hw.gpus_per_node % size == 0:
            for node in range(hw.num_nodes):
                for first in range(0, hw.gpus_per_node, size):
                    start = node * hw.gpus_per_node + first
                    meshes.append(tuple(range(start, start + size)))
        size *= 2
    for num in range(2, hw.num_nodes + 1):
        for node in range(hw.num_nodes - num + 1):
            meshes.append(tuple(range(node * hw.gpus_per_node, (node + num) * hw.gpus_per_node)))
    return meshes


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def strategies(
    call: str, devices: tuple[int, ...], w: Workload, hw: Hardware, *, pp_one: bool = False, tp: int | None = None
) -> list[CallAllocation]:
    """Every ``(pp, dp, tp, knobs)`` of ``call`` on ``devices`` that fits alone, fastest first.

    Worked out once per mesh shape (size, inside one node or not) and moved onto ``devices``.
    """
    g = hw.gpus_per_node
    key = (call, len(devices), devices[0] // g == devices[-1] // g, devices[0] % g == 0, pp_one, tp)
    cache = _STRATEGIES.setdefault((w, hw, id(hw.profile)), {})  # Hardware's hash leaves the profile out
    if key not in cache:
        cache[key] = _strategies(call, devices, w, hw, pp_one, tp)
    return [
        a
        if a.devices == devices
        else CallAllocation(devices, a.pp, a.dp, a.tp, a.num_microbatches, a.activation_checkpointing, a.offload)
        for a in cache[key]
    ]


_STRATEGIES: dict[tuple[Workload, Hardware, int], dict[tuple, list[CallAllocation]]] = {}


def _strategies(
    call: str, devices: tuple[int, ...], w: Workload, hw: Hardware, pp_one: bool, tp: int | None
) -> list[CallAllocation]:
    spec, ev, limits = w.spec(call), evaluator(w, hw), w.limits
    out = []
    for t in _divisors(len(devices)) if tp is None else [tp]:
        replicate = limits.kv_replication or call == "actor_gen"  # vLLM replicates kv heads itself
        kv_ok = spec.num_kv_heads % t == 0 or (replicate and t % spec.num_kv_heads == 0)
        if t > hw.gpus_per_node or spec.num_heads % t or not kv_ok or len(devices) % t:
            continue
        if t > 1 and call == "actor_gen" and not limits.generation_tp:
            continue
        pipelined = limits.pipeline_calls is None or call in limits.pipeline_calls
        for pp in _divisors(len(devices) // t) if pipelined and not pp_one else [1]:
            dp = len(devices) // (t * pp)
            if spec.num_layers % pp or w.batch < dp:
                continue
            found = _fitting_knobs(call, CallAllocation(devices, pp, dp, t), MICROBATCHES, w, hw)
            out += found or _fitting_knobs(call, CallAllocation(devices, pp, dp, t), FINE_MICROBATCHES, w, hw)
    out.sort(key=lambda a: (ev.seconds(call, a), a.num_microbatches, a.activation_checkpointing, a.offload))
    return out


def _fitting_knobs(
    call: str, layout: CallAllocation, microbatches: tuple[int, ...], w: Workload, hw: Hardware
) -> list[CallAllocation]:
    """``layout`` with each micro-batch count, checkpointing and offload choice that fits alone."""
    ev, out = evaluator(w, hw), []
    for mb in microbatches:
        if layout.dp * mb > w.batch:
            break
        for ckpt in (False, True) if CALL_KIND[call] == TRAIN else (False,):
            sharded = layout.tp > 1 or layout.pp > 1
            can_offload = call in OFFLOADABLE and (w.limits.offload_sharded or not sharded)
            for offload in (False, True) if can_offload else (False,):
                alloc = CallAllocation(layout.devices, layout.pp, layout.dp, layout.tp, mb, ckpt, offload)
                if ev.fits_alone(call, alloc):
                    out.append(alloc)
    return out


def seconds(call: str, alloc: CallAllocation, w: Workload, hw: Hardware) -> float:
    """The call alone (offload reload included, reallocation not)."""
    return evaluator(w, hw).seconds(call, alloc)


def pareto(call: str, allocs: list[CallAllocation], w: Workload, hw: Hardware) -> list[CallAllocation]:
    """Drop allocations beaten on (time, resident, active) by one on the same devices.

    ``allocs`` must be sorted by time (``strategies`` does that), so a later one is dominated when
    an earlier one on its GPUs needs no more resident and no more active memory.
    """
    ev = evaluator(w, hw)
    kept: dict[tuple[int, ...], list[tuple[float, float]]] = {}
    out = []
    for a in allocs:
        _, res, act, copy = ev.facts(call, a)
        front = kept.setdefault(a.devices, [])
        if any(r <= res and c <= act + copy for r, c in front):
            continue
        front.append((res, act + copy))
        out.append(a)
    return out


def candidates(call: str, w: Workload, hw: Hardware) -> list[CallAllocation]:
    """Pareto-pruned candidates of ``call`` over all meshes, fastest first.

    Meshes of one size cost the same wherever they sit (aligned blocks inside a node, or runs of
    whole nodes), so strategies are worked out on the first mesh of each size and moved.
    """
    ev = evaluator(w, hw)
    fronts: dict[int, list[CallAllocation]] = {}
    out: list[CallAllocation] = []
    for mesh in device_meshes(hw):
        if len(mesh) not in fronts:
            fronts[len(mesh)] = pareto(call, strategies(call, mesh, w, hw), w, hw)
        out.extend(
            CallAllocation(mesh, a.pp, a.dp, a.tp, a.num_microbatches, a.activation_checkpointing, a.offload)
            for a in fronts[len(mesh)]
        )
    out.sort(key=lambda a: (ev.seconds(call, a), len(a.devices), a.devices))
    return out
