"""The only module that imports Ray: a cluster handle and groups of rank-aware actors.

Workers are plain Python classes (see ``runtime/device/shards.py`` and ``models/vllm_engine.py``); this
module only decides where they run. A ``ActorGroup`` is N actors of one class, rank i built with
``rank=i`` and a shared rendezvous address, so the class can set up torch.distributed itself::

    cluster = RayCluster.start(address="", num_cpus=2)
    policy = cluster.group(PolicyShard, num_ranks=2, kwargs=dict(model_dir=..., backend="gloo"))
    logprobs = policy.call("compute_logprobs", batch)       # every rank, same arguments
    cluster.shutdown()

The plan runtime places its workers with ``DevicePool``: ONE placement group with one bundle per
device the execution plan uses (never more than the cluster has: too many fails at start, naming
both counts, instead of pending), one device-worker actor per bundle, and optionally a companion
actor (the vLLM engine) in the same bundle, on the same device. Every actor checks from inside
itself that it sits on the node and device the plan names.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from common.env import WORKER_DEFAULTS, WORKER_KEYS, apply_defaults

# The resource that counts devices: Ray's GPUs (real ones, or declared on a simulated cluster); a
# local CPU Ray declares this custom resource instead, one unit per plan device.
CPU_DEVICE_RESOURCE = "realm_device"


class PlacementError(RuntimeError):
    """The cluster cannot hold the plan's devices (raised at start, never left pending)."""


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ActorGroup:
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

    def submit_timed(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Futures (for ``wait``) of ``method`` on every rank, each giving (result, start, end)."""
        return [a.run_timed.remote(method, args, kwargs) for a in self.actors]

    def kill(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self.actors = []


class RayHost:
    """The actor body: builds one worker object and runs its methods by name."""

    def __init__(self, cls: type | None, kwargs: dict[str, Any], env: dict[str, str], num_threads: int):
        os.environ.update(env)
        import torch

        if num_threads > 0:
            torch.set_num_threads(num_threads)
        self.worker = cls(**kwargs) if cls is not None else None

    def build(self, cls: type, kwargs: dict[str, Any]) -> None:
        self.worker = cls(**kwargs)

    def run(self, method: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.worker, method)(*args, **kwargs)

    def run_timed(self, method: str, args: tuple, kwargs: dict) -> tuple[Any, float, float]:
        """``run`` with its wall-clock start and end (seconds since the epoch)."""
        start = time.time()
        out = getattr(self.worker, method)(*args, **kwargs)
        return out, start, time.time()

    def run_split(self, method: str, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        """For a method returning (payload, info): two results, so that the payload can go to another
        actor as its own object (from this node's object store, not through the driver)."""
        payload, info = getattr(self.worker, method)(*args, **kwargs)
        return payload, info

    def run_with(self, method: str, payload: Any) -> tuple[Any, float, float]:
        """``method(payload)``; ``payload`` may be another actor's result (Ray resolves it here)."""
        start = time.time()
        out = getattr(self.worker, method)(payload)
        return out, start, time.time()

    def where(self) -> tuple[str, tuple[int, ...], int]:
        """(Ray node id, GPU ids, pid) as seen from inside this actor."""
        return ray.get_runtime_context().get_node_id(), tuple(int(g) for g in ray.get_gpu_ids()), os.getpid()

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a port free on it: where a process group whose rank 0 runs in
        this actor listens (on a multi-node cluster the driver's host is not that node)."""
        host = ray.util.get_node_ip_address()
        return host, _free_port(host)

    def check_placement(self, node_id: str, gpu_ids: tuple[int, ...]) -> None:
        here = self.where()
        if (here[0], tuple(here[1])) != (node_id, tuple(gpu_ids)):
            raise PlacementError(
                f"actor pid {here[2]} sits on node {here[0]} GPUs {list(here[1])}, "
                f"its plan device is on node {node_id} GPUs {list(gpu_ids)}"
            )


class RayCluster:
    """A local Ray (CPU default) or a connection to an existing cluster."""

    def __init__(self, host: str):
        self.host = host

    @classmethod
    def start(cls, address: str = "", num_cpus: int = 2, num_gpus: int = 0, num_cpu_devices: int = 0) -> RayCluster:
        """Join ``address``, or start a local Ray with ``num_cpus`` CPUs, ``num_gpus`` GPUs and
        ``num_cpu_devices`` plan devices made of CPU (the ``realm_device`` resource)."""
        apply_defaults()
        if address:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=True)
            return cls(host=ray.util.get_node_ip_address())
        host = "127.0.0.1"
        ray.init(
            # "local": always a new Ray of our own, never a cluster someone else started on this machine.
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            resources={CPU_DEVICE_RESOURCE: num_cpu_devices} if num_cpu_devices else None,
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
    ) -> ActorGroup:
        """Start ``num_ranks`` actors of ``cls``; each gets rank/world_size/master addr+port kwargs.

        ``num_cpus=0`` on CPU: the phases of a PPO iteration run one after another, so actors
        share the machine's cores instead of reserving them (which would deadlock on 2 cores).
        """
        env = _actor_env(self.host)
        port = _free_port(self.host) if distributed else 0
        remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(RayHost)
        actors = []
        for rank in range(num_ranks):
            rank_kwargs = dict(kwargs)
            if distributed:
                rank_kwargs.update(rank=rank, world_size=num_ranks, master_addr=self.host, master_port=port)
            actors.append(
                remote.options(name=f"{name or cls.__name__}-{rank}-{port}").remote(cls, rank_kwargs, env, num_threads)
            )
        return ActorGroup(actors, name or cls.__name__)

    def device_resource(self) -> tuple[str, int]:
        """(resource name, count) of the devices this cluster offers to a plan."""
        resources = ray.cluster_resources()
        if resources.get("GPU", 0) >= 1:
            return "GPU", int(resources["GPU"])
        return CPU_DEVICE_RESOURCE, int(resources.get(CPU_DEVICE_RESOURCE, 0))

    def device_pool(
        self,
        devices: Sequence[int],
        gpus_per_node: int,
        *,
        timeout_s: float = 120.0,
        num_threads: int = 0,
    ) -> DevicePool:
        """One placement group with a bundle per plan device, one host actor per bundle.

        ``devices`` are the plan's global device ids (device d is local device ``d % gpus_per_node``
        of plan node ``d // gpus_per_node``). Fails at once when the cluster has fewer devices than
        the plan needs, and after ``timeout_s`` if the group is still pending; never waits forever.
        ``num_threads``: torch threads per device process; 0 on a local CPU cluster means the cores shared
        out over the devices (``threads_per_device``), on GPUs Ray's default.
        """
        from ray.util.placement_group import placement_group_table

        devices = sorted(devices)
        resource = self._check_capacity(len(devices))
        pg = _reserve(resource, len(devices), timeout_s)
        bundle_nodes = placement_group_table(pg)["bundles_to_node_id"]
        env = _actor_env(self.host)
        if resource == CPU_DEVICE_RESOURCE and num_threads == 0:
            num_threads = threads_per_device(int(ray.cluster_resources().get("CPU", 1)), len(devices))
            env["OMP_NUM_THREADS"] = str(num_threads)  # vLLM's CPU worker and OpenMP read it, not torch's setting
        # Half a device each: the device worker and, on generation devices, its vLLM engine.
        share = {"num_gpus": 0.5} if resource == "GPU" else {"resources": {resource: 0.5}}
        remote = ray.remote(num_cpus=0, **share)(RayHost)
        hosts: list[Any] = [
            remote.options(name=f"device-bundle{i}-{os.getpid()}", scheduling_strategy=_in_bundle(pg, i)).remote(
                None, {}, env, num_threads
            )
            for i in range(len(devices))
        ]
        where = ray.get([h.where.remote() for h in hosts])
        assignment = assign_devices(devices, gpus_per_node, [(node, gpus) for node, gpus, _ in where])
        by_device = {d: hosts[i] for d, i in assignment.items()}
        expected = {d: where[i][:2] for d, i in assignment.items()}
        ray.get([by_device[d].check_placement.remote(*expected[d]) for d in devices])
        return DevicePool(
            pg,
            by_device,
            expected,
            {i: bundle_nodes.get(i) for i in range(len(devices))},
            dict(assignment),
            remote,
            env,
            num_threads,
        )

    def _check_capacity(self, num_devices: int) -> str:
        """The device resource's name, if the cluster has ``num_devices`` of it (else PlacementError)."""
        resource, available = self.device_resource()
        if num_devices > available:
            raise PlacementError(
                f"the execution plan needs {num_devices} devices, the cluster has {available} (Ray resource {resource!r})"
            )
        return resource

    def shutdown(self) -> None:
        ray.shutdown()


class SimulatedCluster:
    """Several Ray nodes on this machine, each declaring GPUs it does not have (``ray.cluster_utils``):
    placement is tested without GPUs (workers keep tensors on CPU and use gloo)::

        with SimulatedCluster(num_nodes=2, gpus_per_node=4) as address:
            ...  # python train.py cluster.address=$address ...
    """

    def __init__(self, num_nodes: int, gpus_per_node: int, num_cpus_per_node: int = 4):
        self.num_nodes, self.gpus_per_node, self.num_cpus = num_nodes, gpus_per_node, num_cpus_per_node
        self.cluster: Any = None

    def __enter__(self) -> str:
        from ray.cluster_utils import Cluster

        apply_defaults()
        # Ray's memory monitor kills workers when the *machine* is nearly full, whoever fills it; on
        # a shared test machine that is usually someone else.
        os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
        node = {
            "num_cpus": self.num_cpus,
            "num_gpus": self.gpus_per_node,
            "node_ip_address": "127.0.0.1",
            "include_dashboard": False,
        }
        self.cluster = Cluster(initialize_head=True, head_node_args=node)
        for _ in range(self.num_nodes - 1):
            self.cluster.add_node(**{k: v for k, v in node.items() if k != "include_dashboard"})
        self.cluster.wait_for_nodes()
        return self.cluster.address

    def __exit__(self, *exc: Any) -> None:
        ray.shutdown()
        self.cluster.shutdown()


def _reserve(resource: str, num_devices: int, timeout_s: float) -> Any:
    """A placement group of ``num_devices`` one-device bundles, ready within ``timeout_s`` (else
    removed and reported: a run never waits forever)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([{resource: 1.0}] * num_devices, strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        raise PlacementError(
            f"placement group of {num_devices} devices still pending after {timeout_s:.0f} s "
            f"(cluster resources: {ray.cluster_resources()})"
        )
    return pg


def _in_bundle(pg: Any, index: int) -> Any:
    """The scheduling strategy that puts an actor into bundle ``index`` of ``pg``."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)


def threads_per_device(num_cpus: int, num_devices: int) -> int:
    """Torch threads of each device process (and its vLLM engine) on a local CPU cluster: the cores shared
    out over the plan's devices, at least one. Two devices on 2 cores: 1 each, as Ray's default for actors
    without a CPU reservation; one device on 2 cores: 2, so that a plan that runs everything on one device
    does not leave a core idle. A device's worker and its engine never compute at the same time (generation
    and the other calls are separate phases), so they each get the device's share."""
    return max(1, num_cpus // max(1, num_devices))


def _actor_env(host: str) -> dict[str, str]:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env = {**WORKER_DEFAULTS, **{k: os.environ[k] for k in WORKER_KEYS if k in os.environ}}
    env["MASTER_ADDR"] = host
    return env


def assign_devices(
    devices: Sequence[int], gpus_per_node: int, locations: Sequence[tuple[str, tuple[int, ...]]]
) -> dict[int, int]:
    """Plan device -> index of the actor (bundle) that hosts it (pure).

    ``locations[i]`` is (Ray node id, GPU ids) of the actor in bundle i. Each plan node's devices
    must land on one Ray node, different plan nodes on different Ray nodes: plan nodes and Ray
    nodes are paired largest first, and within a node plan devices go, in order, to the actors
    sorted by GPU id. Example: devices 0..7, 4 per node, bundles 0-3 on node "b" with GPUs 3..0,
    bundles 4-7 on node "a" with GPUs 0..3 -> {0: 3, 1: 2, 2: 1, 3: 0, 4: 4, ...}.
    """
    by_plan_node: dict[int, list[int]] = {}
    for d in sorted(devices):
        by_plan_node.setdefault(d // gpus_per_node, []).append(d)
    by_ray_node: dict[str, list[int]] = {}
    for i, (node, _) in enumerate(locations):
        by_ray_node.setdefault(node, []).append(i)
    plan_nodes = sorted(by_plan_node, key=lambda n: (-len(by_plan_node[n]), n))
    ray_nodes = sorted(by_ray_node, key=lambda n: (-len(by_ray_node[n]), min(by_ray_node[n])))
    counts = sorted(len(v) for v in by_plan_node.values()), sorted(len(v) for v in by_ray_node.values())
    if counts[0] != counts[1]:
        raise PlacementError(f"plan devices per node {counts[0]} do not match where Ray placed them {counts[1]}")
    out: dict[int, int] = {}
    for plan_node, ray_node in zip(plan_nodes, ray_nodes):
        actors = sorted(by_ray_node[ray_node], key=lambda i: (tuple(locations[i][1]), i))
        out.update(zip(by_plan_node[plan_node], actors))
    return out


class DevicePool:
    """The actors of one placement group: a host per plan device, plus companions in the same bundles."""

    def __init__(
        self,
        pg,
        hosts: dict[int, Any],
        locations: dict[int, tuple[str, tuple[int, ...]]],
        bundle_nodes: dict[int, str],
        bundles: dict[int, int],
        remote,
        env: dict[str, str],
        num_threads: int,
    ):
        self.pg, self.hosts, self.locations = pg, hosts, locations
        self._bundle_nodes, self._bundles, self._remote = bundle_nodes, bundles, remote
        self._env, self._num_threads = env, num_threads
        self.companions: dict[tuple[str, int], Any] = {}

    @property
    def devices(self) -> list[int]:
        return sorted(self.hosts)

    def rendezvous(self, device: int) -> tuple[str, int]:
        """(address, port) for a process group whose rank 0 is ``device``'s process: found on
        ``device``'s node, from inside its host actor."""
        return ray.get(self.hosts[device].rendezvous.remote())

    def build(self, cls: type, kwargs_of: Any) -> None:
        """Build ``cls(**kwargs_of(device))`` inside every device's host actor (concurrently)."""
        ray.get([self.hosts[d].build.remote(cls, kwargs_of(d)) for d in self.devices])

    def add_companions(
        self, name: str, devices: Sequence[int], cls: type, kwargs: dict[str, Any] | Callable[[int], dict[str, Any]]
    ) -> None:
        """Start ``cls(**kwargs)`` (or ``cls(**kwargs(device))``) in its own actor in each device's
        bundle (same node, same device), all at once; each checks from inside that it sits where its
        device is."""
        actors = {}
        for device in devices:
            actors[device] = self._remote.options(
                name=f"{name}-device{device}-{os.getpid()}",
                scheduling_strategy=_in_bundle(self.pg, self._bundles[device]),
            ).remote(cls, kwargs(device) if callable(kwargs) else kwargs, self._env, self._num_threads)
        ray.get([actors[d].check_placement.remote(*self.locations[d]) for d in devices])
        self.companions.update({(name, d): actor for d, actor in actors.items()})

    def submit(self, device: int, method: str, *args: Any, **kwargs: Any):
        """Run ``method`` on ``device``'s host; a future of (result, start, end) for ``wait``."""
        return self.hosts[device].run_timed.remote(method, args, kwargs)

    def submit_split(self, device: int, method: str, *args: Any, **kwargs: Any):
        """Run a ``method`` that returns (payload, info); two futures (see ``RayHost.run_split``)."""
        return self.hosts[device].run_split.options(num_returns=2).remote(method, args, kwargs)

    def submit_companion(self, name: str, device: int, method: str, *args: Any, **kwargs: Any):
        """Like ``submit``, on the companion ``name`` of ``device``."""
        return self.companions[name, device].run_timed.remote(method, args, kwargs)

    def submit_companion_with(self, name: str, device: int, method: str, payload: Any):
        """``method(payload)`` on a companion, where ``payload`` is a future from ``submit_split``."""
        return self.companions[name, device].run_with.remote(method, payload)

    def where(self) -> dict[int, dict[str, Any]]:
        """Per device, what its host actor reports from inside: node id, GPU ids, pid."""
        found = ray.get([self.hosts[d].where.remote() for d in self.devices])
        return {
            d: {"node_id": node, "gpu_ids": list(gpus), "pid": pid} for d, (node, gpus, pid) in zip(self.devices, found)
        }

    def shutdown(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for actor in [*self.hosts.values(), *self.companions.values()]:
            ray.kill(actor)
        remove_placement_group(self.pg)


def wait(futures: Sequence[Any]) -> list[Any]:
    """Results of ``DevicePool.submit`` futures, in order."""
    return ray.get(list(futures))
