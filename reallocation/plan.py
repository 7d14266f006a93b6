"""Transfer planning between two layouts: pure data, no torch.distributed.

Input: the source and destination *holdings* (parameter name -> global rank -> box, see
``layout.py``) and the full parameter shapes. Output: a ``Plan``, the list of transfers
``(parameter, box, source rank, destination ranks)`` that gives every destination rank exactly
the elements it lacks:

- a destination rank that already holds part of its destination box (it is also a source rank
  holding an overlapping box) copies that part locally (``Plan.local_copies``); nothing is sent;
- every other element of the destination box is sent once, from one source rank that holds it.
  With ``gpus_per_node`` given, a holder on the destination's own node is preferred (node =
  rank // gpus_per_node; ReaL's ``_assign_src_to_dsts`` does the same), so nothing crosses nodes
  when the destination's node has a full replica. Among the preferred holders the one that has
  been given the fewest elements to send so far sends (ties rotate with the destination rank).

So the elements moved equal the lower bound (``lower_bound_elements``): for each destination
rank, the elements it needs and does not hold. The gather-everything-then-broadcast scheme of most
RLHF systems moves the full model to every destination rank instead.

``schedule`` then cuts a plan into rounds of point-to-point messages where each rank sends plus
receives at most ``bucket_bytes`` per round; the executor (``reshard.py``) packs one buffer per
round, so that is also its extra memory per rank.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from reallocation.layout import Box, Holdings, Shape, box_numel, full_box, intersect, subtract

# Send/receive buffers place each piece at a 16-byte aligned offset so that a byte buffer can be
# viewed as any dtype.
ALIGN = 16


@dataclass(frozen=True)
class Transfer:
    """Send ``box`` (global coordinates) of parameter ``name`` from ``src`` to each of ``dsts``."""

    name: str
    box: Box
    src: int
    dsts: tuple[int, ...]

    @property
    def numel(self) -> int:
        return box_numel(self.box)


@dataclass(frozen=True)
class Message:
    """One piece from one rank to another: the unit the executor packs into a round's buffer."""

    src: int
    dst: int
    name: str
    box: Box


@dataclass(frozen=True)
class Plan:
    """Transfers that turn ``src`` holdings into ``dst`` holdings.

    ``transfers`` cross ranks (``src not in dsts``); ``local_copies`` have ``dsts == (src,)`` and
    move nothing over the network.
    """

    shapes: Mapping[str, Shape]
    src: Holdings
    dst: Holdings
    transfers: tuple[Transfer, ...]
    local_copies: tuple[Transfer, ...]

    @property
    def names(self) -> list[str]:
        return list(self.dst)

    @property
    def ranks(self) -> list[int]:
        """Every global rank that sends or receives anything, sorted."""
        ranks = {r for per in self.src.values() for r in per} | {r for per in self.dst.values() for r in per}
        return sorted(ranks)

    def num_elements_moved(self) -> int:
        return sum(t.numel * len(t.dsts) for t in self.transfers)

    def bytes_moved(self, itemsize: int | Mapping[str, int]) -> int:
        return sum(t.numel * len(t.dsts) * _itemsize(itemsize, t.name) for t in self.transfers)

    def messages(self) -> list[Message]:
        """Transfers expanded to one message per destination, in plan order."""
        return [Message(t.src, d, t.name, t.box) for t in self.transfers for d in t.dsts]

    def subset(self, names: Iterable[str]) -> Plan:
        """The part of the plan for ``names`` (parameters are planned independently)."""
        keep = set(names)
        return Plan(
            shapes={n: s for n, s in self.shapes.items() if n in keep},
            src={n: h for n, h in self.src.items() if n in keep},
            dst={n: h for n, h in self.dst.items() if n in keep},
            transfers=tuple(t for t in self.transfers if t.name in keep),
            local_copies=tuple(t for t in self.local_copies if t.name in keep),
        )

    def summary(self, itemsize: int | Mapping[str, int] = 1) -> dict:
        sent: dict[int, int] = defaultdict(int)
        received: dict[int, int] = defaultdict(int)
        for t in self.transfers:
            nbytes = t.numel * _itemsize(itemsize, t.name)
            sent[t.src] += nbytes * len(t.dsts)
            for d in t.dsts:
                received[d] += nbytes
        return {
            "num_transfers": len(self.transfers),
            "num_local_copies": len(self.local_copies),
            "bytes_moved": self.bytes_moved(itemsize),
            "lower_bound_bytes": lower_bound_bytes(self.src, self.dst, self.shapes, itemsize),
            "bytes_sent_per_rank": dict(sorted(sent.items())),
            "bytes_received_per_rank": dict(sorted(received.items())),
        }


def _itemsize(itemsize: int | Mapping[str, int], name: str) -> int:
    return itemsize if isinstance(itemsize, int) else itemsize[name]


def source_pieces(name: str, holdings: Mapping[int, Box], shape: Shape) -> list[tuple[Box, list[int]]]:
    """Distinct boxes of one parameter with their holders; checks that they partition the tensor."""
    holders: dict[Box, list[int]] = {}
    for rank in sorted(holdings):
        holders.setdefault(holdings[rank], []).append(rank)
    pieces = list(holders.items())
    boxes = [b for b, _ in pieces]
    for box in boxes:
        if intersect(box, full_box(shape)) != box:
            raise ValueError(f"{name}: box {box} is outside shape {shape}")
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if intersect(a, b) is not None:
                raise ValueError(f"{name}: source boxes {a} and {b} overlap without being equal")
    if sum(box_numel(b) for b in boxes) != math.prod(shape):
        raise ValueError(f"{name}: source boxes do not cover shape {shape}")
    return pieces


def make_plan(src: Holdings, dst: Holdings, shapes: Mapping[str, Shape], *, gpus_per_node: int | None = None) -> Plan:
    """Plan the transfers that give every destination rank its ``dst`` boxes.

    ``gpus_per_node``: prefer senders on the destination's node (None: every holder is as near).

    ``src`` must hold every parameter of ``dst``, and for each parameter the distinct source
    boxes must partition it (true for every ``Layout``). Deterministic: every rank computes the
    same plan from the same inputs.
    """
    missing = [n for n in dst if n not in src]
    if missing:
        raise ValueError(f"source holds no shards of {missing[:5]}")
    load: dict[int, int] = defaultdict(int)  # elements each source rank has been asked to send
    grouped: dict[tuple[str, Box, int], list[int]] = {}
    local: list[Transfer] = []
    for name, per_rank in dst.items():
        pieces = source_pieces(name, src[name], shapes[name])
        have_by_rank = src[name]
        for d in sorted(per_rank):
            need = per_rank[d]
            have = have_by_rank.get(d)
            overlap = intersect(need, have) if have is not None else None
            if overlap is not None:
                local.append(Transfer(name, overlap, d, (d,)))
            for missing_box in subtract(need, have):
                for piece_box, holders in pieces:
                    part = intersect(missing_box, piece_box)
                    if part is None:
                        continue
                    # Same-node holders first, then the least-loaded; ties rotate with the
                    # destination so that replicas of a piece are drained evenly.
                    near = holders
                    if gpus_per_node:
                        near = [h for h in holders if h // gpus_per_node == d // gpus_per_node] or holders
                    src_rank = min(near, key=lambda h: (load[h], (holders.index(h) - d) % len(holders)))
                    load[src_rank] += box_numel(part)
                    grouped.setdefault((name, part, src_rank), []).append(d)
    transfers = tuple(Transfer(n, b, s, tuple(ds)) for (n, b, s), ds in grouped.items())
    return Plan(dict(shapes), src, dst, transfers, tuple(local))


def lower_bound_elements(src: Holdings, dst: Holdings) -> int:
    """Sum over destination ranks of the elements they need and do not already hold."""
    total = 0
    for name, per_rank in dst.items():
        for d, need in per_rank.items():
            have = src.get(name, {}).get(d)
            overlap = intersect(need, have) if have is not None else None
            total += box_numel(need) - (box_numel(overlap) if overlap is not None else 0)
    return total


def lower_bound_bytes(
    src: Holdings, dst: Holdings, shapes: Mapping[str, Shape], itemsize: int | Mapping[str, int]
) -> int:
    return sum(lower_bound_elements(src, {n: dst[n]}) * _itemsize(itemsize, n) for n in dst)


def gather_broadcast_bytes(
    src: Holdings, dst: Holdings, shapes: Mapping[str, Shape], itemsize: int | Mapping[str, int], root: int = 0
) -> int:
    """Bytes of the baseline: gather every parameter in full on ``root``, broadcast it to every
    other destination rank (each then keeps its slice)."""
    dst_ranks = {r for per in dst.values() for r in per} - {root}
    total = 0
    for name, shape in shapes.items():
        if name not in dst:
            continue
        gather = lower_bound_elements(src, {name: {root: full_box(shape)}})
        total += (gather + math.prod(shape) * len(dst_ranks)) * _itemsize(itemsize, name)
    return total


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def take_box(box: Box, max_numel: int) -> tuple[Box, list[Box]]:
    """Split off a leading row-major piece of at most ``max_numel`` elements (>= 1).

    Returns ``(head, rest)``: ``rest`` is at most ``ndim`` boxes covering the remainder, so a
    message cut at a round boundary stays in few pieces.
    """
    if box_numel(box) <= max_numel:
        return box, []
    (start, stop), inner = box[0], box[1:]
    rows = max_numel // (box_numel(inner) if inner else 1)
    if rows >= 1:
        return ((start, start + rows),) + inner, [((start + rows, stop),) + inner]
    # Not even one row fits: take part of the first row.
    head, rest = take_box(inner, max_numel)
    tail = [((start + 1, stop),) + inner] if start + 1 < stop else []
    return ((start, start + 1),) + head, [((start, start + 1),) + b for b in rest] + tail


def schedule(plan: Plan, itemsize: int | Mapping[str, int], bucket_bytes: int) -> list[list[Message]]:
    """Rounds of messages in which every rank sends plus receives at most ``bucket_bytes``.

    Each rank's share of a round is packed into one buffer, so ``bucket_bytes`` bounds the
    executor's extra memory per rank. Every (src, dst) pair with data left is active in every
    round and gets a fair share of both ends' capacity (``bucket_bytes`` / number of active
    pairs at that rank): all links stay busy at once, instead of a few pairs filling a round
    while the rest wait. A message larger than its share is cut into row blocks
    (``take_box``) and continues in the next round. Deterministic, so every rank derives the
    same rounds (and buffer offsets) from the plan.
    """
    if bucket_bytes < ALIGN:
        raise ValueError(f"bucket_bytes must be >= {ALIGN}")
    capacity = bucket_bytes // ALIGN * ALIGN
    queues: dict[tuple[int, int], deque[Message]] = {}
    for msg in plan.messages():
        queues.setdefault((msg.src, msg.dst), deque()).append(msg)
    rounds: list[list[Message]] = []
    while queues:
        degree: dict[int, int] = defaultdict(int)
        for s, d in queues:
            degree[s] += 1
            degree[d] += 1
        load: dict[int, int] = defaultdict(int)
        msgs: list[Message] = []
        for (s, d), queue in list(queues.items()):
            share = min(capacity // degree[s], capacity // degree[d]) // ALIGN * ALIGN
            # At least one aligned slot (progress with tiny buckets), never past either end's cap.
            quota = min(max(share, ALIGN), capacity - load[s], capacity - load[d])
            used = 0
            while queue:
                msg = queue[0]
                size = _itemsize(itemsize, msg.name)
                fit = (quota - used) // size
                if fit == 0:
                    break
                queue.popleft()
                if box_numel(msg.box) > fit:
                    head, rest = take_box(msg.box, fit)
                    queue.extendleft(reversed([Message(s, d, msg.name, b) for b in rest]))
                    msg = Message(s, d, msg.name, head)
                msgs.append(msg)
                used += aligned(box_numel(msg.box) * size)
            load[s] += used
            load[d] += used
            if not queue:
                del queues[(s, d)]
        rounds.append(msgs)
    return rounds
