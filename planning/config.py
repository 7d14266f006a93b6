"""Typed cluster config: which devices exist, and where the execution plan comes from.

What runs where (each model function call's devices and layout) is not configured here field by
field: it is an execution plan (``planning/execution_plan.py``), chosen at start by
``trainer/plan_select.resolve_plan`` from ``plan``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HARDWARE = ("cpu", "a100-80g", "h100", "h200")
PLAN_RULES = ("heuristic", "search", "disjoint")
"""``plan`` values that name a rule; anything else is a path to a plan YAML file."""
PROFILES_DIR = Path(__file__).parent / "profiles"
"""Cost-model profiles shipped with realm (package data), named by file stem: ``cluster.profile=cpu-2core``."""


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def profile_path(value: str) -> Path:
    """The file ``cluster.profile`` names: a shipped profile (``planning/profiles/NAME.json``, found from
    any working directory), else a path. Example: ``cpu-2core`` -> ``<package>/planning/profiles/cpu-2core.json``;
    ``docs/p.json`` -> ``docs/p.json``."""
    if value in shipped_profiles():
        return PROFILES_DIR / f"{value}.json"
    return Path(value).expanduser()


MEMORY_UTILIZATION = 0.9
"""The share of each device's memory a plan may fill (``cluster.memory_utilization``'s default): vLLM's
``gpu_memory_utilization`` default, the same idea. The rest is a margin for the caching allocator's
fragmentation and what the lifecycle does not price (cuBLAS workspaces, NCCL's LL buffers, kernels'
scratch): 8 GiB of an 80 GiB H100, 14.1 of an H200's 141."""
ANALYTIC = "analytic"
"""``cluster.profile=analytic``: the ``hardware`` preset's analytic model even where a profile of it is shipped."""


def hardware_profile(hardware: str) -> str:
    """The shipped profile measured on ``hardware`` itself, or "" where realm ships none. Example: ``h200`` ->
    ``h200`` (``planning/profiles/h200.json``, measured on one lent H200, docs/gpu_measure/); ``h100`` -> ""."""
    return hardware if hardware in shipped_profiles() else ""


@dataclass
class ClusterConfig:
    address: str = ""
    """Empty: start a local Ray (CPU). Otherwise a Ray address to join, e.g. `auto` or `HEAD_IP:6379`."""
    num_cpus: int = 2
    """CPUs for the local Ray (ignored when joining a cluster)."""
    num_nodes: int = 1
    devices_per_node: int = 1
    """GPUs per node. On CPU, logical devices: one worker process each, sharing the machine's cores."""
    hardware: str = "cpu"
    """What one device is, for the cost model's predictions: cpu, a100-80g, h100 or h200."""
    backend: str = "gloo"
    """torch.distributed backend for training workers: gloo (CPU) or nccl (GPU)."""
    plan: str = "heuristic"
    """Where the execution plan comes from: `heuristic` (a fixed rule that always fits the cluster),
    `search` (the cost model's search at start, within plan_search_seconds; written to the run
    directory as plan.yaml), `disjoint` (each role on its own devices, the pre-plan placement),
    or a path to a plan YAML file (validated against this cluster and the model)."""
    plan_search_seconds: float = 30.0
    """Time budget of `plan=search`, in CPU seconds of the driver (so that other jobs' load does not
    change which plan a seed finds)."""
    profile: str = ""
    """A cost-model profile that the search, the heuristic's micro-batch fitting and the dry run price
    time with: the name of one shipped in planning/profiles/ (``cpu-2core``: a 2-core x86_64 machine, one
    thread per device, float32) or the path of one measured on this machine (``bash scripts/plan_calibration.sh``,
    or ``python -m planning.profile --out P.json`` then ``python bench/empty_calls.py --profile P.json`` for
    the fixed per-call costs). Empty: the profile shipped for ``hardware`` where there is one (``h200``), else
    the ``hardware`` preset's analytic model; ``analytic``: that model always (``cost_profile``)."""
    memory_utilization: float = MEMORY_UTILIZATION
    """The share of each device's memory the plan may fill, the rest a margin (vLLM's
    ``gpu_memory_utilization`` idea): the plan search, the heuristic's fitting and the memory lifecycle check
    every device against it. Of the ``hardware`` preset's memory on CPU and in dry runs; of what
    ``torch.cuda.mem_get_info`` reports at the start of a GPU run (its total, and at most what is free)."""
    collective_timeout_s: float = 1800.0
    """How long a collective (an all-reduce, an all-gather, a point-to-point transfer) may wait for its
    peers before it fails, on every process group the device processes create. NCCL's watchdog default
    (10 minutes) kills a healthy run whose collective waits behind a long call on another node."""

    @property
    def cost_profile(self) -> str:
        """The profile the cost model prices with: ``profile``, or where it is empty the one shipped for
        ``hardware`` (``hardware_profile``); "" for the analytic model."""
        if self.profile == ANALYTIC:
            return ""
        return self.profile or hardware_profile(self.hardware)

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.devices_per_node

    @property
    def uses_gpus(self) -> bool:
        return self.backend == "nccl"

    def __post_init__(self) -> None:
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"cluster.backend={self.backend!r}: expected gloo or nccl")
        if self.hardware not in HARDWARE:
            raise ValueError(f"cluster.hardware={self.hardware!r}: expected one of {', '.join(HARDWARE)}")
        for key in ("num_nodes", "devices_per_node", "num_cpus"):
            if getattr(self, key) < 1:
                raise ValueError(f"cluster.{key}={getattr(self, key)}: must be >= 1")
        if not self.plan:
            raise ValueError(f"cluster.plan is empty: expected {', '.join(PLAN_RULES)} or a plan YAML path")
        if self.plan_search_seconds <= 0:
            raise ValueError(f"cluster.plan_search_seconds={self.plan_search_seconds}: must be > 0")
        if self.profile not in ("", ANALYTIC) and not profile_path(self.profile).is_file():
            raise ValueError(
                f"cluster.profile={self.profile}: no such file, nor a shipped profile ({', '.join(shipped_profiles())}); "
                "write one with bash scripts/plan_calibration.sh"
            )
        if not 0 < self.memory_utilization <= 1:
            raise ValueError(f"cluster.memory_utilization={self.memory_utilization}: must be in (0, 1]")
        if self.collective_timeout_s <= 0:
            raise ValueError(f"cluster.collective_timeout_s={self.collective_timeout_s}: must be > 0")
