"""One PPO actor step as a device process runs it, and the CPU levers on it, each against eager in the same run.

    python bench/ppo_step.py --threads 2 --rows 128
    python bench/ppo_step.py --model smollm2-135m --threads 1 --rows 4 --levers mallopt
    python bench/ppo_step.py --levers compile mallopt preload:/path/to/libtcmalloc_minimal.so.4
    python bench/ppo_step.py --threads 1 --rows 128 --microbatches 16 --torch-profile

The step is ``runtime.device.shards``' policy update on one minibatch: response log-probabilities and
entropy (``response_logprobs``), the PPO-clip loss, the backward, the gradient-norm clip and the fused
AdamW step (``common.optim``), over ``--rows`` rows of a random prompt (30-34 tokens) and response (44-48),
lengths varying from step to step as real minibatches do. Each variant runs in a fresh process of its own
(allocator settings act from a process's start), eager first; the report is each one's milliseconds per
step (the mean of 10 steps after 5 warm-up steps, whose time is printed apart: a compile happens there)
and its ratio to eager. Levers:

- ``compile``: ``torch.compile(dynamic=True)`` of the model's body (decoder layers, norms, rotary), as
  ``model.model.compile``; the inference forward (no grad) is timed too, as it compiles again;
- ``mallopt``: glibc's malloc kept from returning freed memory to the OS between steps (``mallopt``:
  mmap threshold 32 MiB, trim threshold 1 GiB, top pad 64 MiB), so large tensors are not page-faulted anew;
- ``preload:PATH``: ``LD_PRELOAD=PATH`` (tcmalloc, or Intel OpenMP's libiomp5).

``--microbatches K`` runs each step's rows as K micro-batches whose gradients accumulate, as a device
process runs a minibatch (the default run's searched plan: 128 rows per step in 16 micro-batches of 8).
``--torch-profile`` prints, instead, where one eager step's time goes: torch's profiler, operators by
their own CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's malloc.h


def _keep_freed_memory() -> None:
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    for option, value in ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 1 << 30), (M_TOP_PAD, 64 << 20)):
        if libc.mallopt(option, value) != 1:
            raise SystemExit(f"mallopt({option}, {value}) failed")


def measure(
    model_name: str,
    threads: int,
    rows: int,
    compile_body: bool,
    num_steps: int = 10,
    num_microbatches: int = 1,
    torch_profile: bool = False,
) -> dict[str, Any]:
    """This process's milliseconds per step (and per no-grad forward) after 5 warm-up steps; with
    ``torch_profile``, also the profiler's table of one more step (``"table"``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from bench.generate import load_model_config
    from common.optim import adamw
    from models.registry import resolve_model_dir
    from ppo.losses import policy_loss
    from runtime.device.shards import response_logprobs

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_dir(load_model_config(model_name)), dtype=torch.float32)
    model.eval()
    start = time.perf_counter()
    if compile_body:
        model.model.compile(dynamic=True)
    optimizer = adamw(model.parameters(), lr=1e-6)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)

    def batch(i: int) -> dict[str, torch.Tensor]:
        prompt, response = 30 + i % 5, 44 + i % 5
        ids = torch.randint(4, vocab - 1, (rows, prompt + response), generator=generator)
        return {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "response_mask": torch.ones(rows, response),
            "old_logprobs": torch.full((rows, response), -5.0),
            "advantages": torch.randn(rows, response, generator=generator),
        }

    def step(b: dict[str, torch.Tensor]) -> None:
        num_tokens = b["response_mask"].sum()
        for part in torch.arange(rows).tensor_split(num_microbatches):
            mb = {k: v[part] for k, v in b.items()}
            logprobs, _ = response_logprobs(model, mb, 1.0, with_entropy=True)
            mask = mb["response_mask"]
            loss, _ = policy_loss(logprobs, mb["old_logprobs"], mb["advantages"], mask, 0.2, num_tokens)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    batches = [batch(i) for i in range(num_steps)]
    for b in batches[:5]:
        step(b)
    warm_up = time.perf_counter() - start
    start = time.perf_counter()
    for b in batches:
        step(b)
    step_ms = (time.perf_counter() - start) / num_steps * 1e3
    start = time.perf_counter()
    with torch.no_grad():
        for b in batches:
            response_logprobs(model, b, 1.0)
    forward_ms = (time.perf_counter() - start) / num_steps * 1e3
    result: dict[str, Any] = {"warm_up_s": warm_up, "step_ms": step_ms, "no_grad_forward_ms": forward_ms}
    if torch_profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(batches[0])
        result["table"] = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    return result


def run_variant(args: argparse.Namespace, lever: str) -> dict[str, Any]:
    """``lever`` ("eager" for none) measured in a fresh process."""
    env = dict(os.environ)
    cmd = [sys.executable, __file__, "--model", args.model, "--threads", str(args.threads), "--rows", str(args.rows)]
    cmd += ["--microbatches", str(args.microbatches)] + (["--torch-profile"] if args.torch_profile else [])
    if lever.startswith("preload:"):
        path = lever.split(":", 1)[1]
        if not Path(path).is_file():
            raise SystemExit(f"--levers {lever}: no such file {path}")
        env["LD_PRELOAD"] = path
    elif lever != "eager":
        cmd += ["--variant", lever]
    out = subprocess.run(cmd + ["--child"], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{lever}: exit {out.returncode}\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="a configs/model/ name (tiny, smollm2-135m, ...)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, as a device process has")
    parser.add_argument("--rows", type=int, default=64, help="rows per step (a minibatch's share of a device)")
    parser.add_argument("--microbatches", type=int, default=1, help="micro-batches per step (gradients accumulate)")
    parser.add_argument("--torch-profile", action="store_true", help="print where one eager step's time goes")
    parser.add_argument("--levers", nargs="*", default=["compile", "mallopt"], help="compile, mallopt, preload:PATH")
    parser.add_argument("--variant", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.variant == "mallopt":
            _keep_freed_memory()
        compile_body = args.variant == "compile"
        print(
            json.dumps(
                measure(args.model, args.threads, args.rows, compile_body, 10, args.microbatches, args.torch_profile)
            )
        )
        return
    for lever in args.levers:
        if lever not in ("compile", "mallopt") and not lever.startswith("preload:"):
            raise SystemExit(f"--levers: unknown lever {lever!r} (compile, mallopt, preload:PATH)")
    print(
        f"PPO actor step, {args.model}, {args.rows} rows in {args.microbatches} micro-batch(es), {args.threads} "
        "thread(s); each variant in its own process"
    )
    eager = run_variant(args, "eager")
    if args.torch_profile:
        print(f"eager: {eager['step_ms']:.1f} ms per step; one step under torch's profiler:\n{eager['table']}")
        return
    print("| variant | warm-up s | ms per step | x eager | no-grad forward ms | x eager |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for lever, r in [("eager", eager)] + [(lever, run_variant(args, lever)) for lever in args.levers]:
        print(
            f"| {lever} | {r['warm_up_s']:.1f} | {r['step_ms']:.1f} | {eager['step_ms'] / r['step_ms']:.2f} | "
            f"{r['no_grad_forward_ms']:.1f} | {eager['no_grad_forward_ms'] / r['no_grad_forward_ms']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
