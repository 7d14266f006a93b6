"""The cost model against the policy steps measured on one lent H200: per measured point, the estimator's
seconds (``planning.estimator.call_seconds`` with ``planning/profiles/h200.json``) and the memory lifecycle's
peak bytes (``call_memory``: the trained model's float32 weights, gradients and Adam, and the step's
activations, ``planning.lifecycle``'s rules; the CUDA context is left out, as ``max_memory_allocated`` leaves
it out), beside the measurement.

    python bench/h200_step.py            # the markdown table of docs/plan_search.md

Every point is one PPO policy step of a Qwen2.5-Math-1.5B shape (random weights), ``rows`` x (512 prompt +
512 response) tokens, one micro-batch, one optimizer step, on one device: ``plain`` is realm's path for a
single replica (float32 weights under bf16 autocast), ``fsdp`` FSDP2 at a world of 1 (bf16 compute copies),
which realm runs only with dp > 1 (priced here with FSDP2's host floors and no collectives). Nothing here
runs a GPU: the measurements are copied from the logs each row names.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planning.config import profile_path  # noqa: E402
from planning.estimator import Hardware, Workload, call_memory, call_seconds, hardware  # noqa: E402
from planning.execution_plan import CallAllocation  # noqa: E402
from planning.profile import Profile  # noqa: E402
from planning.shapes import named_spec  # noqa: E402

GIB = float(1 << 30)
MODEL = "qwen2.5-math-1.5b"
PROMPT_TOKENS = RESPONSE_TOKENS = 512


@dataclass(frozen=True)
class Point:
    """One measured step: its path, rows, activation checkpointing, seconds, peak allocated GiB (None: not
    recorded) and the log it comes from."""

    path: str
    rows: int
    checkpointing: bool
    seconds: float
    peak_gib: float | None
    source: str


SWEEP = "docs/gpu_measure/first_run_step_sweep.log"
SPLIT = "docs/gpu_measure/step_split.log"
VARIANTS = "docs/gpu_measure/first_run_step_variants.log"
MEASURED = (
    Point("fsdp", 8, False, 0.262, 46.9, "docs/gpu_measure/first_run_check_and_step.log"),
    Point("fsdp", 4, False, 0.236, 32.4, SWEEP),
    Point("fsdp", 8, False, 0.233, 46.9, SWEEP),
    Point("fsdp", 16, False, 0.411, 76.1, SWEEP),
    Point("fsdp", 8, True, 0.360, 31.2, SWEEP),
    Point("fsdp", 16, True, 0.504, 38.9, SWEEP),
    Point("fsdp", 32, True, 1.009, 54.3, SWEEP),
    Point("fsdp", 64, True, 1.858, 79.4, SWEEP),
    Point("fsdp", 4, False, 0.338, 32.3, SPLIT),
    Point("fsdp", 16, False, 0.433, 76.1, SPLIT),
    Point("fsdp", 4, False, 0.223, None, VARIANTS),
    Point("fsdp", 16, False, 0.423, None, VARIANTS),
    Point("plain", 4, False, 0.167, 36.5, SPLIT),
    Point("plain", 16, False, 0.437, 85.1, SPLIT),
    Point("plain", 4, False, 0.160, None, VARIANTS),
    Point("plain", 16, False, 0.437, None, VARIANTS),
)


def h200() -> Hardware:
    """One H200 priced with the shipped profile."""
    return hardware("h200", 1, 1, Profile.load(profile_path("h200")))


def predict(path: str, rows: int, checkpointing: bool, hw: Hardware) -> tuple[float, float]:
    """``(seconds, bytes)`` the cost model gives one such step on one device."""
    spec = named_spec(MODEL)
    w = Workload(spec, None, None, rows, PROMPT_TOKENS, RESPONSE_TOKENS, reference=False)
    alloc = CallAllocation((0,), activation_checkpointing=checkpointing)
    seconds = call_seconds("actor_train", spec, alloc, w, hw, fsdp=path == "fsdp")
    resident, active = call_memory("actor_train", spec, alloc, w)
    return seconds, resident + active


def table(hw: Hardware) -> list[str]:
    """The markdown table: per measured point, predicted, measured and measured / predicted."""
    lines = [
        "| path | rows | ckpt | predicted s | measured s | ratio | predicted GiB | measured GiB | ratio | source |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for p in MEASURED:
        seconds, nbytes = predict(p.path, p.rows, p.checkpointing, hw)
        mem = f"{p.peak_gib:.1f} | {p.peak_gib / (nbytes / GIB):.2f}" if p.peak_gib else "- | -"
        lines.append(
            f"| {p.path} | {p.rows} | {'yes' if p.checkpointing else 'no'} | {seconds:.3f} | {p.seconds:.3f} | "
            f"{p.seconds / seconds:.2f} | {nbytes / GIB:.1f} | {mem} | {p.source} |"
        )
    return lines


if __name__ == "__main__":
    print("\n".join(table(h200())))
