"""Execution-plan cost model (ReaL-style): time and memory of one model function call under one
allocation, and the cost of moving parameters between two allocations.

An *execution plan* gives each model function call (actor generation, reward / reference /
critic inference, actor / critic training) an ``Allocation``: a device mesh (a contiguous block
of GPUs) and a ``Layout`` (pp x dp x fsdp x tp) on it. ``search.py`` looks for the plan with the
shortest simulated PPO iteration.

The model is analytic (ReaL profiles layers instead; see ../shared/reference/real-reallocation.md §4):

- compute: ``2 * N * tokens`` FLOPs per forward (x3 for training), at ``mfu`` of peak, split
  over all GPUs of the mesh; pipeline bubble ``(pp - 1) / num_microbatches`` on top;
- tensor parallel: two all-reduces of the activations per layer per forward pass (x2 for
  backward) over the intra-node links, plus a latency per all-reduce (decode steps are latency
  bound);
- data parallel: gradient reduce-scatter + all-gather of the shard per training step (FSDP also
  all-gathers the weights for forward and backward);
- generation: prefill is compute bound; each decode step reads the local weights and KV cache
  from HBM or computes, whichever is slower;
- memory per GPU: weights (+ fp32 grads and Adam state for training, sharded by FSDP), and the
  active memory (activations or KV cache);
- reallocation: the plan's lower bound (``plan.py``) between the two layouts placed on their
  meshes; the slowest receiving GPU sets the time (intra- or inter-node bandwidth).

Numbers are for ranking plans, not for predicting wall time to the second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from reallocation.layout import Layout, ModelSpec
from reallocation.plan import lower_bound_elements

TRAIN, INFERENCE, GENERATE = "train", "inference", "generate"


@dataclass(frozen=True)
class Hardware:
    """A cluster of identical nodes. Defaults: 8x A100-80GB nodes (NVLink, 200 Gb/s between nodes)."""

    num_nodes: int = 1
    gpus_per_node: int = 8
    gpu_memory_bytes: int = 80 << 30
    peak_flops: float = 312e12  # bf16 dense
    mfu: float = 0.45  # fraction of peak reached by large matmuls
    hbm_bytes_per_s: float = 1.6e12
    intra_node_bytes_per_s: float = 150e9  # per GPU, NVLink
    inter_node_bytes_per_s: float = 25e9  # per node, 200 Gb/s
    collective_latency_s: float = 20e-6  # one small all-reduce

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node


@dataclass(frozen=True)
class Call:
    """One model function call of the dataflow graph.

    ``model`` names the parameters it uses (calls of the same model share weights, e.g.
    actor_gen and actor_train); ``deps`` are calls whose outputs it needs in the same iteration.
    Sequence lengths are in tokens; ``gen_len`` only for ``kind == GENERATE``.
    """

    name: str
    model: str
    kind: str
    spec: ModelSpec
    batch: int
    prompt_len: int
    gen_len: int = 0
    deps: tuple[str, ...] = ()
    num_microbatches: int = 4  # training / inference pipeline micro-batches

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.gen_len


@dataclass(frozen=True)
class Allocation:
    """GPUs ``[first, first + size)`` running ``layout`` (``layout.size == size``)."""

    first: int
    size: int
    layout: Layout

    @property
    def gpus(self) -> range:
        return range(self.first, self.first + self.size)

    def __str__(self) -> str:
        return f"gpus[{self.first}:{self.first + self.size}] {self.layout}"


def _bytes_per_param() -> int:
    return 2  # bf16 weights and activations


@lru_cache(maxsize=100_000)
def estimate_time(call: Call, alloc: Allocation, hw: Hardware) -> float:
    """Seconds for one call under ``alloc``."""
    lay, spec = alloc.layout, call.spec
    n = spec.num_params()
    dp = lay.dp * lay.fsdp
    gpus = alloc.size
    flops_per_s = hw.peak_flops * hw.mfu
    # TP all-reduces ride NVLink inside a node; a mesh spanning nodes pays the node link.
    link = hw.intra_node_bytes_per_s if lay.tp <= hw.gpus_per_node else hw.inter_node_bytes_per_s
    act_bytes = spec.hidden_size * _bytes_per_param()

    def tp_comm(tokens_per_replica: float, passes: int) -> float:
        if lay.tp == 1:
            return 0.0
        volume = 2 * (lay.tp - 1) / lay.tp * tokens_per_replica * act_bytes  # ring all-reduce
        per_layer = 2 * passes * (volume / link + hw.collective_latency_s)
        return per_layer * spec.num_layers / lay.pp

    def bubble(micro: int) -> float:
        return (micro + lay.pp - 1) / micro

    if call.kind in (TRAIN, INFERENCE):
        tokens = call.batch * call.seq_len
        passes = 3 if call.kind == TRAIN else 1  # backward costs two forwards
        compute = 2 * n * tokens * passes / (gpus * flops_per_s)
        t = compute * bubble(call.num_microbatches) + tp_comm(tokens / dp, passes)
        if call.kind == TRAIN and dp > 1:
            shard = n * _bytes_per_param() / (lay.tp * lay.pp)
            link_dp = hw.intra_node_bytes_per_s if gpus <= hw.gpus_per_node else hw.inter_node_bytes_per_s / hw.gpus_per_node
            # Gradient reduce-scatter + all-gather; FSDP also gathers weights for fwd and bwd.
            rounds = 2 + (2 if lay.fsdp > 1 else 0)
            t += rounds * (dp - 1) / dp * shard / link_dp
        return t
    # Generation: prefill, then gen_len decode steps for the replica's share of the batch.
    batch = call.batch / dp
    prefill = 2 * n * call.batch * call.prompt_len / (gpus * flops_per_s) * bubble(lay.pp) + tp_comm(batch * call.prompt_len, 1)
    weights_per_gpu = n * _bytes_per_param() / (lay.tp * lay.pp)
    kv_per_gpu = _kv_bytes(call, lay) / 2  # average cache length over the decode
    step_memory = (weights_per_gpu + kv_per_gpu) / hw.hbm_bytes_per_s * lay.pp  # stages run in turn
    step_compute = 2 * n * batch / (lay.tp * flops_per_s)
    decode = call.gen_len * (max(step_memory, step_compute) + tp_comm(batch, 1))
    return prefill + decode


def _kv_bytes(call: Call, lay: Layout) -> float:
    """KV cache of one GPU at full length."""
    spec = call.spec
    kv_heads = max(1, spec.num_kv_heads // lay.tp) if spec.num_kv_heads >= lay.tp else 1
    per_token = 2 * kv_heads * spec.head_dim * _bytes_per_param() * math.ceil(spec.num_layers / lay.pp)
    return call.batch / (lay.dp * lay.fsdp) * call.seq_len * per_token


@lru_cache(maxsize=100_000)
def static_memory(call: Call, alloc: Allocation) -> float:
    """Bytes per GPU that stay resident: weights, and for training fp32 grads + Adam state."""
    lay, n = alloc.layout, call.spec.num_params()
    weights = n * _bytes_per_param() / (lay.tp * lay.pp)
    if call.kind != TRAIN:
        return weights
    # bf16 weights + fp32 master, grads, Adam m and v = 2 + 16 bytes/param, sharded by FSDP.
    return n * 18 / (lay.tp * lay.pp * lay.fsdp)


@lru_cache(maxsize=100_000)
def active_memory(call: Call, alloc: Allocation) -> float:
    """Bytes per GPU only while the call runs: activations or the KV cache."""
    lay, spec = alloc.layout, call.spec
    if call.kind == GENERATE:
        return _kv_bytes(call, lay)
    tokens = call.batch * call.seq_len / (lay.dp * lay.fsdp) / call.num_microbatches
    layers = math.ceil(spec.num_layers / lay.pp)
    # ~34 bytes/token/hidden/layer of saved activations for training (Korthikanti et al.),
    # split by TP; inference keeps one layer's worth plus the logits.
    if call.kind == TRAIN:
        return tokens * spec.hidden_size * 34 * layers / lay.tp * min(lay.pp, call.num_microbatches)
    return tokens * (spec.hidden_size * 34 + spec.vocab_size * 4) / lay.tp


def fits(call: Call, alloc: Allocation, hw: Hardware) -> bool:
    return static_memory(call, alloc) + active_memory(call, alloc) <= hw.gpu_memory_bytes


@lru_cache(maxsize=100_000)
def realloc_time(spec: ModelSpec, src: Allocation, dst: Allocation, hw: Hardware) -> float:
    """Seconds to move ``spec``'s parameters from ``src`` to ``dst`` with a minimal plan.

    Each destination GPU receives the elements it lacks (the plan's lower bound); GPUs receive
    in parallel, so the slowest one sets the time. Zero when nothing moves.
    """
    if src == dst:
        return 0.0
    model_src, model_dst = _holdings(spec, src), _holdings(spec, dst)
    worst = 0.0
    for gpu in dst.gpus:
        mine = {n: {gpu: per[gpu]} for n, per in model_dst.items() if gpu in per}
        nbytes = lower_bound_elements(model_src, mine) * _bytes_per_param()
        same_node = all(g // hw.gpus_per_node == gpu // hw.gpus_per_node for g in src.gpus)
        bandwidth = hw.intra_node_bytes_per_s if same_node else hw.inter_node_bytes_per_s / hw.gpus_per_node
        worst = max(worst, nbytes / bandwidth)
    return worst + (hw.collective_latency_s * 10 if worst else 0.0)


@lru_cache(maxsize=4096)
def _holdings(spec: ModelSpec, alloc: Allocation):
    """The allocation's layout placed on its GPUs (GPU index = global rank)."""
    lay = alloc.layout
    placed = Layout(pp=lay.pp, dp=lay.dp, fsdp=lay.fsdp, tp=lay.tp, ranks=tuple(alloc.gpus), vocab_pad_to=lay.vocab_pad_to)
    return placed.holdings(spec)
