"""Typed cluster/placement config (what runs where, and in which layout)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ClusterConfig:
    address: str = ""
    """Empty: start a local Ray (CPU). Otherwise a Ray address to join, e.g. `auto` or `HEAD_IP:6379`."""
    num_cpus: int = 2
    """CPUs for the local Ray (ignored when joining a cluster)."""
    num_gpus_per_node: int = 0
    num_nodes: int = 1
    backend: str = "gloo"
    """torch.distributed backend for training workers: gloo (CPU) or nccl (GPU)."""
    actor_num_ranks: int = 1
    """FSDP2 ranks (data-parallel shards) of the actor's training layout."""
    critic_num_ranks: int = 1
    train_tp_size: int = 1
    """Tensor-parallel size of the training layout (DTensor)."""
    gen_tp_size: int = 1
    """Tensor-parallel size of each vLLM engine."""
    num_engines: int = 1
    """vLLM engine replicas (data-parallel generation)."""

    def __post_init__(self) -> None:
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"cluster.backend={self.backend!r}: expected gloo or nccl")
        for key in ("actor_num_ranks", "critic_num_ranks", "train_tp_size", "gen_tp_size", "num_engines", "num_nodes"):
            if getattr(self, key) < 1:
                raise ValueError(f"cluster.{key}={getattr(self, key)}: must be >= 1")
