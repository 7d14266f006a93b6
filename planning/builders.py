"""Plan builders, each returning an ``ExecutionPlan`` like the search's result. Two families:

realm's own rules, what ``cluster.plan`` runs when it does not search (``trainer.plan_select``):

- ``realm_heuristic_plan`` (``cluster.plan=heuristic``, the GPU clusters' default): a fixed rule that fits any
  cluster shape, in layouts the runtime runs, data parallel only. Generation on every device, one vLLM
  replica each; on one node every other call on every device too, on several the actor's side
  (training, reference) on the first half of the nodes and the critic's side (critic, reward model) on
  the rest. On GPUs training checkpoints activations, training and inference use micro-batches of at
  most ``TOKENS_PER_MICROBATCH`` tokens per device, generation runs in waves whose KV cache fits
  ``KV_BYTES_PER_DEVICE``, and the frozen models leave the GPU between calls (offload); then
  ``fit_microbatches`` adds micro-batches until the cost model's fullest device fits.
- ``realm_disjoint_plan`` (``cluster.plan=disjoint``): each role on its own devices.

The ReaL paper's baselines, which the search and ``bench/plan_search.py`` compare against:

- ``real_heuristic_plan``: ReaL's own heuristic, the rule of ``PPOConfig._heuristic_rpc_allocation`` in
  openpsi-project/ReaLHF, realhf/experiments/common/ppo_exp.py (HEAD be75fce9), re-implemented here:
  generation on all GPUs with pp = max(2, nodes), tp = 1; reference inference on all GPUs with
  dp = 2, pp = nodes, tp = 4. One node: actor training on GPUs 0-3 and critic training on 4-7, each
  dp 2 x tp 2 (<= 7B) or tp 4; reward inference on 0-3 and critic inference on 4-7, dp 2 x tp 2.
  Several nodes: actor training on the first ``min(ceil(nodes * a / (a + c)), nodes - 1)`` nodes
  (a, c = actor / critic size) and critic training on the rest, each dp 2 x pp (its nodes) x tp 4;
  reward inference on the first ``ceil(nodes / 2)`` nodes and critic inference on the rest, dp 2 x
  pp x tp 4.
  A critic-free algorithm (no critic calls; ReaL's rule has none) gives actor training and reward inference
  every GPU, with the actor-training and reward tp above on one node and dp 2 x pp (nodes) x tp 4 on several,
  and drops reference inference without a KL term.
  Adaptations, because realm's plan format and runtime need them: ReaL asserts 8 GPUs per node
  (here 8 becomes ``gpus_per_node`` and 4 becomes ``min(4, gpus_per_node)``); ReaL allows
  pipeline stages of unequal depth, realm needs pp to divide the layers, so pp drops to the
  largest such divisor and dp grows to keep the mesh; tp drops (dp grows) when it would not divide
  the heads; the rule sets no micro-batches or checkpointing, so each call gets the fastest
  micro-batch count and checkpointing with which it fits on its GPUs alone.
- ``symmetric_plan``: DeepSpeed-Chat style: every call on all GPUs with one strategy (pp 1, the same tp
  for every call, the rest data parallel / ZeRO-3 shards); the fastest tp that fits.
- ``openrlhf_disjoint_plan``: OpenRLHF style: generation, actor training, critic (training and inference),
  reference and reward each on their own GPU group; the best split of the cluster into
  power-of-two groups, each call with its fastest fitting strategy on its group.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from planning.candidates import MICROBATCHES, seconds, strategies
from planning.config import ClusterConfig
from planning.estimator import Hardware, PlanCost, Workload, _estimate, evaluator
from planning.execution_plan import CALL_KIND, CALL_MODEL, TRAIN, CallAllocation, ExecutionPlan, PlanError, graph_calls
from planning.shapes import size_in_billions
from reallocation.layout import ModelSpec

TOKENS_PER_MICROBATCH = 16384
"""Heuristic: training and inference micro-batches of at most this many tokens per GPU."""
KV_BYTES_PER_DEVICE = 16 << 30
"""Heuristic: generation runs in waves (micro-batches) whose full-length bf16 KV cache fits this per GPU."""
BASELINES = ("real_heuristic", "symmetric", "disjoint")


def _best_knobs(
    call: str, devices: tuple[int, ...], pp: int, dp: int, tp: int, w: Workload, hw: Hardware
) -> CallAllocation:
    """The rule's allocation with the fastest micro-batch count and checkpointing that fit alone;
    the most memory-frugal one when nothing fits (the plan is then reported as not fitting)."""
    ev = evaluator(w, hw)
    fitting, tried = [], []
    for ckpt in (False, True) if CALL_KIND[call] == TRAIN else (False,):
        for mb in MICROBATCHES:
            if dp * mb > w.batch and mb > 1:
                break
            alloc = CallAllocation(devices, pp, dp, tp, mb, ckpt)
            if ev.fits_alone(call, alloc):
                fitting.append((ev.seconds(call, alloc), mb, ckpt, alloc))
            tried.append((sum(ev.facts(call, alloc)[1:]), mb, ckpt, alloc))
    return min(fitting)[-1] if fitting else min(tried)[-1]


def _adapt(call: str, devices: tuple[int, ...], pp: int, tp: int, w: Workload, hw: Hardware) -> CallAllocation:
    """ReaL's (pp, tp) on ``devices``, with pp and tp lowered until realm can run them."""
    spec, size = w.spec(call), len(devices)
    while tp > 1 and (tp > size or spec.num_heads % tp or (spec.num_kv_heads % tp and tp % spec.num_kv_heads)):
        tp //= 2
    pp = max(p for p in range(1, pp + 1) if spec.num_layers % p == 0 and (size // tp) % p == 0)
    return _best_knobs(call, devices, pp, size // (pp * tp), tp, w, hw)


def real_heuristic_plan(w: Workload, hw: Hardware) -> ExecutionPlan:
    """ReaL's heuristic plan (see the module docstring for the rule and its adaptations)."""
    n, g = hw.num_nodes, hw.gpus_per_node
    every = tuple(range(n * g))
    tp4 = min(4, g)
    calls = {"actor_gen": _adapt("actor_gen", every, max(2, n), 1, w, hw)}
    if w.reference:
        calls["ref_inf"] = _adapt("ref_inf", every, n, tp4, w, hw)
    if w.critic is None:  # a critic-free algorithm: actor training takes the critic's half too
        train_tp = min(2, g) if size_in_billions(w.actor) <= 7.5 else tp4
        calls["actor_train"] = _adapt("actor_train", every, n, train_tp if n == 1 else tp4, w, hw)
        if w.reward is not None:
            calls["rew_inf"] = _adapt("rew_inf", every, n, min(2, g) if n == 1 else tp4, w, hw)
    elif n == 1:
        first, second = tuple(range(g // 2 or 1)), tuple(range(g // 2, g)) or (0,)
        for call, spec, devices in (("actor_train", w.actor, first), ("critic_train", w.critic, second)):
            calls[call] = _adapt(call, devices, 1, min(2, g) if size_in_billions(spec) <= 7.5 else tp4, w, hw)
        if w.reward is not None:
            calls["rew_inf"] = _adapt("rew_inf", first, 1, min(2, g), w, hw)
        calls["critic_inf"] = _adapt("critic_inf", second, 1, min(2, g), w, hw)
    else:
        a, c = size_in_billions(w.actor), size_in_billions(w.critic)
        actor_nodes = min(math.ceil(n * a / (a + c)), n - 1)
        reward_nodes = math.ceil(n / 2)
        for call, lo, hi in (
            ("actor_train", 0, actor_nodes),
            ("critic_train", actor_nodes, n),
            ("rew_inf", 0, reward_nodes),
            ("critic_inf", reward_nodes, n),
        ):
            if call == "rew_inf" and w.reward is None:
                continue
            calls[call] = _adapt(call, tuple(range(lo * g, hi * g)), hi - lo, tp4, w, hw)
    return ExecutionPlan(n, g, calls, source="real_heuristic")


# Knob variants a baseline tries: every call (or only the frozen ref/reward calls) takes its
# fastest option needing at most this fraction of a GPU's memory on its own.
VARIANTS = tuple((f, frozen_only) for f in (1.0, 0.75, 0.5, 0.35, 0.25, 0.15) for frozen_only in (False, True))


def _pick(
    call: str, options: list[CallAllocation], variant: tuple[float, bool], w: Workload, hw: Hardware
) -> CallAllocation:
    """The fastest option within the variant's memory share (the most frugal when none is)."""
    fraction, frozen_only = variant
    if frozen_only and call not in ("ref_inf", "rew_inf"):
        return options[0]
    ev = evaluator(w, hw)
    budget = fraction * hw.usable_memory_bytes
    for a in options:  # fastest first
        if sum(ev.facts(call, a)[1:]) <= budget:
            return a
    return min(options, key=lambda a: (sum(ev.facts(call, a)[1:]), ev.seconds(call, a)))


def _best_of(candidate_plans: list[ExecutionPlan], w: Workload, hw: Hardware) -> ExecutionPlan | None:
    """The fastest plan that fits, else the one with the smallest overflow."""
    best = None
    for plan in candidate_plans:
        cost = _estimate(tuple((c, plan.calls[c]) for c in w.calls), w, hw)
        key = (not cost.fits, cost.seconds_per_iteration if cost.fits else cost.overflow_bytes)
        if best is None or key < best[0]:
            best = (key, plan)
    return None if best is None else best[1]


def symmetric_plan(w: Workload, hw: Hardware) -> ExecutionPlan:
    """DeepSpeed-Chat style: all calls on all GPUs, one tp for all, pp 1; the fastest that fits
    (knobs per call from ``VARIANTS``)."""
    every = tuple(range(hw.num_gpus))
    plans = []
    for tp in (t for t in range(1, hw.gpus_per_node + 1) if hw.num_gpus % t == 0):
        options = {call: strategies(call, every, w, hw, pp_one=True, tp=tp) for call in w.calls}
        if all(options.values()):
            for variant in VARIANTS:
                calls = {c: _pick(c, options[c], variant, w, hw) for c in w.calls}
                plans.append(ExecutionPlan(hw.num_nodes, hw.gpus_per_node, calls, source="symmetric"))
    best = _best_of(plans, w, hw)
    if best is None:  # nothing fits even alone: tp 1, most frugal knobs, reported as oom
        calls = {c: _best_knobs(c, every, 1, hw.num_gpus, 1, w, hw) for c in w.calls}
        return ExecutionPlan(hw.num_nodes, hw.gpus_per_node, calls, source="symmetric")
    return best


GROUPS = ("gen", "actor", "critic", "ref", "reward")
GROUP_CALLS = {
    "gen": ("actor_gen",),
    "actor": ("actor_train",),
    "critic": ("critic_train", "critic_inf"),
    "ref": ("ref_inf",),
    "reward": ("rew_inf",),
}


def _group_sizes(num_gpus: int, num_groups: int) -> list[tuple[int, ...]]:
    """Ordered tuples of powers of two summing to ``num_gpus``."""
    powers = [1 << k for k in range(num_gpus.bit_length()) if (1 << k) <= num_gpus]
    return [s for s in itertools.product(powers, repeat=num_groups) if sum(s) == num_gpus]


def openrlhf_disjoint_plan(w: Workload, hw: Hardware) -> ExecutionPlan:
    """OpenRLHF style: one GPU group per model role (generation apart from actor training)."""
    groups = [g for g in GROUPS if all(c in w.calls for c in GROUP_CALLS[g])]
    plans = []
    for sizes in _group_sizes(hw.num_gpus, len(groups)):
        # Largest groups first keeps every group aligned (powers of two, sorted descending).
        order = sorted(range(len(groups)), key=lambda i: -sizes[i])
        start, meshes = 0, {}
        for i in order:
            meshes[groups[i]] = tuple(range(start, start + sizes[i]))
            start += sizes[i]
        if any(len(m) > hw.gpus_per_node and len(m) % hw.gpus_per_node for m in meshes.values()):
            continue
        options = {call: strategies(call, mesh, w, hw) for group, mesh in meshes.items() for call in GROUP_CALLS[group]}
        if all(options.values()):
            for variant in VARIANTS:
                calls = {c: _pick(c, options[c], variant, w, hw) for c in w.calls}
                plans.append(ExecutionPlan(hw.num_nodes, hw.gpus_per_node, calls, source="disjoint"))
    best = _best_of(plans, w, hw)
    if best is None:
        raise ValueError(f"disjoint: no split of {hw.num_gpus} GPUs gives every call a fitting allocation")
    return best


def baselines(w: Workload, hw: Hardware) -> dict[str, tuple[ExecutionPlan | None, PlanCost | None]]:
    """Every baseline's plan and cost; ``(None, None)`` when a baseline cannot even be built."""
    out: dict[str, tuple[ExecutionPlan | None, PlanCost | None]] = {}
    for name, build in (
        ("real_heuristic", real_heuristic_plan),
        ("symmetric", symmetric_plan),
        ("disjoint", openrlhf_disjoint_plan),
    ):
        try:
            plan = build(w, hw)
        except ValueError:
            out[name] = (None, None)
            continue
        out[name] = (plan, _estimate(tuple((c, plan.calls[c]) for c in w.calls), w, hw))
    return out


# ----------------------------------------------------------------------------------------------- realm's rules


def _microbatches(rows_per_replica: int, seq_len: int, on_gpu: bool) -> int:
    """Power of two giving <= TOKENS_PER_MICROBATCH tokens per micro-batch (1 on CPU), <= the rows."""
    if not on_gpu or rows_per_replica <= 1:
        return 1
    need = math.ceil(rows_per_replica * seq_len / TOKENS_PER_MICROBATCH)
    return min(1 << max(0, need - 1).bit_length(), rows_per_replica)


def _generation_waves(spec: ModelSpec, tp: int, rows_per_replica: int, seq_len: int, on_gpu: bool) -> int:
    """Power of two of waves so that one wave's KV cache (K and V, bf16, every layer, full length)
    fits KV_BYTES_PER_DEVICE; 1 on CPU. Qwen2.5-Math-7B at tp 1 (4 kv heads): 2 * 4 * 128 * 2 B *
    28 layers = 56 KiB per token, 117 MB per 2048-token sequence, 146 sequences per wave."""
    if not on_gpu or rows_per_replica <= 1:
        return 1
    kv_heads = max(1, spec.num_kv_heads // tp)
    per_sequence = 2 * kv_heads * spec.head_dim * 2 * spec.num_layers * seq_len
    need = math.ceil(rows_per_replica * per_sequence / KV_BYTES_PER_DEVICE)
    return min(1 << max(0, need - 1).bit_length(), rows_per_replica)


def realm_heuristic_plan(
    cluster: ClusterConfig, specs: dict[str, ModelSpec], *, rows: int, seq_len: int
) -> ExecutionPlan:
    """The fixed rule of the module docstring; ``rows`` sequences of ``seq_len`` tokens per iteration.

    One node: every call on every device. Two or more: generation still on every device, but the
    actor's side (actor training, reference) on the first half of the nodes and the critic's side
    (critic inference and training, reward model) on the rest, so that the two sides run at the
    same time and no FSDP group pays the inter-node link. A critic-free algorithm has no critic's side to
    run beside actor training: every call on every device. Calls of the algorithm's graph only
    (``graph_calls``: ``specs`` has the models it has).
    """
    n, gpu, per_node = cluster.num_devices, cluster.uses_gpus, cluster.devices_per_node
    everything = tuple(range(n))
    if cluster.num_nodes >= 2 and "critic" in specs:
        split = (cluster.num_nodes + 1) // 2 * per_node
        actor_side, critic_side = everything[:split], everything[split:]
    else:
        actor_side = critic_side = everything
    mesh = {
        "actor_gen": everything,
        "ref_inf": actor_side,
        "actor_train": actor_side,
        "critic_inf": critic_side,
        "critic_train": critic_side,
        "rew_inf": critic_side,
    }

    def allocation(call: str, spec: ModelSpec) -> CallAllocation:
        devices, train = mesh[call], call.endswith("_train")
        dp = len(devices)
        waves = (
            _generation_waves(spec, 1, rows // dp, seq_len, gpu)
            if call == "actor_gen"
            else _microbatches(rows // dp, seq_len, gpu)
        )
        return CallAllocation(
            devices=devices,
            dp=dp,
            num_microbatches=waves,
            activation_checkpointing=train and gpu,
            offload=call in ("ref_inf", "rew_inf") and gpu,
        )

    calls: dict[str, CallAllocation] = {c: allocation(c, specs[CALL_MODEL[c]]) for c in graph_calls(specs)}
    return ExecutionPlan(cluster.num_nodes, per_node, calls, source="heuristic")


def fit_microbatches(plan: ExecutionPlan, w: Workload, hw: Hardware) -> ExecutionPlan:
    """``plan`` with more micro-batches (generation: waves) until the cost model's fullest device
    fits ``hw``'s memory: each round doubles the call with the most active memory on the fullest
    device (resident state does not shrink with micro-batches). Stops when it fits or when every
    call there is down to one row per micro-batch (the dry run then warns).

    Why: one micro-batch per call is fastest on CPU, but its logits are rows x new tokens x vocabulary
    floats: SmolLM2-135M (49,152 tokens) at 32 rows x 257 columns per device is 1.6 GB per copy, and
    the heuristic's 1-micro-batch plan ran a 24 GiB machine out of memory. The tiny model's plans
    already fit and keep one.
    """
    from planning.estimator import call_memory, estimate_plan

    calls = dict(plan.calls)
    while True:
        cost = estimate_plan(replace(plan, calls=calls), w, hw)
        if cost.fits:
            break
        fullest = max(cost.peak_bytes_per_device, key=lambda d: cost.peak_bytes_per_device[d])
        splittable = [
            (call_memory(c, w.spec(c), a, w)[1], c)
            for c, a in calls.items()
            if fullest in a.devices and a.num_microbatches < w.batch // a.dp
        ]
        if not splittable:
            break
        _, call = max(splittable)
        calls[call] = replace(calls[call], num_microbatches=2 * calls[call].num_microbatches)
    return replace(plan, calls=calls)


def realm_disjoint_plan(cluster: ClusterConfig, specs: dict[str, ModelSpec]) -> ExecutionPlan:
    """Each role on its own devices: generation, actor training, critic (inference + training), reference,
    reward model (those the algorithm's graph has). Equal shares, the rest to
    generation; raises PlanError when the cluster has fewer devices than roles."""
    present = graph_calls(specs)
    roles = [
        role
        for role in [("actor_gen",), ("actor_train",), ("critic_inf", "critic_train"), ("ref_inf",), ("rew_inf",)]
        if role[0] in present
    ]
    n = cluster.num_devices
    if n < len(roles):
        raise PlanError(
            f"cluster.plan=disjoint: {len(roles)} roles need {len(roles)} devices, the cluster has {n} "
            f"(cluster.num_nodes={cluster.num_nodes} x cluster.devices_per_node={cluster.devices_per_node})"
        )
    share = n // len(roles)
    sizes = [share + n - share * len(roles)] + [share] * (len(roles) - 1)
    calls, first = {}, 0
    for role, size in zip(roles, sizes):
        devices = tuple(range(first, first + size))
        first += size
        for call in role:
            calls[call] = CallAllocation(devices=devices, dp=size)
    return ExecutionPlan(cluster.num_nodes, cluster.devices_per_node, calls, source="disjoint")


__all__ = [
    "BASELINES",
    "baselines",
    "fit_microbatches",
    "openrlhf_disjoint_plan",
    "real_heuristic_plan",
    "realm_disjoint_plan",
    "realm_heuristic_plan",
    "seconds",
    "symmetric_plan",
]
