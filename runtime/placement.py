"""The only module that imports Ray: a cluster handle and groups of rank-aware actors.

Workers are plain Python classes (see ``runtime/device/shards.py`` and ``models/vllm_engine.py``); this
module only decides where they run. A ``ActorGroup`` is N actors of one class, rank i built with
``rank=i`` and a shared rendezvous address, so the class can set up torch.distributed itself::

    cluster = RayCluster.start(address="", num_cpus=2)
    policy = cluster.group(PolicyShard, num_ranks=2, kwargs=dict(model_dir=..., backend="gloo"))
    logprobs = policy.call("compute_logprobs", batch)       # every rank, same arguments
    cluster.shutdown()

The plan runtime places its workers with ``DevicePool``: one placement group per plan node, with one
bundle per device of that node, packed on one Ray node (``STRICT_PACK``) that no other plan node
uses, whatever each node's device count (never more than the cluster has: a plan that cannot fit
fails at start, naming the counts, instead of pending); one device-worker actor per bundle, and
optionally a companion actor (the vLLM engine) in the same bundle, on the same device. Every actor
checks from inside itself that it sits on the node and device the plan names.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray

from common.env import WORKER_DEFAULTS, WORKER_KEYS, apply_defaults, apply_loopback
from runtime.processes import ProcessGuard

# The resource that counts devices: Ray's GPUs (real ones, or declared on a simulated cluster); a
# local CPU Ray declares this custom resource instead, one unit per plan device.
CPU_DEVICE_RESOURCE = "realm_device"
# The label every Ray node carries with its own node id (placement of a plan node away from the others).
NODE_ID_LABEL = "ray.io/node-id"


class PlacementError(RuntimeError):
    """The cluster cannot hold the plan's devices (raised at start, never left pending)."""


class ActorLost(RuntimeError):
    """A device process (or its ``companion``, the engine) died: killed, out of memory, crashed. ``device`` None:
    Ray's memory monitor killed a worker of the run and no device's actor is the one found dead."""

    def __init__(self, device: int | None, companion: str | None, detail: str):
        self.device, self.companion, self.detail = device, companion, detail
        who = "a worker of the run" if device is None else f"the {companion or 'device process'} of device {device}"
        super().__init__(f"{who} died ({detail})")


def exit_detail(error: Exception) -> str:
    """Ray's account of why an actor's process ended, in one short clause: its exit type and the first
    sentence of its detail (Ray does not report the signal; a SYSTEM_ERROR exit without a Python error is
    a kill from outside, such as SIGKILL or the kernel's OOM killer)."""
    import re

    text = str(error)
    if isinstance(error, ray.exceptions.OutOfMemoryError) or "running low on memory" in text:
        usage = re.search(r"was ([\d.]+GB) used / ([\d.]+GB) limit", text)
        return "killed by Ray's memory monitor: the node ran low on memory" + (
            f" ({usage.group(1)} used of {usage.group(2)})" if usage else ""
        )
    kind = re.search(r"Worker exit type: (\w+)", text)
    detail = re.search(r"Worker exit detail: (.+?\.)(?:\s|$)", text)
    if kind is None:
        return text.strip().splitlines()[0][:200] if text.strip() else type(error).__name__
    said = f"exit type {kind.group(1)}" + (f": {detail.group(1)}" if detail else "")
    if kind.group(1) == "SYSTEM_ERROR":
        said += " (no Python error: killed from outside, e.g. SIGKILL or the OOM killer)"
    return said


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
        return ray.get([a.run.remote(method, *args, **kwargs) for a in self.actors])

    def submit_timed(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Futures (for ``wait``) of ``method`` on every rank, each giving (result, start, end)."""
        return [a.run_timed.remote(method, *args, **kwargs) for a in self.actors]

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

    def run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method(*args)`` on the hosted object; an argument that is another actor's result (a future
        passed as it is) arrives resolved, from the object store of this node."""
        return getattr(self.worker, method)(*args, **kwargs)

    def run_timed(self, method: str, *args: Any, **kwargs: Any) -> tuple[Any, float, float]:
        """``run`` with its wall-clock start and end (seconds since the epoch)."""
        start = time.time()
        out = getattr(self.worker, method)(*args, **kwargs)
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


LOOPBACK = "127.0.0.1"


def ray_init_arguments(address: str, num_cpus: int, num_gpus: int, num_cpu_devices: int) -> dict[str, Any]:
    """``ray.init``'s arguments for ``cluster.address`` (pure). Empty: a new Ray of this process's own on
    this node ("local": never one someone else started here), bound to loopback, with ``num_cpus``
    CPUs, ``num_gpus`` GPUs (a one-node GPU cluster, ``cluster=gpu_1x8``, needs no ``ray start``) and
    ``num_cpu_devices`` plan devices made of CPU. Otherwise the cluster at ``address`` ("auto": the one
    ``ray start`` started on this node), whose resources its nodes declared themselves.

    Example: ``("", 2, 8, 0)`` -> address "local", num_gpus 8, no custom resource; ``("auto", 2, 8, 0)``
    -> ``{"address": "auto"}``."""
    if address:
        return {"address": address}
    return {
        "address": "local",
        "num_cpus": num_cpus,
        "num_gpus": num_gpus,
        "resources": {CPU_DEVICE_RESOURCE: num_cpu_devices} if num_cpu_devices else None,
        "include_dashboard": False,
        "_node_ip_address": LOOPBACK,
        "configure_logging": False,
    }


def check_visible_gpus(num_gpus: int, visible: int) -> None:
    """A local Ray declares the GPUs it is told to, whether or not they exist (Ray trusts ``num_gpus``):
    refuse at start when this node shows fewer than the cluster config names, instead of placing device
    processes on GPUs that are not there."""
    if visible < num_gpus:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise PlacementError(
            f"cluster.devices_per_node={num_gpus}: this node shows {visible} GPUs"
            + (f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else "")
        )


def loopback_if_one_node(num_nodes: int, environ: Any = os.environ) -> None:
    """vLLM's ranks advertise loopback (``common.env.LOOPBACK_DEFAULTS``, forwarded to every actor) only on
    a one-node cluster; on more nodes each finds its node's own address, so that an engine whose ranks span
    nodes can form."""
    if num_nodes == 1:
        apply_loopback(environ)


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


RAY_START_TIMEOUT = "timed out during startup"
"""What ``ray.init`` says when the local raylet did not register within Ray's fixed 30 s
(``ray/_private/node.py``): on an overloaded machine, not a misconfiguration."""


def start_timeout_message(load: float, num_cores: int) -> str:
    """The one line for a Ray that did not start in time. Example: load 61.2 on 2 cores -> '... (1-minute
    load 61.2 on 2 cores) ...'."""
    return (
        f"Ray's local node did not start within Ray's 30 s (1-minute load {load:.1f} on {num_cores} cores): the "
        "machine is overloaded, not misconfigured; run again when it is quieter (a named run resumes from its "
        "last checkpoint)"
    )


class RayCluster:
    """A local Ray (CPU default) or a connection to an existing cluster."""

    def __init__(self, host: str, guard: ProcessGuard | None = None):
        self.host = host
        self.guard = guard

    @classmethod
    def start(
        cls,
        address: str = "",
        num_cpus: int = 2,
        num_gpus: int = 0,
        num_cpu_devices: int = 0,
        record: Path | None = None,
    ) -> RayCluster:
        """Join ``address``, or start a local Ray with ``num_cpus`` CPUs, ``num_gpus`` GPUs and
        ``num_cpu_devices`` plan devices made of CPU (the ``realm_device`` resource).

        ``record``: where this launch notes its processes (``runtime.processes``): first what an earlier
        launch left running there is ended, then a watchdog ends this launch's if the driver dies."""
        apply_defaults()
        if num_gpus and not address:
            check_visible_gpus(num_gpus, _visible_gpus())
        # Before Ray starts: a failed start still leaves the watchdog to end what it started.
        guard = ProcessGuard.start(record) if record is not None else None
        arguments = ray_init_arguments(address, num_cpus, num_gpus, num_cpu_devices)
        try:
            ray.init(**arguments, ignore_reinit_error=True, log_to_driver=True)
        except ConnectionError as e:  # "auto" or HOST:PORT with no Ray there
            if guard is not None:
                guard.close()
            raise PlacementError(
                f"cluster.address={address}: no Ray cluster there ({e}). Start one with `ray start --head` from "
                "the shell whose virtual environment is active (Ray's workers run the Python that started it), "
                "or leave cluster.address empty for a Ray of this node's own"
            ) from None
        except Exception as e:  # Ray raises a bare Exception when its raylet misses its fixed 30 s start-up wait
            if guard is not None:
                guard.close()
            if RAY_START_TIMEOUT not in str(e):
                raise
            raise PlacementError(start_timeout_message(os.getloadavg()[0], os.cpu_count() or 1)) from None
        num_nodes = 1 if not address else len([n for n in ray.nodes() if n["Alive"]])
        loopback_if_one_node(num_nodes)
        host = LOOPBACK if not address else ray.util.get_node_ip_address()
        return cls(host=host, guard=guard)

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
        """A placement group per plan node (``_reserve``), one host actor per bundle.

        ``devices`` are the plan's global device ids (device d is local device ``d % gpus_per_node``
        of plan node ``d // gpus_per_node``). Fails at once when the cluster's nodes cannot hold the
        plan's nodes, and after ``timeout_s`` if a group is still pending; never waits forever.
        ``num_threads``: torch threads per device process; 0 on a local CPU cluster means the cores shared
        out over the devices (``threads_per_device``), on GPUs Ray's default.
        """
        devices = sorted(devices)
        per_node = list(devices_by_node(devices, gpus_per_node).values())
        resource = self._check_capacity([len(node) for node in per_node])
        bundles = [(pg, i) for pg, node in _reserve(resource, per_node, timeout_s) for i in range(len(node))]
        env = _actor_env(self.host)
        if resource == CPU_DEVICE_RESOURCE and num_threads == 0:
            num_threads = threads_per_device(int(ray.cluster_resources().get("CPU", 1)), len(devices))
            env["OMP_NUM_THREADS"] = str(num_threads)  # vLLM's CPU worker and OpenMP read it, not torch's setting
        # Half a device each: the device worker and, on generation devices, its vLLM engine.
        share = {"num_gpus": 0.5} if resource == "GPU" else {"resources": {resource: 0.5}}
        remote = ray.remote(num_cpus=0, **share)(RayHost)
        hosts: list[Any] = [
            remote.options(name=f"device-bundle{i}-{os.getpid()}", scheduling_strategy=_in_bundle(*bundle)).remote(
                None, {}, env, num_threads
            )
            for i, bundle in enumerate(bundles)
        ]
        where = ray.get([h.where.remote() for h in hosts])
        assignment = assign_devices(devices, gpus_per_node, [(node, gpus) for node, gpus, _ in where])
        by_device = {d: hosts[i] for d, i in assignment.items()}
        expected = {d: where[i][:2] for d, i in assignment.items()}
        ray.get([by_device[d].check_placement.remote(*expected[d]) for d in devices])
        groups = list(dict.fromkeys(pg for pg, _ in bundles))
        return DevicePool(
            groups, by_device, expected, {d: bundles[i] for d, i in assignment.items()}, remote, env, num_threads
        )

    def _check_capacity(self, devices_per_node: Sequence[int]) -> str:
        """The device resource's name, if the cluster has enough of it for plan nodes with
        ``devices_per_node`` devices, each on a Ray node of its own (else PlacementError)."""
        resource, available = self.device_resource()
        if sum(devices_per_node) > available:
            raise PlacementError(
                f"the execution plan needs {sum(devices_per_node)} devices, the cluster has {available} "
                f"(Ray resource {resource!r})"
            )
        capacities = [int(n["Resources"].get(resource, 0)) for n in ray.nodes() if n["Alive"]]
        if not nodes_fit(devices_per_node, capacities):
            raise PlacementError(
                f"the execution plan's nodes need {sorted(devices_per_node, reverse=True)} devices each, on "
                f"nodes of their own; the cluster's nodes have {sorted(capacities, reverse=True)} (Ray resource {resource!r})"
            )
        return resource

    def shutdown(self) -> None:
        ray.shutdown()
        if self.guard is not None:  # what outlived Ray's shutdown
            self.guard.close()


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


def _reserve(resource: str, per_node: Sequence[Sequence[int]], timeout_s: float) -> list[tuple[Any, list[int]]]:
    """(placement group, plan devices) per plan node, all ready within ``timeout_s`` (else all
    removed and reported: a run never waits forever).

    A plan node's devices are one-device bundles packed on one Ray node (``STRICT_PACK``); Ray's
    ``PACK`` for the whole plan may split a node's devices (3 + 1 devices landing 2 + 2). Each
    group goes on a Ray node no earlier group uses (a selector on Ray's ``ray.io/node-id`` label),
    largest plan node first: if any pairing of plan nodes with Ray nodes fits, then so does one
    where the largest plan node sits wherever Ray puts it (swap it with whatever the pairing put
    there, which is no larger), so going largest first never strands a plan node that could fit.
    """
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    deadline = time.monotonic() + timeout_s
    reserved: list[tuple[Any, list[int]]] = []
    used_nodes: list[str] = []
    try:
        for devices in sorted(per_node, key=len, reverse=True):
            elsewhere = {NODE_ID_LABEL: f"!in({','.join(used_nodes)})"} if used_nodes else {}
            pg = placement_group(
                [{resource: 1.0}] * len(devices),
                strategy="STRICT_PACK",
                bundle_label_selector=[elsewhere] * len(devices),
            )
            reserved.append((pg, list(devices)))
            ready, _ = ray.wait([pg.ready()], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise PlacementError(
                    f"placement group of {len(devices)} devices on one node still pending after {timeout_s:.0f} s "
                    f"(cluster resources: {ray.cluster_resources()})"
                )
            used_nodes.append(placement_group_table(pg)["bundles_to_node_id"][0])
    except BaseException:
        for pg, _ in reserved:
            remove_placement_group(pg)
        raise
    return reserved


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


def devices_by_node(devices: Sequence[int], gpus_per_node: int) -> dict[int, list[int]]:
    """Plan node -> its devices among ``devices``, in order (pure): device d is on plan node
    ``d // gpus_per_node``. Example: [0, 1, 2, 4], 4 per node -> {0: [0, 1, 2], 1: [4]}."""
    by_plan_node: dict[int, list[int]] = {}
    for d in sorted(devices):
        by_plan_node.setdefault(d // gpus_per_node, []).append(d)
    return by_plan_node


def nodes_fit(needs: Sequence[int], capacities: Sequence[int]) -> bool:
    """Whether plan nodes needing ``needs`` devices can each have a Ray node of its own among nodes
    with ``capacities`` devices (pure). Pairing them largest to largest fits if any pairing does.
    Example: [3, 1] fit [4, 4]; [3, 1] do not fit [8] (one node) nor [2, 2]."""
    needs, capacities = sorted(needs, reverse=True), sorted(capacities, reverse=True)
    return len(needs) <= len(capacities) and all(n <= c for n, c in zip(needs, capacities))


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
    by_plan_node = devices_by_node(devices, gpus_per_node)
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
    """The actors of the plan's placement groups: a host per plan device, plus companions in the same bundles."""

    def __init__(
        self,
        groups: list[Any],
        hosts: dict[int, Any],
        locations: dict[int, tuple[str, tuple[int, ...]]],
        bundles: dict[int, tuple[Any, int]],
        remote,
        env: dict[str, str],
        num_threads: int,
    ):
        """``groups``: the placement groups (one per plan node); ``bundles``: device -> (its group,
        bundle index in it)."""
        self.groups, self.hosts, self.locations = groups, hosts, locations
        self._bundles, self._remote = bundles, remote
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
                scheduling_strategy=_in_bundle(*self._bundles[device]),
            ).remote(cls, kwargs(device) if callable(kwargs) else kwargs, self._env, self._num_threads)
        ray.get([actors[d].check_placement.remote(*self.locations[d]) for d in devices])
        self.companions.update({(name, d): actor for d, actor in actors.items()})

    def submit(
        self,
        device: int,
        method: str,
        *args: Any,
        companion: str | None = None,
        timed: bool = True,
        num_returns: int = 1,
        **kwargs: Any,
    ) -> Any:
        """Run ``method`` on ``device``'s host (or on its ``companion``): a future of (result, start, end)
        for ``wait``, or with ``timed=False`` of the result itself, split into ``num_returns`` futures
        when the method returns that many values (so that one of them can go to another actor as its
        own object, from this node's object store, not through the driver). A future among ``args``
        arrives resolved."""
        actor = self.hosts[device] if companion is None else self.companions[companion, device]
        fn = actor.run_timed if timed else actor.run
        return (fn.options(num_returns=num_returns) if num_returns != 1 else fn).remote(method, *args, **kwargs)

    def wait(self, futures: Sequence[Any]) -> list[Any]:
        """Results of ``submit`` futures, in order; ``ActorLost`` when one failed because its actor died, and a
        user reward function's ``RewardFunctionError`` as itself (its one line says what went wrong)."""
        try:
            return wait(futures)
        except ray.exceptions.RayError as e:  # a dead actor, a peer failing with it, an OOM kill
            raise _reported(e) or self._lost(e) from None

    def wait_any(self, futures: Sequence[Any]) -> list[Any]:
        """Block until at least one of ``futures`` is ready; the ready ones. A ready one that failed
        because its actor died raises ``ActorLost`` at once, without waiting for peers that may hang
        in a collective with the dead process (NCCL's would, until the collective timeout)."""
        ready = wait_any(futures)
        try:
            ray.get(ready, timeout=0)
        except ray.exceptions.RayError as e:  # a dead actor, a peer failing with it, an OOM kill
            raise _reported(e) or self._lost(e) from None
        return ready

    def _lost(self, error: Exception) -> Exception:
        """The ``ActorLost`` behind ``error`` (a dead actor's own failure, or a peer's collective failing
        because of it), found by asking every actor where it is; ``error`` itself if none is dead."""
        probes: dict[tuple[int, str | None], Any] = {(d, None): h.where.remote() for d, h in self.hosts.items()}
        probes.update({(d, name): a.where.remote() for (name, d), a in self.companions.items()})
        ready = ray.wait(list(probes.values()), num_returns=len(probes), timeout=10)[0] if probes else []
        for (device, companion), ref in probes.items():
            if ref not in ready:
                continue  # alive, busy with a call
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as dead:
                return ActorLost(device, companion, exit_detail(dead))
        if isinstance(error, ray.exceptions.OutOfMemoryError):  # a restart may fit where this did not
            return ActorLost(None, None, exit_detail(error))
        return error

    def where(self) -> dict[int, dict[str, Any]]:
        """Per device, what its host actor reports from inside: node id, GPU ids, pid; and the pid of each
        companion beside it (``companion_pids``: name -> pid)."""
        found = ray.get([self.hosts[d].where.remote() for d in self.devices])
        companions = {key: actor.where.remote() for key, actor in self.companions.items()}
        pids = {key: where[2] for key, where in zip(companions, ray.get(list(companions.values())))}
        return {
            d: {
                "node_id": node,
                "gpu_ids": list(gpus),
                "pid": pid,
                "companion_pids": {name: p for (name, device), p in pids.items() if device == d},
            }
            for d, (node, gpus, pid) in zip(self.devices, found)
        }

    def shutdown(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for actor in [*self.hosts.values(), *self.companions.values()]:
            ray.kill(actor)
        for pg in self.groups:
            remove_placement_group(pg)


def _reported(error: Exception) -> Exception | None:
    """The error a call raised on purpose for the user to read (a user reward function's), unwrapped from Ray's
    task error; None for anything else."""
    from rewards.types import RewardFunctionError

    cause = getattr(error, "cause", None)
    return cause if isinstance(error, ray.exceptions.RayTaskError) and isinstance(cause, RewardFunctionError) else None


def wait(futures: Sequence[Any]) -> list[Any]:
    """Results of ``DevicePool.submit`` futures, in order."""
    return ray.get(list(futures))


def wait_any(futures: Sequence[Any]) -> list[Any]:
    """Block until at least one of ``futures`` is ready; the ready ones."""
    ready, _ = ray.wait(list(futures), num_returns=1)
    more, _ = ray.wait(list(futures), num_returns=len(futures), timeout=0)
    return [*ready, *(f for f in more if f not in ready)]
