"""Device capacity minus a margin (``cluster.memory_utilization``, vLLM's ``gpu_memory_utilization`` idea):
what the presets and a GPU run's reading at start give, and that the lifecycle and the plan search check fits
against it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from planning.config import MEMORY_UTILIZATION, ClusterConfig
from planning.estimator import Workload, estimate_plan, hardware, memory_lifecycle
from planning.execution_plan import CallAllocation, ExecutionPlan
from planning.shapes import named_spec

GIB = float(1 << 30)


def test_the_presets_leave_a_tenth_free():
    """vLLM's default share, 0.9: an H100 preset's 80 GiB leaves a margin of 8 GiB, 72 usable; an H200's 141
    leaves 14.1, 126.9 usable."""
    assert MEMORY_UTILIZATION == 0.9
    h100, h200 = hardware("h100", 1, 8), hardware("h200", 1, 8)
    assert (h100.memory_margin_bytes / GIB, h100.usable_memory_bytes / GIB) == pytest.approx((8.0, 72.0))
    assert (h200.memory_margin_bytes / GIB, h200.usable_memory_bytes / GIB) == pytest.approx((14.1, 126.9))
    assert hardware("h100", 1, 8, memory_utilization=1.0).memory_margin_bytes == 0


def test_memory_read_at_start_replaces_the_preset_and_free_memory_bounds_it():
    """mem_get_info's (free, total): the H200 of docs/gpu_measure reports 139.8 GiB total (the preset says
    141). All of it free: 0.9 x 139.8 = 125.8 GiB usable. Another process holding 20 GiB (119.8 free): 119.8
    usable, the margin 20 GiB."""
    total = 150_109_880_320.0  # planning/profiles/h200.json process_memory.total_bytes
    free = hardware("h200", 1, 1, device_memory=(total, total))
    assert free.gpu_memory_bytes == total
    assert free.usable_memory_bytes == pytest.approx(0.9 * total)
    busy = hardware("h200", 1, 1, device_memory=(total - 20 * GIB, total))
    assert (busy.usable_memory_bytes, busy.memory_margin_bytes) == (total - 20 * GIB, 20 * GIB)


def test_the_driver_reads_no_gpu_here_and_the_child_says_so():
    """The child that reads mem_get_info for a GPU run (trainer.plan_select.read_device_memory) runs and prints
    null on this CPU-only machine; a gloo cluster does not start it."""
    from trainer.plan_select import _MEM_GET_INFO, read_device_memory

    proc = subprocess.run([sys.executable, "-c", _MEM_GET_INFO], capture_output=True, text=True, timeout=300)
    assert (proc.returncode, proc.stdout) == (0, "null\n"), proc.stderr
    assert read_device_memory(ClusterConfig(backend="gloo")) is None
    assert read_device_memory(ClusterConfig(backend="nccl", hardware="h100")) is None
    with pytest.raises(ValueError, match=r"cluster.memory_utilization=1.5: must be in \(0, 1\]"):
        ClusterConfig(memory_utilization=1.5)


def test_a_plan_that_fits_the_device_but_not_its_margin_does_not_fit():
    """A 1.5B actor trained on one H100 beside its engine, 160 rows x 1024 tokens in 4 checkpointed
    micro-batches: its fullest phase (75.6 GiB) needs more
    than 72 GiB but less than 80 (so it fits only without the margin); the lifecycle and the estimate both
    say it does not fit at 0.9 and does at 1.0."""
    spec = named_spec("qwen2.5-math-1.5b")
    one = CallAllocation((0,), num_microbatches=4, activation_checkpointing=True)
    plan = ExecutionPlan(1, 1, {"actor_gen": CallAllocation((0,)), "actor_train": one}, source="test")
    w = Workload(spec, None, None, batch=160, prompt_len=512, gen_len=512, reference=False)
    margin, none = hardware("h100", 1, 1), hardware("h100", 1, 1, memory_utilization=1.0)
    peak = estimate_plan(plan, w, none).peak_bytes / GIB
    assert 72 < peak < 80, peak
    assert not memory_lifecycle(plan, w, margin).fits() and memory_lifecycle(plan, w, none).fits()
    assert not estimate_plan(plan, w, margin).fits and estimate_plan(plan, w, none).fits
    assert estimate_plan(plan, w, margin).overflow_bytes == pytest.approx(peak * GIB - 72 * GIB)


def test_the_search_keeps_every_device_within_capacity_minus_margin():
    """Searched for the same workload on one H100 with the margin, the plan's fullest device stays within
    72 GiB (the plan above, at 75.6 GiB, is not one it may return)."""
    from planning.search import search_plan

    spec = named_spec("qwen2.5-math-1.5b")
    w = Workload(spec, None, None, batch=160, prompt_len=512, gen_len=512, reference=False)
    hw = hardware("h100", 1, 1)
    _, cost = search_plan(w, hw, seconds=0.5, seed=0)
    assert cost.fits and cost.peak_bytes <= hw.usable_memory_bytes == 72 * GIB
