"""Point-to-point messages between ranks: every send and receive in realm is posted by ``exchange``.

NCCL runs a rank's communication one operation at a time, in posting order, on one stream, and a
send completes only once its peer's matching receive runs (NCCL pairs the k-th send from a to b with
the k-th receive at b from a; tags mean nothing to it). Two ranks that each post [send to the other,
receive from the other] as separate operations therefore both wait in their send forever. Posted as
one ``batch_isend_irecv`` (one NCCL group) the operations progress together, whatever their order in
the batch: Megatron-LM's ``p2p_communication.py`` batches its pipeline's sends and receives for this
reason. So a caller puts every operation that must progress together into one ``exchange``.

gloo moves each operation on background threads and hides such deadlocks. The default tests install,
with ``use_transport``, a transport that keeps NCCL's rules on top of gloo (``tests/strict_p2p.py``);
the default transport is ``torch.distributed`` itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist


class Transport(Protocol):
    """What posts a batch of ``dist.P2POp``: ``torch.distributed`` or a test's model of NCCL."""

    def batch_isend_irecv(self, p2p_op_list: list[dist.P2POp]) -> list[Any]: ...


_transport: Transport = dist


def use_transport(transport: Transport) -> Transport:
    """Post this process's point-to-point messages through ``transport`` from now on; returns the
    transport it replaces."""
    global _transport
    previous, _transport = _transport, transport
    return previous


def exchange(ops: Sequence[dist.P2POp]) -> None:
    """Post ``ops`` as one batch and wait until every one of them has completed (nothing to do for
    none). A rank's ``exchange`` calls must pair with its peers' in the same order."""
    if not ops:
        return
    for work in _transport.batch_isend_irecv(list(ops)):
        if work is not None:  # None: this rank is outside the op's group (never for a peer we name)
            work.wait()


def barrier(group: Any, device: torch.device) -> None:
    """A barrier over ``group`` (None: the world). On NCCL it runs on ``device``, this rank's GPU:
    left to itself torch guesses the GPU from the rank, which is wrong when a process sees only its
    own GPU under another index, and a communicator on the wrong GPU hangs.

    Before a group's first ``batch_isend_irecv``: NCCL creates a group's communicator on the group's
    first call, and a first call that is a batch of sends and receives must involve every rank of
    the group (torch's documentation of ``batch_isend_irecv``); after this barrier, batches between
    any subset of the group's ranks are allowed."""
    if dist.get_backend(group) == "nccl":
        index = device.index if device.index is not None else torch.cuda.current_device()
        dist.barrier(group=group, device_ids=[index])
    else:
        dist.barrier(group=group)
