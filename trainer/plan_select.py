"""Where a run's execution plan comes from (`cluster.plan`), checked against the cluster and the models.

    specs = model_specs(cfg)                     # "actor", "critic", "ref" (+ "reward") -> ModelSpec
    plan = resolve_plan(cfg, specs)              # heuristic | search | disjoint | PATH.yaml

- ``heuristic`` (the GPU clusters' default; local_cpu searches) and ``disjoint``: realm's rules (``planning.builders``:
  ``realm_heuristic_plan`` then ``fit_microbatches``, ``realm_disjoint_plan``);
- ``search``: the cost model's search (``planning.search.search_plan``) within
  ``cluster.plan_search_seconds``, also started from the heuristic's plan so it is never slower;
- a path: a plan YAML file (``planning/execution_plan.py`` describes the format).

Whatever its source, the plan is checked against the cluster (nodes, devices per node) and the
configured models (heads, kv heads and vocabulary divisible by tp, layers by pp) before anything
starts, and errors name the file, the call and the field. Pure: no Ray, no torch.distributed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from models.config import ModelConfig, ModelSource
from planning.config import ClusterConfig, profile_path
from planning.execution_plan import CallAllocation, ExecutionPlan, PlanError
from reallocation.layout import ModelSpec
from rewards.config import BUILTIN_REWARD_MODELS
from trainer.config import TrainConfig

if TYPE_CHECKING:
    from planning.lifecycle import MemoryLifecycle

PLAN_FILE = "plan.yaml"
PUBLIC_REWARD_MODEL_SHAPES = {
    # Mistral-7B-v0.1's config.json shape; Math-Shepherd's PRM is that model fine-tuned (the PRM the
    # reward paper recipes name). Lets the dry run plan calls.rew_inf without downloading it.
    "peiyi9979/math-shepherd-mistral-7b-prm": ModelSpec(
        num_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        vocab_size=32000,
        tie_word_embeddings=False,
    ),
}
"""Hub id -> shape, for reward models whose config.json is not on this machine."""


# ----------------------------------------------------------------------------------------------- shapes


def spec_from_config_json(path: Path) -> ModelSpec:
    """``ModelSpec.from_config_json`` with its error as a PlanError (it names the file and field)."""
    try:
        return ModelSpec.from_config_json(path)
    except ValueError as e:
        raise PlanError(str(e)) from None


def model_spec(model: ModelConfig, model_dir: Path | None = None, *, key: str = "model") -> ModelSpec:
    """The shape of a configured model, without loading weights.

    From, in order: ``model_dir/config.json`` (the built or downloaded model), the config's
    ``shape`` fields, the tiny architecture (``source=tiny``; its vocabulary is the tokenizer's
    target size), or ``config.json`` in a local ``path``. ``key`` names the config key in errors.
    """
    if model_dir is not None and (model_dir / "config.json").exists():
        return spec_from_config_json(model_dir / "config.json")
    if model.shape.given:
        return ModelSpec.from_hf_config(SimpleNamespace(**vars(model.shape)))
    if model.source == ModelSource.tiny:
        from models.tiny import hf_config_fields

        return ModelSpec.from_hf_config(SimpleNamespace(**hf_config_fields(model.tiny, model.tiny.vocab_size)))
    local = Path(model.path).expanduser() / "config.json"
    if model.source == ModelSource.hf and local.exists():
        return spec_from_config_json(local)
    raise PlanError(
        f"{key}: the shape of {model.name!r} ({model.path}) is unknown here: give {key}.shape "
        f"(the num_hidden_layers, hidden_size, ... of its config.json) or a local {key}.path"
    )


def reward_spec(cfg: TrainConfig, reward_dir: Path | None = None) -> ModelSpec | None:
    """The reward model's shape (None for the rule-based success reward)."""
    if not cfg.reward.has_model:
        return None
    path = cfg.reward.model.path
    if reward_dir is not None:
        return spec_from_config_json(reward_dir / "config.json")
    if path in BUILTIN_REWARD_MODELS:
        from rewards.train_rm import builtin_config

        return model_spec(builtin_config(path).backbone, key="reward.model (built-in backbone)")
    local = Path(path).expanduser() / "config.json"
    if local.exists():
        return spec_from_config_json(local)
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(path, "config.json")
    if isinstance(cached, str):
        return spec_from_config_json(Path(cached))
    if path in PUBLIC_REWARD_MODEL_SHAPES:
        return PUBLIC_REWARD_MODEL_SHAPES[path]
    raise PlanError(
        f"reward.model.path={path}: no config.json here to read its shape from (calls.rew_inf needs "
        f"it); fetch it first, e.g. huggingface-cli download {path} config.json"
    )


def model_specs(
    cfg: TrainConfig, *, actor_dir: Path | None = None, critic_dir: Path | None = None, reward_dir: Path | None = None
) -> dict[str, ModelSpec]:
    """Model name -> shape, as ``ExecutionPlan.validate`` and the cost model take them: the models of the
    algorithm's dataflow graph (a critic only for one that trains it, a reference only with a KL term)."""
    actor = model_spec(cfg.model, actor_dir)
    specs = {"actor": actor}
    if cfg.algorithm.has_critic:
        specs["critic"] = (
            actor if cfg.critic.from_policy else model_spec(cfg.critic.model, critic_dir, key="critic.model")
        )
    if cfg.algorithm.has_reference:
        specs["ref"] = actor
    reward = reward_spec(cfg, reward_dir)
    if reward is not None:
        specs["reward"] = reward
    return specs


def workload(cfg: TrainConfig, specs: dict[str, ModelSpec], longest_prompt: int | None = None):
    """The cost model's ``Workload`` of one iteration as the runtime runs it: full prompt and response
    length, the run's compute dtype (``model.dtype``: float32 runs hold twice the bytes of bf16 ones),
    its PPO epochs and minibatches, and the old logprobs' forward on actor training's layout (``actor_inf``;
    none when the update takes one step and uses its own, ``ppo.config.reuses_update_logprobs``).
    ``longest_prompt``: tokens of the run's longest rendered training prompt, when known (time is then
    priced at it: the runtime trims padding to each micro-batch's longest row)."""
    from common.dtypes import torch_dtype
    from planning.estimator import Workload
    from ppo.config import reuses_update_logprobs
    from runtime.topology import RUNTIME_LIMITS

    r = cfg.rollout
    return Workload(
        actor=specs["actor"],
        critic=specs.get("critic"),
        reward=specs.get("reward"),
        reference="ref" in specs,
        batch=r.num_prompts * r.num_samples_per_prompt,
        prompt_len=r.max_prompt_tokens,
        gen_len=r.max_new_tokens,
        limits=RUNTIME_LIMITS,  # the search proposes only plans the plan runtime runs
        value_bytes=torch_dtype(cfg.model.dtype).itemsize,
        num_epochs=cfg.ppo.num_epochs,
        num_minibatches=cfg.ppo.num_minibatches,
        old_logprobs_pass=not reuses_update_logprobs(cfg.algorithm, cfg.ppo),  # the runtime's Call.actor_inf
        longest_prompt=longest_prompt,
        engine_eager=r.enforce_eager,
    )


DeviceMemory = tuple[float, float]
"""``(free, total)`` bytes of a device, as ``torch.cuda.mem_get_info`` gives them."""

_MEM_GET_INFO = (
    "import json, torch\n"
    "m = [torch.cuda.mem_get_info(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []\n"
    "print(json.dumps([min(f for f, _ in m), min(t for _, t in m)] if m else None))\n"
)


def read_device_memory(cl: ClusterConfig) -> DeviceMemory | None:
    """At the start of a GPU run: the least free and the least total memory over this node's GPUs
    (``torch.cuda.mem_get_info``), read in a child process so that the driver keeps no CUDA context on a
    device the plan fills. None for a gloo cluster, or where the child sees no GPU or fails (the preset then
    stands). Every node is taken to be as this one (``Hardware``: identical nodes)."""
    import subprocess
    import sys

    if not cl.uses_gpus:
        return None
    proc = subprocess.run([sys.executable, "-c", _MEM_GET_INFO], capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or lines[-1] == "null":
        return None
    free, total = json.loads(lines[-1])
    return float(free), float(total)


def cluster_hardware(cl: ClusterConfig, device_memory: DeviceMemory | None = None):
    """The cost model's ``Hardware`` for the configured cluster, with ``cluster.profile``'s measured
    costs when one is given, or the one shipped for ``cluster.hardware`` (``ClusterConfig.cost_profile``; a
    PlanError names the key and the file when it cannot be read), and ``cluster.memory_utilization`` of the
    preset's device memory or of ``device_memory`` (``read_device_memory``)."""
    from planning.estimator import hardware

    profile = _load_profile(str(profile_path(cl.cost_profile))) if cl.cost_profile else None
    return hardware(
        cl.hardware,
        cl.num_nodes,
        cl.devices_per_node,
        profile,
        memory_utilization=cl.memory_utilization,
        device_memory=device_memory,
    )


@lru_cache(maxsize=4)
def _load_profile(path: str):
    """A profile file, read once per process (the plan choice, the dry run and the lifecycle all price with it)."""
    from planning.profile import Profile

    try:
        return Profile.load(path)
    except ValueError as e:
        raise PlanError(f"cluster.profile: {e}") from None


# ----------------------------------------------------------------------------------------------- resolve


def check_plan(plan: ExecutionPlan, cluster: ClusterConfig, specs: dict[str, ModelSpec], where: str) -> None:
    """The plan matches the cluster's shape and the models' shapes; PlanError names file, call and field."""
    if plan.num_nodes != cluster.num_nodes:
        raise PlanError(f"{where}: num_nodes={plan.num_nodes} but cluster.num_nodes={cluster.num_nodes}")
    if plan.gpus_per_node != cluster.devices_per_node:
        raise PlanError(
            f"{where}: gpus_per_node={plan.gpus_per_node} but cluster.devices_per_node={cluster.devices_per_node}"
        )
    plan.validate(specs, where=where)


def resolve_plan(
    cfg: TrainConfig,
    specs: dict[str, ModelSpec],
    *,
    run_dir: Path | None = None,
    log: Callable[[str], None] | None = None,
    longest_prompt: int | None = None,
    device_memory: DeviceMemory | None = None,
) -> ExecutionPlan:
    """The execution plan ``cfg.cluster.plan`` names, validated against the cluster and ``specs``.

    With ``run_dir``, the plan is also written there as ``plan.yaml`` (a searched plan is only
    reproducible from that file). ``longest_prompt``: as ``workload``'s; ``device_memory``: as
    ``cluster_hardware``'s (a GPU run's, read at start). Raises PlanError.
    """
    from planning.builders import fit_microbatches, realm_disjoint_plan, realm_heuristic_plan

    cl, r = cfg.cluster, cfg.rollout
    rows, seq_len = r.num_prompts * r.num_samples_per_prompt, r.max_prompt_tokens + r.max_new_tokens
    w, hw = workload(cfg, specs, longest_prompt), cluster_hardware(cl, device_memory)
    if cl.plan == "heuristic":
        plan = fit_microbatches(realm_heuristic_plan(cl, specs, rows=rows, seq_len=seq_len), w, hw)
        where = "cluster.plan=heuristic"
    elif cl.plan == "disjoint":
        plan, where = realm_disjoint_plan(cl, specs), "cluster.plan=disjoint"
    elif cl.plan == "search":
        from planning.search import NoFitError, search_plan

        if log:
            log(f"[plan] searching for {cl.plan_search_seconds:g} CPU s ({cl.num_devices} x {cl.hardware})")
        try:
            # Also from the rule's plan: the search's result is then never slower than cluster.plan=heuristic.
            rule = fit_microbatches(realm_heuristic_plan(cl, specs, rows=rows, seq_len=seq_len), w, hw)
            plan, _ = search_plan(w, hw, seconds=cl.plan_search_seconds, seed=cfg.run.seed, also_from=rule)
        except NoFitError as e:
            raise PlanError(
                f"cluster.plan=search: {e}; cluster.plan=heuristic may fit (check it with run.dry_run=true)"
            ) from None
        where = "cluster.plan=search"
    else:
        plan = ExecutionPlan.load(cl.plan)
        where = cl.plan
    check_plan(plan, cl, specs, where)
    if run_dir is not None:
        plan.save(Path(run_dir) / PLAN_FILE)
    return plan


# ----------------------------------------------------------------------------------------------- dry run


def _mesh(plan: ExecutionPlan, alloc: CallAllocation) -> str:
    """``node 0 devices 0-7``: where a call runs."""
    nodes = sorted({plan.node_of(d) for d in alloc.devices})
    devs = list(alloc.devices)
    span = (
        f"{devs[0]}-{devs[-1]}"
        if devs == list(range(devs[0], devs[-1] + 1)) and len(devs) > 1
        else ",".join(map(str, devs))
    )
    where = f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {nodes[0]}-{nodes[-1]}"
    return f"{where} devices {span}"


@dataclass
class PlanReport:
    """The plan part of `python train.py run.dry_run=true` (``plan_report``)."""

    plan: ExecutionPlan
    lines: list[str]
    """The cluster and workload, one line per call, reallocation."""
    summary: str
    """``plan: N devices, predicted S s/iteration, peak G GiB/device``: the dry run's last line."""
    problem: str | None
    """Why the plan cannot run (it does not fit the devices' memory), or None."""


def plan_report(cfg: TrainConfig, longest_prompt: int | None = None) -> PlanReport:
    """The plan ``cluster.plan`` gives this config: one line per call (mesh, layout, predicted seconds,
    memory per device), the cost model's totals, and whether it fits the devices' memory. With
    ``longest_prompt`` (``workload``'s), time is priced as the run prices it, so a searched plan is the run's.

    Reads shapes from the configs only (no weights, no download, no Ray). The call's memory is its
    own (resident + active) bytes per device; the peak is the fullest device of its mesh with every
    model the plan keeps there.
    """
    from planning.estimator import call_memory, estimate_plan, memory_lifecycle

    cl = cfg.cluster
    specs = model_specs(cfg)
    plan = resolve_plan(cfg, specs, longest_prompt=longest_prompt)
    w = workload(cfg, specs, longest_prompt)
    hw = cluster_hardware(cl)
    cost = estimate_plan(plan, w, hw)
    gib = float(1 << 30)
    lines = [
        f"cluster: {cl.num_nodes} x {cl.devices_per_node} {cl.hardware} (time: {_priced_by(cl)}); plan: {plan.source}; model "
        f"{cfg.model.name}; {w.batch} sequences x ({w.prompt_len} prompt + {w.gen_len} new) tokens per iteration"
        + (f", time at {w.computed_prompt_len}-token prompts" if longest_prompt else "")
    ]
    for call, alloc in plan.calls.items():
        resident, active = call_memory(call, w.spec(call), alloc, w)
        peak = max(cost.peak_bytes_per_device.get(d, 0.0) for d in alloc.devices)
        lines.append(
            f"  {call:<13} {_mesh(plan, alloc):<26} {alloc.describe().split(' ', 1)[1]:<24} "
            f"{cost.call_seconds[call]:8.2f} s  {(resident + active) / gib:6.1f} GiB/device "
            f"(peak {peak / gib:.1f})"
        )
    lines.append(_old_logprobs_line(plan, cost.call_seconds.get("actor_inf")))
    lines.append(f"  reallocation {cost.realloc_seconds:.2f} s per iteration; calls on disjoint devices overlap")
    lines += _memory_lines(plan, cl, hw)
    life = memory_lifecycle(plan, w, hw)
    if cl.uses_gpus:
        lines.append(_engine_line(life, plan, w.engine_eager))
    lines += life.table()
    problem = None
    if not cost.fits:
        problem = (
            f"the plan does not fit: its fullest device needs {cost.overflow_bytes / gib:.1f} GiB more than a "
            f"{cl.hardware} has; add devices (cluster.devices_per_node, cluster.num_nodes), try cluster.plan=search, "
            "or shrink the batch (rollout.num_prompts, rollout.num_samples_per_prompt)"
        )
    summary = (
        f"plan: {plan.num_devices} devices, predicted {cost.seconds_per_iteration:.2f} s/iteration, "
        f"peak {cost.peak_bytes / gib:.1f} GiB/device"
    )
    return PlanReport(plan, lines, summary, problem)


def _memory_lines(plan: ExecutionPlan, cl: ClusterConfig, hw) -> list[str]:
    """The dry run's device memory line (capacity, margin, what a plan may fill) and, on GPUs, the NCCL
    communicators each device process and engine rank holds (``planning.communicators``)."""
    from planning.communicators import communicator_bytes, device_communicators, engine_communicators
    from planning.lifecycle import CUDA_CONTEXT_BYTES

    gib = float(1 << 30)
    lines = [
        f"  device memory: {hw.gpu_memory_bytes / gib:.1f} GiB each ({cl.hardware} preset; a GPU run reads "
        f"torch.cuda.mem_get_info at start), margin {hw.memory_margin_bytes / gib:.1f} GiB "
        f"(cluster.memory_utilization={cl.memory_utilization:g}): a plan may fill {hw.usable_memory_bytes / gib:.1f} GiB"
    ]
    if not cl.uses_gpus:
        return lines
    by_count: dict[int, list[int]] = {}
    for d in range(plan.num_devices):
        by_count.setdefault(device_communicators(plan.calls, d), []).append(d)
    counts = "; ".join(
        f"{n} on devices {_span(ds)} ({communicator_bytes(n) / gib:.2f} GiB)" for n, ds in by_count.items()
    )
    engine = engine_communicators(plan.calls["actor_gen"])
    lines.append(
        f"  per process: CUDA context {CUDA_CONTEXT_BYTES / gib:.2f} GiB; NCCL communicators of the device "
        f"processes: {counts}; of each engine rank: {engine} ({communicator_bytes(engine) / gib:.2f} GiB); "
        "NCCL state measured on an H200, buffers estimated (planning/communicators.py)"
    )
    return lines


def _engine_line(life, plan: ExecutionPlan, eager: bool) -> str:
    """The engines' batch limits and the working memory the lifecycle gives them at those limits
    (``planning.lifecycle.engine_batch_limits``, ``engine_workspace_bytes``)."""
    from planning.lifecycle import Kind

    max_num_seqs, max_num_batched_tokens = life.engine_batch
    workspace = life.engine_budget(plan.calls["actor_gen"].devices[0]).get(Kind.activations, 0.0)
    return (
        f"  each engine rank: max_num_seqs {max_num_seqs}, max_num_batched_tokens {max_num_batched_tokens}, "
        f"{'eager' if eager else 'CUDA graphs'} (rollout.enforce_eager={str(eager).lower()}); working memory while "
        f"generating {workspace / (1 << 30):.2f} GiB (one forward's activations, the sampler's float32 logits"
        f"{', graph pools' if not eager else ''}: planning/lifecycle.py engine_workspace_bytes)"
    )


def _span(devices: list[int]) -> str:
    return f"{devices[0]}-{devices[-1]}" if len(devices) > 1 else str(devices[0])


def _priced_by(cl: ClusterConfig) -> str:
    """What the dry run's times come from: ``profile h200`` (a measured profile) or ``analytic h100 preset``."""
    return f"profile {cl.cost_profile}" if cl.cost_profile else f"analytic {cl.hardware} preset"


def _old_logprobs_line(plan: ExecutionPlan, seconds: float | None) -> str:
    """The dry run's line for actor_inf, the old logprobs' forward on actor training's layout (not a plan entry),
    or for its absence when the update takes one step and uses its own (``ppo.config.reuses_update_logprobs``)."""
    if seconds is None:
        return "  actor_inf     none: one optimizer step per batch uses its own logprobs, detached, as the old ones"
    train = plan.calls["actor_train"]
    return f"  {'actor_inf':<13} {_mesh(plan, train):<26} {'(actor_train layout)':<24} {seconds:8.2f} s  old logprobs"


def plan_lifecycle(
    cfg: TrainConfig, plan: ExecutionPlan, specs: dict[str, ModelSpec], device_memory: DeviceMemory | None = None
) -> MemoryLifecycle:
    """The plan's device-memory lifecycle on the configured hardware (``planning.lifecycle``): what the
    cost model priced, and the budgets and phases the runtime follows (``device_memory``: as ``resolve_plan``'s)."""
    from planning.estimator import memory_lifecycle

    cl = cfg.cluster
    return memory_lifecycle(plan, workload(cfg, specs), cluster_hardware(cl, device_memory))
