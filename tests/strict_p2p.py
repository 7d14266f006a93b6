"""NCCL's point-to-point rules, kept on top of gloo for the default CPU tests (``common.p2p``'s transport).

gloo moves every send and receive on background threads, so code that would deadlock on NCCL passes
on it. ``StrictPointToPoint`` runs each rank's messages the way NCCL does instead:

- each rank has one stream: the units it posts (a single ``isend``/``irecv``, or one
  ``batch_isend_irecv`` group) run one at a time, in posting order;
- a unit progresses only when, for each of its operations, the matching operation of the peer is
  in the unit at the head of the peer's stream (NCCL matches the k-th send from a to b in a group
  with the k-th receive at b from a in that group; tags mean nothing to it);
- a send never completes on its own (no eager buffering): the strictest of NCCL's behaviours,
  the one large messages get.

Ranks coordinate through a store (a ``FileStore`` in the test's directory: no socket). When a unit
reaches the head of its rank's stream, the rank writes what it sends and raises one flag per
operation; the unit completes once the peers' flags for all its operations are up, i.e. once both
ends were at the head of their streams together. A unit that waits longer than ``stall_s`` is a
deadlock: the waiting ``wait()`` raises, naming what each rank's stream is stuck at.
"""

from __future__ import annotations

import io
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from common import p2p

STALL_S = 60.0
"""How long a unit may wait at the head of its stream before the model calls it a deadlock. The tiny
models' forwards take milliseconds; a minute leaves room for a loaded 2-core machine."""


@dataclass
class _Op:
    send: bool
    tensor: torch.Tensor
    peer: int
    key: str  # the message: group, sender > receiver, and its index k between them in that group


@dataclass
class _Unit:
    ops: list[_Op]
    done: threading.Event = field(default_factory=threading.Event)
    error: str = ""


class _Work:
    """What ``isend``/``irecv``/``batch_isend_irecv`` return: ``wait()`` blocks until the unit ran."""

    def __init__(self, unit: _Unit):
        self.unit = unit

    def wait(self, timeout: Any = None) -> bool:
        self.unit.done.wait()
        if self.unit.error:
            raise RuntimeError(self.unit.error)
        return True

    def is_completed(self) -> bool:
        return self.unit.done.is_set()


def _describe(ops: Sequence[_Op]) -> str:
    return "[" + ", ".join(f"{'send' if op.send else 'recv'} {op.key}" for op in ops) + "]"


class StrictPointToPoint:
    """A ``common.p2p`` transport with NCCL's ordering rules (module docstring) over ``store``.

    Also offers ``isend``/``irecv``: what posting each operation on its own does on NCCL.
    """

    def __init__(self, store: dist.Store, stall_s: float = STALL_S):
        self.store, self.stall_s = store, stall_s
        self._num_posted: dict[tuple[str, int, int], int] = {}
        self._stream: queue.Queue[_Unit] = queue.Queue()
        self._broken = ""
        threading.Thread(target=self._run_stream, daemon=True, name="strict-p2p-stream").start()

    def isend(self, tensor: torch.Tensor, dst: int, group: Any = None, tag: int = 0) -> _Work:
        return self._post([(True, tensor, dst, group)])[0]

    def irecv(self, tensor: torch.Tensor, src: int, group: Any = None, tag: int = 0) -> _Work:
        return self._post([(False, tensor, src, group)])[0]

    def batch_isend_irecv(self, p2p_op_list: list[dist.P2POp]) -> list[_Work]:
        return self._post([(op.op is dist.isend, op.tensor, op.peer, op.group) for op in p2p_op_list])

    def _post(self, specs: Sequence[tuple[bool, torch.Tensor, int, Any]]) -> list[_Work]:
        """Number each message (k-th between this sender and receiver in its group), queue the unit."""
        if self._broken:
            raise RuntimeError(self._broken)
        me, ops = dist.get_rank(), []
        for send, tensor, peer, group in specs:
            src, dst = (me, peer) if send else (peer, me)
            name = (group if group is not None else dist.group.WORLD).group_name
            k = self._num_posted.get((name, src, dst), 0)
            self._num_posted[name, src, dst] = k + 1
            ops.append(_Op(send, tensor, peer, f"{name}:{src}>{dst}#{k}"))
        unit = _Unit(ops)
        self._stream.put(unit)
        return [_Work(unit)] * len(ops)

    def _run_stream(self) -> None:
        """The rank's one stream: units in posting order; after a stall nothing more runs."""
        while True:
            unit = self._stream.get()
            try:
                self._run_unit(unit)
            except Exception as error:  # noqa: BLE001 (any failure ends the stream, as on NCCL)
                self._broken = unit.error = f"rank {dist.get_rank()}: {error}"
            unit.done.set()
            if self._broken:
                break
        while True:  # fail everything still queued instead of leaving its wait() blocked
            unit = self._stream.get()
            unit.error = self._broken
            unit.done.set()

    def _run_unit(self, unit: _Unit) -> None:
        me = dist.get_rank()
        for op in unit.ops:
            if op.send:
                buffer = io.BytesIO()
                torch.save(op.tensor.detach().cpu().clone(), buffer)
                self.store.set(f"data/{op.key}", buffer.getvalue())
        self.store.set(f"head/{me}", _describe(unit.ops))
        for op in unit.ops:
            self.store.set(f"flag/{op.key}/{'send' if op.send else 'recv'}", "1")
        peer_flags = [f"flag/{op.key}/{'recv' if op.send else 'send'}" for op in unit.ops]
        try:
            self.store.wait(peer_flags, timedelta(seconds=self.stall_s))
        except RuntimeError:
            raise RuntimeError(self._stall_report(unit)) from None
        for op in unit.ops:
            if not op.send:
                self._receive(op)

    def _receive(self, op: _Op) -> None:
        sent = torch.load(io.BytesIO(self.store.get(f"data/{op.key}")))
        if sent.dtype != op.tensor.dtype or sent.numel() != op.tensor.numel():
            raise RuntimeError(
                f"message {op.key}: sent {sent.dtype} x {sent.numel()}, received into "
                f"{op.tensor.dtype} x {op.tensor.numel()} (NCCL would deliver garbage)"
            )
        # This thread is outside the poster's grad and inference modes (thread-local); a buffer made
        # under inference_mode (a reward model's scoring) may only be written inside it.
        with torch.no_grad(), torch.inference_mode(op.tensor.is_inference()):
            op.tensor.copy_(sent.reshape(op.tensor.shape))
        self.store.delete_key(f"data/{op.key}")

    def _stall_report(self, unit: _Unit) -> str:
        peers = sorted({op.peer for op in unit.ops})
        heads = []
        for peer in peers:
            key = f"head/{peer}"
            head = self.store.get(key).decode() if self.store.check([key]) else "[nothing posted yet]"
            heads.append(f"rank {peer}'s stream is at {head}")
        return (
            f"point-to-point deadlock: after {self.stall_s:.0f} s this rank's stream is still at "
            f"{_describe(unit.ops)}, whose peers have not reached the matching operations; " + "; ".join(heads)
        )


def install(store_path: str | Path, world_size: int, stall_s: float = STALL_S) -> StrictPointToPoint:
    """Send this process's point-to-point messages under NCCL's rules, through a ``FileStore`` at
    ``store_path`` shared by the ``world_size`` processes of the test."""
    transport = StrictPointToPoint(dist.FileStore(str(store_path), world_size), stall_s)
    p2p.use_transport(transport)
    return transport


def spawn_with_deadline(fn: Callable[..., None], args: tuple, nprocs: int, deadline_s: float) -> None:
    """``torch.multiprocessing.spawn`` that gives up on the processes after ``deadline_s``: a
    deadlock fails the test (TimeoutError, the children killed) instead of hanging the suite.
    ``fn(rank, *args)`` as for ``mp.spawn``; an exception in a child is re-raised here."""
    context = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + deadline_s
    while not context.join(timeout=max(0.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for process in context.processes:
                if process.is_alive():
                    os.kill(process.pid, 9)
            raise TimeoutError(f"{nprocs} processes still running after {deadline_s:.0f} s: hung")
