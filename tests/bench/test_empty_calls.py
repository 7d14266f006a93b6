"""bench/empty_calls.py drives the plan runtime the way trainer/loop.py does; the whole benchmark runs only in
the slow suite, so this fast check keeps its calls in step with the driver's API."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from runtime.driver import PlanRuntime

ROOT = Path(__file__).resolve().parents[2]


def _runtime_attributes_used(path: Path) -> set[str]:
    """Names read as ``runtime.<name>`` anywhere in the file."""
    tree = ast.parse(path.read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "runtime"
    }


def _plan_runtime_attributes() -> set[str]:
    """PlanRuntime's methods and the attributes its __init__ sets."""
    init = ast.parse(inspect.getsource(PlanRuntime.__init__).strip())
    assigned = {
        node.attr
        for node in ast.walk(init)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
    }
    return set(dir(PlanRuntime)) | assigned


def test_empty_calls_uses_only_what_the_plan_runtime_has():
    used = _runtime_attributes_used(ROOT / "bench" / "empty_calls.py")
    assert {"generate", "infer", "drain_events"} <= used  # the parse sees the calls
    assert used <= _plan_runtime_attributes(), used - _plan_runtime_attributes()


def test_overheads_from_empty_calls_worked_by_hand():
    """Empty calls: generation 10 ms, two inference calls 20 and 30 ms, training 330 and 370 ms over 2
    epochs x 4 minibatches. Call overhead: the median of the non-training calls, 20 ms; step overhead:
    the training calls' median 350 ms less 20 ms, over 8 steps, 41.25 ms."""
    from bench.empty_calls import call_overhead, step_overhead

    median_s = {"actor_gen": 0.01, "ref_inf": 0.02, "critic_inf": 0.03, "actor_train": 0.33, "critic_train": 0.37}
    assert call_overhead(median_s) == pytest.approx(0.02)
    assert step_overhead(median_s, 8) == pytest.approx(0.04125)
