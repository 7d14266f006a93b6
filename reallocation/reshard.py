"""Executing a transfer plan with torch.distributed (gloo on CPU, NCCL on GPU).

Every rank calls the same function with the same ``Plan`` (``plan.py``) and its own source
shards (parameter name -> local tensor holding ``plan.src[name][rank]``). ``plan.schedule`` cuts
the plan into rounds in which each rank sends plus receives at most ``bucket_bytes``; in each
round every rank posts one ``isend``/``irecv`` per message, all of them in one batch
(``common.p2p.exchange``), and waits.

Why NCCL cannot deadlock on it: a round's operations are one batch on each rank, so they progress
together; every rank walks the same schedule in the same order (a rank with nothing in a round
skips it), so when all rounds before r are done every rank's round-r batch is what it runs next;
and within a round both ends list the messages between a pair in plan order, so NCCL's k-th send
from a to b meets the k-th receive at b from a, the same message (NCCL ignores ``tag``).

A message travels as the row-major elements of its box in the destination dtype. When the
source slice is already that (a contiguous row block of a shard, in the wire dtype), it is sent
straight from the shard; when the destination slice is contiguous, it is received straight into
the destination shard. Only the rest (row-parallel column blocks, dtype casts) goes through one
staging buffer per rank, reused across rounds and never larger than a round's bytes. So the extra
memory per rank stays within one bucket on top of the destination shards. Elements a rank
already holds are copied locally and never sent.

Point-to-point rather than broadcast: the plan gives each destination only its own slice, and
gloo and NCCL both batch P2P ops, so no per-transfer process groups are needed.

``reshard_in_process`` runs a plan for all ranks in one process (tests);
``reshard_gather_broadcast`` is the baseline most RLHF systems use (gather every parameter in
full on one rank, broadcast it, slice), kept for comparison and as a reference.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch

from common import p2p
from reallocation.layout import box_numel, box_shape, full_box, local_slices
from reallocation.plan import Message, Plan, aligned, make_plan, schedule

DEFAULT_BUCKET_BYTES = 64 << 20

DTypes = torch.dtype | Mapping[str, torch.dtype]


@dataclass
class ReshardStats:
    """What one rank did. Bytes are parameter bytes in the wire (= destination) dtype."""

    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_copied_locally: int = 0
    bytes_staged: int = 0  # sent or received through the staging buffer (the rest went zero-copy)
    num_rounds: int = 0
    num_messages: int = 0  # point-to-point ops posted by this rank (sends + receives)
    peak_buffer_bytes: int = 0  # staging buffer: the executor's extra memory besides destinations
    dst_bytes: int = 0  # destination shards allocated by the executor
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)  # timing breakdown: local_s, post_s, wait_s, unpack_s

    def add_time(self, key: str, seconds: float) -> None:
        self.extra[key] = self.extra.get(key, 0.0) + seconds


def _dtype(dtype: DTypes, name: str) -> torch.dtype:
    return dtype if isinstance(dtype, torch.dtype) else dtype[name]


def _itemsizes(plan: Plan, dtype: DTypes) -> dict[str, int]:
    return {n: _dtype(dtype, n).itemsize for n in plan.shapes}


def _copy_local(plan: Plan, src_shards, dst_shards, rank: int, stats: ReshardStats, dtype: DTypes) -> None:
    for t in plan.local_copies:
        if t.src != rank:
            continue
        src = src_shards[t.name][local_slices(t.box, plan.src[t.name][rank])]
        dst_shards[t.name][local_slices(t.box, plan.dst[t.name][rank])].copy_(src)
        stats.bytes_copied_locally += box_numel(t.box) * _dtype(dtype, t.name).itemsize


def allocate_destination(
    plan: Plan, rank: int, dtype: DTypes, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """Empty destination shards of ``rank`` (every element is written by the plan)."""
    return {
        name: torch.empty(box_shape(per_rank[rank]), dtype=_dtype(dtype, name), device=device)
        for name, per_rank in plan.dst.items()
        if rank in per_rank
    }


def _param_groups(plan: Plan, itemsizes: Mapping[str, int], group_bytes: int | None) -> list[list[str]]:
    """Consecutive parameters whose full size sums to at most ``group_bytes`` (at least one each)."""
    names = plan.names
    if group_bytes is None:
        return [names]
    groups: list[list[str]] = [[]]
    size = 0
    for name in names:
        nbytes = box_numel(full_box(plan.shapes[name])) * itemsizes[name]
        if groups[-1] and size + nbytes > group_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


@dataclass
class _Op:
    """One message as seen by this rank: the local slice and, if staged, its buffer offset."""

    send: bool
    peer: int
    tag: int  # index of the message between this pair in this round (gloo matches on it)
    local: torch.Tensor  # the slice of the source / destination shard
    wire_dtype: torch.dtype
    shape: tuple[int, ...]
    staged_at: int | None  # byte offset in the staging buffer, None = zero-copy


def _round_ops(
    round_msgs: list[Message], plan: Plan, rank: int, src_shards, dst_shards, dtype: DTypes
) -> tuple[list[_Op], int]:
    """This rank's ops for one round, in the order both ends post them, and staging bytes."""
    ops: list[_Op] = []
    tags: dict[tuple[int, int], int] = {}
    staged = 0
    for msg in round_msgs:
        if rank not in (msg.src, msg.dst):
            continue
        tag = tags.get((msg.src, msg.dst), 0)
        tags[msg.src, msg.dst] = tag + 1
        send = msg.src == rank
        holdings, shards = (plan.src, src_shards) if send else (plan.dst, dst_shards)
        local = shards[msg.name][local_slices(msg.box, holdings[msg.name][rank])]
        wire = _dtype(dtype, msg.name)
        direct = local.is_contiguous() and local.dtype == wire
        ops.append(
            _Op(send, msg.dst if send else msg.src, tag, local, wire, box_shape(msg.box), None if direct else staged)
        )
        if not direct:
            staged += aligned(box_numel(msg.box) * wire.itemsize)
    return ops, staged


def _staged_view(buf: torch.Tensor | None, op: _Op) -> torch.Tensor:
    assert buf is not None and op.staged_at is not None  # only staged ops are viewed, after the buffer exists
    nbytes = box_numel(tuple((0, n) for n in op.shape)) * op.wire_dtype.itemsize
    return buf[op.staged_at : op.staged_at + nbytes].view(op.wire_dtype).view(op.shape)


def iter_reshard(
    plan: Plan,
    src_shards: Mapping[str, torch.Tensor],
    *,
    dtype: DTypes,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    group_bytes: int | None = None,
    group: torch.distributed.ProcessGroup | None = None,
    rank: int | None = None,
    device: torch.device | str | None = None,
    out: Mapping[str, torch.Tensor] | None = None,
    stats: ReshardStats | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Run ``plan`` on this rank; yield ``(name, destination shard)`` as parameters complete.

    Args:
        src_shards: name -> local tensor holding ``plan.src[name][rank]`` (shape = that box).
        dtype: wire and destination dtype, one for all or per name (sources are cast before
            sending, so fp32 training shards travel as bf16 when the destination is bf16).
        bucket_bytes: per-rank cap on the bytes sent plus received in one round.
        group_bytes: None runs the whole plan, then yields; otherwise parameters are processed in
            consecutive groups of at most this many full-tensor bytes and yielded group by group
            (streaming to a consumer such as vLLM's ``reload_weights``).
        group: process group; plan ranks are *global* ranks.
        out: preallocated destination shards in the wire dtype (e.g. parameters to overwrite).
        stats: filled in place.

    Every rank of the plan must iterate to the end (the rounds are collective; with NCCL every
    rank of ``group``). Shapes per destination rank: ``box_shape(plan.dst[name][rank])``.
    """
    import torch.distributed as dist

    stats = stats if stats is not None else ReshardStats()
    rank = dist.get_rank() if rank is None else rank
    device = torch.device(device) if device is not None else _guess_device(src_shards, out)
    itemsizes = _itemsizes(plan, dtype)
    if dist.get_backend(group) == "nccl":
        # NCCL: the first batched P2P call in a group must involve all its ranks; a barrier
        # creates the communicator, after which rounds may involve any subset.
        p2p.barrier(group, device)
    start = time.perf_counter()
    for names in _param_groups(plan, itemsizes, group_bytes):
        sub = plan.subset(names) if group_bytes is not None else plan
        if out is not None:
            dst_shards = {n: out[n] for n in names if rank in plan.dst[n]}
        else:
            dst_shards = allocate_destination(sub, rank, dtype, device)
            stats.dst_bytes += sum(t.numel() * t.element_size() for t in dst_shards.values())
        _run_plan(sub, src_shards, dst_shards, rank, dtype, itemsizes, bucket_bytes, group, device, stats)
        stats.seconds += time.perf_counter() - start
        yield from dst_shards.items()
        start = time.perf_counter()
    stats.seconds += time.perf_counter() - start


def _run_plan(
    plan: Plan,
    src_shards: Mapping[str, torch.Tensor],
    dst_shards: dict[str, torch.Tensor],
    rank: int,
    dtype: DTypes,
    itemsizes: Mapping[str, int],
    bucket_bytes: int,
    group,
    device: torch.device,
    stats: ReshardStats,
) -> None:
    """This rank's part of ``plan``: the local copies, then every round of the schedule."""
    t0 = time.perf_counter()
    _copy_local(plan, src_shards, dst_shards, rank, stats, dtype)
    stats.add_time("local_s", time.perf_counter() - t0)
    rounds = [
        _round_ops(msgs, plan, rank, src_shards, dst_shards, dtype) for msgs in schedule(plan, itemsizes, bucket_bytes)
    ]
    stats.num_rounds += len(rounds)
    # One staging buffer for the whole schedule, reused by every round.
    size = max((staged for _, staged in rounds), default=0)
    buf = torch.empty(size, dtype=torch.uint8, device=device) if size else None
    stats.peak_buffer_bytes = max(stats.peak_buffer_bytes, size)
    for ops, _ in rounds:
        if ops:
            _run_round(ops, buf, group, stats)


def _run_round(ops: list[_Op], buf: torch.Tensor | None, group, stats: ReshardStats) -> None:
    """One round of the schedule: stage and post every send and receive, wait, unpack the staged ones."""
    import torch.distributed as dist

    t0 = time.perf_counter()
    batch = []
    for op in ops:
        tensor = op.local if op.staged_at is None else _staged_view(buf, op)
        if op.send and op.staged_at is not None:
            tensor.copy_(op.local)  # gather a strided slice and/or cast to the wire dtype
        batch.append(dist.P2POp(dist.isend if op.send else dist.irecv, tensor, op.peer, group, tag=op.tag))
        nbytes = op.local.numel() * op.wire_dtype.itemsize
        if op.send:
            stats.bytes_sent += nbytes
        else:
            stats.bytes_received += nbytes
        if op.staged_at is not None:
            stats.bytes_staged += nbytes
    t1 = time.perf_counter()
    p2p.exchange(batch)
    t2 = time.perf_counter()
    for op in ops:
        if not op.send and op.staged_at is not None:
            op.local.copy_(_staged_view(buf, op))
    stats.add_time("post_s", t1 - t0)
    stats.add_time("wait_s", t2 - t1)
    stats.add_time("unpack_s", time.perf_counter() - t2)
    stats.num_messages += len(batch)


def reshard(
    plan: Plan, src_shards: Mapping[str, torch.Tensor], **kwargs
) -> tuple[dict[str, torch.Tensor], ReshardStats]:
    """Run the whole plan; return this rank's destination shards and its stats.

    Same arguments as ``iter_reshard`` (without ``group_bytes``).
    """
    stats = kwargs.pop("stats", None) or ReshardStats()
    out = dict(iter_reshard(plan, src_shards, stats=stats, **kwargs))
    return out, stats


def _guess_device(src_shards, out) -> torch.device:
    for tensors in (out or {}, src_shards):
        for t in tensors.values():
            return t.device
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reshard_in_process(
    plan: Plan,
    shards_by_rank: Mapping[int, Mapping[str, torch.Tensor]],
    *,
    dtype: DTypes,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> tuple[dict[int, dict[str, torch.Tensor]], dict[int, ReshardStats]]:
    """Execute ``plan`` for all ranks in one process, round by round as ``iter_reshard`` does;
    each message is handed over as its row-major wire tensor."""
    itemsizes = _itemsizes(plan, dtype)
    ranks = plan.ranks
    stats = {r: ReshardStats() for r in ranks}
    out = {r: allocate_destination(plan, r, dtype) for r in ranks}
    for r in ranks:
        _copy_local(plan, shards_by_rank.get(r, {}), out[r], r, stats[r], dtype)
    for msgs in schedule(plan, itemsizes, bucket_bytes):
        load: dict[int, int] = {}
        for msg in msgs:
            src = shards_by_rank[msg.src][msg.name][local_slices(msg.box, plan.src[msg.name][msg.src])]
            wire = src.to(_dtype(dtype, msg.name)).contiguous().view(-1)  # what goes over the network
            out[msg.dst][msg.name][local_slices(msg.box, plan.dst[msg.name][msg.dst])].copy_(
                wire.view(box_shape(msg.box))
            )
            nbytes = wire.numel() * wire.element_size()
            stats[msg.src].bytes_sent += nbytes
            stats[msg.dst].bytes_received += nbytes
            for r in (msg.src, msg.dst):
                load[r] = load.get(r, 0) + aligned(nbytes)
        for r, nbytes in load.items():
            stats[r].num_rounds += 1
            # In-flight bytes of the round: the executor's worst-case staging for this rank.
            stats[r].peak_buffer_bytes = max(stats[r].peak_buffer_bytes, nbytes)
    return out, stats


def _bucket_buffer(
    plan: Plan, names: list[str], dtype: DTypes, itemsizes: Mapping[str, int], device: torch.device
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One flat byte buffer for the full parameters ``names`` (each at an aligned offset) and a view
    of each parameter in it (name -> tensor of its full shape), so one broadcast moves the bucket."""
    offsets, total = {}, 0
    for name in names:
        offsets[name] = total
        total += aligned(box_numel(full_box(plan.shapes[name])) * itemsizes[name])
    flat = torch.empty(total, dtype=torch.uint8, device=device)
    full = {}
    for n in names:
        nbytes = box_numel(full_box(plan.shapes[n])) * itemsizes[n]
        full[n] = flat[offsets[n] : offsets[n] + nbytes].view(_dtype(dtype, n)).view(plan.shapes[n])
    return flat, full


def reshard_gather_broadcast(
    plan: Plan,
    src_shards: Mapping[str, torch.Tensor],
    *,
    dtype: DTypes,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    root: int = 0,
    group: torch.distributed.ProcessGroup | None = None,
    broadcast_group: torch.distributed.ProcessGroup | None = None,
    rank: int | None = None,
    stats: ReshardStats | None = None,
) -> dict[str, torch.Tensor]:
    """Baseline: per bucket of parameters, gather them in full on ``root`` (point-to-point over
    ``group``, root keeps what it holds), broadcast the bucket over ``broadcast_group`` (default:
    ``group``; it must contain root and every destination rank), and let each destination rank
    slice its box. This is the gather-everything-then-broadcast weight sync of most RLHF systems.
    Every rank of ``group`` calls it."""
    import torch.distributed as dist

    stats = stats if stats is not None else ReshardStats()
    rank = dist.get_rank() if rank is None else rank
    broadcast_group = group if broadcast_group is None else broadcast_group
    in_broadcast = rank in dist.get_process_group_ranks(broadcast_group or dist.group.WORLD)
    device = _guess_device(src_shards, None)
    itemsizes = _itemsizes(plan, dtype)
    start = time.perf_counter()
    out = allocate_destination(plan, rank, dtype, device)
    for names in _param_groups(plan, itemsizes, bucket_bytes):
        flat, full = _bucket_buffer(plan, names, dtype, itemsizes, device)
        total = flat.numel()
        # Gather on root with the minimal plan (root keeps what it holds) ...
        gather_dst = {n: {root: full_box(plan.shapes[n])} for n in names}
        gather = make_plan({n: plan.src[n] for n in names}, gather_dst, plan.shapes)
        gather_stats = ReshardStats()
        for _ in iter_reshard(
            gather,
            src_shards,
            dtype=dtype,
            bucket_bytes=bucket_bytes,
            group=group,
            rank=rank,
            device=device,
            out=full if rank == root else None,
            stats=gather_stats,
        ):
            pass
        # ... then broadcast the whole bucket.
        if in_broadcast:
            dist.broadcast(flat, src=root, group=broadcast_group)
        for name in names:
            if rank in plan.dst[name]:
                out[name].copy_(full[name][local_slices(plan.dst[name][rank], full_box(plan.shapes[name]))])
        payload = sum(box_numel(full_box(plan.shapes[n])) * itemsizes[n] for n in names)
        stats.bytes_sent += gather_stats.bytes_sent + (payload if rank == root else 0)
        stats.bytes_received += gather_stats.bytes_received + (payload if rank != root and in_broadcast else 0)
        stats.peak_buffer_bytes = max(stats.peak_buffer_bytes, total + gather_stats.peak_buffer_bytes)
        del flat, full
    stats.seconds += time.perf_counter() - start
    return out
