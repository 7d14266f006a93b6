"""cluster.plan -> ExecutionPlan: the heuristic rule on every cluster shape, the disjoint placement,
plan files checked against the cluster and the configured model, with errors naming file, call and field."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from planning.builders import fit_microbatches, realm_disjoint_plan, realm_heuristic_plan
from planning.config import ClusterConfig
from planning.execution_plan import CallAllocation, ExecutionPlan, PlanError
from trainer.compose import to_train_config
from trainer.config import TrainConfig, register_configs
from trainer.plan_select import (
    PLAN_FILE,
    cluster_hardware,
    model_spec,
    model_specs,
    resolve_plan,
    workload,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
register_configs()


def _cfg(*overrides: str) -> TrainConfig:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=list(overrides)))


def test_qwen_math_shapes_give_the_published_parameter_counts():
    # Qwen2.5-Math model cards: 1.54B and 7.62B parameters (embeddings included, 1.5B's head tied).
    small = model_spec(_cfg("model=qwen2.5-math-1.5b-instruct").model)
    large = model_spec(_cfg("model=qwen2.5-math-7b").model)
    assert round(small.num_params() / 1e9, 2) == 1.54
    assert round(large.num_params() / 1e9, 2) == 7.62
    assert (large.num_heads, large.num_kv_heads, large.head_dim, large.num_layers) == (28, 4, 128, 28)


@pytest.mark.parametrize("cluster", ["local_cpu", "gpu_1x8", "gpu_2x8"])
@pytest.mark.parametrize("model", ["tiny", "qwen2.5-math-1.5b-instruct", "qwen2.5-math-7b-instruct"])
def test_heuristic_uses_every_device_and_never_more(cluster, model):
    cfg = _cfg(f"cluster={cluster}", f"model={model}", "cluster.plan=heuristic")
    plan = resolve_plan(cfg, model_specs(cfg))
    n = cfg.cluster.num_devices
    assert plan.num_devices == n and plan.source == "heuristic"
    assert plan.calls["actor_gen"].devices == tuple(range(n))
    assert "rew_inf" not in plan.calls  # success reward: no reward model
    if cfg.cluster.num_nodes == 1:
        assert all(a.devices == tuple(range(n)) for a in plan.calls.values())
        assert plan.calls["actor_train"].dp == plan.calls["critic_train"].dp == n  # FSDP over all of them
    else:  # actor's side on node 0, critic's side on node 1: they train at the same time
        assert plan.calls["actor_train"].devices == plan.calls["ref_inf"].devices == tuple(range(8))
        assert plan.calls["critic_train"].devices == plan.calls["critic_inf"].devices == tuple(range(8, 16))


def test_heuristic_on_gpus_worked_example_7b_on_one_node():
    # 512 rows of 256 + 48 tokens on 8 GPUs, data parallel only: 64 rows x 304 tokens = 19456 tokens
    # per GPU -> 2 micro-batches of <= 16384 for training and inference; generation in 1 wave
    # (64 sequences x 304 tokens x 56 KiB of KV cache per token = 1.1 GB per GPU).
    cfg = _cfg("cluster=gpu_1x8", "model=qwen2.5-math-7b-instruct")
    calls = resolve_plan(cfg, model_specs(cfg)).calls
    assert all((a.dp, a.tp, a.pp) == (8, 1, 1) for a in calls.values())
    assert calls["actor_gen"].num_microbatches == 1
    assert (calls["actor_train"].num_microbatches, calls["actor_train"].activation_checkpointing) == (2, True)
    assert (calls["ref_inf"].num_microbatches, calls["ref_inf"].offload) == (2, True)
    assert not calls["critic_inf"].offload


def test_generation_runs_in_waves_whose_kv_cache_fits_16_gib():
    # 4096 prompts x 8 samples of 1024 + 1024 tokens on one 8-GPU node: 4096 sequences per 7B replica
    # x 117 MB of KV cache (2 x 4 kv heads x 128 x 2 B x 28 layers = 56 KiB per token) = 448 GiB
    # -> 28 -> 32 waves.
    cfg = _cfg(
        "cluster=gpu_1x8",
        "model=qwen2.5-math-7b-instruct",
        "rollout.num_prompts=4096",
        "rollout.num_samples_per_prompt=8",
        "rollout.max_prompt_tokens=1024",
        "rollout.max_new_tokens=1024",
    )
    gen = resolve_plan(cfg, model_specs(cfg)).calls["actor_gen"]
    assert (gen.dp, gen.tp, gen.num_microbatches) == (8, 1, 32)


@pytest.mark.parametrize("num_nodes, per_node", [(1, 1), (1, 3), (2, 3), (3, 2), (1, 6)])
def test_heuristic_fits_odd_cluster_shapes(num_nodes, per_node):
    cfg = _cfg(
        "model=qwen2.5-math-7b",
        "cluster=gpu_1x8",
        f"cluster.num_nodes={num_nodes}",
        f"cluster.devices_per_node={per_node}",
        "+reward=prm",
        "reward.model.path=peiyi9979/math-shepherd-mistral-7b-prm",
    )
    specs = model_specs(cfg)
    plan = resolve_plan(cfg, specs)  # validates
    assert plan.num_devices == num_nodes * per_node
    assert "rew_inf" in plan.calls


def test_heuristic_splits_the_largest_calls_until_the_fullest_device_fits():
    # SmolLM2-135M (float32) on the 2 CPU devices at the benchmark workload (16 prompts x 4
    # samples, 256 new tokens): one micro-batch per call predicts 27.4 GiB (the vLLM engine, awake on CPU,
    # included) on a device the cost model
    # gives 8 GiB (the plan that ran this machine's 24 GiB out of memory); doubling the call with the
    # most active memory on the fullest device gives actor and critic training 8 micro-batches each
    # (over the whole batch: 2 per PPO minibatch, 4 rows each per device) and fits.
    from planning.estimator import estimate_plan, hardware

    cfg = _cfg(
        "model=smollm2-135m",
        "rollout.num_prompts=16",
        "rollout.num_samples_per_prompt=4",
        "rollout.max_new_tokens=256",
        "cluster.plan=heuristic",
        "cluster.profile=",  # the cpu preset's analytic model, as hw below
    )
    specs = model_specs(cfg)
    w, hw = workload(cfg, specs), hardware("cpu", 1, 2)
    rule = realm_heuristic_plan(cfg.cluster, specs, rows=64, seq_len=512)
    assert not estimate_plan(rule, w, hw).fits
    assert round(estimate_plan(rule, w, hw).peak_bytes / 2**30, 1) == 27.4
    fitted = fit_microbatches(rule, w, hw)
    assert {c: a.num_microbatches for c, a in fitted.calls.items()} == {
        "actor_gen": 1,
        "ref_inf": 1,
        "critic_inf": 1,
        "actor_train": 8,
        "critic_train": 8,
    }
    assert estimate_plan(fitted, w, hw).fits and resolve_plan(cfg, specs) == fitted
    # Only micro-batches change: same devices and layouts.
    assert all(replace(a, num_microbatches=1) == rule.calls[c] for c, a in fitted.calls.items())


def test_the_default_run_and_fitting_gpu_plans_keep_their_micro_batches():
    from planning.estimator import hardware

    for overrides, rows, seq_len, hw in (
        ((), 512, 304, hardware("cpu", 1, 2)),
        (("experiment=reward_paper_1.5b", "cluster=gpu_1x8"), 8192, 2048, hardware("h100", 1, 8)),
    ):
        cfg = _cfg(*overrides)
        specs = model_specs(cfg)
        rule = realm_heuristic_plan(cfg.cluster, specs, rows=rows, seq_len=seq_len)
        assert fit_microbatches(rule, workload(cfg, specs), hw) == rule


def test_fitting_stops_at_one_row_per_micro_batch():
    # 2 sequences per iteration of SmolLM2 on a "GPU" of 1 GiB: the training state alone (135M x 16 B
    # over 2 devices, 1.1 GiB) does not fit, so every call on the device ends at one row per micro-batch.
    from planning.estimator import estimate_plan, hardware

    cfg = _cfg("model=smollm2-135m", "rollout.num_prompts=2", "rollout.num_samples_per_prompt=2")
    specs = model_specs(cfg)
    w = workload(cfg, specs)
    hw = replace(hardware("cpu", 1, 2), gpu_memory_bytes=1 << 30)
    fitted = fit_microbatches(realm_heuristic_plan(cfg.cluster, specs, rows=4, seq_len=304), w, hw)
    assert not estimate_plan(fitted, w, hw).fits
    assert {a.num_microbatches for a in fitted.calls.values()} == {2}  # 4 rows / dp 2


def test_disjoint_gives_each_role_its_own_devices():
    cfg = _cfg("cluster.devices_per_node=5", "cluster.plan=disjoint")
    calls = resolve_plan(cfg, model_specs(cfg)).calls
    assert calls["actor_gen"].devices == (0, 1) and calls["actor_gen"].dp == 2
    assert calls["actor_train"].devices == (2,)
    assert calls["critic_inf"].devices == calls["critic_train"].devices == (3,)
    assert calls["ref_inf"].devices == (4,)


def test_disjoint_on_too_few_devices_says_how_many_it_needs():
    cfg = _cfg("cluster.plan=disjoint", "+reward=prm")  # 5 roles, local_cpu has 2 devices
    with pytest.raises(
        PlanError,
        match=r"5 roles need 5 devices, the cluster has 2 \(cluster.num_nodes=1 x "
        r"cluster.devices_per_node=2\)",
    ):
        resolve_plan(cfg, model_specs(cfg))


def _write(tmp_path: Path, plan: ExecutionPlan) -> Path:
    path = tmp_path / "my_plan.yaml"
    path.write_text(plan.to_yaml())
    return path


def test_plan_file_is_loaded_validated_and_written_to_the_run_dir(tmp_path):
    cfg = _cfg("cluster=gpu_1x8", "model=qwen2.5-math-1.5b-instruct")
    specs = model_specs(cfg)
    wanted = realm_disjoint_plan(cfg.cluster, specs)
    path = _write(tmp_path, wanted)
    cfg.cluster.plan = str(path)
    plan = resolve_plan(cfg, specs, run_dir=tmp_path / "run")
    assert plan.calls == wanted.calls
    assert ExecutionPlan.load(tmp_path / "run" / PLAN_FILE).calls == wanted.calls


def test_plan_file_for_another_cluster_names_the_field(tmp_path):
    cfg = _cfg("cluster=gpu_1x8", "model=qwen2.5-math-1.5b-instruct")
    other = realm_heuristic_plan(replace(cfg.cluster, devices_per_node=4), model_specs(cfg), rows=8, seq_len=8)
    cfg.cluster.plan = str(_write(tmp_path, other))
    with pytest.raises(PlanError, match=r"my_plan.yaml: gpus_per_node=4 but cluster.devices_per_node=8"):
        resolve_plan(cfg, model_specs(cfg))


def test_plan_file_with_a_tp_the_model_cannot_take_names_call_and_field(tmp_path):
    cfg = _cfg("cluster=gpu_1x8", "model=qwen2.5-math-1.5b-instruct")  # 12 heads, 2 kv heads
    specs = model_specs(cfg)
    plan = realm_heuristic_plan(cfg.cluster, specs, rows=8, seq_len=8)
    calls = dict(plan.calls, actor_gen=CallAllocation(devices=tuple(range(8)), dp=1, tp=8))
    cfg.cluster.plan = str(_write(tmp_path, replace(plan, calls=calls)))
    with pytest.raises(PlanError, match=r"my_plan.yaml: calls.actor_gen.tp=8 does not divide num_attention_heads=12"):
        resolve_plan(cfg, specs)
    # tp 3 divides the 12 heads, but neither divides the other with the 2 kv heads.
    calls = dict(plan.calls, ref_inf=CallAllocation(devices=tuple(range(6)), dp=2, tp=3))
    cfg.cluster.plan = str(_write(tmp_path, replace(plan, calls=calls)))
    with pytest.raises(PlanError, match=r"calls.ref_inf.tp=3 and num_key_value_heads=2: one must divide the other"):
        resolve_plan(cfg, specs)


def test_a_missing_plan_file_names_it(tmp_path):
    cfg = _cfg("cluster.plan=" + str(tmp_path / "nope.yaml"))
    with pytest.raises(PlanError, match="nope.yaml: cannot read execution plan"):
        resolve_plan(cfg, model_specs(cfg))


def test_a_hub_model_without_shape_says_which_key_to_set():
    cfg = _cfg("model=qwen2.5-math-7b", "model.shape.num_hidden_layers=0")
    with pytest.raises(PlanError, match=r"model: the shape of 'qwen2.5-math-7b' .* give model.shape"):
        model_specs(cfg)


def test_a_cluster_config_reaches_the_rule_unchanged():
    cluster = ClusterConfig(num_nodes=2, devices_per_node=4, backend="nccl", hardware="h100")
    cfg = _cfg("model=qwen2.5-math-7b")
    plan = realm_heuristic_plan(cluster, model_specs(cfg), rows=64, seq_len=2048)
    assert (plan.num_nodes, plan.gpus_per_node, plan.num_devices) == (2, 4, 8)


def test_search_returns_a_fitting_plan_within_its_budget_and_writes_it(tmp_path):
    import time

    from planning.estimator import estimate_plan, hardware
    from trainer.plan_select import workload

    cfg = _cfg(
        "cluster=gpu_1x8", "model=qwen2.5-math-7b-instruct", "cluster.plan=search", "cluster.plan_search_seconds=1"
    )
    specs = model_specs(cfg)
    t = time.monotonic()
    plan = resolve_plan(cfg, specs, run_dir=tmp_path)
    assert time.monotonic() - t < 20  # 1 s of search plus baselines and set-up
    assert plan.source == "search" and plan.num_devices <= 8
    assert estimate_plan(plan, workload(cfg, specs), hardware("h100", 1, 8)).fits
    assert ExecutionPlan.load(tmp_path / PLAN_FILE).calls == plan.calls


@pytest.mark.parametrize("experiment", ["reward_paper_1.5b", "reward_paper_7b"])
@pytest.mark.parametrize("cluster", ["gpu_1x8", "gpu_2x8"])
def test_searched_recipe_plans_run_on_the_plan_runtime_and_beat_the_rule(experiment, cluster):
    """The search looks only at layouts the runtime runs (no pp; training and inference TP that divides
    the kv heads), starts from the rule's plan as well, and so never returns a slower one. The 7B
    recipe (32,768 sequences per iteration) fits only with hundreds of micro-batches per training call."""
    from planning.builders import realm_heuristic_plan
    from planning.estimator import estimate_plan, hardware
    from runtime.driver import check_supported
    from trainer.plan_select import workload

    cfg = _cfg(f"experiment={experiment}", f"cluster={cluster}", "cluster.plan=search", "cluster.plan_search_seconds=1")
    specs = model_specs(cfg)
    plan = resolve_plan(cfg, specs)
    check_supported(plan, specs)
    w, hw = workload(cfg, specs), hardware("h100", cfg.cluster.num_nodes, 8)
    r = cfg.rollout
    rule = realm_heuristic_plan(cfg.cluster, specs, rows=r.num_prompts * r.num_samples_per_prompt, seq_len=2048)
    searched, ruled = estimate_plan(plan, w, hw), estimate_plan(rule, w, hw)
    assert searched.fits and searched.seconds_per_iteration <= ruled.seconds_per_iteration


@pytest.mark.parametrize(
    "model, named",
    [
        ("qwen2.5-math-1.5b-instruct", "qwen2.5-math-1.5b"),
        ("qwen2.5-math-7b", "qwen2.5-math-7b"),
        ("smollm2-135m", "smollm2-135m"),
    ],
)
def test_model_config_shapes_agree_with_the_plan_searchs_named_shapes(model, named):
    from planning.shapes import named_spec

    assert model_spec(_cfg(f"model={model}").model) == named_spec(named)


def test_a_public_prm_is_planned_from_its_known_shape_without_download():
    cfg = _cfg(
        "cluster=gpu_1x8",
        "model=qwen2.5-math-1.5b-instruct",
        "+reward=prm",
        "reward.model.path=peiyi9979/math-shepherd-mistral-7b-prm",
    )
    specs = model_specs(cfg)
    assert round(specs["reward"].num_params() / 1e9, 2) == 7.24  # Mistral-7B
    rew = resolve_plan(cfg, specs).calls["rew_inf"]
    assert (rew.tp, rew.dp, rew.offload) == (1, 8, True)  # 14.5 GB of weights per GPU, only during its call


def test_cluster_profile_prices_the_dry_run_with_measured_costs(tmp_path):
    """cluster.profile: the dry run's prediction comes from the profile (by path, here the one the earlier
    benchmarks used, docs/plan_calibration_profile.json, or by the name of one shipped, local_cpu's default:
    this machine's layer costs, its 2 cores and fixed call costs) instead of the cpu preset's analytic
    model; a missing file or a broken one is named."""
    from trainer.plan_select import plan_report

    profile = Path(__file__).resolve().parents[2] / "docs" / "plan_calibration_profile.json"
    analytic = plan_report(_cfg("cluster.plan=heuristic", "cluster.profile=")).summary
    measured = plan_report(_cfg("cluster.plan=heuristic", f"cluster.profile={profile}")).summary
    shipped = plan_report(_cfg("cluster.plan=heuristic")).summary
    assert len({analytic, measured, shipped}) == 3 and "predicted" in measured
    with pytest.raises(ValueError, match="cluster.profile=.*no such file"):
        _cfg(f"cluster.profile={tmp_path / 'missing.json'}")
    (tmp_path / "broken.json").write_text("{}")
    with pytest.raises(PlanError, match=r"cluster.profile: .*broken.json: missing key 'device'"):
        plan_report(_cfg(f"cluster.profile={tmp_path / 'broken.json'}"))


def test_h200_clusters_price_with_the_shipped_h200_profile():
    """cluster.hardware=h200 with no cluster.profile prices with planning/profiles/h200.json (the only
    hardware realm ships a profile of), and says so on the dry run's cluster line; cluster.profile=analytic
    gives the h200 preset's analytic model, and h100 has no profile to take."""
    from planning.config import hardware_profile
    from trainer.plan_select import cluster_hardware, plan_report

    h200 = _cfg("experiment=reward_paper_1.5b", "cluster=gpu_1x8", "cluster.hardware=h200")
    analytic = _cfg(
        "experiment=reward_paper_1.5b", "cluster=gpu_1x8", "cluster.hardware=h200", "cluster.profile=analytic"
    )
    assert (h200.cluster.cost_profile, analytic.cluster.cost_profile) == ("h200", "")
    assert (hardware_profile("h200"), hardware_profile("h100"), hardware_profile("cpu")) == ("h200", "", "")
    assert cluster_hardware(h200.cluster).profile.device == "NVIDIA H200 (bfloat16)"
    assert cluster_hardware(analytic.cluster).profile is None
    assert "1 x 8 h200 (time: profile h200)" in plan_report(h200).lines[0]
    assert "1 x 8 h200 (time: analytic h200 preset)" in plan_report(analytic).lines[0]


def test_the_cpu_default_searches_the_side_by_side_plan_well_inside_its_budget():
    """local_cpu's default (search, priced with the shipped cpu-2core profile, at the default run's longest
    prompt): actor and critic trained side by side, one on each device, generation in one wave on both; the
    same plan from a twentieth of the 1 CPU-second budget as from all of it."""
    import time

    from planning.search import search

    cfg = _cfg()
    assert (cfg.cluster.plan, cfg.cluster.profile, cfg.cluster.plan_search_seconds) == ("search", "cpu-2core", 1.0)
    specs = model_specs(cfg)
    w, hw = workload(cfg, specs, longest_prompt=39), cluster_hardware(cfg.cluster)
    plans = [search(w, hw, seconds_budget=b, clock=time.process_time).plan for b in (0.05, 1.0)]
    assert plans[0].calls == plans[1].calls
    calls = plans[1].calls
    assert {calls["actor_train"].devices, calls["critic_train"].devices} == {(0,), (1,)}
    assert calls["actor_gen"].devices == (0, 1) and calls["actor_gen"].num_microbatches == 1


@pytest.mark.parametrize("one_step", [False, True])
def test_the_graph_has_actor_inf_exactly_when_the_runtime_runs_it(one_step):
    """GRPO with one optimizer step per batch reuses the update's logprobs (``ppo.config.reuses_update_logprobs``):
    the runtime runs no actor_inf, so the workload, the estimator's calls, the lifecycle's holdings and the dry
    run's table have none either; with its default 2 epochs x 4 minibatches they all have it."""
    from planning.estimator import estimate_plan, lifecycle_inputs
    from planning.lifecycle import holdings
    from trainer.plan_select import plan_report

    steps = ("ppo.num_epochs=1", "ppo.num_minibatches=1") if one_step else ()
    cfg = _cfg("algorithm=grpo", "cluster=gpu_1x8", "model=qwen2.5-math-1.5b-instruct", *steps)
    specs = model_specs(cfg)
    plan, w, hw = resolve_plan(cfg, specs), workload(cfg, specs), cluster_hardware(cfg.cluster)
    assert w.old_logprobs_pass is not one_step
    assert ("actor_inf" in estimate_plan(plan, w, hw).call_seconds) is not one_step
    assert any(h.during == "actor_inf" for h in holdings(plan.calls, lifecycle_inputs(w, hw))) is not one_step
    (line,) = [x for x in plan_report(cfg).lines if x.split()[0] == "actor_inf"]
    assert line.split()[1] == "none:" if one_step else re.search(r"devices 0-7 .* \d+\.\d\d s  old logprobs$", line)
