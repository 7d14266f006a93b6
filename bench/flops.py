"""FLOP accounting for ``bench/ppo_iteration.py``: the machine's matmul peak, and per model function call
the FLOPs of what it computed (from the model's shapes and the counts each forward logged,
``runtime/device/work_log.py``), padding apart, achieved GFLOPS and the fraction of the peak of the cores
the call used.

Conventions (those of MFU accounting, e.g. PaLM's appendix B):
- a matmul of [m, k] by [k, n] is 2 m k n FLOPs; norms, activations, RoPE and softmax are not counted;
- a forward is, per token, 2 x (the decoder's linear weights) per layer, plus 4 x heads x head_dim per
  causal attention pair (QK^T and PV), plus 2 x hidden x vocab per position the LM head ran on (a value
  model's scalar head: 2 x hidden per token);
- a training pass is 3 forwards (the backward is two matmuls per forward one); a recomputed forward
  (activation checkpointing, ``ppo.losses.head_logprobs``' backward) is work, not model FLOPs, and is
  not counted;
- padding: what the forward computed on (rows x columns after ``trim_padding``, and every head position)
  minus the real tokens.
"""

from __future__ import annotations

import bisect
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRAINING_PASS_FORWARDS = 3
"""A forward and a backward (the gradients of the activations and of the weights: two matmuls each)."""


@dataclass(frozen=True)
class ModelShape:
    """The shapes a decoder's FLOPs follow from (an HF Llama/Qwen2 ``config.json``)."""

    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        heads = int(config["num_attention_heads"])
        return cls(
            num_layers=int(config["num_hidden_layers"]),
            hidden=int(config["hidden_size"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelShape:
        return cls.from_config(json.loads((Path(model_dir) / "config.json").read_text()))

    @property
    def linear_flops_per_token(self) -> int:
        """2 x the weights of q, k, v, o and the gated MLP (gate, up, down), over all layers."""
        h, q, kv = self.hidden, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * self.intermediate
        return 2 * self.num_layers * per_layer

    @property
    def attention_flops_per_pair(self) -> int:
        """QK^T and PV: 2 x head_dim each, per head, per layer."""
        return 4 * self.num_layers * self.num_heads * self.head_dim

    def forward_flops(self, tokens: int, pairs: int, head_positions: int, value_head: bool = False) -> int:
        """One forward over ``tokens`` tokens with ``pairs`` causal attention pairs, the LM head on
        ``head_positions`` positions (or, ``value_head``, a scalar head on every token)."""
        head = 2 * self.hidden * (tokens if value_head else self.vocab * head_positions)
        return self.linear_flops_per_token * tokens + self.attention_flops_per_pair * pairs + head


def record_flops(shape: ModelShape, line: Mapping[str, Any]) -> tuple[int, int]:
    """(FLOPs on real tokens, FLOPs on padding) of one logged forward, times 3 when it kept a graph (a
    training pass: ``TRAINING_PASS_FORWARDS``)."""
    value_head = line["kind"] == "values"
    real = shape.forward_flops(line["tokens"], line["pairs"], line["head_tokens"], value_head)
    computed = shape.forward_flops(line["computed_tokens"], line["computed_pairs"], line["head_positions"], value_head)
    passes = TRAINING_PASS_FORWARDS if line["grad"] else 1
    return passes * real, passes * (computed - real)


def matmul_peak_gflops(num_threads: int, n: int = 2048, reps: int = 8) -> float:
    """Best-of-``reps`` GFLOPS of one float32 [n, n] @ [n, n] matmul on ``num_threads`` torch threads (the
    same BLAS the models use). Best-of, because the machine is shared: the peak is what the cores can do
    when the call gets them."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)  # warm-up: BLAS buffers, thread pool
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    return 2 * n**3 / best / 1e9


MatMul = tuple[int, int, int, int]
"""(m, k, n, count): ``count`` matmuls of [m, k] @ [k, n]."""


def call_matmuls(
    shape: ModelShape, tokens: int, head_positions: int, training: bool, value_head: bool = False, head_rows: int = 128
) -> list[MatMul]:
    """The matmuls of one forward (and, ``training``, its backward) over ``tokens`` tokens, as the model runs
    them: per layer q, k, v, o and the gated MLP on every token; the LM head on ``head_positions`` positions
    in blocks of ``head_rows`` rows (``ppo.losses.head_logprobs``; a value model's scalar head is left out,
    as its FLOPs are negligible). The backward of each [m, k] @ [k, n] is [m, n] @ [n, k] (the input's
    gradient) and [k, m] @ [m, n] (the weight's). Attention's QK^T and PV are not matmuls of weights and are
    left out. Same shapes merged, counts added."""
    h, i = shape.hidden, shape.intermediate
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    layer = [(tokens, h, q, 1), (tokens, h, kv, 2), (tokens, q, h, 1), (tokens, h, i, 2), (tokens, i, h, 1)]
    forward = [(m, k, n, c * shape.num_layers) for m, k, n, c in layer]
    if not value_head and head_positions:
        full, rest = divmod(head_positions, head_rows)
        forward += [(head_rows, h, shape.vocab, full)] if full else []
        forward += [(rest, h, shape.vocab, 1)] if rest else []
    out = list(forward)
    if training:
        for m, k, n, c in forward:
            out += [(m, n, k, c), (k, m, n, c)]
    merged: dict[tuple[int, int, int], int] = {}
    for m, k, n, c in out:
        if m and k and n and c:
            merged[m, k, n] = merged.get((m, k, n), 0) + c
    return [(m, k, n, c) for (m, k, n), c in merged.items()]


def matmul_rate_gflops(matmuls: Iterable[MatMul], num_threads: int, reps: int = 3) -> float:
    """GFLOPS of ``matmuls`` alone (float32, best of ``reps`` per shape, on ``num_threads`` torch threads):
    what a call's own matmul shapes allow on the cores it gets, before any other work. A model with a small
    hidden size runs its matmuls far below the 2048^2 peak (``matmul_peak_gflops``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    flops, seconds = 0, 0.0
    try:
        for m, k, n, count in matmuls:
            a, b = torch.randn(m, k), torch.randn(k, n)
            torch.mm(a, b)  # warm-up
            best = float("inf")
            for _ in range(reps):
                start = time.perf_counter()
                torch.mm(a, b)
                best = min(best, time.perf_counter() - start)
            flops += 2 * m * k * n * count
            seconds += best * count
    finally:
        torch.set_num_threads(before)
    return flops / seconds / 1e9 if seconds > 0 else 0.0


def read_work_log(directory: Path) -> dict[int, list[dict[str, Any]]]:
    """pid -> its forwards in order, from ``work-<pid>.jsonl`` (``runtime.device.work_log``)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(directory.glob("work-*.jsonl")):
        pid = int(path.stem.split("-", 1)[1])
        out[pid] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def call_of(line: Mapping[str, Any], actor_models: set[int]) -> str:
    """The model function call a logged forward belongs to: a training pass of the policy (actor_train)
    or critic (critic_train), or an inference forward: values (critic_inf), the policy's logprobs
    (actor_inf: the same model object as its training passes) or the reference's (ref_inf)."""
    if line["kind"] == "values":
        return "critic_train" if line["grad"] else "critic_inf"
    if line["grad"]:
        return "actor_train"
    return "actor_inf" if line["model"] in actor_models else "ref_inf"


def iteration_starts(logs: Mapping[int, list[dict[str, Any]]]) -> list[float]:
    """When each PPO iteration after the first began, as far as the forwards tell: the end of the previous
    iteration's last training pass. Read from the processes that train the policy, which also compute the
    old logprobs (actor_inf runs on actor_train's devices): their iteration begins with inference forwards
    (no graph) after training passes."""
    ends: dict[int, float] = {}
    for lines in logs.values():
        if not any(line["kind"] == "logprobs" and line["grad"] for line in lines):
            continue
        iteration, previous_grad = -1, True
        for line in lines:
            if previous_grad and not line["grad"]:
                iteration += 1
            if line["grad"]:
                ends[iteration] = max(ends.get(iteration, 0.0), line["end"])
            previous_grad = line["grad"]
    return [ends[i] for i in sorted(ends)][:-1]


@dataclass
class CallWork:
    """One call's work over the timed iterations: FLOPs on real tokens and on padding, tokens, the time
    its forwards took (inference: the whole pass; training: the forwards only), and the threads per
    process it ran with."""

    flops: int = 0
    padding_flops: int = 0
    tokens: int = 0
    computed_tokens: int = 0
    head_tokens: int = 0
    head_positions: int = 0
    forward_s: float = 0.0
    num_forwards: int = 0
    threads: int = 0

    def add(self, shape: ModelShape, line: Mapping[str, Any]) -> None:
        real, padding = record_flops(shape, line)
        self.flops += real
        self.padding_flops += padding
        self.tokens += line["tokens"]
        self.computed_tokens += line["computed_tokens"]
        self.head_tokens += line["head_tokens"]
        self.head_positions += line["head_positions"]
        self.forward_s += line["end"] - line["start"]
        self.num_forwards += 1
        self.threads = max(self.threads, line["threads"])


def work_by_call(
    shapes: Mapping[str, ModelShape], logs: Mapping[int, list[dict[str, Any]]], timed: Iterable[int]
) -> dict[str, CallWork]:
    """Per call, the work of the iterations ``timed`` (0-based) summed over the processes that ran it.
    ``shapes``: the policy's (``"actor"``) and the critic's (``"critic"``) model shapes."""
    timed, starts = set(timed), iteration_starts(logs)
    out: dict[str, CallWork] = {}
    for lines in logs.values():
        actor_models = {line["model"] for line in lines if line["kind"] == "logprobs" and line["grad"]}
        for line in lines:
            if bisect.bisect_right(starts, line["start"]) not in timed:
                continue
            call = call_of(line, actor_models)
            shape = shapes["critic" if call.startswith("critic") else "actor"]
            out.setdefault(call, CallWork()).add(shape, line)
    return out


def peak_of(num_devices: int, threads: int, peak_one: float, peak_all: float, cpu_count: int) -> float:
    """The matmul peak of a call on ``num_devices`` device processes of ``threads`` torch threads each:
    separate processes add up (each its own BLAS), so ``num_devices`` x one process's peak; a process's peak
    is the one-thread measurement, the all-thread one when it holds every core, else ``threads`` x the
    one-thread one. Two one-thread processes on 2 cores: 2 x the one-thread peak."""
    per_process = peak_one if threads <= 1 else peak_all if threads >= cpu_count else threads * peak_one
    return num_devices * per_process


def call_matmul_rate(shape: ModelShape, work: CallWork, call: str, num_devices: int) -> float:
    """The GFLOPS ``call``'s own matmuls allow on its cores: its mean forward's shapes (``work``'s computed
    tokens and head positions over its forwards; a training call's backward too) timed on the threads each
    of its ``num_devices`` device processes has, times the processes (each its own BLAS on its own cores)."""
    if not work.num_forwards:
        return 0.0
    tokens = round(work.computed_tokens / work.num_forwards)
    head = round(work.head_positions / work.num_forwards)
    matmuls = call_matmuls(shape, tokens, head, call.endswith("_train"), value_head=call.startswith("critic"))
    threads = min(max(1, work.threads), os.cpu_count() or 1)
    return num_devices * matmul_rate_gflops(matmuls, threads)


def call_report(
    work: CallWork,
    num_iterations: int,
    seconds: float,
    num_devices: int,
    peaks: tuple[float, float],
    empty_call_s: float | None,
    matmul_rate: float | None = None,
) -> dict[str, Any]:
    """One call's line of the FLOP table. ``work``: summed over ``num_iterations`` timed iterations (and
    the call's processes); ``seconds``: the call's mean wall time per iteration. Achieved GFLOPS on real
    tokens over that wall time; the fraction of the peak of the cores the call used (devices x threads per
    device; ``peaks``: the one-thread and all-thread matmul GFLOPS); the padding fraction; and where the
    time went: ``forward_share``, the forwards' CPU time over the cores' time (inference: whole passes;
    training: forwards only), and ``empty_call_s``, the same call on an (almost) empty batch. ``matmul_rate``
    (``call_matmul_rate``): the GFLOPS the call's own matmul shapes reach alone on its cores; the call's
    fraction of it is the share of its wall time its matmuls would take at that rate. Near 1, the shapes
    bound the call; far below, what runs around the matmuls does (norms, activations, attention, the
    softmax over the vocabulary, allocation, dispatch, communication)."""
    cores = max(1, num_devices * max(1, work.threads))
    peak = peak_of(num_devices, max(1, work.threads), *peaks, os.cpu_count() or cores)
    per_iteration = 1 / max(1, num_iterations)
    flops, total = work.flops * per_iteration, (work.flops + work.padding_flops) * per_iteration
    gflops = flops / 1e9 / seconds if seconds > 0 else 0.0
    return {
        "gflop": flops / 1e9,
        "padding_gflop": total / 1e9 - flops / 1e9,
        "padding_fraction": 1 - flops / total if total else 0.0,
        "tokens": work.tokens * per_iteration,
        "computed_tokens": work.computed_tokens * per_iteration,
        "head_tokens": work.head_tokens * per_iteration,
        "seconds": seconds,
        "gflops": gflops,
        "gflops_incl_padding": total / 1e9 / seconds if seconds > 0 else 0.0,
        "cores": cores,
        "threads_per_device": work.threads,
        "peak_gflops": peak,
        "fraction_of_peak": gflops / peak,
        "forward_share": work.forward_s * per_iteration / (seconds * num_devices) if seconds > 0 else 0.0,
        "num_forwards": work.num_forwards * per_iteration,
        "empty_call_s": empty_call_s,
        "matmul_rate_gflops": matmul_rate,
        "fraction_of_matmul_rate": gflops / matmul_rate if matmul_rate else None,
    }
