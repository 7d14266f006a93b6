"""``common.p2p.exchange`` under the strict model of NCCL's point-to-point rules (``tests.strict_p2p``),
on two gloo ranks: the model deadlocks exactly where NCCL would, and batches do not."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from common import p2p
from tests import strict_p2p

STALL_S = 3.0  # the crossing below deadlocks at once; 3 s is plenty to tell it from slowness


def _crossing(rank: int, work: str) -> None:
    """Each rank sends [10 * rank + 1, + 2] to the other and receives the other's, three ways (each
    with a fresh model: a failure ends a rank's stream, as it would on NCCL)."""
    dist.init_process_group("gloo", init_method=f"file://{work}/pg_store", rank=rank, world_size=2)
    peer, out = 1 - rank, {}
    mine = torch.tensor([10.0 * rank + 1, 10.0 * rank + 2])

    # 1. One batch each: [send, receive] on one rank, [receive, send] on the other (order within a
    #    batch does not matter). Then two messages in a row between the same pair: the k-th send
    #    meets the k-th receive.
    strict_p2p.install(Path(work) / "store_batched", 2, stall_s=STALL_S)
    theirs = torch.empty(2)
    ops = [dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)]
    p2p.exchange(ops if rank == 0 else ops[::-1])
    first, second = torch.empty(1), torch.empty(1)
    if rank == 0:
        p2p.exchange([dist.P2POp(dist.isend, mine[:1].clone(), peer), dist.P2POp(dist.isend, mine[1:].clone(), peer)])
    else:
        p2p.exchange([dist.P2POp(dist.irecv, first, peer)])
        p2p.exchange([dist.P2POp(dist.irecv, second, peer)])
    out["batched"], out["in_order"] = theirs, torch.cat([first, second])

    # 2. A receive shaped unlike the send: NCCL would deliver garbage; the model refuses.
    strict_p2p.install(Path(work) / "store_mismatch", 2, stall_s=STALL_S)
    try:
        p2p.exchange([dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, torch.empty(3), peer)])
    except RuntimeError as error:
        out["mismatch"] = str(error)

    # 3. The crossing posted one operation at a time: each rank's stream starts with its send,
    #    whose receive waits behind the peer's own send. NCCL hangs; the model says so.
    transport = strict_p2p.install(Path(work) / "store_separate", 2, stall_s=STALL_S)
    try:
        works = [transport.isend(mine, peer), transport.irecv(torch.empty(2), peer)]
        for work_item in works:
            work_item.wait()
        out["separate"] = "completed"
    except RuntimeError as error:
        out["separate"] = str(error)
    torch.save(out, Path(work) / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_strict_model_deadlocks_where_nccl_would_and_batches_do_not(tmp_path):
    strict_p2p.spawn_with_deadline(_crossing, (str(tmp_path),), nprocs=2, deadline_s=300)
    out = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert out[0]["batched"].tolist() == [11.0, 12.0] and out[1]["batched"].tolist() == [1.0, 2.0]
    assert out[1]["in_order"].tolist() == [1.0, 2.0]
    for rank in range(2):
        assert "sent torch.float32 x 2, received into torch.float32 x 3" in out[rank]["mismatch"]
        # Each rank's stream is stuck at its own send (group "0" is the world), and so is its peer's.
        peer = 1 - rank
        assert f"deadlock: after 3 s this rank's stream is still at [send 0:{rank}>{peer}#0]" in out[rank]["separate"]
        assert f"rank {peer}'s stream is at [send 0:{peer}>{rank}#0]" in out[rank]["separate"]
