"""The only module that imports Ray: a cluster handle and groups of rank-aware actors.

Workers are plain Python classes (see ``trainer/workers.py`` and ``models/vllm_engine.py``); this
module only decides where they run. A ``WorkerGroup`` is N actors of one class, rank i built with
``rank=i`` and a shared rendezvous address, so the class can set up torch.distributed itself::

    cluster = RayCluster.start(address="", num_cpus=2)
    policy = cluster.group(PolicyWorker, num_ranks=2, kwargs=dict(model_dir=..., backend="gloo"))
    logprobs = policy.call("compute_logprobs", batch)       # every rank, same arguments
    policy.call_each("update", [slice_0, slice_1])          # rank i gets slice i
    cluster.shutdown()
"""
from __future__ import annotations

import os
import socket
from typing import Any, Sequence

import ray

# Actors inherit these so that nothing they start talks to anything but loopback/offline sources.
_ENV_KEYS = (
    "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK",
    "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE", "VLLM_HOST_IP", "VLLM_ALLOW_INSECURE_SERIALIZATION",
    "MASTER_ADDR", "GLOO_SOCKET_IFNAME", "REALM_CACHE_DIR", "TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS",
    "PYTHONPATH", "VLLM_LOGGING_LEVEL",
)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class WorkerGroup:
    """N Ray actors of one plain class, addressed together or per rank."""

    def __init__(self, actors: list[Any], name: str):
        self.actors = actors
        self.name = name

    @property
    def num_ranks(self) -> int:
        return len(self.actors)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every rank with the same arguments; results in rank order."""
        return ray.get([a.run.remote(method, args, kwargs) for a in self.actors])

    def call_each(self, method: str, per_rank_args: Sequence[tuple], **kwargs: Any) -> list[Any]:
        """Rank i runs ``method(*per_rank_args[i], **kwargs)``."""
        assert len(per_rank_args) == len(self.actors), (len(per_rank_args), len(self.actors))
        return ray.get([a.run.remote(method, args, kwargs) for a, args in zip(self.actors, per_rank_args)])

    def kill(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self.actors = []


class _Host:
    """The actor body: builds one worker object and runs its methods by name."""

    def __init__(self, cls: type, kwargs: dict[str, Any], env: dict[str, str], num_threads: int):
        os.environ.update(env)
        import torch

        if num_threads > 0:
            torch.set_num_threads(num_threads)
        self.worker = cls(**kwargs)

    def run(self, method: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.worker, method)(*args, **kwargs)


class RayCluster:
    """A local Ray (CPU default) or a connection to an existing cluster."""

    def __init__(self, host: str):
        self.host = host

    @classmethod
    def start(cls, address: str = "", num_cpus: int = 2, num_gpus: int = 0) -> "RayCluster":
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        if address:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=True)
            return cls(host=ray.util.get_node_ip_address())
        host = "127.0.0.1"
        ray.init(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            ignore_reinit_error=True,
            _node_ip_address=host,
            log_to_driver=True,
            configure_logging=False,
        )
        return cls(host=host)

    def group(
        self,
        cls: type,
        num_ranks: int,
        kwargs: dict[str, Any],
        *,
        name: str = "",
        num_cpus: float = 0.0,
        num_gpus: float = 0.0,
        num_threads: int = 0,
        distributed: bool = True,
    ) -> WorkerGroup:
        """Start ``num_ranks`` actors of ``cls``; each gets rank/world_size/master addr+port kwargs.

        ``num_cpus=0`` on CPU: the phases of a PPO iteration run one after another, so actors
        share the machine's cores instead of reserving them (which would deadlock on 2 cores).
        """
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        env = {k: os.environ[k] for k in _ENV_KEYS if k in os.environ}
        env["MASTER_ADDR"] = self.host
        port = _free_port(self.host) if distributed else 0
        remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(_Host)
        actors = []
        for rank in range(num_ranks):
            rank_kwargs = dict(kwargs)
            if distributed:
                rank_kwargs.update(rank=rank, world_size=num_ranks, master_addr=self.host, master_port=port)
            actors.append(remote.options(name=f"{name or cls.__name__}-{rank}-{port}").remote(cls, rank_kwargs, env, num_threads))
        return WorkerGroup(actors, name or cls.__name__)

    def shutdown(self) -> None:
        ray.shutdown()
