"""The device's memory calls, in one place: moving frozen weights between the device and pinned host
memory, and handing cached blocks back to CUDA so that a process beside this one (the vLLM engine)
can take them. Every call is logged, on CPU too, so tests check their order without a GPU.

Why ``release``: PyTorch's caching allocator keeps freed blocks reserved for this process. Memory that
training or an offload freed stays unavailable to the engine on the same GPU until ``empty_cache``
returns it (verl and OpenRLHF call it after offloading and before the engine wakes).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class DeviceMemory:
    """One process's memory calls on ``device``; ``cuda`` is ``torch.cuda`` on a GPU (a stand-in in tests)."""

    def __init__(self, device: torch.device, cuda: Any = None):
        self.device = device
        self.cuda = cuda if cuda is not None else (torch.cuda if device.type == "cuda" else None)
        self.log: list[tuple[str, str]] = []
        """(what, why) in call order: ("release", ...), ("to_host", owner), ("to_device", owner)."""
        self._host: dict[str, dict[str, torch.Tensor]] = {}
        self.on_host: set[str] = set()
        """Owners whose weights wait in host memory now."""

    def release(self, why: str) -> None:
        """Give the allocator's cached blocks back to the device (a no-op on CPU)."""
        self.log.append(("release", why))
        if self.cuda is not None:
            self.cuda.empty_cache()

    def release_ipc(self, why: str) -> None:
        """Free what this process shared over CUDA IPC once its receivers are done with it, then release
        (a no-op on CPU). The sender's dropped references free nothing while a receiver may still map the
        memory: ``ipc_collect`` frees the blocks no receiver holds any more (verl's bucketed weight sender
        ends the same way, with ``ipc_collect`` and ``empty_cache`` after the receiver's last
        acknowledgement)."""
        self.log.append(("ipc_collect", why))
        if self.cuda is not None:
            self.cuda.ipc_collect()
        self.release(why)

    def to_host(self, owner: str, model: nn.Module) -> None:
        """Move ``model``'s parameters and buffers to host memory, pinned on a GPU (so the way back is a
        fast DMA copy that can overlap compute), then release what they held on the device."""
        self.log.append(("to_host", owner))
        pinned = self.cuda is not None
        for name, tensor in _tensors(model):
            if tensor.device.type != "cpu":
                host = self._host.setdefault(owner, {}).get(name)
                if host is None or host.shape != tensor.shape or host.dtype != tensor.dtype:
                    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pinned)
                    self._host[owner][name] = host
                host.copy_(tensor, non_blocking=pinned)
                tensor.data = host
        if self.cuda is not None:
            self.cuda.synchronize()
        self.on_host.add(owner)
        self.release(f"{owner} offloaded")

    def to_device(self, owner: str, model: nn.Module) -> None:
        """Bring ``model`` back from host memory (its pinned host copy stays for the next ``to_host``)."""
        self.log.append(("to_device", owner))
        self.on_host.discard(owner)
        for _, tensor in _tensors(model):
            if tensor.device != self.device:
                tensor.data = tensor.data.to(self.device, non_blocking=self.cuda is not None)


def _tensors(model: nn.Module):
    yield from model.named_parameters()
    yield from model.named_buffers()
