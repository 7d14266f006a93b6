"""The device process: one per plan device, hosting every model shard the plan puts on the device.

It joins the world of all device processes, creates the process group of every device set the plan
needs (``runtime.topology.mesh_groups``: ``new_group`` is collective, so every process creates them
all, in the same order), builds the shards of its roles (``runtime.device.shards``,
``runtime.device.reward``) and runs their methods as the driver dispatches them, plus the
reallocations that move a model between two layouts (``reallocate``). No Ray here:
``runtime.placement`` hosts it in an actor.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from planning.lifecycle import HANDOFF, TRANSFER
from reallocation.layout import Holdings
from runtime.device.memory import DeviceMemory
from runtime.meshes import Grid, Pipeline


class DeviceProcess:
    """Everything one device holds: the shard of each of its roles, by role name.

    ``builders``: role -> (shard class, its keyword arguments, the grid or stages its model is
    sharded over); a grid says FSDP over the rows, TP within each row, its ``DeviceMesh`` made from
    the groups created here.
    """

    def __init__(
        self,
        device: int,
        devices: Sequence[int],
        master_addr: str,
        master_port: int,
        backend: str,
        groups: Sequence[tuple[int, ...]],
        dtype: str,
        builders: Mapping[str, tuple[type, dict, Grid | Pipeline]],
        collective_timeout_s: float = 1800.0,
    ):
        """``collective_timeout_s``: how long a collective may wait for its peers before it fails (every
        process group; NCCL's watchdog otherwise kills a healthy run at 10 minutes when one node's call
        outlasts another's)."""
        import datetime

        import torch.distributed as dist

        self.device, self.devices = device, tuple(devices)
        self.rank_of = {d: i for i, d in enumerate(self.devices)}
        timeout = datetime.timedelta(seconds=collective_timeout_s)
        dist.init_process_group(
            backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=self.rank_of[device],
            world_size=len(self.devices),
            timeout=timeout,
        )
        self.groups = {g: dist.new_group([self.rank_of[d] for d in g], timeout=timeout) for g in groups}
        self.backend, self.dtype = backend, dtype
        on_gpu = backend == "nccl"
        self.memory = DeviceMemory(torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu"))
        self._ipc_keepalive: list[torch.Tensor] = []
        """Shards handed to the engine beside this process, held until it has loaded them (``handoff_done``)."""
        self._in_transfer = False  # a reallocation's bucket is in flight
        self.shards: dict[str, Any] = {}
        for role, (cls, kwargs, mesh) in builders.items():
            self.shards[role] = cls(self._ranks(mesh), **kwargs)
        self.memory.release("shards built")  # loading's cached blocks go back before an engine starts beside us

    def _ranks(self, mesh: Grid | Pipeline) -> Any:
        """This device's ``Ranks`` in a model sharded over ``mesh``: a grid (dp rows x tp columns),
        or pipeline stages, the stage holding this device being a grid of its own that passes hidden
        states to the device at the same place in the next stage."""
        from runtime.device.pipeline import PipelineStage
        from runtime.device.ranks import Ranks
        from runtime.meshes import column_of, global_grid, row_of

        pipeline = None
        if isinstance(mesh, Pipeline):
            s, column = mesh.stage_of(self.device), mesh.column(self.device)
            if len(mesh.stages) > 1:  # this device talks to the devices at its place in the other stages
                rank = [self.rank_of[d] for d in column]
                pipeline = PipelineStage(
                    s,
                    len(column),
                    prev=rank[s - 1] if s > 0 else None,
                    next=rank[s + 1] if s + 1 < len(column) else None,
                    first=rank[0],
                    last=rank[-1],
                    group=self.groups[tuple(sorted(column))],
                    tie_group=self.groups[tuple(sorted((column[0], column[-1])))],
                    model_group=self.groups[mesh.devices],
                )
            mesh = mesh.stages[s]
        devices = tuple(sorted(d for row in mesh for d in row))
        if len(devices) == 1:
            return Ranks(None, self.dtype, self.backend, pipeline=pipeline)
        if len(mesh[0]) == 1:  # FSDP (or plain replicas) over the whole group
            return Ranks(self.groups[devices], self.dtype, self.backend, pipeline=pipeline)
        return Ranks(
            self.groups[devices],
            self.dtype,
            self.backend,
            dp_group=self.groups[column_of(mesh, self.device)],
            tp_group=self.groups[row_of(mesh, self.device)],
            grid=global_grid(mesh, self.rank_of),
            pipeline=pipeline,
        )

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` of ``role``'s shard; then the memory the call freed goes back to the device (the
        engine beside this process may need it next)."""
        try:
            return getattr(self.shards[role], method)(*args, **kwargs)
        finally:
            self.memory.release(f"after {role}.{method}")

    def residency(self) -> dict[str, str]:
        """What this device holds now, "owner/kind" -> "device" | "host" (``planning.lifecycle``'s keys):
        its shards' state, and the transient buffers of a reallocation while they live (a bucket in
        flight, "transfer/buffers"; shards handed to the engine and not yet loaded, "handoff/buffers")."""
        out: dict[str, str] = {}
        for shard in self.shards.values():
            out.update({f"{owner}/{kind}": where for (owner, kind), where in shard.residency().items()})
        return {**out, **self.transient()}

    def transient(self) -> dict[str, str]:
        """The reallocation buffers this device holds now (``planning.lifecycle.MemoryLifecycle.transient``)."""
        out = {f"{TRANSFER}/buffers": "device"} if self._in_transfer else {}
        return {**out, **({f"{HANDOFF}/buffers": "device"} if self._ipc_keepalive else {})}

    def reallocate(
        self,
        src_role: str,
        dst_role: str,
        src_devices: Sequence[int],
        dst_devices: Sequence[int],
        engine: Holdings | None = None,
    ) -> tuple[Any, tuple[dict[str, Any], float, float]]:
        """Move ``src_role``'s training shards to the replicas on ``dst_devices`` (collective over the
        union of both meshes): the engine ranks' boxes ``engine`` (``engine_holdings``), or the
        ``dst_role`` shards' own (FSDP/TP) shards. A destination keeps what it already holds and
        receives the rest.

        Returns (engine shards or None, ({bytes_received, bytes_sent, lower_bound, held}, start, end)),
        ``held`` being the transient buffers this device held at the reallocation's fullest point
        (``transient``: the bucket in flight and, on an engine's device, every shard handed over). For an engine a destination
        returns its ``(HF name, full shape, box, shard)`` for the vLLM engine rank beside it
        (``VLLMEngine.load_shards``), held here until the driver says it was loaded (``handoff_done``);
        otherwise it copies the shards into its ``dst_role`` worker's parameters.
        """
        from reallocation.plan import lower_bound_bytes
        from reallocation.reshard import ReshardStats
        from reallocation.sync import drain, iter_plan_weights, plan_sync, source_shards

        start = time.time()
        self.handoff_done()  # a no-op after the driver's own call (a reallocation that failed mid-way left some)
        self._in_transfer = True
        group = self.groups[tuple(sorted(set(src_devices) | set(dst_devices)))]
        src_shard = self.shards.get(src_role) if self.device in src_devices else None
        src = source_shards(src_shard.model if src_shard is not None else {}, group)
        dst_model = self.shards[dst_role].model if engine is None and self.device in dst_devices else None
        dst = self._destination(engine, src, dst_model, group)
        plan = plan_sync(src, dst)
        # The engine and the critic-inference replicas hold their weights in the run's compute dtype.
        wire = {n: self.compute_dtype() for n in src.shapes}
        stats = ReshardStats()
        pairs = iter_plan_weights(plan, src.tensors, dtype=wire, group=group, stats=stats)
        weights = None
        if self.device not in dst_devices:
            drain(pairs)
        elif dst_model is None:  # to the engine rank beside this device
            rank = self.rank_of[self.device]
            weights = [(name, src.shapes[name], dst[name][rank], self._handoff(tensor)) for name, tensor in pairs]
        else:
            _copy_into(dst_model, pairs)
        itemsizes = {n: wire[n].itemsize for n in wire}
        counts = {
            "bytes_received": stats.bytes_received,
            "bytes_sent": stats.bytes_sent,
            "lower_bound": lower_bound_bytes(src.holdings, dst, src.shapes, itemsizes),
            "held": self.transient(),
        }
        self._in_transfer = False
        # The transfer buckets are free now, but cached by this process's allocator: back to the device for
        # the engine beside it, which wakes next (reallocate is not a ``call``; the handoff waits for
        # ``handoff_done``).
        self.memory.release(f"after reallocate {src_role} -> {dst_role}")
        return weights, (counts, start, time.time())

    @staticmethod
    def _destination(engine: Holdings | None, src: Any, dst_model: Any, group: Any) -> Holdings:
        """What each destination rank must hold: the engine ranks' boxes, or whatever the destination
        replicas' own (FSDP/TP) shards are (collective over ``group``)."""
        from reallocation.sync import source_shards

        if engine is None:
            return source_shards(dst_model if dst_model is not None else {}, group).holdings
        if engine.keys() != src.shapes.keys():
            raise ValueError(
                f"engine layout names {sorted(engine.keys() ^ src.shapes.keys())[:5]} differ from the model's"
            )
        return engine

    def handoff_done(self, loaded: Any = None) -> None:
        """The engine beside this device has loaded the shards handed to it (the driver calls this once
        its ``load_shards`` returned; ``loaded``, that call's result, only orders this after it): drop
        them, and on a GPU free the memory the engine no longer maps (``DeviceMemory.release_ipc``). On
        CPU the same bookkeeping runs and nothing is freed by CUDA."""
        if not self._ipc_keepalive:
            return
        self._ipc_keepalive.clear()
        import gc

        gc.collect()  # views of the handed-over tensors that a reference cycle still holds
        self.memory.release_ipc("after the engine loaded the handoff")

    def compute_dtype(self) -> torch.dtype:
        from common.dtypes import torch_dtype

        return torch_dtype(self.dtype)

    def _handoff(self, tensor: torch.Tensor) -> Any:
        """How a received shard reaches the engine process on the same device: on a GPU a CUDA IPC
        handle (the engine maps this process's memory; no copy through the host and the object store,
        as verl's and OpenRLHF's colocated modes do); on CPU the tensor itself (Ray's shared-memory
        object store). Either way it is held here until ``handoff_done``: a handle's memory must outlive
        the engine's load."""
        self._ipc_keepalive.append(tensor)
        if tensor.device.type != "cuda":
            return tensor.cpu()
        from torch.multiprocessing.reductions import reduce_tensor

        return reduce_tensor(tensor)


def _copy_into(model: torch.nn.Module, pairs: Any) -> None:
    """Copy received (HF name, tensor) pairs into ``model``'s local shards (a DTensor's local
    tensor, or the plain parameter)."""
    from reallocation.sync import clean_name

    params = {clean_name(n): p for n, p in model.named_parameters()}
    with torch.no_grad():
        for name, tensor in pairs:
            param = params[name]
            (param.to_local() if hasattr(param, "to_local") else param).copy_(tensor)
