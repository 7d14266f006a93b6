"""The NCCL communicators a plan creates on a device and their bytes (``planning.communicators``), by hand."""

from __future__ import annotations

from planning.communicators import (
    COMMUNICATOR_BYTES,
    NCCL_STATE_BYTES,
    communicator_bytes,
    device_communicators,
    engine_communicators,
)
from planning.execution_plan import CallAllocation

EIGHT = tuple(range(8))
MIB = 1 << 20


def test_the_constants_are_nccls_defaults_and_the_h200_measurement():
    """4 MiB (NCCL_BUFFSIZE's default) x 32 channels = 128 MiB a communicator; NCCL's own state 558 MiB,
    measured once on the lent H200 (process_memory.nccl_bytes in planning/profiles/h200.json)."""
    assert COMMUNICATOR_BYTES == 128 * MIB
    assert round(NCCL_STATE_BYTES / MIB) == 558
    assert communicator_bytes(0) == 0
    assert communicator_bytes(5) == NCCL_STATE_BYTES + 5 * 128 * MIB  # 1,198 MiB


def test_a_data_parallel_plan_has_one_communicator_a_device():
    """Every call data-parallel over the 8 devices (the 1 x 8 heuristic's shape): each device's groups are
    the training grids and the reallocation union, all (0..7), the world's set too: one communicator."""
    calls = {c: CallAllocation(EIGHT, dp=8) for c in ("actor_gen", "actor_train", "critic_train", "critic_inf")}
    calls["ref_inf"] = CallAllocation(EIGHT, dp=8, offload=True)
    assert [device_communicators(calls, d) for d in EIGHT] == [1] * 8
    assert engine_communicators(calls["actor_gen"]) == 0


def test_a_pipelined_tensor_parallel_plan_by_hand():
    """actor_train pp2 dp2 tp2 over 0-7: stage 0 is rows (0, 1), (2, 3), stage 1 rows (4, 5), (6, 7). Device 0
    joins its stage's grid (0, 1, 2, 3), its TP row (0, 1), its FSDP column (0, 2), its pipeline column (0, 4)
    (also the column's first and last device) and the whole model 0-7 (also the world and both reallocation
    unions); critic_train dp2 tp2 on 0-3 and ref_inf dp4 tp2 add no new set of two or more. 5 communicators:
    558 + 5 x 128 = 1,198 MiB. Its engine rank (pp2 tp2) joins its TP and its pipeline group: 2."""
    calls = {
        "actor_gen": CallAllocation(EIGHT, pp=2, dp=2, tp=2),
        "actor_train": CallAllocation(EIGHT, pp=2, dp=2, tp=2),
        "critic_train": CallAllocation((0, 1, 2, 3), dp=2, tp=2),
        "critic_inf": CallAllocation((4, 5, 6, 7), pp=2, tp=2),
        "ref_inf": CallAllocation(EIGHT, dp=4, tp=2),
    }
    assert device_communicators(calls, 0) == 5
    assert round(communicator_bytes(device_communicators(calls, 0)) / MIB) == 1198
    assert engine_communicators(calls["actor_gen"]) == 2
