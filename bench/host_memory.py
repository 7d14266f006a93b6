"""Host memory of the device processes while they build their model shards, as ``train.py`` builds them.

    .venv/bin/python bench/host_memory.py --model smollm2-135m --json docs/bench/host_memory_smollm2.json

The run's own path up to its first iteration: the config composed as ``train.py`` composes it (extra
Hydra overrides after the options), the plan and memory lifecycle ``trainer.loop.execution_plan`` makes
for it, and ``trainer.loop.deploy``, which hands every device process its shards' recipes
(``runtime.driver.PlanRuntime.start``). Only the host differs: each ``DeviceProcess`` is built in a
child process of this one (``LocalPool``) instead of a Ray actor, all at once as Ray starts them, with
the torch threads a Ray actor gets; the vLLM engines beside the generation devices are not started (they
are not device processes), and the policy is the base model (no SFT warm start: the same weights' shapes).

Each child imports the shard modules and transformers first, then records its resident set size (RSS),
resets the kernel's peak (``/proc/self/clear_refs``, 5) and builds; its peak RSS increase while building is
the kernel's peak (``VmHWM``) minus that RSS. A thread samples anonymous and file-backed RSS every 5 ms
(memory-mapped weight files count in RSS while mapped). The report's
``build_host_bytes_over_model_bytes`` is the sum of the device processes' peak increases over the fp32 bytes
of the model instances the plan builds (``runtime.topology.model_grids``: the policy's and critic's training
instances, each reference, critic-inference and reward-model replica; a model sharded over several devices
counts once). At 1 every weight is held once; a full model loaded on every rank of a sharded one, or a
weight held twice while loading, shows above it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TIMEOUT_S = 1800.0
"""How long the build may take before the bench gives up (a 7B build on a loaded machine takes minutes)."""


def _status() -> dict[str, int]:
    """This process's memory counters from /proc/self/status, in bytes (VmRSS, VmHWM, RssAnon, RssFile)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


class _Sampler(threading.Thread):
    """The largest anonymous and file-backed RSS seen, every ``interval_s`` until ``stop``."""

    def __init__(self, interval_s: float = 0.005):
        super().__init__(daemon=True)
        self.interval_s, self.peak = interval_s, {"RssAnon": 0, "RssFile": 0}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            now = _status()
            for key in self.peak:
                self.peak[key] = max(self.peak[key], now[key])
            time.sleep(self.interval_s)

    def stop(self) -> dict[str, int]:
        self._stop_event.set()
        self.join()
        return self.peak


def _measured_build(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Build ``cls(**kwargs)`` here; its peak RSS increase and what it built."""
    import gc

    gc.collect()
    before = _status()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM restarts from the current RSS
    sampler = _Sampler()
    sampler.start()
    start = time.perf_counter()
    worker = cls(**kwargs)
    seconds = time.perf_counter() - start
    peaks, after = sampler.stop(), _status()
    return {
        "device": kwargs["device"],
        "pid": os.getpid(),
        "roles": sorted(worker.shards),
        "build_s": round(seconds, 2),
        "rss_before_bytes": before["VmRSS"],
        "peak_rss_increase_bytes": after["VmHWM"] - before["VmRSS"],
        "rss_increase_after_bytes": after["VmRSS"] - before["VmRSS"],
        "peak_anon_increase_bytes": peaks["RssAnon"] - before["RssAnon"],
        "peak_file_increase_bytes": peaks["RssFile"] - before["RssFile"],
    }


def _host(cls: type, kwargs: dict[str, Any], num_threads: int, reports: Any, done: Any) -> None:
    """A child process: one device process, built and measured; it stays until every device has reported."""
    try:
        import torch

        torch.set_num_threads(num_threads)
        # Code, not weights: imported before the baseline, as a Ray actor has them from its first call.
        import transformers  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoModelForTokenClassification  # noqa: F401

        import runtime.device.process  # noqa: F401
        import runtime.device.reward  # noqa: F401
        import runtime.device.shards  # noqa: F401

        reports.put(_measured_build(cls, kwargs))
    except BaseException:
        reports.put({"device": kwargs["device"], "error": traceback.format_exc()})
    done.wait(TIMEOUT_S)


class LocalPool:
    """``runtime.placement.DevicePool``'s build, with a child process per device instead of a Ray actor."""

    def __init__(self, devices: list[int], num_threads: int):
        self.devices, self.num_threads = devices, num_threads
        self.reports: list[dict[str, Any]] = []
        self.skipped: list[str] = []
        self._not_started: set[str] = set()
        self._ctx = mp.get_context("spawn")
        self._procs: list[Any] = []
        self._done = self._ctx.Event()

    def rendezvous(self, device: int) -> tuple[str, int]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return "127.0.0.1", s.getsockname()[1]

    def build(self, cls: type, kwargs_of: Any) -> None:
        """Start every device's build at once; wait for all their reports."""
        queue = self._ctx.Queue()
        for d in self.devices:
            proc = self._ctx.Process(target=_host, args=(cls, kwargs_of(d), self.num_threads, queue, self._done))
            proc.start()
            self._procs.append(proc)
        for _ in self.devices:
            report = queue.get(timeout=TIMEOUT_S)
            if "error" in report:
                self.shutdown()
                raise RuntimeError(f"device {report['device']} failed to build:\n{report['error']}")
            print(
                f"[host_memory] device {report['device']} built {', '.join(report['roles'])} in {report['build_s']} s: "
                f"peak RSS +{report['peak_rss_increase_bytes'] / 1e6:.0f} MB",
                flush=True,
            )
            self.reports.append(report)
        self.reports.sort(key=lambda r: r["device"])

    def add_companions(self, name: str, devices: Any, cls: type, kwargs: Any) -> None:
        self.skipped.append(f"{name} on devices {list(devices)} ({cls.__name__}): not started")
        self._not_started.add(name)

    def submit(self, device: int, method: str, *args: Any, companion: str | None = None, **kwargs: Any) -> None:
        """A call to a companion that was not started is no call (its future is ``None``); the bench runs
        no call on a device process."""
        if companion in self._not_started:
            return None
        raise NotImplementedError("the bench builds the device processes only; it runs no call")

    def wait(self, futures: Any) -> list[Any]:
        """Nothing for futures of companions that were not started (so the driver prints no engine's
        memory: there is none)."""
        if any(f is not None for f in futures):
            raise NotImplementedError("the bench builds the device processes only; it runs no call")
        return []

    def wait_any(self, futures: Any) -> Any:
        raise NotImplementedError("the bench builds the device processes only; it runs no call")

    def shutdown(self) -> None:
        self._done.set()
        for proc in self._procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()


class LocalCluster:
    """What ``PlanRuntime.start`` asks of a ``RayCluster``: a device pool, and the grader-only reward actor
    (it holds no model and no device: not built here)."""

    def __init__(self, num_cpus: int):
        self.num_cpus = num_cpus
        self.pool: LocalPool | None = None

    def device_pool(self, devices: Any, gpus_per_node: int) -> LocalPool:
        from runtime.placement import threads_per_device

        self.pool = LocalPool(sorted(devices), threads_per_device(self.num_cpus, len(devices)))
        return self.pool

    def group(self, *args: Any, **kwargs: Any) -> None:
        return None


def _fp32_bytes(model_cls: Any, model_dir: Path, **config_kwargs: Any) -> int:
    """fp32 bytes of ``model_cls`` built from ``model_dir``'s config, on the meta device (tied weights once)."""
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir, **config_kwargs)
    with torch.device("meta"):
        model = model_cls.from_config(config)
    return 4 * sum(p.numel() for p in model.parameters())


def _file_fp32_bytes(model_dir: Path) -> int:
    """fp32 bytes of the tensors in ``model_dir``'s safetensors files (a reward model, whatever its class)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                n = 1
                for size in f.get_slice(name).get_shape():
                    n *= size
                total += n
    return 4 * total


def model_bytes(plan: Any, policy_dir: Path, critic_dir: Path, reward_dir: Path | None) -> dict[str, dict[str, int]]:
    """Role -> instances the plan builds and the fp32 bytes of one (``runtime.topology.model_grids``)."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    from runtime.topology import Role, model_grids

    def one(role: Role) -> int:
        if role in (Role.actor, Role.ref):
            return _fp32_bytes(AutoModelForCausalLM, policy_dir)
        if role in (Role.critic, Role.critic_inf):
            return _fp32_bytes(AutoModelForTokenClassification, critic_dir, num_labels=1)
        assert reward_dir is not None, "a plan with rew_inf has a reward model"
        return _file_fp32_bytes(reward_dir)

    return {str(role): {"instances": len(grids), "fp32_bytes": one(role)} for role, grids in model_grids(plan).items()}


def checkpoint_in(model_dir: Path, dtype_name: str, out_dir: Path) -> Path:
    """A copy of ``model_dir`` with its weights stored in ``dtype_name`` (as the Qwen2.5 checkpoints store
    bfloat16), in ``out_dir``."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out_dir.mkdir(parents=True)
    for path in model_dir.iterdir():
        if path.suffix == ".safetensors":
            weights = {k: v.to(getattr(torch, dtype_name)).contiguous() for k, v in load_file(path).items()}
            save_file(weights, out_dir / path.name, metadata={"format": "pt"})
        elif path.is_file():
            shutil.copy(path, out_dir / path.name)
    return out_dir


def measure(cfg: Any, run_dir: Path, checkpoint_dtype: str | None = None) -> dict[str, Any]:
    """The plan ``train.py`` would run with ``cfg``, its device processes built and measured; with
    ``checkpoint_dtype``, from a copy of the model whose weights are stored in that dtype."""
    from transformers import AutoTokenizer

    from models.registry import resolve_model_dir
    from trainer.loop import deploy, execution_plan, load_data, longest_prompt, render_prompts, resolve_reward_model_dir

    policy_dir = resolve_model_dir(cfg.model)
    if checkpoint_dtype is not None:
        policy_dir = checkpoint_in(policy_dir, checkpoint_dtype, run_dir / f"model-{checkpoint_dtype}")
    critic_dir = policy_dir if cfg.critic.from_policy else resolve_model_dir(cfg.critic.model)
    reward_dir = resolve_reward_model_dir(cfg)
    train_problems, heldout = load_data(cfg)
    _, prompt_tokens = render_prompts(cfg, AutoTokenizer.from_pretrained(policy_dir), train_problems + heldout)
    plan, lifecycle = execution_plan(
        cfg, policy_dir, reward_dir, run_dir, longest_prompt(prompt_tokens, train_problems)
    )
    models = model_bytes(plan, policy_dir, critic_dir, reward_dir)
    cluster = LocalCluster(cfg.cluster.num_cpus)
    print(f"[host_memory] building {plan.num_devices} device processes at once", flush=True)
    try:
        deploy(cfg, cluster, plan, lifecycle, policy_dir)  # type: ignore[arg-type]  # a LocalCluster hosts it
    finally:
        if cluster.pool is not None:
            cluster.pool.shutdown()
    assert cluster.pool is not None
    report = _report(cfg, plan, models, cluster.pool)
    return {**report, "checkpoint_dtype": checkpoint_dtype or "as cached"}


def _report(cfg: Any, plan: Any, models: dict[str, dict[str, int]], pool: LocalPool) -> dict[str, Any]:
    total_model = sum(m["instances"] * m["fp32_bytes"] for m in models.values())
    total_build = sum(r["peak_rss_increase_bytes"] for r in pool.reports)
    return {
        "model": cfg.model.name,
        "plan": {call: alloc.describe() for call, alloc in plan.calls.items()},
        "models": models,
        "device_processes": pool.reports,
        "not_built": pool.skipped,
        "model_fp32_bytes": total_model,
        "build_host_bytes": total_build,
        "build_host_bytes_over_model_bytes": round(total_build / total_model, 3),
        "load_1min": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="peak host memory of the device processes while they build")
    parser.add_argument("--model", default="smollm2-135m", help="a config of configs/model/")
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument(
        "--checkpoint-dtype",
        choices=["bfloat16", "float16", "float32"],
        default=None,
        help="build from a copy of the model stored in this dtype (default: the cached checkpoint as it is)",
    )
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides of configs/train.yaml")
    args = parser.parse_args(argv)
    from hydra import compose, initialize_config_dir

    from common.cli import check_overrides
    from common.files import atomic_write_text
    from trainer.compose import to_train_config
    from trainer.config import MOVED_KEYS, register_configs

    register_configs()
    overrides = check_overrides(
        REPO / "configs", "train", [f"model={args.model}", *args.overrides], check=to_train_config, moved=MOVED_KEYS
    )
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = to_train_config(compose(config_name="train", overrides=overrides))
    with tempfile.TemporaryDirectory(prefix="host-memory-") as tmp:
        result = measure(cfg, Path(tmp), args.checkpoint_dtype)
    print(
        f"[host_memory] {result['build_host_bytes'] / 1e6:.0f} MB peak build increase over "
        f"{result['model_fp32_bytes'] / 1e6:.0f} MB of fp32 models: "
        f"build_host_bytes_over_model_bytes {result['build_host_bytes_over_model_bytes']} "
        f"(load {result['load_1min']:.2f})",
        flush=True,
    )
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
