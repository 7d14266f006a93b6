"""bench/empty_calls.py drives the plan runtime the way trainer/loop.py does; the whole benchmark runs only in
the slow suite, so this fast check keeps its calls in step with the driver's API."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

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
