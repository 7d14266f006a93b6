"""Execution-plan cost model (ReaL-style): time and memory of each PPO call under a
``CallAllocation``, the cost of moving parameters between two allocations, and a whole plan's
iteration time (``estimate_plan``).

The per-call model is analytic unless ``Hardware.profile`` holds measured per-layer costs
(``planning.profile``); see ../shared/reference/real-reallocation.md §4 for what ReaL profiles.

- compute: ``2 * N * tokens`` FLOPs per forward, x3 for training (x4 with activation
  checkpointing: the forward runs again in the backward), at ``mfu`` of peak, lower when a
  micro-batch gives a GPU few tokens; pipeline bubble ``(pp - 1 + mb) / mb``; a call's ``mb``
  micro-batches split its whole batch (the runtime cuts each PPO minibatch into its share of them);
- tensor parallel: two ring all-reduces of the activations per layer and pass, plus a latency
  each (decode steps are latency bound);
- FSDP (training ``dp``): each micro-batch all-gathers the weights for forward and backward and
  the step reduce-scatters the gradients, overlapped with compute (time = max of the two);
- generation: ``num_microbatches`` waves of ``batch / (dp * mb)`` sequences per replica (fewer
  KV-cache bytes, more weight reads); prefill is compute bound; a decode step reads the local
  weights and KV cache or computes, whichever is slower; pipeline stages run in turn, waves
  overlap across stages;
- memory per GPU (``call_memory``): resident bytes (training: bf16 weights + fp32 master, grads,
  Adam = 18 B/param over FSDP, 16 in a float32 run; frozen ref/reward weights unless ``offload``;
  every value in ``Workload.value_bytes``, the run's compute dtype) and active bytes
  (activations, or full-layer inputs only with checkpointing, logits, KV cache, and the
  call's own copy of a trainable model's weights);
- offload: frozen weights return from host memory before each call (``host_bytes_per_s``);
- reallocation (``realloc_seconds``): every destination GPU gets the bytes it lacks from a
  holder on its own node when one exists (else from any holder, across nodes); a sender pays for
  every destination it serves (fan-out); the busiest GPU link or node link sets the time.

Numbers are for ranking plans, not for predicting wall time to the second.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from planning.execution_plan import CALL_KIND, CALL_MODEL, GENERATE, INFERENCE, TRAIN, CallAllocation, ExecutionPlan
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

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


# Published specs (bf16 dense peak, HBM, NVLink per GPU one way, node NIC); mfu is an assumption.
HARDWARE = {
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


def hardware(name: str, num_nodes: int, gpus_per_node: int, profile: object | None = None) -> Hardware:
    """``"a100-80g" | "h100" | "h200" | "cpu"`` with the given cluster shape."""
    if name not in HARDWARE:
        raise ValueError(f"unknown GPU {name!r}: expected one of {sorted(HARDWARE)}")
    if num_nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"need num_nodes >= 1 and gpus_per_node >= 1, got {num_nodes} x {gpus_per_node}")
    return Hardware(num_nodes=num_nodes, gpus_per_node=gpus_per_node, name=name, profile=profile, **HARDWARE[name])


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
    """One PPO iteration: ``batch`` prompts of ``prompt_len`` tokens, ``gen_len`` generated each.
    The reference model has the actor's shape; ``reward`` is None for a rule-based reward."""

    actor: ModelSpec
    critic: ModelSpec
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
    layout (realm's runtime does this; ReaL takes them from generation), priced into actor_train."""

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.gen_len

    @property
    def train_state_bytes(self) -> int:
        """Per trainable parameter while it trains: float32 weights, gradients and Adam's m and v
        (16 B), whatever the compute dtype: FSDP2 casts the weights to it per layer as it computes
        (``planning.lifecycle``: outside training the gradients are freed, 12 B)."""
        return TRAIN_STATE_BYTES

    @property
    def calls(self) -> tuple[str, ...]:
        return tuple(c for c in CALL_MODEL if c != "rew_inf" or self.reward is not None)

    def spec(self, call: str) -> ModelSpec:
        model = CALL_MODEL[call]
        if model == "reward":
            if self.reward is None:
                raise ValueError("rew_inf needs a reward model shape")
            return self.reward
        return self.critic if model == "critic" else self.actor

    def specs(self) -> dict[str, ModelSpec]:
        out = {"actor": self.actor, "critic": self.critic, "ref": self.actor}
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
    tokens_per_replica: float,
    num_collectives: int,
    hw: Hardware,
    value_bytes: int = BYTES,
) -> float:
    """Ring all-reduces of ``tokens_per_replica`` activations, ``num_collectives`` per layer."""
    if alloc.tp == 1:
        return 0.0
    volume = 2 * (alloc.tp - 1) / alloc.tp * tokens_per_replica * spec.hidden_size * value_bytes
    return num_collectives * spec.num_layers * (volume / _tp_link(alloc, hw) + hw.collective_latency_s)


def _pp_comm(
    spec: ModelSpec, alloc: CallAllocation, tokens_per_replica: float, passes: int, hw: Hardware, value_bytes: int
) -> float:
    if alloc.pp == 1:
        return 0.0
    one_node = (
        alloc.devices[0] // hw.gpus_per_node
        == alloc.devices[-1] // hw.gpus_per_node
        == min(alloc.devices) // hw.gpus_per_node
    )
    link = hw.intra_node_bytes_per_s if one_node else hw.inter_node_bytes_per_s / hw.gpus_per_node
    return (
        passes
        * (alloc.pp - 1)
        * (tokens_per_replica * spec.hidden_size * value_bytes / alloc.tp / link + hw.collective_latency_s)
    )


def _measured(
    op: str, spec: ModelSpec, tokens: float, alloc: CallAllocation, hw: Hardware, context: float = 0.0
) -> float:
    """Seconds of one layer (or the LM head, ``head_*`` ops) from ``hw.profile``."""
    return hw.profile.seconds(op, spec, tokens=tokens, context=context, tp=alloc.tp)  # type: ignore[attr-defined]


def call_seconds(call: str, spec: ModelSpec, alloc: CallAllocation, w: Workload, hw: Hardware) -> float:
    """Seconds for ``call`` under ``alloc`` (reallocation and offload reloads excluded).

    A training call makes ``w.num_epochs`` passes over its batch, each in ``w.num_minibatches``
    optimizer steps (a pipeline flush after each); with ``w.old_logprobs_pass`` actor training also
    carries the forward that computes the ratio's old logprobs on its layout.
    """
    kind = CALL_KIND[call]
    if kind == GENERATE:
        return _generate_seconds(spec, alloc, w, hw)
    if kind != TRAIN:
        return _passes_seconds(spec, alloc, w, hw, passes=1, flushes=1)
    n, mb, pp, dp, tp = spec.num_params(), alloc.num_microbatches, alloc.pp, alloc.dp, alloc.tp
    epochs, steps = w.num_epochs, w.num_epochs * w.num_minibatches
    passes = 4 if alloc.activation_checkpointing else 3
    t = epochs * _passes_seconds(spec, alloc, w, hw, passes=passes, flushes=w.num_minibatches)
    shard = n * w.value_bytes / (tp * pp)
    if dp > 1:  # all-gathers for each micro-batch's forward and backward, a reduce-scatter per step
        gathers = (2 * mb * epochs + steps) * (dp - 1) / dp * shard / _dp_link(alloc, hw)
        t = max(t, gathers) + hw.collective_latency_s * spec.num_layers * mb * epochs
    if hw.profile is not None:  # the measured Adam step of one unsharded layer, split by FSDP
        t += steps * _measured("optimizer", spec, 0, alloc, hw) * spec.num_layers / (pp * dp)
    else:  # Adam reads and writes the fp32 state
        t += steps * 2 * n * (w.train_state_bytes - w.value_bytes) / (tp * pp * dp) / hw.hbm_bytes_per_s
    if call == "actor_train" and w.old_logprobs_pass:
        t += _passes_seconds(spec, alloc, w, hw, passes=1, flushes=1)
    return t


def _passes_seconds(
    spec: ModelSpec, alloc: CallAllocation, w: Workload, hw: Hardware, *, passes: int, flushes: int
) -> float:
    """``passes`` passes over the whole batch (1: a forward; 3: forward and backward; 4: with the
    forward recomputed) in ``num_microbatches`` micro-batches, the pipeline flushed ``flushes`` times:
    compute with the pipeline bubble, TP all-reduces and stage-to-stage sends."""
    n = spec.num_params()
    mb, pp, dp, tp = alloc.num_microbatches, alloc.pp, alloc.dp, alloc.tp
    tokens = w.batch * w.seq_len
    tokens_mb = tokens / (dp * mb)  # one replica's micro-batch
    per_flush = max(1, -(-mb // flushes))
    bubble = (per_flush + pp - 1) / per_flush
    if hw.profile is not None:
        train = passes > 1
        layer = _measured("train" if train else "forward", spec, tokens_mb, alloc, hw, w.seq_len)
        head = _measured("head_train" if train else "head_forward", spec, tokens_mb, alloc, hw, w.seq_len)
        recompute = (4 / 3) if passes == 4 else 1.0
        compute = (layer * recompute * spec.num_layers / pp + head) * mb * bubble
    else:
        compute = (
            2 * n * tokens * passes / (len(alloc.devices) * hw.peak_flops * _efficiency(tokens_mb / tp, hw)) * bubble
        )
    t = compute + _tp_comm(spec, alloc, tokens / dp, 2 * passes, hw, w.value_bytes) * bubble
    return t + _pp_comm(spec, alloc, tokens / dp, 2 if passes > 1 else 1, hw, w.value_bytes)


def _generate_seconds(spec: ModelSpec, alloc: CallAllocation, w: Workload, hw: Hardware) -> float:
    n = spec.num_params()
    mb, pp, dp, tp = alloc.num_microbatches, alloc.pp, alloc.dp, alloc.tp
    wave = w.batch / (dp * mb)  # sequences per replica per wave
    prefill_tokens = wave * w.prompt_len
    context = w.prompt_len + w.gen_len / 2
    if hw.profile is not None:
        prefill = _measured("forward", spec, prefill_tokens, alloc, hw, w.prompt_len) * spec.num_layers + _measured(
            "head_forward", spec, wave, alloc, hw
        )
        stage = (
            _measured("decode", spec, wave, alloc, hw, context) * spec.num_layers
            + _measured("head_forward", spec, wave, alloc, hw)
        ) / pp
    else:
        prefill = 2 * n * prefill_tokens / (tp * hw.peak_flops * _efficiency(prefill_tokens / tp, hw))
        weights = n * w.value_bytes / (tp * pp)
        kv_avg = _kv_bytes(spec, alloc, wave, context, w.value_bytes)
        stage = max((weights + kv_avg) / hw.hbm_bytes_per_s, 2 * n * wave / (tp * pp * hw.peak_flops * hw.mfu))
    prefill += _tp_comm(spec, alloc, prefill_tokens, 2, hw, w.value_bytes)
    stage += _tp_comm(spec, alloc, wave, 2, hw, w.value_bytes) / pp + hw.collective_latency_s * (pp > 1)
    # Waves overlap across pipeline stages: mb waves take (mb + pp - 1) stage-steps per token.
    decode = w.gen_len * stage * (mb + pp - 1)
    return prefill * (mb + pp - 1) + decode


def shares_training_layout(call: str, alloc: CallAllocation, train: CallAllocation) -> bool:
    """True when ``call`` can run on the training copy itself (same GPUs and shards: no FSDP, same pp/tp)."""
    return (
        alloc.devices == train.devices
        and alloc.pp == train.pp
        and alloc.tp == train.tp
        and alloc.dp == 1
        and train.dp == 1
    )


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
    """Seconds to give every GPU of ``dst`` its shard of ``spec`` (``value_bytes`` per value) from the GPUs of ``src``."""
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
    holders_per_node = np.zeros((num_pieces, hw.num_nodes))
    np.add.at(holders_per_node, (piece_of_rank, s_dev // g), 1)
    same_node = holders_per_node[:, d_dev // g].T > 0  # (dst rank, piece)
    intra, inter = np.where(same_node, overlap, 0.0), np.where(same_node, 0.0, overlap)
    recv_intra, recv_inter = intra.sum(1), inter.sum(1)
    node_onehot = np.zeros((len(d_dev), hw.num_nodes))
    node_onehot[np.arange(len(d_dev)), d_dev // g] = 1
    per_piece_node = intra.T @ node_onehot  # bytes piece k sends inside node n, split over its holders there
    s_node = s_dev // g
    sent_intra = per_piece_node[piece_of_rank, s_node] / holders_per_node[piece_of_rank, s_node]
    sent_inter = inter.sum(0)[piece_of_rank] / holders_per_node.sum(1)[piece_of_rank]
    busiest_gpu = max(np.max(recv_intra, initial=0.0), np.max(sent_intra, initial=0.0))
    node_out, node_in = np.zeros(hw.num_nodes), np.zeros(hw.num_nodes)
    np.add.at(node_out, s_node, sent_inter)
    np.add.at(node_in, d_dev // g, recv_inter)
    busiest_node = max(node_out.max(), node_in.max())
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
    """Predicted cost of one steady-state PPO iteration under a plan."""

    seconds_per_iteration: float
    call_seconds: dict[str, float]  # each call alone (offload reloads included, reallocation not)
    peak_bytes_per_device: dict[int, float]
    fits: bool
    realloc_seconds: float  # per iteration, both directions, summed over models
    overflow_bytes: float = 0.0  # the fullest GPU's excess over its memory (0 when it fits)

    @property
    def peak_bytes(self) -> float:
        return max(self.peak_bytes_per_device.values(), default=0.0)


TRAINED_BY = {"actor_gen": "actor_train", "critic_inf": "critic_train"}
NUM_SIMULATED_ITERATIONS = 3


def estimate_plan(plan: ExecutionPlan, workload: Workload, hw: Hardware) -> PlanCost:
    """List-schedule ``NUM_SIMULATED_ITERATIONS`` PPO iterations of ``plan`` and report the
    steady-state period (the span from the first iteration's end to the last's, per iteration),
    so every iteration pays the same reallocations and none is diluted by a cold start.

    Order per iteration: actor_gen -> {rew_inf, ref_inf, critic_inf} -> {actor_train,
    critic_train}; calls sharing a GPU serialize. actor_gen and critic_inf, when not on their
    model's training layout, receive the trained weights before they run and hand them back
    after (ReaL's pre/post ``ParamReallocHook``), each move occupying both meshes.
    Raises ``PlanError`` when the plan does not match the workload or hardware.
    """
    if (plan.num_nodes, plan.gpus_per_node) != (hw.num_nodes, hw.gpus_per_node):
        from planning.execution_plan import PlanError

        raise PlanError(
            f"plan is for {plan.num_nodes}x{plan.gpus_per_node} GPUs, hardware has {hw.num_nodes}x{hw.gpus_per_node}"
        )
    plan.validate(workload.specs())
    return evaluator(workload, hw).estimate(tuple((c, plan.calls[c]) for c in workload.calls))


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
        self._moves: dict[tuple, tuple[float, float]] = {}
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
        return resident + active + copy <= self.hw.gpu_memory_bytes

    def moves(self, call: str, a: CallAllocation, train: CallAllocation) -> tuple[float, float]:
        """Seconds to bring ``call``'s model from its training layout and back (0, 0 when shared)."""
        key = (call, a.devices, a.pp, a.dp, a.tp, train.devices, train.pp, train.dp, train.tp)
        out = self._moves.get(key)
        if out is None:
            if shares_training_layout(call, a, train):
                out = (0.0, 0.0)
            else:
                spec, kind = self.w.spec(call), CALL_KIND[call]
                out = (
                    realloc_seconds(spec, train, TRAIN, a, kind, self.hw, self.w.value_bytes),
                    realloc_seconds(spec, a, kind, train, TRAIN, self.hw, self.w.value_bytes),
                )
            self._moves[key] = out
        return out

    def index(self, a: CallAllocation) -> np.ndarray:
        out = self._index.get(a.devices)
        if out is None:
            out = self._index[a.devices] = np.asarray(a.devices)
        return out

    def period(self, calls: tuple[tuple[str, CallAllocation], ...], with_moves: bool = True) -> float:
        """Steady-state seconds per iteration; ``with_moves=False`` gives a cheap lower bound."""
        allocs = dict(calls)
        seconds = {c: self.facts(c, a)[0] for c, a in calls}
        moves = {c: self.moves(c, allocs[c], allocs[t]) if with_moves else (0.0, 0.0) for c, t in TRAINED_BY.items()}
        return _schedule(allocs, seconds, moves, self._atoms(calls))

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
        allocs = dict(calls)
        peak = self.peak(calls)
        worst = float(np.nanmax(peak))
        overflow = max(0.0, worst - self.hw.gpu_memory_bytes)
        realloc = sum(sum(self.moves(c, allocs[c], allocs[t])) for c, t in TRAINED_BY.items())
        return PlanCost(
            self.period(calls),
            {c: self.facts(c, a)[0] for c, a in calls},
            {int(d): float(peak[d]) for d in np.flatnonzero(~np.isnan(peak))},
            overflow == 0.0,
            realloc,
            overflow,
        )


def _schedule(
    allocs: Mapping[str, CallAllocation],
    seconds: Mapping[str, float],
    moves: Mapping[str, tuple[float, float]],
    atoms: Mapping[str, list[int]],
) -> float:
    """List scheduling of ``NUM_SIMULATED_ITERATIONS`` iterations over GPU groups (``atoms``);
    returns the steady-state period."""
    free = [0.0] * (1 + max(max(a) for a in atoms.values()))
    done = {"actor_train": 0.0, "critic_train": 0.0}
    iteration_end = []

    def run(groups: list[int], ready: float, duration: float) -> float:
        end = max(ready, max(free[g] for g in groups)) + duration
        for g in groups:
            free[g] = end
        return end

    both = {c: sorted(set(atoms[c]) | set(atoms[t])) for c, t in TRAINED_BY.items()}
    for _ in range(NUM_SIMULATED_ITERATIONS):
        end: dict[str, float] = {}
        for call in ("actor_gen", "rew_inf", "ref_inf", "critic_inf"):
            if call not in allocs:
                continue
            ready = end.get("actor_gen", 0.0)
            if call in TRAINED_BY:
                there, back = moves[call]
                ready = max(ready, done[TRAINED_BY[call]])
                if there:
                    ready = run(both[call], ready, there)
                end[call] = run(atoms[call], ready, seconds[call])
                if back:
                    end[call] = run(both[call], end[call], back)
            else:
                end[call] = run(atoms[call], ready, seconds[call])
        inputs = max(end.values())
        for call in ("actor_train", "critic_train"):
            end[call] = done[call] = run(atoms[call], inputs, seconds[call])
        iteration_end.append(max(end.values()))
    return (iteration_end[-1] - iteration_end[0]) / (NUM_SIMULATED_ITERATIONS - 1)


def lifecycle_inputs(w: Workload, hw: Hardware) -> Inputs:
    """What ``planning.lifecycle`` reads of a workload on a cluster."""
    from planning.lifecycle import Inputs

    return Inputs(w.specs(), w.batch, w.prompt_len, w.gen_len, w.value_bytes, gpu=hw.name != "cpu")


def memory_lifecycle(plan: ExecutionPlan, w: Workload, hw: Hardware) -> MemoryLifecycle:
    """The plan's device-memory lifecycle (``planning.lifecycle``), which ``estimate_plan``'s peaks price."""
    from planning.lifecycle import memory_lifecycle as build

    return build(plan.calls, lifecycle_inputs(w, hw), hw.gpu_memory_bytes)
