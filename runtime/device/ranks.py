"""Where one model shard runs: its rank and process groups (data and tensor parallel, pipeline stage),
its device and compute dtype, and the few collectives the shards use."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from common.dtypes import check_dtype, torch_dtype
from runtime.device.pipeline import PipelineStage


class Ranks:
    """Where one worker's model shard runs: its rank in the model's process group, the group (None
    for a single rank), the device, and the compute dtype; plus the few collectives used.

    Every worker constructor starts with the same prologue, ``Ranks.of(ranks, dtype)``: ``None``
    means one unsharded rank in this process. ``Ranks.join`` starts a process group of its own (a
    standalone multi-rank worker, as in the tests); the plan runtime (``runtime/driver.py``) builds
    one process group per device mesh over all its device workers and passes ``Ranks(group=...)``.

    Tensor parallelism: with ``tp_group`` the ranks form a 2-D mesh ``grid`` (dp rows x tp columns
    of global ranks, row-major like ``Layout``); this rank's row is its ``tp_group`` (one model
    replica, TP-sharded), its column its ``dp_group`` (FSDP). Data is split over dp only: the tp
    ranks of one row see the same rows, so data reductions (token counts, stats) run over
    ``dp_group`` and the loss is scaled by ``num_dp``, the ranks FSDP averages over.
    """

    def __init__(
        self,
        group=None,
        dtype: str = "float32",
        backend: str = "gloo",
        *,
        dp_group=None,
        tp_group=None,
        grid: Sequence[Sequence[int]] | None = None,
        pipeline: PipelineStage | None = None,
    ):
        """``pipeline``: this rank's stage when the model is one pipeline stage of an inference
        replica (``runtime.device.pipeline``); ``group`` and the tp groups are then the stage's own."""
        check_dtype(dtype, "dtype")
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend={backend!r}: expected gloo or nccl")
        if (tp_group is None) != (grid is None) or (tp_group is None) != (dp_group is None):
            raise ValueError("tensor parallel ranks need dp_group, tp_group and grid together")
        self.group = group
        self.rank = dist.get_rank(group) if group is not None else 0
        self.world_size = dist.get_world_size(group) if group is not None else 1
        self.dp_group = dp_group if tp_group is not None else group
        self.tp_group = tp_group
        self.grid = [list(row) for row in grid] if grid is not None else None
        self.pipeline = pipeline
        self.tp_size = len(self.grid[0]) if self.grid is not None else 1
        self.num_dp = self.world_size // self.tp_size
        self.dtype_name = dtype
        self.compute_dtype = torch_dtype(dtype)
        if backend == "nccl":
            # Ray gives each device worker its own GPU through CUDA_VISIBLE_DEVICES: the first visible one is ours.
            self.device = torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")

    def mesh(self):
        """The DeviceMesh the model is sharded over: ("dp",) over the group, or ("dp", "tp") over
        the grid. Built from the existing groups, so no rank outside the mesh takes part."""
        from torch.distributed.device_mesh import DeviceMesh

        if self.tp_group is None:
            return DeviceMesh.from_group(self.group, self.device.type, mesh_dim_names=("dp",))
        return DeviceMesh.from_group(
            [self.dp_group, self.tp_group], self.device.type, mesh=self.grid, mesh_dim_names=("dp", "tp")
        )

    @classmethod
    def of(cls, ranks: Ranks | None, dtype: str) -> Ranks:
        """The worker constructors' prologue: ``ranks`` as given (its dtype must match), or one local rank."""
        if ranks is None:
            return cls(dtype=dtype)
        if ranks.dtype_name != dtype:
            raise ValueError(f"dtype={dtype!r} but the ranks were built for {ranks.dtype_name!r}")
        return ranks

    @classmethod
    def join(
        cls,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        backend: str = "gloo",
        dtype: str = "float32",
    ) -> Ranks:
        """Start (or join) the default process group over TCP and use all of it (world_size 1: no group)."""
        if world_size > 1 and not dist.is_initialized():
            dist.init_process_group(
                backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank, world_size=world_size
            )
        return cls(dist.group.WORLD if world_size > 1 else None, dtype, backend)

    @property
    def sharded(self) -> bool:
        """More than one rank in this stage's group (FSDP and/or TP)."""
        return self.world_size > 1

    @property
    def model_group(self):
        """Every rank holding part of the model: the stage's group, or all stages of a pipeline."""
        return self.pipeline.model_group if self.pipeline is not None else self.group

    @property
    def model_rank(self) -> int:
        return dist.get_rank(self.model_group) if self.model_group is not None else 0

    @property
    def model_sharded(self) -> bool:
        return self.pipeline is not None or self.sharded

    @property
    def first_global_rank(self) -> int:
        """The model group's first rank (it assembles full state dicts)."""
        return dist.get_process_group_ranks(self.model_group)[0] if self.model_group is not None else 0

    def all_reduce_sum(self, x: Tensor) -> Tensor:
        """Sum over the data-parallel ranks (tp ranks of one replica hold the same value)."""
        if self.num_dp > 1:
            x = x.to(self.device)
            dist.all_reduce(x, group=self.dp_group)
        return x

    def barrier(self) -> None:
        """Wait for every rank of the model (all pipeline stages)."""
        if self.model_sharded:
            dist.barrier(group=self.model_group)

    def autocast(self, model: nn.Module):
        """The compute dtype for ``model`` when nothing else gives it: on with float32 parameters that
        FSDP2 does not manage (an unsharded trained model, or TP without FSDP); off under FSDP2 (its
        MixedPrecisionPolicy casts the gathered weights) and for frozen replicas, whose weights already
        are in the compute dtype. So a frozen replica's forward is that of compute-dtype weights, as
        FSDP2's is: the reference's logprobs equal the policy's before the first update."""
        from torch.distributed.fsdp import FSDPModule

        first = next(model.parameters(), None)
        enabled = (
            self.compute_dtype != torch.float32
            and first is not None
            and first.dtype == torch.float32
            and not isinstance(model, FSDPModule)
        )
        return torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=enabled)
