"""The device-memory lifecycle: what each device holds in each phase, worked by hand on a small plan;
the cost model's peaks are its fullest phases; the recipes' plans fit their GPUs in every phase."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from planning.communicators import COMMUNICATOR_BYTES, NCCL_STATE_BYTES, device_communicators, engine_communicators
from planning.estimator import Workload, evaluator, hardware, memory_lifecycle
from planning.execution_plan import CallAllocation, ExecutionPlan
from planning.lifecycle import (
    CUDA_CONTEXT_BYTES,
    GRAPH_POOL_OVERHEAD_BYTES,
    Inputs,
    Kind,
    Phase,
    activation_bytes,
    engine_batch_limits,
    engine_workspace_bytes,
    engines_sleep,
    kv_cache_bytes,
)
from planning.shapes import named_spec

SPEC = named_spec("qwen2.5-math-1.5b")
GIB = float(1 << 30)


def _plan(offload: bool) -> ExecutionPlan:
    both = (0, 1)
    return ExecutionPlan(
        1,
        2,
        {
            "actor_gen": CallAllocation(both, dp=2),
            "ref_inf": CallAllocation(both, dp=2, offload=offload),
            "critic_inf": CallAllocation(both, dp=2),
            "actor_train": CallAllocation(both, dp=2),
            "critic_train": CallAllocation(both, dp=2),
        },
    )


def _workload() -> Workload:
    return Workload(SPEC, SPEC, None, batch=8, prompt_len=96, gen_len=160)


def test_a_colocated_plan_by_hand():
    """Everything on two GPUs, bf16: per device the actor and the critic each keep float32 weights and
    Adam (12 B a parameter over 2 FSDP ranks) in every phase and float32 gradients (4 B) only during
    their own training call; the offloaded reference waits on the host; the engine (its own bf16 copy, 2 B a parameter,
    and a wave of 4 sequences x 256 tokens of KV) is awake to generate, holds only its weights while they
    are reloaded, and sleeps while training and inference use the GPU."""
    plan, w, hw = _plan(offload=True), _workload(), hardware("h100", 1, 2)
    life = memory_lifecycle(plan, w, hw)
    n = SPEC.num_params()
    x = Inputs(w.specs(), w.batch, w.prompt_len, w.gen_len, 2, gpu=True)
    state = 2 * 12 * n / 2  # actor and critic, weights + Adam, half each on this device
    kv = kv_cache_bytes(SPEC, plan.calls["actor_gen"], x)
    assert kv == 4 * 256 * 2 * SPEC.num_kv_heads * SPEC.head_dim * 2 * SPEC.num_layers
    # The device process and the engine's CUDA contexts, and the device process's one NCCL communicator: every
    # group of two devices here is (0, 1), the world too (the engine, tp1 pp1, has none).
    assert device_communicators(plan.calls, 0) == 1 and engine_communicators(plan.calls["actor_gen"]) == 0
    contexts = 2 * CUDA_CONTEXT_BYTES + NCCL_STATE_BYTES + COMMUNICATOR_BYTES
    # The engine's working memory at its batch limits: the wave's 4 sequences and 4 x 256 = 1024 tokens a step.
    assert life.engine_batch == engine_batch_limits(plan.calls["actor_gen"], x) == (4, 1024)
    workspace = engine_workspace_bytes(SPEC, 4, 1024, 2, eager=True)
    assert workspace == 1024 * 66_048 + 4 * SPEC.vocab_size * (2 + 4 * 4)  # engine_workspace_bytes's example shape
    assert life.engine_budget(0)[Kind.activations] == workspace
    assert life.bytes(0, Phase.generate) == pytest.approx(state + 2 * n + kv + workspace + contexts)
    # The two trainings run one after the other here: each call's activations and its own model's gradients.
    train = max(activation_bytes(c, SPEC, plan.calls[c], x) + 4 * n / 2 for c in ("actor_train", "critic_train"))
    assert life.bytes(0, Phase.train) == pytest.approx(state + train + contexts)
    infer = max(
        activation_bytes("ref_inf", SPEC, plan.calls["ref_inf"], x) + 2 * n,  # the reference visits for its call
        activation_bytes("critic_inf", SPEC, plan.calls["critic_inf"], x),
    )
    assert life.bytes(0, Phase.infer) == pytest.approx(state + infer + contexts)
    # Reallocating: the engine's weights, one 64 MiB bucket in flight, and the shards handed to the engine
    # (its weights once more) until it has loaded them; these two live only while realloc_actor runs.
    assert life.bytes(0, Phase.reallocate) == pytest.approx(state + 2 * n + (64 << 20) + 2 * n + contexts)
    assert life.transient(0, "realloc_actor") == {
        ("transfer", Kind.buffers): "device",
        ("handoff", Kind.buffers): "device",
    }
    assert life.transient(0, "actor_train") == {} and life.transient(0, "realloc_critic") == {}
    phases = life.to_json()["devices"]["0"]
    assert phases["reallocate"]["during"] == {
        "realloc_actor": {"handoff/buffers": "device", "transfer/buffers": "device"}
    }
    assert all("during" not in phases[p] for p in ("generate", "infer", "train"))
    assert engines_sleep(plan.calls, gpu=True) and not engines_sleep(plan.calls, gpu=False)
    assert life.residency(0, Phase.generate) == {
        ("actor", Kind.weights): "device",
        ("actor", Kind.optimizer): "device",
        ("critic", Kind.weights): "device",
        ("critic", Kind.optimizer): "device",
        ("ref", Kind.weights): "host",
        ("engine", Kind.weights): "device",
        ("engine", Kind.kv_cache): "device",
    }
    train_residency = life.residency(0, Phase.train)  # gradients come and go inside their training call
    assert ("actor", Kind.gradients) not in train_residency and ("engine", Kind.weights) not in train_residency
    realloc = life.residency(0, Phase.reallocate)
    assert realloc[("engine", Kind.weights)] == "device" and ("engine", Kind.kv_cache) not in realloc
    budget = life.engine_budget(1)
    assert budget[Kind.weights] == pytest.approx(2 * n) and budget[Kind.kv_cache] == pytest.approx(kv)


def test_engine_batch_limits_follow_the_wave_within_vllms_rules():
    """max_num_seqs: the sequences the KV cache holds (a wave per stage in flight); max_num_batched_tokens:
    verl's 8192-token chunk, at least max_num_seqs and max_model_len, at most max_num_seqs x max_model_len
    (vLLM 0.32 config/scheduler.py)."""

    def limits(batch: int, prompt: int, gen: int, **alloc) -> tuple[int, int]:
        x = Inputs({"actor": SPEC}, batch, prompt, gen, 2, gpu=True)
        return engine_batch_limits(CallAllocation(tuple(range(alloc.pop("n", 1))), **alloc), x)

    assert limits(512, 1024, 1024, n=4, dp=4, num_microbatches=2) == (64, 8192)  # a wave of 512 / (4 x 2)
    assert limits(16, 256, 48) == (16, 4864)  # 16 x 304 tokens is all a step could hold
    assert limits(512, 1024, 1024, n=4, dp=2, pp=2, num_microbatches=4) == (128, 8192)  # 2 stages in flight
    assert limits(2, 12_000, 4000) == (2, 16_000)  # one whole prompt + response per step
    assert limits(20_000, 16, 16) == (20_000, 20_000)  # never below max_num_seqs
    assert limits(10, 256, 48, n=4, dp=4) == (3, 912)  # ceil(10 / 4) sequences


def test_engine_workspace_of_a_qwen2_1_5b_shape_by_hand():
    """engine_workspace_bytes's worked example, a Qwen2-1.5B shape in bf16 at 256 sequences and 8192 tokens a
    step: 66,048 B of one layer's activations a token, the sampler's float32 logits 256 x 151,936 x 4 B =
    148.4 MiB (four such copies and the bf16 logits), and with CUDA graphs a 512-token pool and 256 MiB."""
    assert (SPEC.hidden_size, SPEC.intermediate_size, SPEC.num_heads, SPEC.num_kv_heads, SPEC.head_dim) == (
        1536,
        8960,
        12,
        2,
        128,
    )
    assert SPEC.vocab_size == 151_936
    logits_fp32 = 256 * 151_936 * 4
    assert logits_fp32 / 2**20 == pytest.approx(148.375)
    per_token = 2 * (2 * 1536 + (2 * 1536 + 3 * 8960))  # the MLP block is the fuller one
    assert per_token == 66_048
    eager = engine_workspace_bytes(SPEC, 256, 8192, 2, eager=True)
    assert eager == 8192 * per_token + 4 * logits_fp32 + 256 * 151_936 * 2
    assert eager / GIB == pytest.approx(1.156, abs=5e-4)
    graphs = engine_workspace_bytes(SPEC, 256, 8192, 2, eager=False)
    assert graphs - eager == 512 * per_token + GRAPH_POOL_OVERHEAD_BYTES
    assert graphs / GIB == pytest.approx(1.437, abs=5e-4)
    # vLLM's H100 defaults, 1024 sequences and 16,384 tokens a step, would need 3.616 GiB eager.
    assert engine_workspace_bytes(SPEC, 1024, 16_384, 2, eager=True) / GIB == pytest.approx(3.616, abs=5e-4)
    # Under TP 2 each rank holds half the attention heads and half the intermediate; the sampler's full vocabulary.
    tp2 = engine_workspace_bytes(SPEC, 256, 8192, 2, eager=True, tp=2)
    assert eager - tp2 == 8192 * 2 * (3 * 8960 / 2)


def test_graph_pools_are_priced_only_without_enforce_eager():
    """rollout.enforce_eager (default true) prices no graph pool; false adds it to the generate phase of every
    generation device and nowhere else."""
    plan, hw = _plan(offload=True), hardware("h100", 1, 2)
    eager = memory_lifecycle(plan, _workload(), hw)
    graphs = memory_lifecycle(
        plan, Workload(SPEC, SPEC, None, batch=8, prompt_len=96, gen_len=160, engine_eager=False), hw
    )
    pool = min(2 * 4, 512, 1024) * 66_048 + GRAPH_POOL_OVERHEAD_BYTES
    assert graphs.bytes(0, Phase.generate) - eager.bytes(0, Phase.generate) == pytest.approx(pool)
    assert graphs.bytes(0, Phase.train) == eager.bytes(0, Phase.train)


def test_on_cpu_the_engine_never_sleeps_and_a_resident_reference_stays():
    life = memory_lifecycle(_plan(offload=False), _workload(), hardware("cpu", 1, 2))
    for phase in Phase:
        here = life.residency(1, phase)
        assert here[("engine", Kind.weights)] == here[("engine", Kind.kv_cache)] == "device", phase
        assert here[("ref", Kind.weights)] == "device", phase


def test_the_cost_models_peak_is_the_lifecycles_fullest_phase():
    plan, w, hw = _plan(offload=True), _workload(), hardware("h100", 1, 2)
    life = memory_lifecycle(plan, w, hw)
    cost = evaluator(w, hw).estimate(tuple(plan.calls.items()))
    assert cost.peak_bytes_per_device == pytest.approx({d: life.fullest(d)[1] for d in (0, 1)})


CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _recipe(experiment: str, cluster: str, gpu: str, plan: str):
    from trainer.compose import to_train_config
    from trainer.config import register_configs

    register_configs()
    overrides = [f"experiment={experiment}", f"cluster={cluster}", f"cluster.hardware={gpu}", f"cluster.plan={plan}"]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=[*overrides, "cluster.plan_search_seconds=2"]))


@pytest.mark.parametrize("plan", ["heuristic", "search"])
@pytest.mark.parametrize("gpu", ["h100", "h200"])
@pytest.mark.parametrize("cluster", ["gpu_1x8", "gpu_2x8"])
@pytest.mark.parametrize("experiment", ["reward_paper_1.5b", "reward_paper_7b"])
def test_the_recipes_plans_fit_every_device_in_every_phase(experiment, cluster, gpu, plan):
    """The engine's budget while it generates, with everything else the device holds then, and every
    other phase, fit the GPU (what vLLM checks at start-up and at wake-up, and what training needs)."""
    from trainer.plan_select import model_specs, resolve_plan, workload

    cfg = _recipe(experiment, cluster, gpu, plan)
    specs = model_specs(cfg)
    chosen = resolve_plan(cfg, specs)
    cl = cfg.cluster
    hw = hardware(cl.hardware, cl.num_nodes, cl.devices_per_node)
    life = memory_lifecycle(chosen, workload(cfg, specs), hw)
    for d in life.devices:
        phase, used = life.fullest(d)
        assert used <= hw.gpu_memory_bytes, f"device {d}: {phase} needs {used / GIB:.1f} GiB"
    for d in chosen.calls["actor_gen"].devices:
        engine = sum(life.engine_budget(d).values())
        others = life.bytes(d, Phase.generate) - engine
        assert engine + others <= hw.gpu_memory_bytes and engine > 0


def test_a_tensor_parallel_engine_reload_prices_its_largest_full_size_parameter(tiny_model_dir):
    """A TP engine rank takes each split parameter checkpoint-shaped (``reallocation.names.checkpoint_shaped``):
    the lifecycle prices the largest such tensor during the actor's reallocation, on generation devices only;
    a tp=1 engine takes its boxes as they are. Checked against what checkpoint_shaped allocates for the tiny
    model's tp=2 boxes, in the compute dtype."""
    import torch

    from planning.lifecycle import engine_reload_bytes
    from reallocation.layout import ModelSpec
    from reallocation.names import checkpoint_shaped, vllm_layout

    tiny = ModelSpec.from_config_json(tiny_model_dir / "config.json")
    layout, allocated = vllm_layout(tp=2), []
    for param in tiny.params():
        box = layout.box(param, 1, tiny)
        shard = torch.zeros([stop - start for start, stop in box], dtype=torch.bfloat16)
        full = checkpoint_shaped(shard, box, param.shape)
        allocated.append(0 if full is shard else full.numel() * full.element_size())
    two, one = CallAllocation((0, 1), tp=2), CallAllocation((0, 1), dp=2)
    assert engine_reload_bytes(tiny, two, 2) == max(allocated) > 0
    assert engine_reload_bytes(tiny, one, 2) == 0
    both = (0, 1)
    calls = {c: CallAllocation(both, dp=2) for c in ("ref_inf", "critic_inf", "actor_train", "critic_train")}
    x = Inputs({"actor": SPEC, "critic": SPEC, "ref": SPEC}, 8, 96, 160, 2, gpu=True)
    from planning.lifecycle import memory_lifecycle as lifecycle_of

    tp1 = lifecycle_of({**calls, "actor_gen": CallAllocation(both, dp=2)}, x, 80e9)
    tp2 = lifecycle_of({**calls, "actor_gen": CallAllocation(both, tp=2)}, x, 80e9)
    halved = SPEC.num_params() * 2 / 2  # the engine's weights: a tp=2 rank holds half
    want = engine_reload_bytes(SPEC, CallAllocation(both, tp=2), 2)
    assert want == SPEC.vocab_size * SPEC.hidden_size * 2  # the embedding (and the head) of the 1.5B
    engine_nccl = NCCL_STATE_BYTES + COMMUNICATOR_BYTES  # the tp=2 engine's tensor-parallel communicator
    # The engine's weights and the shards handed to it (the same bytes) both halve.
    assert tp2.bytes(0, Phase.reallocate) - tp1.bytes(0, Phase.reallocate) == pytest.approx(
        want - 2 * halved + engine_nccl
    )
    assert tp2.bytes(0, Phase.generate) - tp1.bytes(0, Phase.generate) < 0  # not outside the reload
