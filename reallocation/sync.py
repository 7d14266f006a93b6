"""Weight sync: the trainer's single entry for pushing training weights into a generation engine.

All functions are collective over the training process group: every rank calls them and
iterates the returned iterator to the end (ranks that receive nothing get an empty iterator,
but their iteration is what sends their shards).

CPU / TP=1 engine on rank 0 (the default run)::

    from reallocation.sync import iter_full_weights

    weights = iter_full_weights(model, dst_rank=0, dtype=torch.bfloat16)  # FSDP2/TP-sharded model
    if dist.get_rank() == 0:
        engine.reload_weights(weights)   # (hf_name, full tensor) pairs, streamed bucket by bucket
    else:
        drain(weights)                   # sends this rank's shards

Each destination rank receives only what it lacks (rank 0 keeps its own shards), buckets bound
the memory, and nothing is all-gathered everywhere as ``DTensor.full_tensor()`` would.

vLLM with TP > 1 whose workers are ranks of the same process group (GPU path)::

    from reallocation.names import vllm_layout
    from reallocation.layout import ModelSpec
    spec = ModelSpec.from_hf_config(model.config)
    layout = vllm_layout(tp=4, ranks=(4, 5, 6, 7))
    # trainer ranks pass the model, vLLM worker ranks an empty dict (they hold no training shards)
    pairs = iter_layout_weights(model if is_trainer else {}, layout, spec, vllm_names=True, dtype=torch.bfloat16)
    for name, shard in pairs:            # yields only on vLLM worker ranks
        params[name].data.copy_(shard)   # vLLM's own (fused, padded, per-TP-rank) parameters

Lower level, when the destination ranks hold no training shards and got the plan by other means
(it is plain picklable data): ``plan = plan_sync(source_shards(model), dst_holdings)`` on the
trainer, then ``iter_plan_weights(plan, local_shards, ...)`` on every rank of the plan.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch

from reallocation.layout import Box, Holdings, Layout, ModelSpec, Shape, full_box, single_rank_holdings
from reallocation.plan import Plan, make_plan
from reallocation.reshard import DEFAULT_BUCKET_BYTES, ReshardStats, iter_reshard

# Wrapper modules that insert a path segment into parameter names.
_WRAPPER_SEGMENTS = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


@dataclass
class SourceShards:
    """This rank's training shards plus every rank's boxes (gathered once, identical everywhere).

    ``tensors``: name -> local tensor (shape = ``box_shape(holdings[name][rank])``);
    ``holdings``: name -> global rank -> box; ``shapes``/``dtypes``: full shape and dtype.
    """

    tensors: dict[str, torch.Tensor]
    holdings: Holdings
    shapes: dict[str, Shape]
    dtypes: dict[str, torch.dtype]


def clean_name(name: str) -> str:
    """HF name of a parameter of a wrapped module (torch.compile, activation checkpointing)."""
    for segment in _WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


def _local_box(tensor: torch.Tensor) -> tuple[torch.Tensor, Box | None]:
    """(local tensor, its box in the full tensor); plain tensors are held in full."""
    from torch.distributed.tensor import DTensor

    if not isinstance(tensor, DTensor):
        return tensor.detach(), full_box(tuple(tensor.shape))
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if any(p.is_partial() for p in tensor.placements):
        raise ValueError("cannot sync a Partial DTensor; redistribute it first")
    local = tensor.to_local().detach()
    if tensor.device_mesh.get_coordinate() is None:  # this rank is outside the tensor's mesh
        return local, None
    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    if tuple(local.shape) != tuple(shape):
        raise AssertionError(f"local shard {tuple(local.shape)} != computed {tuple(shape)}")
    box = tuple((o, o + n) for o, n in zip(offset, shape))
    return local, (box if all(n > 0 for n in shape) else None)


def _unique_items(module_or_state_dict) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) pairs, each tensor once (a tied weight appears twice in a state dict)."""
    if isinstance(module_or_state_dict, torch.nn.Module):
        items: Iterable[tuple[str, torch.Tensor]] = module_or_state_dict.named_parameters()
    else:
        items = module_or_state_dict.items()
    seen: set[int] = set()
    for raw_name, tensor in items:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            yield clean_name(raw_name), tensor


def source_shards(module_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor], group=None) -> SourceShards:
    """Collect this rank's shards of a (possibly FSDP2/TP-sharded) model and gather every rank's
    boxes with one ``all_gather_object`` of metadata. Collective."""
    import torch.distributed as dist

    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, tuple[Box | None, Shape, str]] = {}  # box None: a plain (unsharded) tensor
    for name, tensor in _unique_items(module_or_state_dict):
        local, box = _local_box(tensor)
        meta[name] = (box, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
        if box is not None:
            tensors[name] = local
    rank = dist.get_rank()
    gathered: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, (rank, meta), group=group)
    holdings: Holdings = {}
    shapes: dict[str, Shape] = {}
    dtypes: dict[str, torch.dtype] = {}
    for r, rank_meta in gathered:
        for name, (box, shape, dtype) in rank_meta.items():
            holdings.setdefault(name, {})
            shapes[name] = shape
            dtypes[name] = getattr(torch, dtype)
            if box is not None:
                holdings[name][r] = box
    return SourceShards(tensors, holdings, shapes, dtypes)


def plan_sync(src: SourceShards, dst: Holdings) -> Plan:
    """The transfer plan from the training shards to ``dst`` holdings (pure)."""
    return make_plan(src.holdings, dst, src.shapes)


def iter_plan_weights(
    plan: Plan,
    local_shards: Mapping[str, torch.Tensor],
    *,
    dtype: torch.dtype | Mapping[str, torch.dtype],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    group=None,
    device: torch.device | str | None = None,
    vllm: tuple[ModelSpec, Layout] | None = None,
    stats: ReshardStats | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Run ``plan`` and yield this rank's destination ``(name, shard)`` pairs bucket by bucket.

    With ``vllm=(model_spec, dst_layout)`` the pairs are this rank's fused vLLM parameters
    (``names.to_vllm_shards``); otherwise HF names and the plan's boxes. Collective.
    """
    pairs = iter_reshard(
        plan,
        local_shards,
        dtype=dtype,
        bucket_bytes=bucket_bytes,
        group_bytes=bucket_bytes,
        group=group,
        device=device,
        stats=stats,
    )
    if vllm is None:
        yield from pairs
        return
    import torch.distributed as dist

    from reallocation.names import to_vllm_shards

    model, layout = vllm
    rank = dist.get_rank()
    if rank not in layout.global_ranks:
        yield from pairs  # nothing arrives here; still drives the collective rounds
        return
    yield from to_vllm_shards(pairs, model, layout.tp)


def iter_full_weights(
    module_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor],
    *,
    dst_rank: int = 0,
    dtype: torch.dtype | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    group=None,
    stats: ReshardStats | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full tensor)`` on ``dst_rank`` for every parameter of a sharded model.

    The plan targets TP=1 on ``dst_rank``: it keeps its own shards and receives the rest, at
    most ``bucket_bytes`` of parameters at a time (buffers and yielded tensors both). ``dtype``
    None keeps each parameter's dtype; otherwise shards are cast before sending. Collective:
    every rank must exhaust the iterator; other ranks' iterators yield nothing. Without an
    initialized process group it simply yields the (unsharded) parameters.
    """
    import torch.distributed as dist

    if not dist.is_initialized():  # a single unsharded process: nothing to move
        for name, tensor in _unique_items(module_or_state_dict):
            yield name, tensor.detach().to(dtype) if dtype is not None else tensor.detach()
        return
    src = source_shards(module_or_state_dict, group)
    plan = plan_sync(src, single_rank_holdings(src.shapes, dst_rank))
    yield from iter_plan_weights(
        plan, src.tensors, dtype=dtype or src.dtypes, bucket_bytes=bucket_bytes, group=group, stats=stats
    )


def iter_layout_weights(
    module_or_state_dict: torch.nn.Module | Mapping[str, torch.Tensor],
    dst_layout: Layout,
    model: ModelSpec,
    *,
    vllm_names: bool = False,
    dtype: torch.dtype | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    group=None,
    stats: ReshardStats | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield this rank's shards of ``dst_layout`` (HF names, or vLLM's fused ones with
    ``vllm_names``, for which ``dst_layout`` should be ``names.vllm_layout(tp, ...)``). Collective."""
    src = source_shards(module_or_state_dict, group)
    plan = plan_sync(src, dst_layout.holdings(model))
    yield from iter_plan_weights(
        plan,
        src.tensors,
        dtype=dtype or src.dtypes,
        bucket_bytes=bucket_bytes,
        group=group,
        vllm=(model, dst_layout) if vllm_names else None,
        stats=stats,
    )


def drain(pairs: Iterable) -> None:
    """Exhaust an iterator from this module on a rank that keeps nothing."""
    deque(pairs, maxlen=0)
