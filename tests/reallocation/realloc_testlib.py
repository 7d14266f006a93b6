"""Shared helpers for the reallocation tests: tiny model specs, reference weights, and a
multi-rank gloo runner (``run_ranks``).

Multi-rank runs rendezvous through a ``FileStore`` in a temp dir (the TCP store listens on every
interface; a file needs no socket at all) and gloo is pinned to the loopback interface, so
nothing binds outside 127.0.0.1. On gloo their sends and receives keep NCCL's point-to-point rules
(``tests.strict_p2p``), so a schedule NCCL would deadlock on fails here too.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import torch

from reallocation.layout import Holdings, ModelSpec, Shape, full_box, local_slices

# hidden 64, 4 heads (head_dim 16), 2 kv heads: small enough for fast tests, large enough to hit
# GQA replication at tp=4 and uneven FSDP chunks.
TINY = dict(
    num_layers=2, hidden_size=64, intermediate_size=96, num_heads=4, num_kv_heads=2, head_dim=16, vocab_size=128
)


def tiny_spec(tied: bool = True, qkv_bias: bool = True, **overrides) -> ModelSpec:
    return ModelSpec(**{**TINY, **overrides}, tie_word_embeddings=tied, qkv_bias=qkv_bias)


def reference_weights(shapes: Mapping[str, Shape], dtype=torch.float32, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random full tensors; bit-exact comparisons against their slices catch any misplacement."""
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=gen).to(dtype) for n, s in shapes.items()}


def shards_of(holdings: Holdings, ref: Mapping[str, torch.Tensor], rank: int) -> dict[str, torch.Tensor]:
    """The local shards ``rank`` holds: copies of the reference slices."""
    return {
        n: ref[n][local_slices(per[rank], full_box(ref[n].shape))].clone() for n, per in holdings.items() if rank in per
    }


def all_shards(holdings: Holdings, ref) -> dict[int, dict[str, torch.Tensor]]:
    ranks = sorted({r for per in holdings.values() for r in per})
    return {r: shards_of(holdings, ref, r) for r in ranks}


def mismatches(holdings: Holdings, ref, shards: Mapping[str, torch.Tensor], rank: int) -> list[str]:
    """Names whose shard on ``rank`` is not bit-identical to the reference slice."""
    bad = []
    for n, per in holdings.items():
        if rank not in per:
            if n in shards:
                bad.append(f"{n} (unexpected)")
            continue
        want = ref[n][local_slices(per[rank], full_box(ref[n].shape))]
        got = shards.get(n)
        if got is None or got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got, want):
            bad.append(n)
    return bad


def _worker(rank: int, world_size: int, store_dir: str, backend: str, fn: Callable, args: tuple) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)  # 2 cores shared by up to 4 ranks
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{store_dir}/store", rank=rank, world_size=world_size)
    if backend == "gloo":  # every send and receive under NCCL's point-to-point rules
        from tests import strict_p2p

        strict_p2p.install(f"{store_dir}/p2p_store", world_size)
    try:
        result: Any = fn(rank, world_size, *args)
    except BaseException:
        result = RuntimeError(f"rank {rank}:\n{traceback.format_exc()}")
    try:
        dist.destroy_process_group()
    finally:
        with open(os.path.join(store_dir, f"result_{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)


def run_ranks(fn: Callable, world_size: int, *args, backend: str = "gloo") -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks (gloo; NCCL with one GPU per
    rank for ``backend="nccl"``); return their results.

    ``fn`` must be a module-level function (it is pickled into spawned processes). An exception
    on any rank is re-raised here with that rank's traceback.
    """
    import torch.multiprocessing as mp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory(prefix="realloc-") as store_dir:
        mp.spawn(_worker, args=(world_size, store_dir, backend, fn, args), nprocs=world_size, join=True)
        results = []
        for rank in range(world_size):
            with open(os.path.join(store_dir, f"result_{rank}.pkl"), "rb") as f:
                results.append(pickle.load(f))
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results
