"""Execution-plan search (ReaL-style): pick an allocation for every model function call so that a
simulated PPO iteration is shortest.

- ``ppo_calls`` builds the PPO dataflow graph: actor_gen -> {rew_inf, ref_inf, critic_inf} ->
  {actor_train, critic_train}.
- ``candidates`` enumerates allocations per call: aligned device meshes (1, 2, 4, ... GPUs inside
  a node, or whole nodes) x (pp, dp, tp) factorizations (training uses FSDP for dp), pruned by
  memory, keeping the fastest ``max_per_call``.
- ``simulate`` list-schedules the graph over a few iterations: a call starts when its inputs are
  ready and its GPUs are free; calls on overlapping meshes serialize; when a model's call runs
  on a different allocation from the model's previous call, a reallocation (``realloc_time``)
  occupies both meshes first. Only updated parameters move: after a model trains, its other
  allocations receive the update before their next call (the training copy is never freed, as
  in ReaL). A plan whose resident memory overflows a GPU costs x3 (ReaL).
- ``mcmc_search``: Metropolis over plans starting from each call's fastest candidate: re-pick one
  call's candidate at random, accept a worse plan with probability ``exp(-beta * relative
  increase)``, keep the best seen. Deterministic for a seed.

Example::

    calls = ppo_calls(ModelSpec.from_hf_config(actor_cfg), ModelSpec.from_hf_config(critic_cfg),
                      batch=512, prompt_len=512, gen_len=512)
    result = mcmc_search(calls, Hardware(num_nodes=2), steps=5000, seed=0)
    for name, alloc in result.plan.items(): print(name, alloc)
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import dataclass, field

from reallocation.estimator import (
    GENERATE, INFERENCE, TRAIN, Allocation, Call, Hardware, active_memory, estimate_time, fits, realloc_time,
    static_memory,
)
from reallocation.layout import Layout, ModelSpec

Plan = dict[str, Allocation]


def ppo_calls(actor: ModelSpec, critic: ModelSpec, *, batch: int, prompt_len: int, gen_len: int,
              reward: ModelSpec | None = None) -> list[Call]:
    """The six calls of one PPO iteration (reward model defaults to the critic's shape)."""
    reward = reward or critic
    common = dict(batch=batch, prompt_len=prompt_len, gen_len=gen_len)
    return [
        Call("actor_gen", "actor", GENERATE, actor, **common),
        Call("rew_inf", "reward", INFERENCE, reward, deps=("actor_gen",), **common),
        Call("ref_inf", "ref", INFERENCE, actor, deps=("actor_gen",), **common),
        Call("critic_inf", "critic", INFERENCE, critic, deps=("actor_gen",), **common),
        Call("actor_train", "actor", TRAIN, actor, deps=("rew_inf", "ref_inf", "critic_inf"), **common),
        Call("critic_train", "critic", TRAIN, critic, deps=("rew_inf", "ref_inf", "critic_inf"), **common),
    ]


def device_meshes(hw: Hardware) -> list[tuple[int, int]]:
    """(first GPU, size): aligned power-of-two blocks inside a node, or runs of whole nodes."""
    meshes = []
    size = 1
    while size <= hw.gpus_per_node:
        for node in range(hw.num_nodes):
            for first in range(0, hw.gpus_per_node, size):
                meshes.append((node * hw.gpus_per_node + first, size))
        size *= 2
    for num in range(2, hw.num_nodes + 1):
        for node in range(hw.num_nodes - num + 1):
            meshes.append((node * hw.gpus_per_node, num * hw.gpus_per_node))
    return meshes


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(call: Call, hw: Hardware, max_per_call: int = 64) -> list[Allocation]:
    """Feasible allocations for ``call``, fastest first."""
    spec = call.spec
    out = []
    for first, size in device_meshes(hw):
        for tp in _divisors(size):
            # TP stays inside a node and must split heads (and kv heads, or replicate them).
            kv_ok = spec.num_kv_heads % tp == 0 or tp % spec.num_kv_heads == 0
            if tp > hw.gpus_per_node or spec.num_heads % tp or not kv_ok:
                continue
            for pp in _divisors(size // tp):
                dp = size // (tp * pp)
                if pp > spec.num_layers or call.batch < dp:
                    continue
                layout = Layout(pp=pp, tp=tp, fsdp=dp) if call.kind == TRAIN else Layout(pp=pp, tp=tp, dp=dp)
                alloc = Allocation(first, size, layout)
                if fits(call, alloc, hw):
                    out.append(alloc)
    out.sort(key=lambda a: (estimate_time(call, a, hw), a.size, a.first))
    return out[:max_per_call]


@dataclass
class Simulation:
    seconds_per_iteration: float
    peak_memory_bytes: float  # the fullest GPU's resident + largest active memory
    realloc_seconds: float  # per iteration, summed over reallocations
    feasible: bool


def simulate(calls: list[Call], plan: Plan, hw: Hardware, num_iterations: int = 3) -> Simulation:
    """List-schedule ``num_iterations`` iterations of the graph under ``plan``."""
    by_name = {c.name: c for c in calls}
    gpu_free = defaultdict(float)  # GPU -> time it becomes free
    # model -> allocations holding the latest parameters (all of them before the first update;
    # a training call leaves only its own, and others must receive the update before use).
    fresh: dict[str, set[Allocation]] = {}
    end: dict[tuple[int, str], float] = {}
    realloc_total = 0.0
    order = _topological(calls)
    for it in range(num_iterations):
        for name in order:
            call, alloc = by_name[name], plan[name]
            ready = max([end[it, d] for d in call.deps] + [end.get((it - 1, name), 0.0)])
            start = max([ready] + [gpu_free[g] for g in alloc.gpus])
            holders = fresh.get(call.model)
            if holders is not None and alloc not in holders:
                src = min(holders, key=lambda a: (realloc_time(call.spec, a, alloc, hw), a.first, a.size))
                moved = realloc_time(call.spec, src, alloc, hw)
                start = max([start] + [gpu_free[g] for g in src.gpus]) + moved
                realloc_total += moved
                for g in src.gpus:
                    gpu_free[g] = max(gpu_free[g], start)
                holders.add(alloc)
            finish = start + estimate_time(call, alloc, hw)
            for g in alloc.gpus:
                gpu_free[g] = finish
            end[it, name] = finish
            if call.kind == TRAIN:
                fresh[call.model] = {alloc}
    # Memory: every (model, allocation) pair keeps its weights resident (ReaL keeps training
    # parameters and the generation copy); active memory is one call at a time per GPU.
    resident = defaultdict(float)
    active = defaultdict(float)
    seen = set()
    for call in calls:
        alloc = plan[call.name]
        key = (call.model, alloc, call.kind == TRAIN)
        for g in alloc.gpus:
            if key not in seen:
                resident[g] += static_memory(call, alloc)
            active[g] = max(active[g], active_memory(call, alloc))
        seen.add(key)
    peak = max(resident[g] + active[g] for g in set(resident) | set(active))
    total = max(end.values()) / num_iterations
    return Simulation(total, peak, realloc_total / num_iterations, peak <= hw.gpu_memory_bytes)


def _topological(calls: list[Call]) -> list[str]:
    done: list[str] = []
    pending = [c.name for c in calls]
    deps = {c.name: set(c.deps) for c in calls}
    while pending:
        ready = [n for n in pending if deps[n] <= set(done)]
        if not ready:
            raise ValueError(f"dependency cycle among {pending}")
        done.extend(ready)
        pending = [n for n in pending if n not in ready]
    return done


def cost(calls: list[Call], plan: Plan, hw: Hardware) -> float:
    sim = simulate(calls, plan, hw)
    return sim.seconds_per_iteration * (1 if sim.feasible else 3)


def heuristic_plan(calls: list[Call], hw: Hardware) -> Plan:
    """Every call on all GPUs (the colocated layout of most RLHF systems): the smallest TP that
    fits, the rest data parallel (FSDP for training)."""
    plan = {}
    for call in calls:
        options = [a for a in candidates(call, hw, max_per_call=10_000) if a.size == hw.num_gpus and a.layout.pp == 1]
        if not options:
            raise ValueError(f"{call.name} does not fit on all {hw.num_gpus} GPUs")
        plan[call.name] = min(options, key=lambda a: a.layout.tp)
    return plan


@dataclass
class SearchResult:
    plan: Plan
    cost: float
    simulation: Simulation
    initial_cost: float
    history: list[float] = field(default_factory=list)  # best cost after each accepted improvement


def mcmc_search(calls: list[Call], hw: Hardware, *, steps: int = 2000, beta: float = 20.0, seed: int = 0,
                max_per_call: int = 64, start: Plan | None = None) -> SearchResult:
    """Metropolis search over plans (one candidate per call)."""
    rng = random.Random(seed)
    options = {c.name: candidates(c, hw, max_per_call) for c in calls}
    empty = [n for n, o in options.items() if not o]
    if empty:
        raise ValueError(f"no allocation fits for {empty}")
    current = dict(start) if start else {n: o[0] for n, o in options.items()}
    current_cost = cost(calls, current, hw)
    best, best_cost = dict(current), current_cost
    history = [best_cost]
    names = [c.name for c in calls]
    for _ in range(steps):
        name = rng.choice(names)
        proposal = dict(current)
        proposal[name] = rng.choice(options[name])
        proposal_cost = cost(calls, proposal, hw)
        worse = (proposal_cost - current_cost) / current_cost
        if worse <= 0 or rng.random() < math.exp(-beta * worse):
            current, current_cost = proposal, proposal_cost
            if current_cost < best_cost:
                best, best_cost = dict(current), current_cost
                history.append(best_cost)
    return SearchResult(best, best_cost, simulate(calls, best, hw), history[0], history)
