"""Executing a transfer plan with torch.distributed (gloo on CPU, NCCL on GPU).

Every rank calls the same function with the same ``Plan`` (``plan.py``) and its own source
shards (parameter name -> local tensor holding ``plan.src[name][rank]``). The plan is cut into
rounds (``plan.schedule``): in each round a rank packs everything it sends into one byte buffer,
posts one ``isend`` per peer and one ``irecv`` per peer with ``batch_isend_irecv``, waits, and
unpacks. Each rank sends plus receives at most ``bucket_bytes`` per round, so the extra memory per
rank is one bucket on top of the destination shards. Elements a rank already holds are copied
locally and never sent.

Point-to-point rather than broadcast: the plan gives each destination only its own slice, and
gloo and NCCL both batch P2P ops, so no per-transfer process groups are needed.

``reshard_in_process`` runs the same packing code in one process (all ranks' shards in one dict)
for tests; ``reshard_gather_broadcast`` is the baseline most RLHF systems use (gather every
parameter in full on one rank, broadcast it, slice), kept for comparison and as a reference.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterator, Mapping

import torch

from reallocation.layout import Box, box_shape, full_box, local_slices
from reallocation.plan import Message, Plan, aligned, make_plan, schedule

DEFAULT_BUCKET_BYTES = 64 << 20

DTypes = torch.dtype | Mapping[str, torch.dtype]


@dataclass
class ReshardStats:
    """What one rank did. Bytes are parameter bytes in the wire (= destination) dtype; buffers add
    at most 15 bytes of alignment padding per message."""

    bytes_sent: int = 0
    bytes_received: int = 0
    bytes_copied_locally: int = 0
    num_rounds: int = 0
    num_messages: int = 0  # point-to-point messages posted by this rank (sends + receives)
    peak_buffer_bytes: int = 0  # largest send+receive buffer of one round
    dst_bytes: int = 0  # destination shards allocated by the executor
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


def _dtype(dtype: DTypes, name: str) -> torch.dtype:
    return dtype if isinstance(dtype, torch.dtype) else dtype[name]


def _itemsizes(plan: Plan, dtype: DTypes) -> dict[str, int]:
    return {n: _dtype(dtype, n).itemsize for n in plan.shapes}


@dataclass
class _Segment:
    """The messages between one (src, dst) pair in one round, at offsets in one byte buffer."""

    messages: list[tuple[Message, int]]  # (message, byte offset within the segment)
    nbytes: int  # buffer bytes, with alignment padding
    payload: int = 0  # bytes of parameter data


def _segments(round_msgs: list[Message], itemsizes: Mapping[str, int]) -> dict[tuple[int, int], _Segment]:
    segs: dict[tuple[int, int], _Segment] = {}
    for msg in round_msgs:
        seg = segs.setdefault((msg.src, msg.dst), _Segment([], 0))
        seg.messages.append((msg, seg.nbytes))
        nbytes = _numel(msg.box) * itemsizes[msg.name]
        seg.nbytes += aligned(nbytes)
        seg.payload += nbytes
    return segs


def _numel(box: Box) -> int:
    n = 1
    for start, stop in box:
        n *= stop - start
    return n


def _view(buf: torch.Tensor, offset: int, box: Box, dtype: torch.dtype) -> torch.Tensor:
    """The piece at ``offset`` of a byte buffer, as a ``dtype`` tensor of the box's shape."""
    nbytes = _numel(box) * dtype.itemsize
    return buf[offset : offset + nbytes].view(dtype).view(box_shape(box))


def _pack(seg: _Segment, buf: torch.Tensor, plan: Plan, src_shards: Mapping[str, torch.Tensor], rank: int, dtype: DTypes) -> None:
    for msg, offset in seg.messages:
        local = src_shards[msg.name][local_slices(msg.box, plan.src[msg.name][rank])]
        _view(buf, offset, msg.box, _dtype(dtype, msg.name)).copy_(local)


def _unpack(seg: _Segment, buf: torch.Tensor, plan: Plan, dst_shards: Mapping[str, torch.Tensor], rank: int, dtype: DTypes) -> None:
    for msg, offset in seg.messages:
        local = dst_shards[msg.name][local_slices(msg.box, plan.dst[msg.name][rank])]
        local.copy_(_view(buf, offset, msg.box, _dtype(dtype, msg.name)))


def _copy_local(plan: Plan, src_shards, dst_shards, rank: int, stats: ReshardStats, dtype: DTypes) -> None:
    for t in plan.local_copies:
        if t.src != rank:
            continue
        src = src_shards[t.name][local_slices(t.box, plan.src[t.name][rank])]
        dst_shards[t.name][local_slices(t.box, plan.dst[t.name][rank])].copy_(src)
        stats.bytes_copied_locally += _numel(t.box) * _dtype(dtype, t.name).itemsize


def allocate_destination(plan: Plan, rank: int, dtype: DTypes, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
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
        nbytes = _numel(full_box(plan.shapes[name])) * itemsizes[name]
        if groups[-1] and size + nbytes > group_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def iter_reshard(
    plan: Plan,
    src_shards: Mapping[str, torch.Tensor],
    *,
    dtype: DTypes,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    group_bytes: int | None = None,
    group: "torch.distributed.ProcessGroup | None" = None,
    rank: int | None = None,
    device: torch.device | str | None = None,
    out: Mapping[str, torch.Tensor] | None = None,
    stats: ReshardStats | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Run ``plan`` on this rank; yield ``(name, destination shard)`` as parameters complete.

    Args:
        src_shards: name -> local tensor holding ``plan.src[name][rank]`` (shape = that box).
        dtype: wire and destination dtype, one for all or per name (sources are cast on packing,
            so fp32 training shards travel as bf16 when the destination is bf16).
        bucket_bytes: per-rank cap on send + receive buffer bytes in one round.
        group_bytes: None runs the whole plan, then yields; otherwise parameters are processed in
            consecutive groups of at most this many full-tensor bytes and yielded group by group
            (streaming to a consumer such as vLLM's ``reload_weights``).
        group: process group; plan ranks are *global* ranks.
        out: preallocated destination shards (e.g. the parameters to overwrite).
        stats: filled in place.

    Every rank of the plan must iterate to the end (the rounds are collective). Shapes per
    destination rank: ``box_shape(plan.dst[name][rank])``.
    """
    import torch.distributed as dist

    stats = stats if stats is not None else ReshardStats()
    rank = dist.get_rank() if rank is None else rank
    device = torch.device(device) if device is not None else _guess_device(src_shards, out)
    itemsizes = _itemsizes(plan, dtype)
    start = time.perf_counter()
    for names in _param_groups(plan, itemsizes, group_bytes):
        sub = plan.subset(names) if group_bytes is not None else plan
        if out is not None:
            dst_shards = {n: out[n] for n in names if rank in plan.dst[n]}
        else:
            dst_shards = allocate_destination(sub, rank, dtype, device)
            stats.dst_bytes += sum(t.numel() * t.element_size() for t in dst_shards.values())
        _copy_local(sub, src_shards, dst_shards, rank, stats, dtype)
        for round_msgs in schedule(sub, itemsizes, bucket_bytes):
            segs = _segments(round_msgs, itemsizes)
            sends = {d: seg for (s, d), seg in sorted(segs.items()) if s == rank}
            recvs = {s: seg for (s, d), seg in sorted(segs.items()) if d == rank}
            stats.num_rounds += 1
            if not sends and not recvs:
                continue
            send_bytes = sum(seg.nbytes for seg in sends.values())
            recv_bytes = sum(seg.nbytes for seg in recvs.values())
            # One allocation per round for everything this rank sends and receives.
            buf = torch.empty(send_bytes + recv_bytes, dtype=torch.uint8, device=device)
            stats.peak_buffer_bytes = max(stats.peak_buffer_bytes, send_bytes + recv_bytes)
            ops, offset = [], 0
            for peer, seg in sends.items():
                piece = buf[offset : offset + seg.nbytes]
                _pack(seg, piece, sub, src_shards, rank, dtype)
                ops.append(dist.P2POp(dist.isend, piece, peer, group))
                offset += seg.nbytes
            recv_pieces = {}
            for peer, seg in recvs.items():
                recv_pieces[peer] = buf[offset : offset + seg.nbytes]
                ops.append(dist.P2POp(dist.irecv, recv_pieces[peer], peer, group))
                offset += seg.nbytes
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            for peer, seg in recvs.items():
                _unpack(seg, recv_pieces[peer], sub, dst_shards, rank, dtype)
            stats.bytes_sent += sum(seg.payload for seg in sends.values())
            stats.bytes_received += sum(seg.payload for seg in recvs.values())
            stats.num_messages += len(ops)
            del buf, recv_pieces, ops
        stats.seconds += time.perf_counter() - start
        yield from dst_shards.items()
        start = time.perf_counter()
    stats.seconds += time.perf_counter() - start


def reshard(plan: Plan, src_shards: Mapping[str, torch.Tensor], **kwargs) -> tuple[dict[str, torch.Tensor], ReshardStats]:
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
    """Execute ``plan`` for all ranks in one process, with the same rounds, packing and
    unpacking as ``iter_reshard`` (buffers are handed over by memcpy instead of the network)."""
    itemsizes = _itemsizes(plan, dtype)
    ranks = plan.ranks
    stats = {r: ReshardStats() for r in ranks}
    out = {r: allocate_destination(plan, r, dtype) for r in ranks}
    for r in ranks:
        _copy_local(plan, shards_by_rank.get(r, {}), out[r], r, stats[r], dtype)
    for round_msgs in schedule(plan, itemsizes, bucket_bytes):
        segs = _segments(round_msgs, itemsizes)
        per_rank_bytes: dict[int, int] = defaultdict(int)
        for (s, d), seg in segs.items():
            per_rank_bytes[s] += seg.nbytes
            per_rank_bytes[d] += seg.nbytes
            buf = torch.empty(seg.nbytes, dtype=torch.uint8)
            _pack(seg, buf, plan, shards_by_rank[s], s, dtype)
            wire = buf.clone()  # what the receiver gets
            _unpack(seg, wire, plan, out[d], d, dtype)
            stats[s].bytes_sent += seg.payload
            stats[d].bytes_received += seg.payload
        for r, nbytes in per_rank_bytes.items():
            stats[r].num_rounds += 1
            stats[r].peak_buffer_bytes = max(stats[r].peak_buffer_bytes, nbytes)
    return out, stats


def reshard_gather_broadcast(
    plan: Plan,
    src_shards: Mapping[str, torch.Tensor],
    *,
    dtype: DTypes,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    root: int = 0,
    group: "torch.distributed.ProcessGroup | None" = None,
    rank: int | None = None,
    stats: ReshardStats | None = None,
) -> dict[str, torch.Tensor]:
    """Baseline: per bucket of parameters, gather them in full on ``root``, broadcast the bucket
    to every rank of ``group`` (all of them must call this), and let each destination rank slice
    its box. This is the gather-everything-then-broadcast weight sync of most RLHF systems."""
    import torch.distributed as dist

    stats = stats if stats is not None else ReshardStats()
    rank = dist.get_rank() if rank is None else rank
    device = _guess_device(src_shards, None)
    itemsizes = _itemsizes(plan, dtype)
    start = time.perf_counter()
    out = allocate_destination(plan, rank, dtype, device)
    for names in _param_groups(plan, itemsizes, bucket_bytes):
        offsets, total = {}, 0
        for name in names:
            offsets[name] = total
            total += aligned(_numel(full_box(plan.shapes[name])) * itemsizes[name])
        flat = torch.empty(total, dtype=torch.uint8, device=device)
        full = {n: _view(flat, offsets[n], full_box(plan.shapes[n]), _dtype(dtype, n)) for n in names}
        # Gather on root with the minimal plan (root keeps what it holds) ...
        gather_dst = {n: {root: full_box(plan.shapes[n])} for n in names}
        gather = make_plan({n: plan.src[n] for n in names}, gather_dst, plan.shapes)
        gather_stats = ReshardStats()
        for _ in iter_reshard(gather, src_shards, dtype=dtype, bucket_bytes=bucket_bytes, group=group,
                              rank=rank, device=device, out=full if rank == root else None, stats=gather_stats):
            pass
        # ... then broadcast the whole bucket.
        dist.broadcast(flat, src=root, group=group)
        for name in names:
            if rank in plan.dst[name]:
                out[name].copy_(full[name][local_slices(plan.dst[name][rank], full_box(plan.shapes[name]))])
        payload = sum(_numel(full_box(plan.shapes[n])) * itemsizes[n] for n in names)
        stats.bytes_sent += gather_stats.bytes_sent + (payload if rank == root else 0)
        stats.bytes_received += gather_stats.bytes_received + (payload if rank != root else 0)
        stats.peak_buffer_bytes = max(stats.peak_buffer_bytes, total + gather_stats.peak_buffer_bytes)
        del flat, full
    stats.seconds += time.perf_counter() - start
    return out
