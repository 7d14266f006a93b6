"""Weights loaded in the dtype a checkpoint stores them in, converted where they are kept.

transformers maps a safetensors checkpoint into memory and, when asked for the dtype the file holds, copies
nothing: a weight's pages are read when first touched. Asked for another dtype (fp32 master weights from a
bf16 checkpoint), it converts the whole model in host memory in every process, before any sharding keeps
a part of it (7B: 28 GB per process). So ``runtime.device.shards`` loads in the stored dtype
(``stored_dtype``) and converts afterwards only what the process keeps: an FSDP rank the rows its shard keeps
(``cast_fsdp_rows``), a TP rank its local shard, an unsharded replica every weight, one at a time, each moved
to the device at once (``cast_weights``).

The values to convert are read from the checkpoint file with plain reads where a weight is still the file's
mapping (``/proc/self/maps`` says which file and offset): the file's pages then stay in the page cache, not
in this process's resident memory. This relies on nothing having written to the loaded weights before the
conversion (a write would make a private copy of the page that the file does not have): the shards convert
right after loading, before any update, and a weight initialized in memory (a new value head) is no mapping
and converts from memory.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def stored_dtype(model_dir: str | Path) -> torch.dtype | None:
    """The one floating dtype of every floating tensor in ``model_dir``'s safetensors files; None when they
    mix dtypes or there are none (then loading in the target dtype converts nothing that could be kept)."""
    dtypes = set()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        dtypes |= {_SAFETENSORS_DTYPES.get(v["dtype"]) for k, v in header.items() if k != "__metadata__"}
    dtypes.discard(None)
    return dtypes.pop() if len(dtypes) == 1 else None


def _mapped_files() -> list[tuple[int, int, int, str]]:
    """(start, end, file offset, path) of every safetensors file mapped into this process (Linux); [] elsewhere."""
    try:
        text = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].endswith(".safetensors"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            rows.append((lo, hi, int(parts[2], 16), parts[5]))
    return rows


def _read(part: Tensor, files: list[tuple[int, int, int, str]]) -> Tensor | None:
    """``part``'s values read from the file it is mapped from, or None when it is not such a mapping."""
    if part.device.type != "cpu" or not part.is_contiguous() or type(part) is not Tensor:
        return None
    start, nbytes = part.data_ptr(), part.numel() * part.element_size()
    for lo, hi, offset, path in files:
        if lo <= start and start + nbytes <= hi:
            raw = torch.empty(nbytes, dtype=torch.uint8)
            with open(path, "rb") as f:
                f.seek(offset + start - lo)
                if nbytes and f.readinto(raw.numpy().data) != nbytes:
                    return None
            return raw.view(part.dtype).view(part.shape)
    return None


def _converted(part: Tensor, dtype: torch.dtype, files: list[tuple[int, int, int, str]]) -> Tensor:
    read = _read(part, files)
    return (part if read is None else read).to(dtype)


def fsdp_rows(num_rows: int, rank: int, world: int) -> tuple[int, int]:
    """The rows [start, stop) of a parameter that FSDP2's ``fully_shard`` keeps on ``rank`` of ``world``: its
    ``torch.chunk`` along dim 0 (chunks of ceil(rows / world); ranks past the last chunk keep none).
    Example: 5 rows over 2 ranks -> (0, 3), (3, 5); 1 row over 2 ranks -> (0, 1), (1, 1)."""
    size = -(-num_rows // world)
    start = min(num_rows, rank * size)
    return start, min(num_rows, start + size)


def _params_not_in(model: nn.Module, dtype: torch.dtype) -> list[nn.Parameter]:
    """Floating parameters not in ``dtype`` (a tied one once)."""
    return [p for p in model.parameters() if p.is_floating_point() and p.dtype != dtype]


def cast_fsdp_rows(model: nn.Module, dtype: torch.dtype, rank: int, world: int) -> None:
    """Before ``fully_shard`` over ``world`` ranks (no TP): each plain parameter not in ``dtype`` becomes a
    ``dtype`` tensor of its shape in which only the rows this rank's shard keeps (``fsdp_rows``) are written;
    FSDP2 copies those rows into its shard and drops the tensor. Rows never written are never resident, and
    no other rank's rows are read. A tied weight is one parameter: converted once, still tied."""
    files = _mapped_files()
    with torch.no_grad():
        for p in _params_not_in(model, dtype):
            if type(p.data) is not Tensor or p.dim() == 0:
                continue  # left to cast_weights
            start, stop = fsdp_rows(p.shape[0], rank, world)
            full = torch.empty(p.shape, dtype=dtype, device=p.device)
            full[start:stop] = _converted(p.data[start:stop], dtype, files)
            p.data = full


def cast_weights(model: nn.Module, dtype: torch.dtype, device: torch.device | None = None) -> None:
    """Convert every parameter still not in ``dtype`` whole (a DTensor: its local shard), one at a time,
    each moved to ``device`` right after (the host then holds one converted weight at a time)."""
    files = _mapped_files()
    replaced: dict[int, nn.Parameter] = {}
    with torch.no_grad():
        for p in _params_not_in(model, dtype):
            if type(p.data) is Tensor:
                p.data = _converted(p.data, dtype, files).to(device or p.device)
            else:  # a DTensor: ``.data`` of another dtype would keep the old local tensor; a new parameter
                replaced[id(p)] = nn.Parameter(p.to(dtype), requires_grad=p.requires_grad)
        for module in model.modules():
            for name, held in list(module._parameters.items()):
                if held is not None and id(held) in replaced:
                    module._parameters[name] = replaced[id(held)]
    config: Any = getattr(model, "config", None)
    if config is not None:
        config.dtype = dtype
