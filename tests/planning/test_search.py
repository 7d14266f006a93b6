"""Execution-plan cost model and search: worked costs a person can check, the knobs, the
baselines' rules, and search results against the baselines."""

import re

import pytest

from planning.builders import openrlhf_disjoint_plan, real_heuristic_plan, symmetric_plan
from planning.candidates import candidates, device_meshes, strategies
from planning.estimator import (
    Hardware,
    LayoutLimits,
    Workload,
    call_memory,
    call_seconds,
    estimate_plan,
    hardware,
    lifecycle_inputs,
    offload_seconds,
    realloc_seconds,
    training_layout_forward_seconds,
)
from planning.execution_plan import CallAllocation, ExecutionPlan, PlanError
from planning.search import NoFitError, main, model_shape, search, search_plan
from planning.shapes import named_spec

QWEN_1_5B = named_spec("qwen2.5-math-1.5b")
LLAMA_7B = named_spec("llama-2-7b")
HW = hardware("a100-80g", 1, 8)
PAPER_7B = Workload(LLAMA_7B, LLAMA_7B, LLAMA_7B, batch=512, prompt_len=128, gen_len=896)


def test_named_specs_have_published_sizes(tmp_path):
    assert named_spec("llama-2-7b").num_params() == pytest.approx(6.74e9, rel=0.01)
    assert named_spec("70B").num_params() == pytest.approx(68.98e9, rel=0.01)
    assert named_spec("qwen2.5-math-1.5b").num_params() == pytest.approx(1.54e9, rel=0.01)
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 96,'
        ' "num_attention_heads": 4, "vocab_size": 128}'
    )
    assert named_spec(str(tmp_path)).num_kv_heads == 4
    with pytest.raises(ValueError, match="unknown model 'gpt-5'"):
        named_spec("gpt-5")


def test_fan_out_charges_the_sender_for_every_copy():
    spec = QWEN_1_5B
    one = CallAllocation(devices=(0,))
    full = spec.num_params() * 2
    latency = 10 * HW.collective_latency_s
    single = realloc_seconds(spec, one, "train", CallAllocation(devices=(1,)), "generate", HW)
    assert single == pytest.approx(full / HW.intra_node_bytes_per_s + latency, rel=1e-6)
    # 1 GPU -> 8 replicas: GPU 0 keeps its own copy and sends 7.
    eight = realloc_seconds(spec, one, "train", CallAllocation(devices=tuple(range(8)), dp=8), "generate", HW)
    assert eight == pytest.approx(7 * full / HW.intra_node_bytes_per_s + latency, rel=1e-6)
    fsdp = CallAllocation(devices=tuple(range(8)), dp=8)
    assert realloc_seconds(spec, fsdp, "train", fsdp, "train", HW) == 0.0


def test_same_node_sources_keep_reallocation_off_the_node_link():
    spec = LLAMA_7B
    two = Hardware(num_nodes=2)
    slow_nic = Hardware(num_nodes=2, inter_node_bytes_per_s=1.0)
    src = CallAllocation(devices=tuple(range(16)), dp=2, tp=8)  # one tp8 replica per node
    dst = CallAllocation(devices=tuple(range(8, 16)), dp=2, tp=4)  # on node 1 only
    fast = realloc_seconds(spec, src, "generate", dst, "generate", two)
    assert 0 < fast < 1 and realloc_seconds(spec, src, "generate", dst, "generate", slow_nic) == fast
    # Moving to node 1 from a replica that lives only on node 0 must use the node link.
    node0 = CallAllocation(devices=tuple(range(8)), tp=8)
    assert realloc_seconds(spec, node0, "generate", dst, "generate", slow_nic) > 1e6


def test_micro_batches_and_checkpointing_trade_memory_for_time():
    call, n = "actor_train", LLAMA_7B.num_params()
    plain = CallAllocation(devices=tuple(range(8)), dp=8)
    res, act = call_memory(call, LLAMA_7B, plain, PAPER_7B)
    assert res == pytest.approx(n * 16 / 8)  # float32 weights, gradients, Adam m and v (planning.lifecycle)
    assert res + act > HW.gpu_memory_bytes  # 64 sequences of 1024 tokens per GPU do not fit at once
    eight = CallAllocation(devices=tuple(range(8)), dp=8, num_microbatches=8)
    ckpt = CallAllocation(devices=tuple(range(8)), dp=8, activation_checkpointing=True)
    assert sum(call_memory(call, LLAMA_7B, eight, PAPER_7B)) < HW.gpu_memory_bytes
    assert call_memory(call, LLAMA_7B, ckpt, PAPER_7B)[1] < act / 5
    # Checkpointing reruns the forward: 4 passes instead of 3 of compute (the same FSDP traffic).
    t_plain, t_ckpt = (call_seconds(call, LLAMA_7B, a, PAPER_7B, HW) for a in (plain, ckpt))
    assert 1.2 < t_ckpt / t_plain <= 4 / 3 + 1e-9
    # More micro-batches: more weight all-gathers and smaller matmuls, so never faster here.
    assert call_seconds(call, LLAMA_7B, eight, PAPER_7B, HW) > t_plain


def test_a_float32_run_is_priced_at_four_bytes_a_value():
    """The same calls in float32: weights, activations (34 -> 68 B per token, hidden unit and layer) and
    KV cache double; training state is 16 B per parameter in both (float32 master, gradients, Adam: FSDP2
    casts to bf16 per layer as it computes)."""
    from dataclasses import replace

    fp32 = replace(PAPER_7B, value_bytes=4)
    n, eight = LLAMA_7B.num_params(), CallAllocation(devices=tuple(range(8)), dp=8, num_microbatches=8)
    assert call_memory("ref_inf", LLAMA_7B, eight, fp32)[0] == pytest.approx(n * 4)
    res, act = call_memory("actor_train", LLAMA_7B, eight, fp32)
    res16, act16 = call_memory("actor_train", LLAMA_7B, eight, PAPER_7B)
    logits = 2 * PAPER_7B.batch * PAPER_7B.seq_len / 64 * LLAMA_7B.vocab_size * 4  # fp32 in both
    assert (res, res16) == (pytest.approx(n * 16 / 8), pytest.approx(n * 16 / 8))
    assert act - logits == pytest.approx(2 * (act16 - logits))
    gen = CallAllocation(devices=(0,), num_microbatches=64)
    assert call_memory("actor_gen", LLAMA_7B, gen, fp32)[1] == pytest.approx(
        2 * call_memory("actor_gen", LLAMA_7B, gen, PAPER_7B)[1]
    )


def test_training_is_priced_per_epoch_and_step_and_the_old_logprobs_forward_is_a_call_of_its_own():
    """On one GPU: 2 epochs of 4 steps cost twice the passes and 8 Adam steps; the old logprobs'
    forward is actor_inf, a third of one epoch's 3 passes on actor training's layout, not part of
    actor_train; pipeline flushes after every minibatch cost bubbles."""
    from dataclasses import replace

    one, n = CallAllocation(devices=(0,), num_microbatches=8), LLAMA_7B.num_params()
    base = call_seconds("actor_train", LLAMA_7B, one, PAPER_7B, HW)
    adam = 2 * n * (16 - 2) / HW.hbm_bytes_per_s
    passes = base - adam
    epochs = replace(PAPER_7B, num_epochs=2, num_minibatches=4)
    assert call_seconds("actor_train", LLAMA_7B, one, epochs, HW) == pytest.approx(2 * passes + 8 * adam)
    old = replace(PAPER_7B, old_logprobs_pass=True)
    assert call_seconds("actor_train", LLAMA_7B, one, old, HW) == pytest.approx(base)
    assert training_layout_forward_seconds(LLAMA_7B, one, old, HW) == pytest.approx(passes / 3)
    plan = ExecutionPlan(1, 8, {c: replace(one, offload=False) for c in PAPER_7B.calls})
    priced = estimate_plan(plan, old, HW).call_seconds
    assert (
        priced["actor_inf"] == pytest.approx(passes / 3)
        and "actor_inf" not in estimate_plan(plan, PAPER_7B, HW).call_seconds
    )
    staged = CallAllocation(devices=(0, 1), pp=2, num_microbatches=8)
    flushed = replace(PAPER_7B, num_minibatches=4)  # 2 micro-batches per flush: bubble 3/2, not 9/8
    assert call_seconds("actor_train", LLAMA_7B, staged, flushed, HW) > call_seconds(
        "actor_train", LLAMA_7B, staged, PAPER_7B, HW
    )


def test_offload_frees_resident_memory_and_costs_a_reload():
    alloc = CallAllocation(devices=(0, 1), dp=2)
    off = CallAllocation(devices=(0, 1), dp=2, offload=True)
    weights = LLAMA_7B.num_params() * 2
    assert call_memory("ref_inf", LLAMA_7B, alloc, PAPER_7B)[0] == pytest.approx(weights)
    assert call_memory("ref_inf", LLAMA_7B, off, PAPER_7B)[0] == 0.0
    assert offload_seconds(LLAMA_7B, off, HW) == pytest.approx(weights / HW.host_bytes_per_s)
    assert offload_seconds(LLAMA_7B, alloc, HW) == 0.0


def test_serialized_plan_costs_the_sum_of_its_calls_and_its_reallocations():
    w = Workload(QWEN_1_5B, QWEN_1_5B, None, batch=64, prompt_len=128, gen_len=128)
    every = tuple(range(8))
    calls = {c: CallAllocation(every, dp=8) for c in w.calls}
    calls["actor_gen"] = CallAllocation(every, dp=2, tp=4)
    calls["critic_inf"] = CallAllocation(every, dp=4, tp=2)  # a layout of its own: the critic moves there
    plan = ExecutionPlan(1, 8, calls)
    cost = estimate_plan(plan, w, HW)
    to_engine = realloc_seconds(QWEN_1_5B, calls["actor_train"], "train", calls["actor_gen"], "generate", HW)
    to_critic_inf = realloc_seconds(QWEN_1_5B, calls["critic_train"], "train", calls["critic_inf"], "inference", HW)
    assert to_engine > 0 and to_critic_inf > 0
    # One way only: the training shards stay; generation and critic inference get copies.
    assert cost.realloc_seconds == pytest.approx(to_engine + to_critic_inf)
    # Every call shares all 8 GPUs, so an iteration is every call plus every move, one after another.
    assert cost.seconds_per_iteration == pytest.approx(sum(cost.call_seconds.values()) + cost.realloc_seconds)
    assert cost.fits and set(cost.peak_bytes_per_device) == set(every)
    # Critic inference on critic training's devices and layout runs on the training shards: no move.
    shared = dict(calls, critic_inf=CallAllocation(every, dp=8))
    assert estimate_plan(ExecutionPlan(1, 8, shared), w, HW).realloc_seconds == pytest.approx(to_engine)


def test_disjoint_calls_overlap():
    w = Workload(QWEN_1_5B, QWEN_1_5B, QWEN_1_5B, batch=64, prompt_len=128, gen_len=128)
    every = tuple(range(8))
    calls = {c: CallAllocation(every, dp=8) for c in w.calls}
    together = dict(calls, rew_inf=CallAllocation((0, 1, 2, 3), dp=4), ref_inf=CallAllocation((0, 1, 2, 3), dp=4))
    apart = dict(together, ref_inf=CallAllocation((4, 5, 6, 7), dp=4))
    t_together = estimate_plan(ExecutionPlan(1, 8, together), w, HW).seconds_per_iteration
    t_apart = estimate_plan(ExecutionPlan(1, 8, apart), w, HW).seconds_per_iteration
    ref_alone = call_seconds("ref_inf", QWEN_1_5B, apart["ref_inf"], w, HW)
    assert t_together - t_apart == pytest.approx(ref_alone, rel=1e-6)


def test_estimate_plan_rejects_a_plan_for_other_hardware():
    w = Workload(QWEN_1_5B, QWEN_1_5B, None, batch=64, prompt_len=128, gen_len=128)
    plan = ExecutionPlan(1, 4, {c: CallAllocation((0,)) for c in w.calls})
    with pytest.raises(PlanError, match="plan is for 1x4 GPUs, hardware has 1x8"):
        estimate_plan(plan, w, HW)


def test_real_heuristic_follows_realhf_rule():
    two = hardware("a100-80g", 2, 8)
    plan = real_heuristic_plan(PAPER_7B, two)
    c = plan.calls
    assert (c["actor_gen"].devices, c["actor_gen"].pp, c["actor_gen"].dp, c["actor_gen"].tp) == (
        tuple(range(16)),
        2,
        8,
        1,
    )
    assert (c["ref_inf"].pp, c["ref_inf"].dp, c["ref_inf"].tp) == (2, 2, 4)
    # ceil(2 * 7 / 14) = 1 node for the actor, the other for the critic: dp2 x pp1 x tp4 each.
    assert c["actor_train"].devices == tuple(range(8)) and c["critic_train"].devices == tuple(range(8, 16))
    assert (c["actor_train"].pp, c["actor_train"].dp, c["actor_train"].tp) == (1, 2, 4)
    assert c["rew_inf"].devices == tuple(range(8)) and c["critic_inf"].devices == tuple(range(8, 16))
    one = real_heuristic_plan(PAPER_7B, HW).calls
    assert one["actor_train"].devices == (0, 1, 2, 3) and (one["actor_train"].dp, one["actor_train"].tp) == (2, 2)
    assert one["critic_inf"].devices == (4, 5, 6, 7)
    # 70B + 7B on 8 nodes: ceil(8 * 69 / 75.7) = 8, capped at 7 nodes; pp 7 does not divide 80
    # layers, so pp drops to 2 (the largest divisor of both 80 and 56 / tp4 = 14) and dp grows to 7.
    w = Workload(named_spec("70b"), LLAMA_7B, LLAMA_7B, 512, 128, 896)
    big = real_heuristic_plan(w, hardware("a100-80g", 8, 8)).calls["actor_train"]
    assert big.devices == tuple(range(56)) and (big.pp, big.dp, big.tp) == (2, 7, 4)
    for plan in (
        real_heuristic_plan(w, hardware("a100-80g", 8, 8)),
        symmetric_plan(PAPER_7B, HW),
        openrlhf_disjoint_plan(PAPER_7B, two),
    ):
        plan.validate(w.specs() if plan.num_nodes == 8 else PAPER_7B.specs())


def test_symmetric_and_disjoint_shapes():
    two = hardware("a100-80g", 2, 8)
    sym = symmetric_plan(PAPER_7B, two)
    assert {a.devices for a in sym.calls.values()} == {tuple(range(16))}
    assert len({a.tp for a in sym.calls.values()}) == 1 and all(a.pp == 1 for a in sym.calls.values())
    dis = openrlhf_disjoint_plan(PAPER_7B, two)
    groups = [set(dis.calls[c].devices) for c in ("actor_gen", "actor_train", "critic_train", "ref_inf", "rew_inf")]
    assert all(not (a & b) for i, a in enumerate(groups) for b in groups[i + 1 :])
    assert dis.calls["critic_inf"].devices == dis.calls["critic_train"].devices


def test_candidates_fit_alone_and_include_small_meshes_at_scale():
    hw = hardware("a100-80g", 16, 8)
    w = Workload(named_spec("70b"), named_spec("70b"), named_spec("70b"), 512, 128, 896)
    options = candidates("ref_inf", w, hw)
    assert any(len(a.devices) == 8 for a in options)  # a 70B forward fits on one node (tp8, or offloaded)
    assert all(sum(call_memory("ref_inf", w.actor, a, w)) <= hw.gpu_memory_bytes for a in options[:200])
    assert len(device_meshes(hw)) == 16 * (8 + 4 + 2 + 1) + sum(16 - k + 1 for k in range(2, 17))


def test_search_returns_a_fitting_plan_no_worse_than_any_fitting_baseline():
    w = Workload(QWEN_1_5B, QWEN_1_5B, QWEN_1_5B, batch=128, prompt_len=256, gen_len=512)
    report = search(w, HW, seconds_budget=4, seed=0)
    assert report.cost.fits
    report.plan.validate(w.specs())
    fitting = [c.seconds_per_iteration for _, c in report.baselines.values() if c is not None and c.fits]
    assert fitting and report.cost.seconds_per_iteration <= min(fitting) + 1e-9
    again = estimate_plan(report.plan, w, HW)
    assert again.seconds_per_iteration == pytest.approx(report.cost.seconds_per_iteration)


@pytest.mark.parametrize("reference", [True, False])
def test_a_critic_free_graph_is_searched_priced_and_placed_without_a_critic(reference):
    """GRPO's graph (and Dr. GRPO's, without a reference): the search, the baselines and the lifecycle see only
    its calls, and the same plan with the critic's calls added costs at least as much."""
    from planning.lifecycle import holdings

    w = Workload(QWEN_1_5B, None, QWEN_1_5B, batch=128, prompt_len=256, gen_len=512, reference=reference)
    expected = {"actor_gen", "rew_inf", "actor_train"} | ({"ref_inf"} if reference else set())
    assert set(w.calls) == expected
    report = search(w, HW, seconds_budget=2, seed=0)
    assert report.cost.fits and set(report.plan.calls) == expected
    report.plan.validate(w.specs())
    for plan, _ in report.baselines.values():
        assert plan is None or set(plan.calls) == expected
    owners = {h.owner for h in holdings(report.plan.calls, lifecycle_inputs(w, HW))}
    assert not {"critic", "critic_inf"} & owners and ("ref" in owners) == reference
    with_critic = Workload(QWEN_1_5B, QWEN_1_5B, QWEN_1_5B, batch=128, prompt_len=256, gen_len=512)
    critic_calls = {c: report.plan.calls["actor_train"] for c in ("critic_inf", "critic_train")}
    plus = ExecutionPlan(1, 8, {**report.plan.calls, "ref_inf": report.plan.calls["actor_train"], **critic_calls})
    assert estimate_plan(plus, with_critic, HW).seconds_per_iteration >= report.cost.seconds_per_iteration


def test_limits_keep_the_candidates_to_what_a_runtime_runs():
    w = Workload(LLAMA_7B, LLAMA_7B, LLAMA_7B, batch=512, prompt_len=128, gen_len=896)
    assert any(a.tp > 1 for a in candidates("actor_gen", w, HW))
    limited = Workload(**{**w.__dict__, "limits": LayoutLimits(pipeline_calls=(), generation_tp=False)})
    assert all(a.tp == 1 and a.pp == 1 for a in candidates("actor_gen", limited, HW))
    assert all(a.pp == 1 for a in candidates("actor_train", limited, HW))
    # A runtime that pipelines only some calls (realm's: reference and critic inference).
    some = Workload(**{**w.__dict__, "limits": LayoutLimits(pipeline_calls=("ref_inf",))})
    assert any(a.pp > 1 for a in candidates("ref_inf", some, HW))
    assert all(a.pp == 1 for a in candidates("actor_train", some, HW))
    # Qwen2.5-Math-1.5B has 2 kv heads: without kv replication, tp 4 and 8 (12 heads: tp 4) are gone.
    qwen = Workload(QWEN_1_5B, QWEN_1_5B, None, batch=512, prompt_len=128, gen_len=896)
    no_repl = Workload(**{**qwen.__dict__, "limits": LayoutLimits(kv_replication=False)})
    node = tuple(range(8))
    assert {a.tp for a in strategies("actor_train", node, qwen, HW)} == {1, 2, 4}
    assert {a.tp for a in strategies("actor_train", node, no_repl, HW)} == {1, 2}
    # Generation runs in vLLM, which replicates kv heads itself: tp 4 stays.
    assert {a.tp for a in strategies("actor_gen", node, no_repl, HW)} == {1, 2, 4}


def test_finer_micro_batches_only_where_nothing_coarser_fits():
    """A 7B actor's 32,768 sequences of 2,048 tokens on 8 GPUs: no training layout fits with at most 64
    micro-batches; the candidates then come with 128 or more."""
    qwen7 = named_spec("qwen2.5-math-7b")
    big = Workload(qwen7, qwen7, None, batch=32768, prompt_len=1024, gen_len=1024)
    train = candidates("actor_train", big, hardware("h100", 1, 8))
    assert train and min(a.num_microbatches for a in train) >= 128
    small = candidates("actor_train", PAPER_7B, HW)
    assert max(a.num_microbatches for a in small) <= 64  # where coarse splits fit, nothing finer is tried


def test_search_says_when_nothing_fits():
    w = Workload(named_spec("70b"), named_spec("70b"), None, batch=64, prompt_len=128, gen_len=128)
    with pytest.raises(NoFitError, match="GiB") as info:
        search_plan(w, hardware("a100-80g", 1, 1), seconds=1)
    assert info.value.overflow_bytes > 0


def test_cli_prints_plan_and_summary_line(tmp_path, capsys):
    # train.py's words: a configs/model/ name, cluster.* and rollout.*; 16 prompts x 4 samples = 64 sequences.
    out = tmp_path / "plan.yaml"
    rc = main(
        "--actor qwen2.5-math-1.5b-instruct --num-nodes 1 --devices-per-node 8 --num-prompts 16 "
        f"--samples-per-prompt 4 --max-prompt-tokens 128 --max-new-tokens 256 --seconds 2 --out {out}".split()
    )
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(
        r"best \d+\.\d\d s/iteration, fits; ReaL-Heuristic (\d+\.\d\d s|oom); symmetric (\d+\.\d\d s|oom);"
        r" disjoint (\d+\.\d\d s|oom); searched in \d+\.\d s",
        lines[-1],
    ), lines[-1]
    assert any(line.strip().startswith("actor_train") for line in lines)
    plan = ExecutionPlan.load(out)
    assert plan.source == "search" and "rew_inf" not in plan.calls
    w = Workload(QWEN_1_5B, QWEN_1_5B, None, 64, 128, 256)  # the critic defaults to the actor's shape
    best = float(lines[-1].split()[1])
    assert estimate_plan(plan, w, HW).seconds_per_iteration == pytest.approx(best, abs=0.006)


def test_cli_reads_model_names_as_train_py_does():
    # configs/model/qwen2.5-math-7b-instruct.yaml's shape is Qwen2.5-Math-7B's (the Instruct model shares it).
    assert model_shape("qwen2.5-math-7b-instruct") == named_spec("qwen2.5-math-7b")
    assert model_shape("llama-2-7b") == named_spec("llama-2-7b")


@pytest.mark.parametrize(
    "args, message",
    [
        ("--actor nope", "unknown model 'nope'"),
        ("--actor qwen2.5-math-1.5b-instrukt", "did you mean qwen2.5-math-1.5b-instruct"),
        ("--num-prompts 0", "argument --num-prompts: 0 must be > 0"),
        ("--max-new-tokens -5", "argument --max-new-tokens: -5 must be > 0"),
        ("--gpu h100", "unknown option --gpu (now --hardware)"),
        ("--hardware h300", "invalid choice: 'h300'"),
        ("--num-devices 3", "unknown option --num-devices"),
    ],
)
def test_cli_bad_input_is_one_error_line_and_exit_status_1(args, message, capsys):
    base = (
        "--actor llama-2-7b --num-nodes 1 --devices-per-node 8 --num-prompts 8 --max-prompt-tokens 8 --max-new-tokens 8"
    )
    with pytest.raises(SystemExit) as info:
        main(base.split() + args.split())
    err = capsys.readouterr().err
    assert info.value.code == 1 and err.count("\n") == 1 and err.startswith("error: ") and message in err, err


def test_cli_no_fitting_plan_is_exit_status_1(capsys):
    # LLaMA-2 70B training state (7e10 x 16 B = 1 TB) on one 80 GB GPU.
    with pytest.raises(SystemExit) as info:
        main(
            "--actor llama-2-70b --num-nodes 1 --devices-per-node 1 --num-prompts 8 --max-prompt-tokens 8 "
            "--max-new-tokens 8 --seconds 1".split()
        )
    err = capsys.readouterr().err
    assert info.value.code == 1 and err.startswith("error: ") and "GiB" in err


@pytest.mark.slow
def test_70b_70b_on_128_gpus_finds_a_fitting_plan_no_slower_than_the_baselines():
    """The largest setting of bench/plan_search.py (which gives it 60 CPU seconds and reports the result), on
    a 20-second budget: the search returns a plan that fits, never slower than a fitting baseline."""
    w = Workload(named_spec("70b"), named_spec("70b"), named_spec("70b"), batch=512, prompt_len=128, gen_len=896)
    report = search(w, hardware("a100-80g", 16, 8), seconds_budget=20, seed=0)
    assert report.cost.fits
    fitting = [c.seconds_per_iteration for _, c in report.baselines.values() if c is not None and c.fits]
    assert fitting and report.cost.seconds_per_iteration <= min(fitting) + 1e-9
