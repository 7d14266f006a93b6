"""Execution-plan cost model (ReaL-style): time and memory of each PPO call under a
``CallAllocation``, the cost of moving parameters between two allocations, and a whole plan's
iteration (``estimate_plan``; ``iteration_schedule`` gives each call's predicted start and end).

The per-call model is analytic unless ``Hardware.profile`` holds measured per-layer costs
(``planning.profile``); see ../shared/reference/real-reallocation.md §4 for what ReaL profiles.

- compute: ``2 * N * tokens`` FLOPs per forward, x3 for training (x4 with activation
  checkpointing: the forward runs again in the backward), at ``mfu`` of peak, lower when a
  micro-batch gives a GPU few tokens; pipeline bubble ``(pp - 1 + mb) / mb``; a call's ``mb``
  micro-batches split its whole batch (the runtime cuts each PPO minibatch into its share of them);
- tensor parallel: two ring all-reduces of the activations per layer and pass, plus a latency
  each, over a pipeline stage's ``num_layers / pp`` layers for each micro-batch;
- pipeline sends: only the fill (and, for gradients, the drain) pays them, ``pp - 1`` hops of one
  micro-batch per flush; the others overlap with compute;
- FSDP (training ``dp``, and forwards on training shards): each micro-batch all-gathers the
  weights for forward and backward and the step reduce-scatters the gradients, overlapped with
  compute (time = max of the two);
- generation (``_generate_seconds``): a replica's sequences in ``num_microbatches`` groups,
  ``min(num_microbatches, pp)`` of them in flight at once (vLLM's pipeline engine keeps at most pp
  batches in flight), ReaL's generate schedule of ``gen_len * max(g, pp) + g - 1`` pipeline slots
  per wave of g groups, each slot one stage's 1/pp share of the model's work on one group; prefill is
  compute bound; a decode step reads the local weights and KV cache or computes, whichever is slower;
- memory per GPU (``call_memory``): resident bytes (training: bf16 weights + fp32 master, grads,
  Adam = 18 B/param over FSDP, 16 in a float32 run; frozen ref/reward weights unless ``offload``;
  every value in ``Workload.value_bytes``, the run's compute dtype) and active bytes
  (activations, or full-layer inputs only with checkpointing, logits, KV cache, and the
  call's own copy of a trainable model's weights);
- offload: frozen weights return from host memory before each call (``host_bytes_per_s``);
- reallocation (``realloc_seconds``), from the training shards to actor_gen's engines and to
  critic_inf's own replicas, after each training call: every destination GPU gets the bytes it
  lacks from a holder on its own node when one exists; a node without one pulls each byte across
  the NIC once and passes it on to its GPUs that need the same box; a sender pays for every
  destination it serves inside a node (fan-out); the busiest GPU link plus the busiest node link
  set the time;
- the iteration: its calls list-scheduled by readiness, the rule the runtime dispatches by
  (``planning.schedule``);
- what a run computes: time at the run's longest prompt (``Workload.longest_prompt``: the runtime
  trims padding to each micro-batch's longest row), memory at the configured prompt length;
- on a CPU machine (a profile's ``num_cores``, ``call_overhead_s``, ``step_overhead_s``): every call
  pays the measured fixed cost of an empty call and every optimizer step that of an empty step; the
  devices share the machine's cores, so a call on more devices than cores takes devices / cores times
  as long, and an iteration at least its device-seconds over the cores.

Numbers are for ranking plans, not for predicting wall time to the second.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from planning.config import MEMORY_UTILIZATION
from planning.execution_plan import (
    CALL_KIND,
    CALL_MODEL,
    GENERATE,
    INFERENCE,
    TRAIN,
    CallAllocation,
    ExecutionPlan,
    graph_calls,
)
from planning.schedule import CALL_ORDER, list_schedule
from reallocation.layout import ROW, ModelSpec

if TYPE_CHECKING:
    from planning.lifecycle import Inputs, MemoryLifecycle

BYTES = 2  # bf16 weights, activations and KV cache (``Workload.value_bytes``'s default)
TRAIN_STATE_BYTES = 16  # float32 weights, gradients, Adam m and v, per parameter (planning.lifecycle)


@dataclass(frozen=True)
class Hardware:
    """A cluster of identical nodes. Defaults: 8x A100-80GB nodes (NVLink, 200 Gb/s between nodes)."""

    num_nodes: int = 1
    gpus_per_node: int = 8
    gpu_memory_bytes: float = 80 << 30
    peak_flops: float = 312e12  # bf16 dense
    mfu: float = 0.45  # fraction of peak reached by large matmuls
    hbm_bytes_per_s: float = 1.6e12
    intra_node_bytes_per_s: float = 150e9  # per GPU, NVLink
    inter_node_bytes_per_s: float = 25e9  # per node, 200 Gb/s
    host_bytes_per_s: float = 20e9  # PCIe, for offloaded weights
    collective_latency_s: float = 20e-6  # one small all-reduce
    half_efficiency_tokens: float = 128.0  # tokens per GPU per micro-batch at which matmuls run at half mfu
    name: str = "a100-80g"
    profile: object | None = field(default=None, compare=False, hash=False)  # planning.profile.Profile
    num_cores: int | None = None
    """Compute units every device of the machine shares (a CPU machine's cores, from the profile); None:
    each device computes on its own (GPUs). An iteration then takes at least its device-seconds over
    the cores."""
    call_overhead_s: float = 0.0
    """Seconds every call pays whatever its batch: the driver's dispatch, Ray's scheduling and
    serialization, the device process's dispatch (on CPU from the profile, measured by
    ``bench/empty_calls.py``; 0 in the GPU presets, where it is small against a call and not measured)."""
    step_overhead_s: float = 0.0
    """Seconds each optimizer step of a training call pays whatever its batch beyond the Adam arithmetic
    the profile prices: FSDP's gradient reduce-scatter and the optimizer's per-parameter dispatch over
    DTensors (as ``call_overhead_s``: on CPU from the profile, 0 in the GPU presets)."""

    memory_margin_bytes: float = 0.0
    """Device memory a plan leaves free (``hardware``: ``cluster.memory_utilization``'s share of
    ``gpu_memory_bytes``, or more where less was free at start): the allocator's fragmentation and what the
    lifecycle does not price."""

    @property
    def usable_memory_bytes(self) -> float:
        """What a plan may fill on each device: ``gpu_memory_bytes - memory_margin_bytes``."""
        return self.gpu_memory_bytes - self.memory_margin_bytes

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


# Published specs (bf16 dense peak, HBM, NVLink per GPU one way, node NIC); mfu is an assumption.
HARDWARE: dict[str, dict[str, Any]] = {
    "a100-80g": dict(
        gpu_memory_bytes=80 << 30,
        peak_flops=312e12,
        hbm_bytes_per_s=2.0e12,
        intra_node_bytes_per_s=300e9,
        inter_node_bytes_per_s=25e9,
    ),
    "h100": dict(
        gpu_memory_bytes=80 << 30,
        peak_flops=989e12,
        hbm_bytes_per_s=3.35e12,
        intra_node_bytes_per_s=450e9,
        inter_node_bytes_per_s=50e9,
    ),
    "h200": dict(
        gpu_memory_bytes=141 << 30,
        peak_flops=989e12,
        hbm_bytes_per_s=4.8e12,
        intra_node_bytes_per_s=450e9,
        inter_node_bytes_per_s=50e9,
    ),
    # A 2-core CPU "device" with gloo: only meaningful with a measured profile.
    "cpu": dict(
        gpu_memory_bytes=8 << 30,
        peak_flops=50e9,
        mfu=0.5,
        hbm_bytes_per_s=10e9,
        intra_node_bytes_per_s=2e9,
        inter_node_bytes_per_s=1e9,
        host_bytes_per_s=10e9,
        collective_latency_s=100e-6,
        half_efficiency_tokens=16.0,
    ),
}


def hardware(
    name: str,
    num_nodes: int,
    gpus_per_node: int,
    profile: object | None = None,
    *,
    memory_utilization: float = MEMORY_UTILIZATION,
    device_memory: tuple[float, float] | None = None,
) -> Hardware:
    """``"a100-80g" | "h100" | "h200" | "cpu"`` with the given cluster shape. A plan may fill
    ``memory_utilization`` of each device's memory: the preset's, or with ``device_memory``, ``(free, total)``
    bytes read from the devices at start (``torch.cuda.mem_get_info``), the total's share and at most
    what was free. Example: an H100 preset of 80 GiB at 0.9 leaves a margin of 8 GiB, 72 GiB usable;
    measured (70, 79.2) GiB at 0.9 leaves 70 usable (margin 9.2)."""
    if name not in HARDWARE:
        raise ValueError(f"unknown GPU {name!r}: expected one of {sorted(HARDWARE)}")
    if num_nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"need num_nodes >= 1 and gpus_per_node >= 1, got {num_nodes} x {gpus_per_node}")
    preset = dict(HARDWARE[name])
    if device_memory is not None:
        preset["gpu_memory_bytes"] = device_memory[1]
    usable = memory_utilization * preset["gpu_memory_bytes"]
    if device_memory is not None:
        usable = min(usable, device_memory[0])
    margin = preset["gpu_memory_bytes"] - usable
    hw = Hardware(
        num_nodes=num_nodes,
        gpus_per_node=gpus_per_node,
        name=name,
        profile=profile,
        memory_margin_bytes=margin,
        **preset,
    )
    if name == "cpu" and profile is not None:  # the profiled machine's cores and fixed per-call cost
        p: Any = profile
        hw = replace(hw, num_cores=p.num_cores, call_overhead_s=p.call_overhead_s, step_overhead_s=p.step_overhead_s)
    return hw


@dataclass(frozen=True)
class LayoutLimits:
    """Which layouts a plan may use, for a runtime that does not run them all (the search honours these;
    the default allows everything the cost model prices)."""

    pipeline_calls: tuple[str, ...] | None = None
    """The calls that may have pp > 1 (None: every call)."""
    generation_tp: bool = True
    """tp > 1 for actor_gen."""
    kv_replication: bool = True
    """tp that does not divide the kv heads in training and inference calls (k/v replicated across tp
    ranks, as vLLM does; generation, which vLLM runs, may always replicate)."""
    offload_sharded: bool = True
    """offload for a frozen replica sharded by TP or pipeline stages (realm's runtime offloads only
    whole replicas)."""


@dataclass(frozen=True)
class Workload:
    """One iteration: ``batch`` prompts of up to ``prompt_len`` tokens, ``gen_len`` generated each.
    The reference model has the actor's shape; ``reward`` is None for a rule-based reward; ``critic`` None for a
    critic-free algorithm and ``reference`` False for one without a KL term (their calls are then not in the
    iteration's dataflow graph, ``calls``).

    Memory is priced at ``prompt_len`` (a prompt may be that long); time at ``computed_prompt_len``,
    the prompt tokens the calls compute on."""

    actor: ModelSpec
    critic: ModelSpec | None
    reward: ModelSpec | None
    batch: int
    prompt_len: int
    gen_len: int
    limits: LayoutLimits = LayoutLimits()
    value_bytes: int = BYTES
    """Bytes of one weight, activation or KV-cache value in the run's compute dtype (4 for a float32
    run, as on CPU)."""
    num_epochs: int = 1
    """PPO epochs: training calls pass over the batch this many times."""
    num_minibatches: int = 1
    """Optimizer steps per epoch (each a pipeline flush)."""
    old_logprobs_pass: bool = False
    """The PPO ratio's old logprobs come from one more forward of the actor on actor training's
    layout (realm's runtime does this; ReaL takes them from generation): the call ``actor_inf``,
    scheduled after generation like the other inference calls."""

    longest_prompt: int | None = None
    """The longest prompt the run actually has, when known (its rendered training prompts): the runtime
    trims each micro-batch's padding to its longest row, so calls compute on this many prompt tokens,
    not ``prompt_len``. None: ``prompt_len``."""
    reference: bool = True
    """The algorithm has a KL term: a reference model and its ref_inf call."""
    engine_eager: bool = True
    """The vLLM engines run eagerly (``rollout.enforce_eager``); False: their CUDA graph pools are priced
    (``planning.lifecycle.engine_workspace_bytes``)."""

    @property
    def seq_len(self) -> int:
        """Tokens a sequence may hold (memory)."""
        return self.prompt_len + self.gen_len

    @property
    def computed_prompt_len(self) -> int:
        """Prompt tokens a call computes on (time)."""
        return min(self.prompt_len, self.longest_prompt) if self.longest_prompt else self.prompt_len

    @property
    def computed_seq_len(self) -> int:
        """Tokens per sequence a call computes on (time)."""
        return self.computed_prompt_len + self.gen_len

    @property
    def train_state_bytes(self) -> int:
        """Per trainable parameter while it trains: float32 weights, gradients and Adam's m and v
        (16 B), whatever the compute dtype: FSDP2 casts the weights to it per layer as it computes
        (``planning.lifecycle``: outside training the gradients are freed, 12 B)."""
        return TRAIN_STATE_BYTES

    @property
    def calls(self) -> tuple[str, ...]:
        """The calls of the iteration's dataflow graph (``planning.execution_plan.graph_calls``)."""
        return graph_calls(self.specs())

    def spec(self, call: str) -> ModelSpec:
        specs = self.specs()
        if CALL_MODEL[call] not in specs:
            raise ValueError(f"{call} is not in this workload's dataflow graph (no {CALL_MODEL[call]} model)")
        return specs[CALL_MODEL[call]]

    def specs(self) -> dict[str, ModelSpec]:
        out = {"actor": self.actor}
        if self.critic is not None:
            out["critic"] = self.critic
        if self.reference:
            out["ref"] = self.actor
        if self.reward is not None:
            out["reward"] = self.reward
        return out


def _efficiency(tokens_per_gpu: float, hw: Hardware) -> float:
    return hw.mfu * tokens_per_gpu / (tokens_per_gpu + hw.half_efficiency_tokens)


def _tp_link(alloc: CallAllocation, hw: Hardware) -> float:
    return hw.intra_node_bytes_per_s if alloc.tp <= hw.gpus_per_node else hw.inter_node_bytes_per_s / hw.gpus_per_node


def _dp_link(alloc: CallAllocation, hw: Hardware) -> float:
    """Per-GPU bandwidth of a data-parallel ring: NVLink inside a node, a share of the NIC across."""
    nodes = {d // hw.gpus_per_node for d in alloc.devices[: alloc.dp * alloc.tp]}
    return hw.intra_node_bytes_per_s if len(nodes) == 1 else hw.inter_node_bytes_per_s / hw.gpus_per_node


def _tp_comm(
    spec: ModelSpec,
    alloc: CallAllocation,
    tokens: float,
    num_collectives: int,
    hw: Hardware,
    value_bytes: int = BYTES,
) -> float:
    """One pipeline stage's ring all-reduces over ``tokens`` activations (one micro-batch):
    ``num_collectives`` per layer over the stage's ``num_layers / pp`` layers, each a bandwidth term
    and a latency."""
    if alloc.tp == 1:
        return 0.0
    volume = 2 * (alloc.tp - 1) / alloc.tp * tokens * spec.hidden_size * value_bytes
    return num_collectives * spec.num_layers / alloc.pp * (volume / _tp_link(alloc, hw) + hw.collective_latency_s)


def _pp_hop(spec: ModelSpec, alloc: CallAllocation, tokens: float, hw: Hardware, value_bytes: int) -> float:
    """One stage-to-stage send of ``tokens`` activations (each TP rank sends its 1/tp slice); 0 without stages."""
    if alloc.pp == 1:
        return 0.0
    one_node = (
        alloc.devices[0] // hw.gpus_per_node
        == alloc.devices[-1] // hw.gpus_per_node
        == min(alloc.devices) // hw.gpus_per_node
    )
    link = hw.intra_node_bytes_per_s if one_node else hw.inter_node_bytes_per_s / hw.gpus_per_node
    return tokens * spec.hidden_size * value_bytes / alloc.tp / link + hw.collective_latency_s


def _measured(
    op: str, spec: ModelSpec, tokens: float, alloc: CallAllocation, hw: Hardware, context: float = 0.0
) -> float:
    """Seconds of one layer (or the LM head, ``head_*`` ops) from ``hw.profile``."""
    return hw.profile.seconds(op, spec, tokens=tokens, context=context, tp=alloc.tp)  # type: ignore[attr-defined]


def call_seconds(
    call: str, spec: ModelSpec, alloc: CallAllocation, w: Workload, hw: Hardware, fsdp: bool | None = None
) -> float:
    """Seconds for ``call`` under ``alloc`` (reallocation and offload reloads excluded).

    A training call makes ``w.num_epochs`` passes over its batch, each in ``w.num_minibatches``
    optimizer steps (a pipeline flush after each). The old logprobs' forward (``w.old_logprobs_pass``)
    is a call of its own, ``actor_inf`` (``training_layout_forward_seconds``). ``fsdp``: whether training
    runs on FSDP2 shards, which sets the profile's host floors; None: as the runtime does, when dp > 1
    (True at dp = 1 prices FSDP2 at a world of 1, which ``bench/h200_step.py`` holds against a measurement).
    """
    kind = CALL_KIND[call]
    if kind == GENERATE:
        return _generate_seconds(spec, alloc, w, hw)
    if kind != TRAIN:
        return _passes_seconds(spec, alloc, w, hw, passes=1, flushes=1)
    n, mb, pp, dp, tp = spec.num_params(), alloc.num_microbatches, alloc.pp, alloc.dp, alloc.tp
    epochs, steps = w.num_epochs, w.num_epochs * w.num_minibatches
    passes, fsdp = (4 if alloc.activation_checkpointing else 3), (dp > 1 if fsdp is None else fsdp)
    t = epochs * _passes_seconds(spec, alloc, w, hw, passes=passes, flushes=w.num_minibatches, fsdp=fsdp)
    shard = n * w.value_bytes / (tp * pp)
    if dp > 1:  # all-gathers for each micro-batch's forward and backward, a reduce-scatter per step
        gathers = (2 * mb * epochs + steps) * (dp - 1) / dp * shard / _dp_link(alloc, hw)
        t = max(t, gathers) + hw.collective_latency_s * spec.num_layers * mb * epochs
    if hw.profile is not None:  # the measured Adam step of one unsharded layer, split by FSDP
        adam = _measured(_optimizer_op(alloc, hw), spec, 0, alloc, hw) * spec.num_layers
        t += steps * (adam / (pp * dp) + _step_floor(spec, alloc, hw, adam, fsdp))
    else:  # Adam reads and writes the fp32 state
        t += steps * 2 * n * (w.train_state_bytes - w.value_bytes) / (tp * pp * dp) / hw.hbm_bytes_per_s
    return t + steps * hw.step_overhead_s


def _optimizer_op(alloc: CallAllocation, hw: Hardware) -> str:
    """The profile's op for a training layout's AdamW step: the fused step (``common.optim.adamw``), or with
    tp > 1 the default path, which a layout of TP-sharded DTensors beside replicated plain tensors takes
    (``common.optim.fusable``: one fused call cannot take both kinds, nor DTensors of several meshes)."""
    if alloc.tp > 1 and hw.profile.has("optimizer_unfused"):  # type: ignore[attr-defined]
        return "optimizer_unfused"
    return "optimizer"


def _microbatch_floor(spec: ModelSpec, alloc: CallAllocation, hw: Hardware, passes: int, fsdp: bool) -> float:
    """The least seconds one pipeline stage's micro-batch takes, whatever its tokens: the host's time to
    run the model's Python and launch its kernels, which the device cannot outrun (the profile's whole-
    model floor, ``Profile.overhead``; 0 without one). A training micro-batch is a forward and backward
    (with activation checkpointing one more forward); a stage runs ``1 / pp`` of the layers.

    Worked example (``planning/profiles/h200.json``): a 1.5B policy micro-batch of 4 rows x 1024 tokens
    on one device computes for 0.099 s by the layer measurements but its host needs 0.119 s, so it takes
    0.119 s; 16 rows compute for 0.32 s, past the floor (measured 0.167 and 0.437 s a step,
    docs/gpu_measure/)."""
    profile: Any = hw.profile
    if profile is None or not getattr(profile, "overheads", None):
        return 0.0
    floor = profile.overhead("train" if passes > 1 else "forward", spec, fsdp=fsdp)
    if passes == 4:
        floor += profile.overhead("forward", spec, fsdp=fsdp)
    return floor / alloc.pp


def _step_floor(spec: ModelSpec, alloc: CallAllocation, hw: Hardware, adam: float, fsdp: bool) -> float:
    """Seconds an optimizer step pays beyond the Adam arithmetic the layer profile prices: gradient
    clipping, ``zero_grad`` and the host's per-parameter work, which FSDP does not divide (the profile's
    whole-model ``step`` at one rank minus ``adam``, the unsharded model's priced Adam; 0 without one)."""
    profile: Any = hw.profile
    if profile is None or not getattr(profile, "overheads", None):
        return 0.0
    return max(0.0, profile.overhead("step", spec, fsdp=fsdp) - adam) / alloc.pp


def training_layout_forward_seconds(spec: ModelSpec, alloc: CallAllocation, w: Workload, hw: Hardware) -> float:
    """A forward over the whole batch on a training call's shards (``actor_inf``, the old logprobs on
    actor_train's layout; ``critic_inf`` when it runs on critic_train's shards): the forward of an
    inference call, with FSDP's all-gather of the weights for each micro-batch overlapped with it."""
    t = _passes_seconds(spec, alloc, w, hw, passes=1, flushes=1, fsdp=alloc.dp > 1)
    if alloc.dp > 1:
        shard = spec.num_params() * w.value_bytes / (alloc.tp * alloc.pp)
        gathers = alloc.num_microbatches * (alloc.dp - 1) / alloc.dp * shard / _dp_link(alloc, hw)
        t = max(t, gathers) + hw.collective_latency_s * spec.num_layers * alloc.num_microbatches
    return t


def _passes_seconds(
    spec: ModelSpec,
    alloc: CallAllocation,
    w: Workload,
    hw: Hardware,
    *,
    passes: int,
    flushes: int,
    fsdp: bool = False,
) -> float:
    """``passes`` passes over the whole batch (1: a forward; 3: forward and backward; 4: with the
    forward recomputed) in ``num_microbatches`` micro-batches, the pipeline flushed ``flushes`` times.

    Each stage works on every micro-batch, ``(per_flush + pp - 1) / per_flush`` of that with the
    bubble: its ``num_layers / pp`` layers' compute and TP all-reduces. Stage-to-stage sends overlap
    with the other micro-batches' compute except on the pipeline's fill (and drain, for the
    gradients): ``pp - 1`` hops of one micro-batch per flush and direction. With a profile, a
    micro-batch takes at least the host's floor (``_microbatch_floor``; ``fsdp``: on FSDP2 shards).
    """
    n = spec.num_params()
    mb, pp, dp, tp = alloc.num_microbatches, alloc.pp, alloc.dp, alloc.tp
    tokens = w.batch * w.computed_seq_len
    tokens_mb = tokens / (dp * mb)  # one replica's micro-batch
    per_flush = max(1, -(-mb // flushes))
    bubble = (per_flush + pp - 1) / per_flush
    if hw.profile is not None:
        train = passes > 1
        layer = _measured("train" if train else "forward", spec, tokens_mb, alloc, hw, w.computed_seq_len)
        head = _measured("head_train" if train else "head_forward", spec, tokens_mb, alloc, hw, w.computed_seq_len)
        recompute = (4 / 3) if passes == 4 else 1.0
        per_microbatch = layer * recompute * spec.num_layers / pp + head
        compute = max(per_microbatch, _microbatch_floor(spec, alloc, hw, passes, fsdp)) * mb * bubble
    else:
        compute = (
            2 * n * tokens * passes / (len(alloc.devices) * hw.peak_flops * _efficiency(tokens_mb / tp, hw)) * bubble
        )
    t = compute + _tp_comm(spec, alloc, tokens_mb, 2 * passes, hw, w.value_bytes) * mb * bubble
    directions = 2 if passes > 1 else 1
    return t + flushes * directions * (pp - 1) * _pp_hop(spec, alloc, tokens_mb, hw, w.value_bytes)


def generation_stage_steps(num_new_tokens: int, num_groups: int, pp: int) -> int:
    """Pipeline time slots (one stage's work on one group of sequences) to generate ``num_new_tokens``
    for ``num_groups`` groups through ``pp`` stages: ReaL's generate schedule (ReaLHF
    ``static_schedule.py``), ``num_new_tokens * max(num_groups, pp) + num_groups - 1``.

    Each token of a group passes the stages in turn; the stages work on the other groups meanwhile,
    so a round of one token for every group takes ``max(num_groups, pp)`` slots, and the last group
    starts ``num_groups - 1`` slots after the first. pp = 2, 2 groups, 10 tokens: 10 * 2 + 1 = 21.
    """
    return num_new_tokens * max(num_groups, pp) + num_groups - 1


def generation_groups_in_flight(alloc: CallAllocation) -> int:
    """How many of a replica's ``num_microbatches`` groups of sequences its pipeline works on at once.

    vLLM 0.32's engine keeps at most ``pp`` batches in flight (``VllmConfig.max_concurrent_batches``
    is the pipeline size, ``EngineCore.step_with_batch_queue`` fills that queue), and its scheduler
    does not put a request into a second batch before the first one's sampled token is back
    (``Scheduler.schedule``: a running request with no new token is skipped). So at most
    ``min(num_microbatches, pp)`` groups are in flight; more groups run in waves of that many.
    """
    return min(alloc.num_microbatches, alloc.pp)


def _generate_seconds(spec: ModelSpec, alloc: CallAllocation, w: Workload, hw: Hardware) -> float:
    """A replica's ``batch / dp`` sequences in ``num_microbatches`` groups, run as realm's vLLM engine
    runs them: ``g = generation_groups_in_flight`` groups at a time (waves of g groups), each wave
    taking ``generation_stage_steps(gen_len, g, pp)`` slots (ReaL's schedule with g micro-batches,
    which is exactly vLLM's for g <= pp). The first ``g + pp - 1`` slots are prefill (the prompt,
    and the first new token), the rest single-token decode steps. A slot costs one stage's share,
    1/pp, of the whole model's work on one group (ReaL's estimator divides per-stage cost by pp),
    with its TP all-reduces and the send to the next stage.

    Assumes the engine gets the replica's requests in ``num_microbatches`` groups; with pp = 1 this
    is ``num_microbatches`` waves one after another.
    """
    n = spec.num_params()
    mb, pp, tp = alloc.num_microbatches, alloc.pp, alloc.tp
    group = w.batch / (alloc.dp * mb)  # sequences per group
    prompt_len = w.computed_prompt_len
    prefill_tokens = group * prompt_len
    context = prompt_len + w.gen_len / 2
    if hw.profile is not None:
        prefill = _measured("forward", spec, prefill_tokens, alloc, hw, prompt_len) * spec.num_layers + _measured(
            "head_forward", spec, group, alloc, hw
        )
        decode = _measured("decode", spec, group, alloc, hw, context) * spec.num_layers + _measured(
            "head_forward", spec, group, alloc, hw
        )
        prefill_slot, decode_slot = prefill / pp, decode / pp
    else:
        prefill_slot = 2 * n * prefill_tokens / (tp * pp * hw.peak_flops * _efficiency(prefill_tokens / tp, hw))
        weights = n * w.value_bytes / (tp * pp)
        kv_avg = _kv_bytes(spec, alloc, group, context, w.value_bytes)
        decode_slot = max((weights + kv_avg) / hw.hbm_bytes_per_s, 2 * n * group / (tp * pp * hw.peak_flops * hw.mfu))
    prefill_slot += _tp_comm(spec, alloc, prefill_tokens, 2, hw, w.value_bytes)
    prefill_slot += _pp_hop(spec, alloc, prefill_tokens, hw, w.value_bytes)
    decode_slot += _tp_comm(spec, alloc, group, 2, hw, w.value_bytes) + _pp_hop(spec, alloc, group, hw, w.value_bytes)
    in_flight = generation_groups_in_flight(alloc)
    num_waves = -(-mb // in_flight)
    prefill_slots = in_flight + pp - 1
    decode_slots = generation_stage_steps(w.gen_len, in_flight, pp) - prefill_slots
    return num_waves * (prefill_slots * prefill_slot + decode_slots * decode_slot)


def shares_training_layout(call: str, alloc: CallAllocation, train: CallAllocation) -> bool:
    """For memory: True when ``call`` needs no copy of its model's weights beside the training shards.

    critic_inf: when it has critic_train's devices and layout (``critic_inference_on_training_shards``:
    the runtime then runs it as a forward on the training shards). actor_gen: the same GPUs and shards
    with no FSDP and the same pp/tp (the estimator's approximation: vLLM's engine holds its own copy,
    freed between generations on GPUs).
    """
    if call == "critic_inf":
        return critic_inference_on_training_shards(alloc, train)
    return (
        alloc.devices == train.devices
        and alloc.pp == train.pp
        and alloc.tp == train.tp
        and alloc.dp == 1
        and train.dp == 1
    )


def critic_inference_on_training_shards(inf: CallAllocation, train: CallAllocation) -> bool:
    """Whether critic inference runs on critic training's shards (the same devices, as a set, and the
    same pp, dp and tp): then it is a forward on the FSDP / TP shards, with no copy of its own and no
    reallocation; otherwise the critic moves to replicas of its own after each training call."""
    if (inf.pp, inf.dp, inf.tp) != (train.pp, train.dp, train.tp) or len(inf.devices) != len(train.devices):
        return False
    return inf.devices == train.devices or sorted(inf.devices) == sorted(train.devices)


def call_memory(
    call: str, spec: ModelSpec, alloc: CallAllocation, w: Workload, own_copy: bool = True
) -> tuple[float, float]:
    """``(resident, active)`` bytes per GPU of the call's devices, by ``planning.lifecycle``'s rules.

    Resident stays between calls (training state; frozen weights unless offloaded); active exists
    only while the call runs. ``own_copy``: a generation / critic-inference call of a trainable model
    holds its own copy of the weights (False when it runs on the training layout itself).
    """
    from planning.lifecycle import Inputs, activation_bytes, kv_cache_bytes

    kind = CALL_KIND[call]
    x = Inputs({}, w.batch, w.prompt_len, w.gen_len, w.value_bytes, gpu=False)
    weights = spec.num_params() * w.value_bytes / (alloc.tp * alloc.pp)
    if kind == GENERATE:
        return 0.0, kv_cache_bytes(spec, alloc, x) + (weights if own_copy else 0.0)
    acts = activation_bytes(call, spec, alloc, x)
    if kind == TRAIN:
        return spec.num_params() * w.train_state_bytes / (alloc.tp * alloc.pp * alloc.dp), acts
    if CALL_MODEL[call] in ("ref", "reward"):
        return (0.0, acts + weights) if alloc.offload else (weights, acts)
    return 0.0, acts + (weights if own_copy else 0.0)


def _kv_bytes(spec: ModelSpec, alloc: CallAllocation, sequences: float, length: float, value_bytes: int) -> float:
    """KV cache on one GPU for ``sequences`` of ``length`` tokens (kv heads replicate when fewer than tp)."""
    kv_heads = max(1, spec.num_kv_heads // alloc.tp)
    return sequences * length * 2 * kv_heads * spec.head_dim * value_bytes * math.ceil(spec.num_layers / alloc.pp)


def offload_seconds(spec: ModelSpec, alloc: CallAllocation, hw: Hardware, value_bytes: int = BYTES) -> float:
    """Reloading offloaded frozen weights before a call."""
    return spec.num_params() * value_bytes / (alloc.tp * alloc.pp) / hw.host_bytes_per_s if alloc.offload else 0.0


@lru_cache(maxsize=64)
def _class_bytes(spec: ModelSpec, value_bytes: int) -> tuple[float, float]:
    """Bytes of parameters split on dim 0 under TP (column, kv, vocab, norms) and on dim 1 (row)."""
    row = sum(math.prod(p.shape) for p in spec.params() if p.kind == ROW)
    return (spec.num_params() - row) * value_bytes, row * value_bytes


def _shard_intervals(alloc: CallAllocation, kind: str) -> np.ndarray:
    """Per layout rank, the normalized box it holds: ``(rank, class, axis, lo/hi)`` with class 0 =
    dim-0-split parameters, 1 = dim-1-split ones, axes = (layers, dim 0, dim 1).

    Layers and TP split evenly; FSDP (training ``dp``) chunks the TP-local dim 0. Embedding
    placement and kv-head replication are ignored: this is the estimator's view, ``plan.py`` is exact.
    """
    fsdp = alloc.dp if kind == TRAIN else 1
    ranks = np.arange(len(alloc.devices))
    t = ranks % alloc.tp
    f = (ranks // alloc.tp) % alloc.dp % fsdp
    p = ranks // (alloc.tp * alloc.dp)
    out = np.zeros((len(ranks), 2, 3, 2))
    out[:, :, 0, 0], out[:, :, 0, 1] = (p / alloc.pp)[:, None], ((p + 1) / alloc.pp)[:, None]
    out[:, 0, 1, 0], out[:, 0, 1, 1] = (t + f / fsdp) / alloc.tp, (t + (f + 1) / fsdp) / alloc.tp
    out[:, 0, 2, 1] = 1.0
    out[:, 1, 1, 0], out[:, 1, 1, 1] = f / fsdp, (f + 1) / fsdp
    out[:, 1, 2, 0], out[:, 1, 2, 1] = t / alloc.tp, (t + 1) / alloc.tp
    return out


def _norm_key(alloc: CallAllocation) -> CallAllocation:
    return CallAllocation(alloc.devices, alloc.pp, alloc.dp, alloc.tp)  # knobs do not change holdings


def realloc_seconds(
    spec: ModelSpec,
    src: CallAllocation,
    src_kind: str,
    dst: CallAllocation,
    dst_kind: str,
    hw: Hardware,
    value_bytes: int = BYTES,
) -> float:
    """Seconds to give every GPU of ``dst`` its shard of ``spec`` (``value_bytes`` per value) from the GPUs of ``src``.

    Inside a node, each destination GPU pulls what it lacks from the piece's holders there, who share
    the sending. A node with no holder of a piece pulls each of its bytes across the NIC once: one GPU
    per distinct destination box receives it and passes it on to the node's replicas of that box
    (ReaL's broadcast; its cost model charges a destination node once, ReaLHF
    ``search_engine/param_realloc.py``). Time: the busiest GPU link plus the busiest node link.
    """
    return _realloc_seconds(spec, _norm_key(src), src_kind == TRAIN, _norm_key(dst), dst_kind == TRAIN, hw, value_bytes)


@lru_cache(maxsize=100_000)
def _realloc_seconds(
    spec: ModelSpec,
    src: CallAllocation,
    src_train: bool,
    dst: CallAllocation,
    dst_train: bool,
    hw: Hardware,
    value_bytes: int,
) -> float:
    """``realloc_seconds`` on normalized allocations (cached).

    Kept whole: one pass over the (destination rank x source piece) overlaps, which the routing rules
    below split into GPU-link and node-link traffic; split up, each part would need all of them.
    """
    if src == dst and src_train == dst_train:
        return 0.0
    col, row = _class_bytes(spec, value_bytes)
    s_box = _shard_intervals(src, TRAIN if src_train else INFERENCE)
    d_box = _shard_intervals(dst, TRAIN if dst_train else INFERENCE)
    # Source pieces: ranks with distinct boxes (dp replicas of inference/generation share one).
    s_dev = np.asarray(src.devices)
    piece_of_rank = _piece_ids(src, src_train)
    num_pieces = int(piece_of_rank.max()) + 1
    first_rank = np.unique(piece_of_rank, return_index=True)[1]
    pieces = s_box[first_rank]
    lo = np.maximum(d_box[:, None, :, :, 0], pieces[None, :, :, :, 0])
    hi = np.minimum(d_box[:, None, :, :, 1], pieces[None, :, :, :, 1])
    frac = np.clip(hi - lo, 0.0, None).prod(axis=3)  # (dst rank, piece, class)
    overlap = frac[..., 0] * col + frac[..., 1] * row
    d_dev = np.asarray(dst.devices)
    # A destination that holds a piece itself copies it locally.
    piece_on_device = np.full(hw.num_gpus, -1)
    piece_on_device[s_dev] = piece_of_rank
    local = piece_on_device[d_dev]
    has = local >= 0
    overlap[np.flatnonzero(has), local[has]] = 0.0
    g = hw.gpus_per_node
    d_node, s_node = d_dev // g, s_dev // g
    holders_per_node = np.zeros((num_pieces, hw.num_nodes))
    np.add.at(holders_per_node, (piece_of_rank, s_node), 1)
    same_node = holders_per_node[:, d_node].T > 0  # (dst rank, piece)
    intra, inter = np.where(same_node, overlap, 0.0), np.where(same_node, 0.0, overlap)
    sent, received = np.zeros(hw.num_gpus), np.zeros(hw.num_gpus)  # bytes over each GPU's own link
    # Inside a node: each destination pulls from the piece's holders there, which share the sending.
    np.add.at(received, d_dev, intra.sum(1))
    node_onehot = np.zeros((len(d_dev), hw.num_nodes))
    node_onehot[np.arange(len(d_dev)), d_node] = 1
    per_piece_node = intra.T @ node_onehot  # bytes piece k sends inside node n, split over its holders there
    np.add.at(sent, s_dev, per_piece_node[piece_of_rank, s_node] / holders_per_node[piece_of_rank, s_node])
    # Across nodes: a destination node pulls each byte once (one GPU per distinct destination box
    # receives it from the NIC), and that GPU passes it on to the node's replicas of its box.
    d_piece = _piece_ids(dst, dst_train)
    box_on_node = d_node * (int(d_piece.max()) + 1) + d_piece
    _, first_of_box, box_index = np.unique(box_on_node, return_index=True, return_inverse=True)
    first = np.zeros(len(d_dev), dtype=bool)
    first[first_of_box] = True
    crossing = np.where(first[:, None], inter, 0.0)
    copied = np.where(first, 0.0, inter.sum(1))
    np.add.at(received, d_dev, copied)
    np.add.at(sent, d_dev[first_of_box[box_index]], copied)
    node_out, node_in = np.zeros(hw.num_nodes), np.zeros(hw.num_nodes)
    np.add.at(node_in, d_node, crossing.sum(1))
    np.add.at(node_out, s_node, crossing.sum(0)[piece_of_rank] / holders_per_node.sum(1)[piece_of_rank])
    busiest_gpu, busiest_node = max(sent.max(), received.max()), max(node_out.max(), node_in.max())
    moved = busiest_gpu / hw.intra_node_bytes_per_s + busiest_node / hw.inter_node_bytes_per_s
    return float(moved + 10 * hw.collective_latency_s) if moved > 0 else 0.0


def _piece_ids(alloc: CallAllocation, train: bool) -> np.ndarray:
    ranks = np.arange(len(alloc.devices))
    t, rest = ranks % alloc.tp, ranks // alloc.tp
    p = rest // alloc.dp
    if train:  # every FSDP rank holds its own chunk
        return (p * alloc.dp + rest % alloc.dp) * alloc.tp + t
    return p * alloc.tp + t


@dataclass(frozen=True)
class PlanCost:
    """Predicted cost of one PPO iteration under a plan."""

    seconds_per_iteration: float
    call_seconds: dict[str, float]  # each call alone (offload reloads included, reallocation not); actor_inf too
    peak_bytes_per_device: dict[int, float]
    fits: bool
    realloc_seconds: float  # per iteration: realloc_actor + realloc_critic
    overflow_bytes: float = 0.0  # the fullest GPU's excess over its memory (0 when it fits)

    @property
    def peak_bytes(self) -> float:
        return max(self.peak_bytes_per_device.values(), default=0.0)


TRAINED_BY = {"actor_gen": "actor_train", "critic_inf": "critic_train"}
"""The calls that run a trainable model on a layout of their own, and the training call it comes from."""


def _check_plan(plan: ExecutionPlan, workload: Workload, hw: Hardware) -> None:
    if (plan.num_nodes, plan.gpus_per_node) != (hw.num_nodes, hw.gpus_per_node):
        from planning.execution_plan import PlanError

        raise PlanError(
            f"plan is for {plan.num_nodes}x{plan.gpus_per_node} GPUs, hardware has {hw.num_nodes}x{hw.gpus_per_node}"
        )
    plan.validate(workload.specs())


def estimate_plan(plan: ExecutionPlan, workload: Workload, hw: Hardware) -> PlanCost:
    """The predicted time and memory of one PPO iteration of ``plan``.

    The iteration's calls (``planning.schedule``: generation, the four inference calls, both training
    calls, the reallocations after them) are list-scheduled by the rule the runtime dispatches by
    (``iteration_schedule`` gives each call's start and end); the iteration lasts until its last call
    ends. Iterations do not overlap: the driver starts one's generation after the previous one's
    reallocations. Reallocation goes one way, from the training shards to generation's engines and
    to critic inference's own replicas (the training shards stay where they are).
    Raises ``PlanError`` when the plan does not match the workload or hardware.
    """
    _check_plan(plan, workload, hw)
    return evaluator(workload, hw).estimate(tuple((c, plan.calls[c]) for c in workload.calls))


@dataclass(frozen=True)
class ScheduledCall:
    """One call of a predicted iteration: its devices and its start and end (seconds from the iteration's start)."""

    devices: tuple[int, ...]
    start: float
    end: float


@dataclass(frozen=True)
class IterationSchedule:
    """The predicted timeline of one PPO iteration (``iteration_schedule``)."""

    calls: dict[str, ScheduledCall]
    """Every call of the iteration, in the order they start (ties in ``planning.schedule.CALL_ORDER``)."""

    @property
    def seconds(self) -> float:
        return max(c.end for c in self.calls.values())

    def order(self) -> list[str]:
        """The calls in the order they start."""
        return list(self.calls)

    def device_order(self) -> dict[int, list[str]]:
        """Per device, the calls it runs, in order."""
        out: dict[int, list[str]] = {}
        for name, call in self.calls.items():
            for d in call.devices:
                out.setdefault(d, []).append(name)
        return dict(sorted(out.items()))


def iteration_schedule(plan: ExecutionPlan, workload: Workload, hw: Hardware) -> IterationSchedule:
    """Each call's predicted start and end in one PPO iteration of ``plan``, and each device's order
    of calls: what a run's call spans can be compared with.

    The calls (``planning.schedule``) and their inputs: ``actor_gen`` first; ``rew_inf``,
    ``actor_inf`` (the old logprobs, on actor_train's devices; only with ``workload.old_logprobs_pass``),
    ``ref_inf``, ``critic_inf`` after actor_gen; ``actor_train`` and ``critic_train`` after all four;
    ``realloc_actor`` (over actor_train's and actor_gen's devices) after actor_train;
    ``realloc_critic`` (over critic_train's and critic_inf's devices) after critic_train, only when
    critic inference has devices or a layout of its own.

    The rule: a device runs one call at a time, and a call holds all its devices from its start to
    its end. A call starts as soon as its inputs are done and every one of its devices is idle; calls
    that can start at the same moment start in the priority order actor_gen, rew_inf, actor_inf,
    ref_inf, critic_inf, actor_train, critic_train, realloc_actor, realloc_critic; a call that cannot
    start does not hold back a later one whose devices are free (list scheduling, as ReaL's simulator
    dispatches by ready time). ``estimate_plan``'s iteration time is the last call's end.
    """
    _check_plan(plan, workload, hw)
    seconds, devices = evaluator(workload, hw).scheduled_calls(tuple((c, plan.calls[c]) for c in workload.calls))
    times = list_schedule(seconds, devices)
    ordered = sorted(times, key=lambda c: (times[c][0], CALL_ORDER.index(c)))
    return IterationSchedule({c: ScheduledCall(tuple(sorted(devices[c])), *times[c]) for c in ordered})


def _estimate(calls: tuple[tuple[str, CallAllocation], ...], w: Workload, hw: Hardware) -> PlanCost:
    return evaluator(w, hw).estimate(calls)


def evaluator(w: Workload, hw: Hardware) -> Evaluator:
    """One shared ``Evaluator`` per workload and hardware, so its caches serve every caller."""
    return _evaluator(w, hw, id(hw.profile))  # Hardware's hash leaves the profile out


@lru_cache(maxsize=8)
def _evaluator(w: Workload, hw: Hardware, profile_id: int) -> Evaluator:
    return Evaluator(w, hw)


class Evaluator:
    """Plan costs for one workload on one cluster, with per-call and per-move caches.

    Per-call facts are keyed by the allocation's shape (degrees, knobs, size and whether its data-
    parallel group and whole mesh stay inside a node), not its position: the search asks for the
    same shape at many positions.
    """

    def __init__(self, w: Workload, hw: Hardware) -> None:
        self.w, self.hw = w, hw
        self._facts: dict[tuple, tuple[float, float, float, float]] = {}
        self._by_alloc: dict[tuple[str, int], tuple[CallAllocation, tuple[float, float, float, float]]] = {}
        self._moves: dict[tuple, float] = {}
        self._index: dict[tuple[int, ...], np.ndarray] = {}

    def _shape_key(self, call: str, a: CallAllocation) -> tuple:
        g = self.hw.gpus_per_node
        nodes = {d // g for d in a.devices}
        dp_nodes = {d // g for d in a.devices[: a.dp * a.tp]}
        return (
            call,
            a.pp,
            a.dp,
            a.tp,
            a.num_microbatches,
            a.activation_checkpointing,
            a.offload,
            len(a.devices),
            len(nodes) == 1,
            len(dp_nodes) == 1,
        )

    def facts(self, call: str, a: CallAllocation) -> tuple[float, float, float, float]:
        """``(seconds, resident, active, own-copy bytes)`` of ``call`` under ``a``."""
        # Keyed by object identity (the cache keeps the object alive, so ids are not reused):
        # hashing 128-device tuples dominated the search's time.
        hit = self._by_alloc.get((call, id(a)))
        if hit is None:
            if len(self._by_alloc) > 1_000_000:  # bound the memory of long-lived processes
                self._by_alloc.clear()
            hit = self._by_alloc[call, id(a)] = (a, self._facts_of_shape(call, a))
        return hit[1]

    def _facts_of_shape(self, call: str, a: CallAllocation) -> tuple[float, float, float, float]:
        key = self._shape_key(call, a)
        out = self._facts.get(key)
        if out is None:
            spec = self.w.spec(call)
            seconds = call_seconds(call, spec, a, self.w, self.hw) + offload_seconds(
                spec, a, self.hw, self.w.value_bytes
            )
            resident, active = call_memory(call, spec, a, self.w, True)
            _, without = call_memory(call, spec, a, self.w, False)
            out = self._facts[key] = (seconds, resident, without, active - without)
        return out

    def seconds(self, call: str, a: CallAllocation) -> float:
        return self.facts(call, a)[0]

    def fits_alone(self, call: str, a: CallAllocation) -> bool:
        _, resident, active, copy = self.facts(call, a)
        return resident + active + copy <= self.hw.usable_memory_bytes

    def training_forward(self, call: str, a: CallAllocation) -> float:
        """``training_layout_forward_seconds`` of ``call``'s model under ``a`` (cached by identity, then shape)."""
        hit = self._by_alloc.get((f"{call} on training shards", id(a)))
        if hit is None:
            key = ("forward on training shards", *self._shape_key(call, a))
            out = self._facts.get(key)
            if out is None:
                seconds = training_layout_forward_seconds(self.w.spec(call), a, self.w, self.hw)
                out = self._facts[key] = (seconds, 0.0, 0.0, 0.0)
            hit = self._by_alloc[f"{call} on training shards", id(a)] = (a, out)
        return hit[1][0]

    def move(self, model: str, train: CallAllocation, a: CallAllocation) -> float:
        """Seconds to give the GPUs of ``a`` (actor_gen for the "actor", critic_inf for the "critic")
        their copy of ``model`` from its training shards on ``train``."""
        key = (model, a.devices, a.pp, a.dp, a.tp, train.devices, train.pp, train.dp, train.tp)
        out = self._moves.get(key)
        if out is None:
            spec, kind = (self.w.actor, GENERATE) if model == "actor" else (self.w.spec("critic_inf"), INFERENCE)
            out = self._moves[key] = realloc_seconds(spec, train, TRAIN, a, kind, self.hw, self.w.value_bytes)
        return out

    def index(self, a: CallAllocation) -> np.ndarray:
        out = self._index.get(a.devices)
        if out is None:
            out = self._index[a.devices] = np.asarray(a.devices)
        return out

    def durations(self, calls: tuple[tuple[str, CallAllocation], ...], with_moves: bool = True) -> dict[str, float]:
        """Seconds of every call of the iteration (``planning.schedule.CALL_ORDER``) under the plan's
        ``calls``; ``with_moves=False`` prices the reallocations at 0 s."""
        allocs = dict(calls)
        out = {c: self.facts(c, a)[0] for c, a in calls}
        if self.w.old_logprobs_pass:
            out["actor_inf"] = self.training_forward("actor_train", allocs["actor_train"])
        out["realloc_actor"] = self.move("actor", allocs["actor_train"], allocs["actor_gen"]) if with_moves else 0.0
        if "critic_train" not in allocs:  # a critic-free algorithm: no critic calls, no critic to move
            pass
        elif critic_inference_on_training_shards(allocs["critic_inf"], allocs["critic_train"]):
            out["critic_inf"] = self.training_forward("critic_inf", allocs["critic_inf"])
        else:
            out["realloc_critic"] = (
                self.move("critic", allocs["critic_train"], allocs["critic_inf"]) if with_moves else 0.0
            )
        if self.hw.num_cores is None and not self.hw.call_overhead_s:
            return out
        # On a machine whose devices share its cores, a call on more devices than cores runs at most that
        # many of them at once.
        num_devices, cores = _num_devices(calls, out), self.hw.num_cores or math.inf
        return {c: (t + self.hw.call_overhead_s) * max(1.0, num_devices[c] / cores) for c, t in out.items()}

    def scheduled_calls(
        self, calls: tuple[tuple[str, CallAllocation], ...], with_moves: bool = True
    ) -> tuple[dict[str, float], dict[str, tuple[int, ...]]]:
        """Every call of the iteration: its seconds and its devices (``planning.schedule``)."""
        seconds = self.durations(calls, with_moves)
        devices = {c: tuple(a.devices) for c, a in calls}
        return seconds, {c: devices.get(c) or _scheduled_devices(c, devices) for c in seconds}

    def period(
        self,
        calls: tuple[tuple[str, CallAllocation], ...],
        with_moves: bool = True,
        seconds: dict[str, float] | None = None,
    ) -> float:
        """Seconds of one iteration; ``with_moves=False`` gives a cheap lower bound (a reallocation
        only ever delays other calls). ``seconds``: ``durations(calls, with_moves)`` when known."""
        seconds = self.durations(calls, with_moves) if seconds is None else seconds
        atoms = self._atoms(calls)
        groups = {c: atoms.get(c) or _scheduled_devices(c, atoms) for c in seconds}
        period = max(end for _, end in list_schedule(seconds, groups).values())
        if self.hw.num_cores is None:
            return period
        return max(period, self.device_seconds(calls, seconds) / self.hw.num_cores)

    def device_seconds(self, calls: tuple[tuple[str, CallAllocation], ...], seconds: Mapping[str, float]) -> float:
        """The compute an iteration asks of devices that share ``hw.num_cores`` cores (each device process
        computes on one thread): each call's seconds times the devices it runs at once (all of them, or
        as many as there are cores)."""
        num_devices, cores = _num_devices(calls, seconds), self.hw.num_cores or math.inf
        return sum(t * min(cores, num_devices[c]) for c, t in seconds.items())

    def _atoms(self, calls: tuple[tuple[str, CallAllocation], ...]) -> dict[str, list[int]]:
        """Per call, the GPU groups it uses, where a group holds GPUs that every call either uses
        all of or none of: the schedule tracks a few groups instead of every GPU."""
        code = np.zeros(self.hw.num_gpus, dtype=np.int64)
        for bit, (_, a) in enumerate(calls):
            code[self.index(a)] |= 1 << bit
        groups = np.unique(code[code > 0]).tolist()
        return {c: [i for i, g in enumerate(groups) if g >> bit & 1] for bit, (c, _) in enumerate(calls)}

    def peak(self, calls: tuple[tuple[str, CallAllocation], ...]) -> np.ndarray:
        """Per GPU: the bytes of its fullest phase in the plan's memory lifecycle (NaN: unused)."""
        from planning.lifecycle import holdings, peak_bytes

        items = holdings(dict(calls), lifecycle_inputs(self.w, self.hw))
        peak = np.asarray(peak_bytes(items, self.hw.num_gpus))
        used = np.zeros(self.hw.num_gpus, dtype=bool)
        for _, a in calls:
            used[self.index(a)] = True
        return np.where(used, peak, np.nan)

    def estimate(self, calls: tuple[tuple[str, CallAllocation], ...]) -> PlanCost:
        peak = self.peak(calls)
        worst = float(np.nanmax(peak))
        overflow = max(0.0, worst - self.hw.usable_memory_bytes)
        seconds = self.durations(calls)
        period = self.period(calls, seconds=seconds)
        moves = {c: seconds.pop(c) for c in ("realloc_actor", "realloc_critic") if c in seconds}
        return PlanCost(
            period,
            seconds,
            {int(d): float(peak[d]) for d in np.flatnonzero(~np.isnan(peak))},
            overflow == 0.0,
            sum(moves.values()),
            overflow,
        )


def _num_devices(calls: tuple[tuple[str, CallAllocation], ...], names: Mapping[str, float]) -> dict[str, int]:
    """How many devices each named call of the iteration holds (``_scheduled_devices`` for those the plan
    does not name)."""
    devices = {c: a.devices for c, a in calls}
    return {c: len(devices.get(c) or _scheduled_devices(c, devices)) for c in names}


def _scheduled_devices(call: str, of_plan_call: Mapping[str, Sequence[int]]) -> tuple[int, ...]:
    """The devices (or device groups) of a call the plan does not name: actor_inf runs on actor_train's,
    each reallocation on the union of its source's and destination's."""
    if call == "actor_inf":
        return tuple(of_plan_call["actor_train"])
    src, dst = ("actor_train", "actor_gen") if call == "realloc_actor" else ("critic_train", "critic_inf")
    return tuple(sorted(set(of_plan_call[src]) | set(of_plan_call[dst])))


def lifecycle_inputs(w: Workload, hw: Hardware) -> Inputs:
    """What ``planning.lifecycle`` reads of a workload on a cluster."""
    from planning.lifecycle import Inputs

    return Inputs(
        w.specs(),
        w.batch,
        w.prompt_len,
        w.gen_len,
        w.value_bytes,
        hw.name != "cpu",
        w.old_logprobs_pass,
        w.engine_eager,
    )


def memory_lifecycle(plan: ExecutionPlan, w: Workload, hw: Hardware) -> MemoryLifecycle:
    """The plan's device-memory lifecycle (``planning.lifecycle``), which ``estimate_plan``'s peaks price."""
    from planning.lifecycle import memory_lifecycle as build

    return build(plan.calls, lifecycle_inputs(w, hw), hw.gpu_memory_bytes, hw.memory_margin_bytes)
