"""common/optim.py: fused AdamW where one fused call can take every parameter, the multi-tensor path where not."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from common.optim import adamw, fusable
from tests import tolerance as tol

# One AdamW step on one weight is a dozen fp32 operations (moments, bias corrections, square root,
# division, the learning rate), each rounding at the step's scale, lr = 0.1: rule 1 of tests/tolerance.py.
STEP_BOUND = tol.rounding(12, 0.1)


def _params(*tensors: torch.Tensor) -> list[torch.nn.Parameter]:
    out = [torch.nn.Parameter(t) for t in tensors]
    for p in out:
        p.grad = torch.ones_like(p)
    return out


@pytest.mark.equivalence
def test_plain_parameters_get_the_fused_kernel_and_step_like_the_default():
    fused = _params(torch.zeros(4), torch.zeros(2, 3))
    default = _params(torch.zeros(4), torch.zeros(2, 3))
    opt_fused, opt_default = adamw(fused, lr=0.1), torch.optim.AdamW(default, lr=0.1, weight_decay=0.0)
    assert opt_fused.defaults["fused"] is True
    opt_fused.step()
    opt_default.step()
    # Adam's first step moves every weight by -lr * sign(grad): -0.1 here, in both paths.
    for a, b in zip(fused, default):
        tol.assert_close(a.detach(), torch.full_like(a, -0.1), STEP_BOUND)
        tol.assert_close(a.detach(), b.detach(), STEP_BOUND)


@pytest.mark.equivalence
def test_dtensors_beside_plain_tensors_take_the_multi_tensor_path():
    # A TP model without FSDP: sharded weights are DTensors, replicated norms plain tensors. One fused call
    # over both fails in torch ("got mixed torch.Tensor and DTensor"); the optimizer must still step.
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        mesh = init_device_mesh("cpu", (1,))
        sharded = distribute_tensor(torch.zeros(4, 2), mesh, [Shard(0)])
        replicated = distribute_tensor(torch.zeros(3), mesh, [Replicate()])
        assert fusable([torch.zeros(1), torch.zeros(2)]) and fusable([sharded, replicated])
        assert not fusable([sharded, torch.zeros(3)])
        mixed = [torch.nn.Parameter(sharded), torch.nn.Parameter(torch.zeros(3))]
        mixed[0].grad = distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])
        mixed[1].grad = torch.ones(3)
        optimizer = adamw(mixed, lr=0.1)
        assert not optimizer.defaults["fused"]
        optimizer.step()
        tol.assert_close(mixed[0].full_tensor(), torch.full((4, 2), -0.1), STEP_BOUND)
        tol.assert_close(mixed[1].detach(), torch.full((3,), -0.1), STEP_BOUND)
        # The failure this avoids is real: the fused kernel over the same mix raises.
        try:
            torch.optim.AdamW(mixed, lr=0.1, fused=True).step()
        except RuntimeError as err:
            assert "mixed torch.Tensor and DTensor" in str(err)
        else:
            raise AssertionError("fused AdamW over mixed Tensor/DTensor stepped; common.optim's guard may be stale")
    finally:
        dist.destroy_process_group()
