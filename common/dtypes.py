"""The one dtype table: the dtypes a model trains, generates, scores or is profiled in, by name.

It lives in the lowest package that needs it (the calibration profiler, ``planning/profile.py``),
so that the model, reward and evaluation configs above it use the same names. torch is imported
only when a name is turned into a ``torch.dtype``, so configs can validate without it.
"""

from __future__ import annotations

from typing import Any

DTYPES = ("float32", "bfloat16", "float16")
"""Names of ``torch.<name>``."""


def check_dtype(name: str, key: str) -> None:
    """ValueError naming the config ``key`` unless ``name`` is in DTYPES."""
    if name not in DTYPES:
        raise ValueError(f"{key}={name!r}: expected {', '.join(DTYPES[:-1])} or {DTYPES[-1]}")


def torch_dtype(name: str) -> Any:
    """``torch.<name>`` for a name in DTYPES."""
    import torch

    check_dtype(name, "dtype")
    return getattr(torch, name)
