"""Calibration: measure the per-layer costs the estimator uses on this machine, and check the
estimator's predictions against measured calls.

    python -m planning.profile --out PROFILE.json                 # measure (CPU, or CUDA if present)
    python -m planning.profile --out PROFILE.json --check         # + predicted vs measured calls

Measured (ReaL profiles the same things, see ../shared/reference/real-reallocation.md §4), for
each model shape and TP-sharded width (``heads / tp``, ``kv_heads / tp``, ``intermediate / tp``):
one decoder layer's forward and forward + backward over a grid of batch x sequence, its Adam step,
a decode step (one token per sequence against a KV cache of ``context`` tokens), and the LM head's
forward and forward + backward. The layer is a plain torch Llama block (RMSNorm, GQA attention
with SDPA, SwiGLU), so the same code runs on CUDA for an H100/H200 profile.

``Profile.seconds`` interpolates the grid linearly in tokens (proportionally past its largest
point) and scales by FLOPs to shapes and TP degrees it did not measure. Without a profile the
estimator uses its analytic model with published peak numbers (``estimator.HARDWARE``: A100/H100/H200
from spec sheets, labelled as such, not measured).

``--check`` runs real calls on 1, 2 and 4 gloo ranks for the tiny model and SmolLM2-135M shapes
(random weights): training = FSDP2 forward + backward + Adam step, inference = data-parallel
forward; and reports predicted vs measured seconds, their Spearman rank correlation and the median
relative error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from common import dtypes
from common.files import atomic_write_text
from common.optim import adamw
from planning.shapes import named_spec
from reallocation.layout import ModelSpec

OPS = ("forward", "train", "optimizer", "optimizer_unfused", "decode", "head_forward", "head_train")
"""``optimizer``: the fused AdamW step the device processes run (``common.optim.adamw``); ``optimizer_unfused``:
torch's default AdamW path, which a tensor-parallel layout's mixed DTensor and plain parameters take
(``common.optim.fusable``). Profiles written before it existed lack it; the estimator then prices both alike."""
CPU_GRID = dict(
    batches=(1, 4, 16), seqs=(16, 64, 256), decode_batches=(1, 4, 16, 64, 256), contexts=(32, 128, 512), tps=(1, 2)
)
"""Up to 4,096 tokens a layer: CPU runs' calls go far past the grid, and the proportional extrapolation
from a point this small would carry its fixed per-call overhead along. Decode steps up to 256 sequences,
as many as one vLLM wave holds: past the largest point a step is priced proportionally, so a grid that
stopped at 16 priced one wave of 256 sequences as sixteen waves of 16, and generating in waves looked free
(the default workload's 16 waves took 1.65 s against 1.15 s in one, predicted 1.02 against 1.10)."""
CUDA_GRID = dict(
    batches=(1, 8, 32), seqs=(128, 512), decode_batches=(1, 8, 32, 128, 256), contexts=(256, 1024), tps=(1, 2, 4, 8)
)


def _cores(device: str) -> int | None:
    """The cores this process may run on (CPU), which a CPU run's device processes share."""
    if device != "cpu":
        return None
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _shape_key(spec: ModelSpec) -> str:
    return f"h{spec.hidden_size}-i{spec.intermediate_size}-a{spec.num_heads}-kv{spec.num_kv_heads}-d{spec.head_dim}"


def _layer_flops_per_token(spec: ModelSpec) -> float:
    hd = spec.head_dim
    params = (
        spec.hidden_size * hd * (2 * spec.num_heads + 2 * spec.num_kv_heads)
        + 3 * spec.hidden_size * spec.intermediate_size
    )
    return 2.0 * params


@dataclass
class Profile:
    """Measured per-layer seconds: ``entries`` rows ``{op, shape, tp, tokens, context, seconds}``; on a
    CPU, the machine's cores (its device processes share them) and the fixed seconds of one call."""

    device: str
    entries: list[dict[str, Any]] = field(default_factory=list)
    shapes: dict[str, dict[str, Any]] = field(default_factory=dict)  # shape key -> ModelSpec fields (ints, bools)
    num_cores: int | None = None
    """The profiled machine's cores (CPU; None on CUDA, where each device computes on its own)."""
    call_overhead_s: float = 0.0
    """Seconds of a call on an (almost) empty batch: ``bench/empty_calls.py --profile`` writes it (0: not measured)."""
    step_overhead_s: float = 0.0
    """Seconds of one optimizer step of a training call on an empty batch beyond ``call_overhead_s`` (as it)."""
    overheads: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Whole models' host floor on the profiled device (``measure_overheads``): model name -> its shape
    (``spec``), ``rows`` x ``tokens`` of the micro-batch it ran, and per path (``plain``: one replica's fp32
    weights under autocast; ``fsdp``: FSDP2's bf16 compute copies) the seconds of a ``forward``, a
    ``train`` micro-batch (forward + backward) and a ``step`` (clip + AdamW + zero_grad). Empty: not measured."""
    process_memory: dict[str, float] = field(default_factory=dict)
    """Device bytes a process holds outside its tensors (``measure_process_memory``, CUDA only). Empty: not measured."""

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        data = {
            "device": self.device,
            "num_cores": self.num_cores,
            "call_overhead_s": self.call_overhead_s,
            "step_overhead_s": self.step_overhead_s,
            "overheads": self.overheads,
            "process_memory": self.process_memory,
            "shapes": self.shapes,
            "entries": self.entries,
        }
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: cannot read profile ({e})") from e
        for key in ("device", "shapes", "entries"):
            if key not in data:
                raise ValueError(f"{path}: missing key {key!r} (write it with python -m planning.profile)")
        for i, row in enumerate(data["entries"]):
            missing = {"op", "shape", "tp", "tokens", "context", "seconds"} - set(row)
            if missing or row["op"] not in OPS:
                raise ValueError(
                    f"{path}: entries[{i}] has missing keys {sorted(missing)} or unknown op {row.get('op')!r}"
                )
        return cls(
            data["device"],
            data["entries"],
            data["shapes"],
            data.get("num_cores"),
            float(data.get("call_overhead_s", 0.0)),
            float(data.get("step_overhead_s", 0.0)),
            dict(data.get("overheads") or {}),
            dict(data.get("process_memory") or {}),
        )

    def has(self, op: str) -> bool:
        return any(r["op"] == op for r in self.entries)

    def overhead(self, kind: str, spec: ModelSpec, *, fsdp: bool = False) -> float:
        """Seconds a whole model of ``spec`` takes for one ``kind`` ("forward" | "train" | "step") on a
        micro-batch so small that the device idles (``measure_overheads``): the host's floor under
        that call, whatever its batch. From the measured model of the same layer shape (else the
        nearest in per-layer FLOPs), scaled by layer count (kernel launches grow with layers, not
        width); 0 when the profile measured none. Worked example: a 28-layer model measured at
        0.14 s a ``train`` micro-batch prices a 14-layer model of its shape at 0.07 s."""
        path = "fsdp" if fsdp else "plain"
        found = [
            (ModelSpec(**o["spec"]), o[path][kind])
            for o in self.overheads.values()
            if o.get(path, {}).get(kind) is not None
        ]
        if not found:
            return 0.0
        target = _layer_flops_per_token(spec)
        same = [f for f in found if _shape_key(f[0]) == _shape_key(spec)]
        measured, seconds = min(same or found, key=lambda f: abs(math.log(_layer_flops_per_token(f[0]) / target)))
        return float(seconds) * spec.num_layers / measured.num_layers

    def seconds(self, op: str, spec: ModelSpec, *, tokens: float, context: float = 0.0, tp: int = 1) -> float:
        """Seconds of ``op`` for one layer (or the LM head) of ``spec`` on ``tokens`` tokens.

        For ``decode``, ``tokens`` is the number of sequences and ``context`` their cache length.
        Shapes or TP degrees not measured are scaled by FLOPs from the nearest measured shape.
        """
        key, scale = self._nearest(spec, op)
        rows = [r for r in self.entries if r["op"] == op and r["shape"] == key and r["tp"] == tp]
        if not rows:
            rows = [r for r in self.entries if r["op"] == op and r["shape"] == key and r["tp"] == 1]
            scale /= tp
        if not rows:
            raise ValueError(f"profile ({self.device}) has no {op!r} measurements")
        if op == "decode":  # nearest measured context (log scale), then interpolate in batch
            ctx = min({r["context"] for r in rows}, key=lambda c: abs(math.log(c) - math.log(max(context, 1))))
            rows = [r for r in rows if r["context"] == ctx]
            scale *= max(context, 1) / ctx if context > ctx else 1.0
        return scale * _interpolate(rows, tokens)

    def _nearest(self, spec: ModelSpec, op: str) -> tuple[str, float]:
        key = _shape_key(spec)
        if key in self.shapes:
            return key, 1.0
        if not self.shapes:
            raise ValueError(f"profile ({self.device}) has no shapes")
        head = op.startswith("head")

        def size(fields: dict[str, Any]) -> float:
            s = ModelSpec(**fields)
            return s.hidden_size * s.vocab_size * 2.0 if head else _layer_flops_per_token(s)

        target = spec.hidden_size * spec.vocab_size * 2.0 if head else _layer_flops_per_token(spec)
        best = min(self.shapes, key=lambda k: abs(math.log(size(self.shapes[k]) / target)))
        return best, target / size(self.shapes[best])


def _interpolate(rows: list[dict[str, Any]], tokens: float) -> float:
    """Piecewise linear in tokens through the mean seconds at each measured token count."""
    by_tokens: dict[float, list[float]] = {}
    for r in rows:
        by_tokens.setdefault(float(r["tokens"]), []).append(float(r["seconds"]))
    points = sorted((t, statistics.fmean(s)) for t, s in by_tokens.items())
    # More tokens never take less time: a noisy smaller point is raised to its predecessor's value.
    for i in range(1, len(points)):
        points[i] = (points[i][0], max(points[i][1], points[i - 1][1]))
    if tokens <= points[0][0]:
        return points[0][1]  # below the grid: overheads dominate, assume no faster
    for (t0, s0), (t1, s1) in zip(points, points[1:]):
        if tokens <= t1:
            return s0 + (s1 - s0) * (tokens - t0) / (t1 - t0)
    t_last, s_last = points[-1]
    return s_last * tokens / t_last


# --- measurement ---------------------------------------------------------------------------


def _layer_module(spec: ModelSpec, tp: int, dtype: Any, device: str):
    """One Llama decoder block at TP-local widths (heads, kv heads and intermediate over ``tp``)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    heads, kv = spec.num_heads // tp, max(1, spec.num_kv_heads // tp)
    hd, hidden, inter = spec.head_dim, spec.hidden_size, spec.intermediate_size // tp

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = (
                nn.Linear(hidden, heads * hd),
                nn.Linear(hidden, kv * hd),
                nn.Linear(hidden, kv * hd),
            )
            self.o = nn.Linear(heads * hd, hidden, bias=False)
            self.gate, self.up = nn.Linear(hidden, inter, bias=False), nn.Linear(hidden, inter, bias=False)
            self.down = nn.Linear(inter, hidden, bias=False)
            self.n1, self.n2 = nn.RMSNorm(hidden), nn.RMSNorm(hidden)

        def forward(self, x, past=None):
            b, s, _ = x.shape
            h = self.n1(x)
            q = self.q(h).view(b, s, heads, hd).transpose(1, 2)
            k = self.k(h).view(b, s, kv, hd).transpose(1, 2)
            v = self.v(h).view(b, s, kv, hd).transpose(1, 2)
            if past is not None:
                k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
            k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=past is None)
            x = x + self.o(a.transpose(1, 2).reshape(b, s, heads * hd))
            h = self.n2(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    return Block().to(device=device, dtype=dtype), (kv, hd)


def _backward_sum(module: Callable[[Any], Any], x: Any) -> None:
    module(x).sum().backward()


def _backward_logsumexp(head: Callable[[Any], Any], x: Any) -> None:
    head(x).float().logsumexp(-1).sum().backward()


def _timed(fn: Callable[[], Any], device: str, repeats: int = 3, before: Callable[[], Any] | None = None) -> float:
    """Seconds of ``fn``: the fastest of ``repeats`` runs after a warm-up, the one least disturbed by
    other jobs sharing the machine (a median still carries their preemptions when most runs are hit).
    ``before`` runs, untimed, before each run (what ``fn`` consumes, such as gradients)."""
    import torch

    if before is not None:
        before()
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(
    specs: dict[str, ModelSpec], *, device: str, grid: dict, dtype: str = "auto", progress: bool = True
) -> Profile:
    """Measure every op of ``OPS`` for each spec over ``grid`` on ``device``, in ``dtype``: a name of
    ``common.dtypes.DTYPES``, or "auto" (bfloat16 on CUDA, float32 on CPU)."""
    import torch

    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    torch_dtype = dtypes.torch_dtype(dtype)
    name = torch.cuda.get_device_name() if device == "cuda" else f"cpu x{torch.get_num_threads()} threads"
    profile = Profile(f"{name} ({str(torch_dtype).removeprefix('torch.')})", num_cores=_cores(device))
    jobs = [
        (n, s, tp)
        for n, s in specs.items()
        for tp in grid["tps"]
        if s.num_heads % tp == 0 and (s.num_kv_heads % tp == 0 or tp % s.num_kv_heads == 0)
    ]
    from tqdm import tqdm

    for _, spec, tp in tqdm(jobs, desc="profile", unit="shape", disable=not progress):
        profile.shapes[_shape_key(spec)] = {k: getattr(spec, k) for k in ModelSpec.__dataclass_fields__}
        profile.entries.extend(_measure_shape(spec, tp, device, torch_dtype, grid))
    return profile


def _measure_shape(spec: ModelSpec, tp: int, device: str, dtype: Any, grid: dict) -> list[dict[str, Any]]:
    import torch

    layer, (kv, hd) = _layer_module(spec, tp, dtype, device)
    head = torch.nn.Linear(spec.hidden_size, -(-spec.vocab_size // tp), bias=False).to(device=device, dtype=dtype)
    opt = adamw(layer.parameters(), lr=1e-6)
    key, out = _shape_key(spec), []

    def row(op: str, tokens: float, context: float, seconds: float) -> None:
        out.append({"op": op, "shape": key, "tp": tp, "tokens": tokens, "context": context, "seconds": seconds})

    for b in grid["batches"]:
        for s in grid["seqs"]:
            x = torch.randn(b, s, spec.hidden_size, device=device, dtype=dtype)
            with torch.no_grad():
                row("forward", b * s, s, _timed(partial(layer, x), device))
                row("head_forward", b * s, s, _timed(partial(head, x), device))
            xg = x.clone().requires_grad_(True)
            row("train", b * s, s, _timed(partial(_backward_sum, layer, xg), device))
            row("head_train", b * s, s, _timed(partial(_backward_logsumexp, head, xg), device))
    for b in grid["decode_batches"]:
        for c in grid["contexts"]:
            past = (
                torch.randn(b, kv, c, hd, device=device, dtype=dtype),
                torch.randn(b, kv, c, hd, device=device, dtype=dtype),
            )
            x = torch.randn(b, 1, spec.hidden_size, device=device, dtype=dtype)
            with torch.no_grad():
                row("decode", b, c, _timed(partial(layer, x, past), device))
    layer(torch.randn(1, 4, spec.hidden_size, device=device, dtype=dtype)).sum().backward()
    row("optimizer", 0, 0, _timed(opt.step, device))
    unfused = torch.optim.AdamW(layer.parameters(), lr=1e-6)
    row("optimizer_unfused", 0, 0, _timed(unfused.step, device))
    return out


# --- a whole model's host floor ------------------------------------------------------------

OVERHEAD_ROWS, OVERHEAD_PROMPT, OVERHEAD_RESPONSE = 1, 8, 8
"""The micro-batch ``measure_overheads`` times: one row of 8 prompt and 8 response tokens, so little work
that a GPU idles between kernels and the wall time is the host's (Python, autograd, and the launch of every
kernel: the 1.5B policy step on 4 rows launched 4,427 kernels, ``../shared/gpu/step_parts.log``). A call of
any batch takes at least this long per micro-batch: the device cannot finish before the host has issued
its kernels."""
OVERHEAD_KINDS = ("forward", "train", "step")
OVERHEAD_PATHS = ("plain", "fsdp")


def whole_model(spec: ModelSpec, device: str):
    """An HF causal LM of ``spec``'s shape with seeded random weights in float32 (the trained models'
    master dtype), built on ``device`` directly (a 7B model's random init on a host takes minutes): Qwen2
    for q/k/v biases without an o bias, else Llama."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields: dict[str, Any] = dict(_hf_shape(spec), max_position_embeddings=4096)
    if spec.qkv_bias and not spec.o_bias and spec.head_dim * spec.num_heads == spec.hidden_size:
        config = AutoConfig.for_model("qwen2", **fields)
    else:
        config = AutoConfig.for_model(
            "llama", head_dim=spec.head_dim, attention_bias=spec.qkv_bias, mlp_bias=spec.mlp_bias, **fields
        )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config)
    return model.float().eval()


def _policy_loss(model: Any, ids: Any, response: int) -> Any:
    """The policy step's model work on ``ids``: logits of the response columns only (``logits_to_keep``, as
    ``runtime.device.shards.response_logits``), float32 log-softmax, the sampled tokens' log-probabilities."""
    logits = model(input_ids=ids, logits_to_keep=response + 1).logits[:, :-1]
    logprobs = logits.float().log_softmax(-1).gather(-1, ids[:, -response:, None]).squeeze(-1)
    return -logprobs.mean()


def _path_overheads(model: Any, device: str, dtype: Any, plain: bool, repeats: int) -> dict[str, float | None]:
    """Seconds of a forward, a train micro-batch and an optimizer step of ``model`` on the
    ``OVERHEAD_*`` micro-batch (``step``: None when the device has no room for Adam's state)."""
    import torch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (OVERHEAD_ROWS, OVERHEAD_PROMPT + OVERHEAD_RESPONSE), generator=g)
    ids = ids.to(device)
    cast = partial(torch.autocast, torch.device(device).type, dtype=dtype, enabled=plain and dtype != torch.float32)

    def forward() -> None:
        with torch.no_grad(), cast():
            _policy_loss(model, ids, OVERHEAD_RESPONSE)

    def train() -> None:
        with cast():
            loss = _policy_loss(model, ids, OVERHEAD_RESPONSE)
        loss.backward()

    out: dict[str, float | None] = {
        "forward": _timed(forward, device, repeats),
        "train": _timed(train, device, repeats),
    }
    try:
        opt = adamw(model.parameters(), lr=1e-7)

        def step() -> None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        out["step"] = _timed(step, device, repeats, before=train)
    except torch.OutOfMemoryError:
        out["step"] = None
    return out


@contextlib.contextmanager
def _world_of_one(device: str):
    """A one-rank process group (NCCL on CUDA, gloo on CPU; a file rendezvous, no socket listens) for
    FSDP2, unless one exists; yields the one-device mesh."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    created = not dist.is_initialized()
    with tempfile.TemporaryDirectory(prefix="realm-profile-pg-") as store:
        if created:
            device_id = torch.device(device, 0) if device == "cuda" else None
            backend = "nccl" if device == "cuda" else "gloo"
            dist.init_process_group(
                backend, init_method=f"file://{store}/pg", rank=0, world_size=1, device_id=device_id
            )
        try:
            yield init_device_mesh(device, (1,), mesh_dim_names=("dp",))
        finally:
            if created:
                dist.destroy_process_group()


def measure_process_memory() -> dict[str, float]:
    """What a CUDA process holds on its device outside the caching allocator's blocks, on a device no other
    process uses, run before this process touched CUDA: ``context_bytes`` once CUDA is up (total minus
    free: the context and the driver's own); ``cublas_bytes`` more after a first bf16 matmul (cuBLAS's
    handle; its workspace, if the allocator holds it, is in ``reserved_bytes``); ``nccl_bytes`` more after a
    one-rank NCCL group's first all-reduce (a lower bound for a communicator of several ranks, whose
    buffers grow with its peers and channels)."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info(device)
    out = {"total_bytes": float(total), "context_bytes": float(total - free)}

    def outside_allocator() -> float:
        torch.cuda.synchronize(device)
        return float(total - torch.cuda.mem_get_info(device)[0] - torch.cuda.memory_reserved(device))

    a = torch.ones(1024, 1024, device=device, dtype=torch.bfloat16)
    (a @ a).sum().item()
    out["cublas_bytes"] = outside_allocator() - out["context_bytes"]
    out["reserved_bytes"] = float(torch.cuda.memory_reserved(device))
    with _world_of_one("cuda"):
        dist.all_reduce(a)
        out["nccl_bytes"] = outside_allocator() - out["context_bytes"] - out["cublas_bytes"]
    return out


def measure_overheads(
    specs: dict[str, ModelSpec],
    *,
    device: str,
    dtype: str = "auto",
    paths: tuple[str, ...] = OVERHEAD_PATHS,
    repeats: int = 3,
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """``Profile.overheads`` of each named model on ``device``: the whole model (every layer, the LM head,
    the loss) on the ``OVERHEAD_*`` micro-batch, per path: ``plain`` (realm's single replica: float32
    weights under ``dtype`` autocast) and ``fsdp`` (FSDP2 over a one-rank group, ``dtype`` compute copies:
    the path of data-parallel calls, which adds its per-parameter casts and copies)."""
    import gc

    import torch
    from tqdm import tqdm

    from models.parallelize import apply_fsdp

    dtype = ("bfloat16" if device == "cuda" else "float32") if dtype == "auto" else dtype
    compute = dtypes.torch_dtype(dtype)
    out: dict[str, dict[str, Any]] = {}
    jobs = [(name, spec, path) for name, spec in specs.items() for path in paths]
    with _world_of_one(device) as mesh:
        for name, spec, path in tqdm(jobs, desc="overheads", unit="model", disable=not progress):
            model = whole_model(spec, device)
            if path == "fsdp":
                param_dtype = None if compute == torch.float32 else compute
                model = apply_fsdp(model, mesh, param_dtype=param_dtype, reduce_dtype=torch.float32)
            entry = out.setdefault(name, {"spec": {k: getattr(spec, k) for k in ModelSpec.__dataclass_fields__}})
            entry.update(rows=OVERHEAD_ROWS, tokens=OVERHEAD_PROMPT + OVERHEAD_RESPONSE, dtype=dtype)
            try:
                entry[path] = _path_overheads(model, device, compute, path == "plain", repeats)
            except Exception as e:  # noqa: BLE001 (one model's failure is recorded; the others are still measured)
                entry[path] = {"error": f"{type(e).__name__}: {e}"[:300]}
                print(f"overheads of {name} ({path}) failed: {entry[path]['error']}", file=sys.stderr)
            del model
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
    return out


# --- predicted vs measured calls ------------------------------------------------------------

# (model, batch, sequence length): small enough for 2 CPU cores, far enough apart to rank.
CHECK_WORKLOADS = (("tiny", 16, 64), ("smollm2-135m", 4, 32))
CHECK_RANKS = (1, 2, 4)
CHECK_CALLS = ("actor_train", "ref_inf")


def _hf_shape(spec: ModelSpec) -> dict[str, Any]:
    """The HF config fields every architecture takes from ``spec``'s shape."""
    return dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        tie_word_embeddings=spec.tie_word_embeddings,
    )


def _hf_model(spec: ModelSpec):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(head_dim=spec.head_dim, **_hf_shape(spec))
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _call_on_rank(rank: int, world: int, spec: ModelSpec, call: str, batch: int, seq: int) -> float:
    """Seconds of one training step (FSDP2 over ``world`` gloo ranks) or one data-parallel forward."""
    import torch
    import torch.distributed as dist

    model = _hf_model(spec)
    ids = torch.randint(0, spec.vocab_size, (batch // world, seq), generator=torch.Generator().manual_seed(rank))
    if call == "actor_train":
        from models.parallelize import apply_fsdp, make_mesh

        apply_fsdp(model, make_mesh(dp=world, device_type="cpu")["dp"])
        opt = adamw(model.parameters(), lr=1e-6)

        def step() -> None:
            model(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad()
    else:

        def step() -> None:
            with torch.no_grad():
                model(input_ids=ids)

    def synced() -> None:
        step()
        dist.barrier()

    dist.barrier()
    return _timed(synced, "cpu", repeats=2)


def _rank_worker(rank: int, world: int, store: str, fn: Callable, args: tuple) -> None:
    import pickle

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}/store", rank=rank, world_size=world)
    try:
        result: Any = fn(rank, world, *args)
    except Exception as e:  # hand the error to the parent, which re-raises it
        result = RuntimeError(f"rank {rank}: {type(e).__name__}: {e}")
    dist.destroy_process_group()
    with open(f"{store}/result_{rank}.pkl", "wb") as f:
        pickle.dump(result, f)


def run_ranks(fn: Callable, world: int, *args: Any) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` gloo ranks (file rendezvous: no socket listens)."""
    import pickle

    import torch.multiprocessing as mp

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory(prefix="realm-profile-") as store:
        mp.spawn(_rank_worker, args=(world, store, fn, args), nprocs=world, join=True)
        results = []
        for rank in range(world):
            with open(f"{store}/result_{rank}.pkl", "rb") as f:
                results.append(pickle.load(f))
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def predicted_seconds(profile: Profile, spec: ModelSpec, call: str, ranks: int, batch: int, seq: int) -> float:
    from planning.estimator import Workload, call_seconds, hardware
    from planning.execution_plan import CallAllocation

    hw = hardware("cpu", 1, max(CHECK_RANKS), profile)
    w = Workload(spec, spec, None, batch=batch, prompt_len=seq, gen_len=0)
    return call_seconds(call, spec, CallAllocation(tuple(range(ranks)), dp=ranks), w, hw)


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    spread = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return cov / spread if spread else math.nan  # undefined when either side is constant


def check(
    profile: Profile, *, workloads=CHECK_WORKLOADS, ranks=CHECK_RANKS, calls=CHECK_CALLS, progress: bool = True
) -> dict[str, Any]:
    """Predicted vs measured seconds per (model, call, ranks); Spearman and median relative error."""
    from tqdm import tqdm

    jobs = [(m, b, s, c, r) for m, b, s in workloads for c in calls for r in ranks]
    rows = []
    for model, batch, seq, call, world in tqdm(jobs, desc="calls", unit="call", disable=not progress):
        spec = named_spec(model)
        measured = max(run_ranks(_call_on_rank, world, spec, call, batch, seq))
        predicted = predicted_seconds(profile, spec, call, world, batch, seq)
        rows.append(
            {
                "model": model,
                "call": call,
                "ranks": world,
                "batch": batch,
                "seq": seq,
                "measured_s": measured,
                "predicted_s": predicted,
            }
        )
    errors = [abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"] for r in rows]
    return {
        "rows": rows,
        "spearman": spearman([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows]),
        "median_relative_error": statistics.median(errors),
    }


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m planning.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="PROFILE.json to write")
    parser.add_argument("--models", default="tiny,smollm2-135m", help="comma-separated named shapes or HF dirs")
    parser.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default: cuda when available")
    parser.add_argument("--check", action="store_true", help="also compare predicted and measured calls on gloo ranks")
    parser.add_argument("--check-jsonl", default=None, help="with --check: write its rows here, one JSON object a line")
    parser.add_argument(
        "--overheads", action="store_true", help="also measure each model's whole-model host floor (measure_overheads)"
    )
    parser.add_argument(
        "--base",
        default=None,
        help="a profile of this device whose layer measurements to keep: only the overheads are measured",
    )
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(1)  # one thread per rank, as the gloo ranks of --check run
    specs = {m: named_spec(m) for m in args.models.split(",")}
    process_memory: dict[str, float] = {}
    if device == "cuda" and (args.overheads or args.base):
        try:
            process_memory = measure_process_memory()
        except Exception as e:  # noqa: BLE001 (the overheads are still measured)
            print(f"process memory not measured: {type(e).__name__}: {e}", file=sys.stderr)
    if args.base:
        profile = Profile.load(args.base)
    else:
        profile = measure(specs, device=device, grid=CUDA_GRID if device == "cuda" else CPU_GRID)
    if args.overheads or args.base:
        profile.process_memory.update(process_memory)
        if process_memory:
            print("  process memory, GiB: " + ", ".join(f"{k} {v / (1 << 30):.3f}" for k, v in process_memory.items()))
        profile.overheads.update(measure_overheads(specs, device=device))
        for name, o in profile.overheads.items():
            said = ", ".join(
                f"{p} " + " / ".join(_seconds(o[p].get(k)) for k in OVERHEAD_KINDS) for p in OVERHEAD_PATHS if p in o
            )
            print(f"  {name}: host floor s (forward / train / step) {said}")
    profile.save(args.out)
    print(f"wrote {args.out}: {len(profile.entries)} measurements on {profile.device}")
    if args.check:
        result = check(profile)
        for r in result["rows"]:
            print(
                f"  {r['model']:<13} {r['call']:<12} {r['ranks']} ranks  measured {r['measured_s']:8.3f} s"
                f"  predicted {r['predicted_s']:8.3f} s"
            )
        print(
            f"spearman {result['spearman']:.2f}, median relative error {result['median_relative_error']:.0%} "
            f"over {len(result['rows'])} (call, layout) pairs"
        )
        if args.check_jsonl:
            atomic_write_text(Path(args.check_jsonl), "".join(json.dumps(r) + "\n" for r in result["rows"]))
            print(f"wrote {args.check_jsonl}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
