"""What runs inside a user reward function's worker process (``rewards.user_fn``): import the user's file once,
then call the function per request. Standard library only, so that a worker starts in a fraction of a second."""

from __future__ import annotations

import importlib.util
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


class LoadError(Exception):
    """The user's file or function could not be loaded; the message says why, in one line."""


def one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return " ".join(line.strip() for line in text.splitlines() if line.strip())[:300]


def import_function(path: Path, name: str) -> tuple[Callable[..., Any] | None, list[str]]:
    """``name`` from the Python file ``path`` (None if it has no such callable), and the module's public
    callables (for a close match); ``LoadError`` when the file is missing or does not import."""
    path = path.resolve()
    if not path.is_file():
        raise LoadError(f"no such file {path}")
    module_name = f"realm_user_reward_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"{path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's module: any error is reported in one line
        sys.modules.pop(module_name, None)
        raise LoadError(f"importing {path} failed: {one_line(e)}") from None
    fn = getattr(module, name, None)
    names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
    return (fn if callable(fn) else None), names


_FN: Callable[..., Any] | None = None


def init(path: str, name: str) -> None:
    """The pool's initializer: load the function once per worker. A failure leaves it unloaded (``ready`` says
    so) instead of raising: a pool whose initializer raises restarts its workers forever."""
    global _FN
    try:
        _FN, _ = import_function(Path(path), name)
    except Exception:  # noqa: BLE001 - reported by ready() and call()
        _FN = None


def ready() -> bool:
    return _FN is not None


def call(args: tuple[Any, ...]) -> tuple[str, Any]:
    """One call: ("ok", value) or ("error", "ExceptionType: message (at file:line)")."""
    if _FN is None:
        return "error", "the function did not load in the worker"
    try:
        return "ok", _FN(*args)
    except Exception as e:  # noqa: BLE001 - the user's code: reported, not raised across the pipe
        frame = traceback.extract_tb(e.__traceback__)[-1]
        return "error", f"{one_line(e)} (at {Path(frame.filename).name}:{frame.lineno})"
