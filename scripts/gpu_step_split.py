"""``bash scripts/gpu_check.sh --step-split``: where one PPO policy step's time goes on this device.

For a named shape (default: Qwen2.5-Math-1.5B on a GPU, the tiny model with ``--cpu``) with random weights,
on each of realm's two training paths (``plain``: one replica's float32 weights under bf16 autocast, as
``runtime.device.shards`` runs a call with dp = 1; ``fsdp``: FSDP2 over a one-rank group with bf16 compute
copies, the path of data-parallel calls), and for each row count, one policy step of rows x (prompt +
response) tokens built from realm's own functions (``response_logits``, ``logprobs_from_logits``,
``policy_loss``, the trainer's gradient clipping, ``common.optim.adamw``), each part timed with a device
sync around it (median of 3 after 2 warm-ups)::

    SPLIT plain rows=4 tokens=4096: forward 0.0920 s, backward 0.0983 s, clip 0.0162 s, optimizer 0.0263 s, ...
    PROFILE plain rows=4: 4427 kernel launches, 2811 copies and casts, device busy 0.128 s of 0.236 s
    FLOOR plain: forward 0.0500 s, train 0.1400 s, step 0.0400 s (planning.profile.measure_overheads)

``PROFILE`` is torch.profiler over one step at the fewest rows: how many kernels the host launched and how
long the device computed; ``FLOOR`` is the host floor the cost model prices (``planning.profile``), measured
on the same device. A step whose device-busy time is well under its wall time is host-bound: more rows
per micro-batch then come for free.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from common.optim import adamw
from models.parallelize import apply_fsdp
from planning.profile import OVERHEAD_KINDS, measure_overheads, whole_model
from planning.shapes import named_spec
from ppo.batch import response_tokens
from ppo.losses import logprobs_from_logits, policy_loss
from runtime.device.shards import _global_grad_norm_clip, response_logits

PARTS = ("forward", "backward", "clip", "optimizer", "zero_grad")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")
COPIES = ("aten::copy_", "aten::_to_copy")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _batch(rows: int, prompt: int, response: int, vocab: int, device: torch.device, seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(5, vocab, (rows, prompt + response), generator=g).to(device),
        "attention_mask": torch.ones(rows, prompt + response, dtype=torch.long, device=device),
        "response_mask": torch.ones(rows, response, device=device),
    }


class _Step:
    """One policy step of ``model`` on ``device``, as the trainer runs it, in timed parts."""

    def __init__(self, model: nn.Module, device: torch.device, plain: bool):
        self.model, self.device = model, device
        # bf16 compute on a GPU; a CPU run computes in float32, as realm's CPU runs do.
        on_gpu = device.type == "cuda"
        self.autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=plain and on_gpu)
        self.optimizer = adamw(model.parameters(), lr=1e-7)

    def parts(self, batch: dict[str, Any]) -> dict[str, float]:
        mask = batch["response_mask"]
        advantages = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)).to(self.device)
        work: dict[str, Callable[[], Any]] = {}
        state: dict[str, Any] = {}

        def forward() -> None:
            with self.autocast():
                logprobs = logprobs_from_logits(response_logits(self.model, batch), response_tokens(batch))
                state["loss"], _ = policy_loss(logprobs, logprobs.detach(), advantages, mask, 0.2, mask.sum())

        work["forward"] = forward
        work["backward"] = lambda: state.pop("loss").backward()
        work["clip"] = lambda: _global_grad_norm_clip(self.model, 1.0)
        work["optimizer"] = self.optimizer.step
        work["zero_grad"] = lambda: self.optimizer.zero_grad(set_to_none=True)
        seconds = {}
        for part in PARTS:
            _sync(self.device)
            start = time.perf_counter()
            work[part]()
            _sync(self.device)
            seconds[part] = time.perf_counter() - start
        return seconds


def _profiled(step: _Step, batch: dict[str, Any], device: torch.device) -> tuple[int, int, float, float]:
    """(kernel launches, copies and casts, device-busy seconds, wall seconds) of one step under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        step.parts(batch)
    wall = time.perf_counter() - start
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key in LAUNCHES)
    copies = sum(e.count for e in events if e.key in COPIES)
    busy_us = sum(getattr(e, "self_device_time_total", 0.0) for e in events)
    return launches, copies, busy_us / 1e6, wall


def _path(shape: str, path: str, device: torch.device, rows_list: tuple[int, ...], prompt: int, response: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    model = whole_model(named_spec(shape), device.type)
    if path == "fsdp":
        mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp",))
        param_dtype = torch.bfloat16 if device.type == "cuda" else None
        model = apply_fsdp(model, mesh, param_dtype=param_dtype, reduce_dtype=torch.float32)
    step = _Step(model, device, plain=path == "plain")
    vocab = model.config.vocab_size
    for rows in rows_list:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for seed in range(2):
            step.parts(_batch(rows, prompt, response, vocab, device, seed))
        runs = [step.parts(_batch(rows, prompt, response, vocab, device, 10 + i)) for i in range(3)]
        median = {part: statistics.median(r[part] for r in runs) for part in PARTS}
        total = statistics.median(sum(r.values()) for r in runs)
        peak = torch.cuda.max_memory_allocated(device) / (1 << 30) if device.type == "cuda" else 0.0
        cells = ", ".join(f"{part} {median[part]:.4f} s" for part in PARTS)
        tokens = rows * (prompt + response)
        print(
            f"SPLIT {path} rows={rows} tokens={tokens}: {cells}, step {total:.4f} s, "
            f"{tokens / total:.0f} tokens/s, peak allocated {peak:.1f} GiB",
            flush=True,
        )
    launches, copies, busy, wall = _profiled(step, _batch(rows_list[0], prompt, response, vocab, device, 99), device)
    print(
        f"PROFILE {path} rows={rows_list[0]}: {launches} kernel launches, {copies} copies and casts, "
        f"device busy {busy:.3f} s of {wall:.3f} s (under the profiler)",
        flush=True,
    )
    del step, model
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run(device: torch.device, shape: str, rows_list: tuple[int, ...], prompt: int, response: int) -> int:
    """Print the split and profile of each path, then the host floor ``planning.profile`` measures."""
    print(f"step split: {shape}, rows {list(rows_list)} x ({prompt} + {response}) tokens, on {device}", flush=True)
    for path in ("plain", "fsdp"):
        _path(shape, path, device, rows_list, prompt, response)
    floors = measure_overheads({shape: named_spec(shape)}, device=device.type, progress=False)[shape]
    for path in ("plain", "fsdp"):
        cells = ", ".join(
            f"{kind} {'-' if floors[path][kind] is None else format(floors[path][kind], '.4f')} s"
            for kind in OVERHEAD_KINDS
        )
        print(f"FLOOR {path}: {cells} (planning.profile.measure_overheads, {floors['tokens']} tokens)", flush=True)
    return 0
