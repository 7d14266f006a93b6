"""The cost model prices what runs: worked examples a person can check by hand for the call order
(list scheduling by readiness), pipelined generation (ReaL's generate schedule, vLLM's groups in
flight), reallocation across nodes (once per destination node) and per-stage TP and pipeline
communication."""

import pytest

from planning.estimator import (
    Hardware,
    Workload,
    call_seconds,
    estimate_plan,
    generation_stage_steps,
    iteration_schedule,
    realloc_seconds,
)
from planning.execution_plan import CallAllocation, ExecutionPlan
from planning.profile import Profile, _shape_key
from planning.schedule import list_schedule
from planning.shapes import named_spec

TINY = named_spec("tiny")  # 2 layers, hidden 128
LLAMA_7B = named_spec("llama-2-7b")
QWEN_1_5B = named_spec("qwen2.5-math-1.5b")


def tiny_profile() -> Profile:
    """Per layer of the tiny model: a forward of 100 tokens 0.25 s, a decode step of up to 4
    sequences 0.002 s; the LM head 0.125 s (all below or at their first grid point: no faster)."""
    key = _shape_key(TINY)
    rows = [
        {"op": "forward", "shape": key, "tp": 1, "tokens": 100, "context": 0, "seconds": 0.25},
        {"op": "head_forward", "shape": key, "tp": 1, "tokens": 100, "context": 0, "seconds": 0.125},
        {"op": "decode", "shape": key, "tp": 1, "tokens": 4, "context": 64, "seconds": 0.002},
    ]
    return Profile("hand-made", rows, {key: {k: getattr(TINY, k) for k in TINY.__dataclass_fields__}})


def no_link_costs(num_gpus: int, **links: float) -> Hardware:
    """One node whose links cost nothing unless ``links`` says otherwise, with the tiny profile."""
    free = dict(collective_latency_s=0.0, intra_node_bytes_per_s=float("inf"), inter_node_bytes_per_s=float("inf"))
    return Hardware(num_nodes=1, gpus_per_node=num_gpus, profile=tiny_profile(), **{**free, **links})


# ----------------------------------------------------------------------------------------------- (a) call order


def test_list_schedule_starts_each_call_when_its_inputs_and_devices_are_ready():
    """actor_gen 1 s on devices 0-1; reward inference 3 s on 0, reference 2 s on 0-1, critic 1 s on 1.
    At 1 s rew_inf takes device 0; ref_inf needs both devices and cannot start; critic_inf, later
    in the priority order, takes device 1 anyway (1-2 s), not after ref_inf as a fixed order
    rew -> ref -> critic would have it (6-7 s). ref_inf runs 4-6 s; training after all four."""
    seconds = {"actor_gen": 1, "rew_inf": 3, "ref_inf": 2, "critic_inf": 1, "actor_train": 5, "critic_train": 4}
    devices = {"actor_gen": [0, 1], "rew_inf": [0], "ref_inf": [0, 1], "critic_inf": [1]}
    devices |= {"actor_train": [0], "critic_train": [1]}
    times = list_schedule(seconds, devices)
    assert times == {
        "actor_gen": (0, 1),
        "rew_inf": (1, 4),
        "critic_inf": (1, 2),
        "ref_inf": (4, 6),
        "actor_train": (6, 11),
        "critic_train": (6, 10),
    }


def test_calls_ready_at_the_same_moment_start_in_priority_order():
    """Reward and reference inference both want device 0 at 1 s: rew_inf (earlier in the order) goes
    first; a zero-second call ends at once and lets its dependants start at the same moment."""
    seconds = {"actor_gen": 1, "rew_inf": 2, "ref_inf": 2, "actor_train": 1, "realloc_actor": 0.0}
    devices = {"actor_gen": [0], "rew_inf": [0], "ref_inf": [0], "actor_train": [0], "realloc_actor": [0]}
    times = list_schedule(seconds, devices)
    assert times["rew_inf"] == (1, 3) and times["ref_inf"] == (3, 5)
    assert times["actor_train"] == (5, 6) and times["realloc_actor"] == (6, 6)


def test_iteration_schedule_names_every_call_its_devices_and_order():
    """A 2 x 4 plan like the simulated cluster's: generation on 0-1, actor training on 0-3, reference on
    4-5, critic on 4-7 (inference on 6-7: a copy of its own). The schedule has actor_inf on actor
    training's devices, realloc_actor over 0-3 (actor_train's and actor_gen's devices), realloc_critic
    over 4-7; reference and critic inference run while the old logprobs are computed."""
    w = Workload(TINY, TINY, None, batch=16, prompt_len=32, gen_len=48, value_bytes=4, old_logprobs_pass=True)
    calls = {
        "actor_gen": CallAllocation((0, 1), dp=2),
        "actor_train": CallAllocation((0, 1, 2, 3), dp=4),
        "ref_inf": CallAllocation((4, 5), pp=2),
        "critic_inf": CallAllocation((6, 7), pp=2),
        "critic_train": CallAllocation((4, 5, 6, 7), pp=2, dp=2),
    }
    hw = Hardware(num_nodes=2, gpus_per_node=4)
    plan = ExecutionPlan(2, 4, calls)
    schedule = iteration_schedule(plan, w, hw)
    assert schedule.order()[0] == "actor_gen" and set(schedule.order()) == {
        "actor_gen",
        "actor_inf",
        "ref_inf",
        "critic_inf",
        "actor_train",
        "critic_train",
        "realloc_actor",
        "realloc_critic",
    }
    c = schedule.calls
    assert c["actor_inf"].devices == (0, 1, 2, 3) and c["realloc_actor"].devices == (0, 1, 2, 3)
    assert c["realloc_critic"].devices == (4, 5, 6, 7)
    gen_end = c["actor_gen"].end
    assert c["actor_inf"].start == c["ref_inf"].start == c["critic_inf"].start == gen_end
    inputs_done = max(c[k].end for k in ("actor_inf", "ref_inf", "critic_inf"))
    assert c["actor_train"].start == c["critic_train"].start == inputs_done
    assert c["realloc_actor"].start == c["actor_train"].end
    assert schedule.device_order()[0] == ["actor_gen", "actor_inf", "actor_train", "realloc_actor"]
    assert schedule.device_order()[6] == ["critic_inf", "critic_train", "realloc_critic"]
    assert estimate_plan(plan, w, hw).seconds_per_iteration == pytest.approx(schedule.seconds)
    # Critic inference on critic training's devices and layout: no realloc_critic.
    shared = ExecutionPlan(2, 4, dict(calls, critic_inf=calls["critic_train"]))
    assert "realloc_critic" not in iteration_schedule(shared, w, hw).calls


# ----------------------------------------------------------------------------------------------- (b) generation


def test_generation_stage_steps_follow_reals_generate_schedule():
    assert generation_stage_steps(10, 2, 2) == 21  # 10 tokens x max(2, 2) slots + 2 - 1
    assert generation_stage_steps(10, 1, 1) == 10
    assert generation_stage_steps(10, 1, 2) == 20  # one group: the two stages take turns
    assert generation_stage_steps(10, 4, 2) == 43  # 10 x 4 + 3


def test_pipelined_generation_with_two_stages_two_groups_and_ten_tokens():
    """4 sequences of 50 prompt tokens, 10 new tokens, on one replica of pp = 2 with 2 groups of 2
    sequences: both groups in flight (vLLM keeps up to pp batches in flight). ReaL's schedule: 21
    slots, the first g + pp - 1 = 3 prefill, the other 18 = 9 tokens x 2 decode. A slot is one
    stage's half of the model's work on one group:
    prefill of 100 tokens: 2 layers x 0.25 s + head 0.125 s = 0.625 s, a slot 0.3125 s;
    decode of 2 sequences: 2 layers x 0.002 s + head 0.125 s = 0.129 s, a slot 0.0645 s;
    3 x 0.3125 + 18 x 0.0645 = 2.0985 s (links free here)."""
    w = Workload(TINY, TINY, None, batch=4, prompt_len=50, gen_len=10)
    hw = no_link_costs(2)
    piped = CallAllocation((0, 1), pp=2, num_microbatches=2)
    assert call_seconds("actor_gen", TINY, piped, w, hw) == pytest.approx(3 * 0.3125 + 18 * 0.0645)
    # pp = 1 with the same 2 groups: two waves one after another, each a prefill and 9 decode steps of
    # the whole model: 2 x (0.625 + 9 x 0.129) = 3.572 s.
    waves = CallAllocation((0,), num_microbatches=2)
    assert call_seconds("actor_gen", TINY, waves, w, hw) == pytest.approx(2 * (0.625 + 9 * 0.129))
    # One group of 4 sequences through 2 stages: nothing overlaps, each token passes both stages in
    # turn (20 slots). Prefill of 200 tokens: 2 x 0.5 s (past the grid: proportional) + 0.125 s =
    # 1.125 s, 2 slots of 0.5625 s; then 18 decode slots of 0.0645 s.
    one_group = CallAllocation((0, 1), pp=2, num_microbatches=1)
    assert call_seconds("actor_gen", TINY, one_group, w, hw) == pytest.approx(2 * 0.5625 + 18 * 0.0645)


# ----------------------------------------------------------------------------------------------- (c) reallocation


def test_a_destination_node_pulls_each_byte_across_the_nic_once():
    """2 nodes x 8 GPUs; a tp8 engine on node 0 moves to 8 full replicas on node 1 (no holder there).
    Node 1 pulls the model across the NIC once (not once per GPU) and its first GPU passes it to
    the other 7 over NVLink: full / NIC + 7 x full / NVLink."""
    full = LLAMA_7B.num_params() * 2
    hw = Hardware(num_nodes=2, collective_latency_s=0.0)
    src = CallAllocation(tuple(range(8)), tp=8)
    dst = CallAllocation(tuple(range(8, 16)), dp=8)
    expected = full / hw.inter_node_bytes_per_s + 7 * full / hw.intra_node_bytes_per_s
    assert realloc_seconds(LLAMA_7B, src, "generate", dst, "inference", hw) == pytest.approx(expected)
    # dp4 x tp2 on node 1: two distinct halves cross once each (the whole model once); each half's
    # first GPU passes it to its 3 other replicas: 3 halves = 1.5 x full on the busiest NVLink.
    halves = CallAllocation(tuple(range(8, 16)), dp=4, tp=2)
    expected = full / hw.inter_node_bytes_per_s + 1.5 * full / hw.intra_node_bytes_per_s
    assert realloc_seconds(LLAMA_7B, src, "generate", halves, "inference", hw) == pytest.approx(expected)


# ----------------------------------------------------------------------------------------------- (d) communication


def test_tp_all_reduces_cover_a_stage_and_pipeline_sends_only_the_fill():
    """Reference inference of 2 sequences x 100 tokens on pp = 2 stages of tp = 2, 2 micro-batches of
    100 tokens (bubble (2 + 1) / 2 = 1.5); NVLink 1 MB/s, 1 ms per collective.
    compute: per layer 0.25 / tp = 0.125 s (scaled by FLOPs), head 0.0625 s; a stage's 1 layer + the
    head = 0.1875 s per micro-batch, x 2 micro-batches x 1.5 = 0.5625 s;
    TP: an all-reduce moves 2 x (1/2) x 100 x 128 x 2 B = 25.6 kB: 0.0256 + 0.001 s; 2 per layer,
    1 layer per stage: 0.0532 s per micro-batch, x 2 x 1.5 = 0.1596 s;
    pipeline: the fill's one hop of a micro-batch, 100 x 128 x 2 B / 2 = 12.8 kB: 0.0128 + 0.001 s."""
    w = Workload(TINY, TINY, None, batch=2, prompt_len=100, gen_len=0)
    hw = no_link_costs(4, intra_node_bytes_per_s=1e6, collective_latency_s=1e-3)
    alloc = CallAllocation((0, 1, 2, 3), pp=2, tp=2, num_microbatches=2)
    assert call_seconds("ref_inf", TINY, alloc, w, hw) == pytest.approx(0.5625 + 0.1596 + 0.0138)


def test_the_search_uses_the_new_pricing_consistently():
    """The search's lower bound (the schedule without reallocations) never exceeds the full estimate."""
    from planning.builders import real_heuristic_plan
    from planning.estimator import evaluator, hardware

    w = Workload(LLAMA_7B, LLAMA_7B, LLAMA_7B, batch=512, prompt_len=128, gen_len=896)
    hw = hardware("a100-80g", 2, 8)
    plan = real_heuristic_plan(w, hw)
    calls = tuple((c, plan.calls[c]) for c in w.calls)
    ev = evaluator(w, hw)
    assert ev.period(calls, with_moves=False) <= estimate_plan(plan, w, hw).seconds_per_iteration


# ----------------------------------------------------------------------------------------------- (e) what a CPU run computes


def test_time_is_priced_at_the_longest_prompt_and_memory_at_the_configured_one():
    """The runtime trims padding to each micro-batch's longest row: with prompts of at most 50 tokens
    in a run configured for 250, reference inference of 2 sequences computes on 2 x (50 + 50) = 200
    tokens (2 layers x 0.25 s + head 0.125 s, past the grid: proportional, x 2 = 1.25 s), not 2 x 300;
    its memory is still priced at 250 + 50 tokens (a prompt may be that long)."""
    from planning.estimator import call_memory

    configured = Workload(TINY, TINY, None, batch=2, prompt_len=250, gen_len=50)
    run = Workload(TINY, TINY, None, batch=2, prompt_len=250, gen_len=50, longest_prompt=50)
    one = CallAllocation((0,))
    hw = no_link_costs(1)
    assert call_seconds("ref_inf", TINY, one, run, hw) == pytest.approx(2 * (2 * 0.25 + 0.125))
    assert call_seconds("ref_inf", TINY, one, configured, hw) == pytest.approx(6 * (2 * 0.25 + 0.125))
    assert call_memory("ref_inf", TINY, one, run) == call_memory("ref_inf", TINY, one, configured)
    # A longest prompt past the configured limit is cut to it, as the runtime cuts the prompt.
    assert (
        Workload(TINY, TINY, None, batch=2, prompt_len=250, gen_len=50, longest_prompt=400).computed_prompt_len == 250
    )


def test_every_call_pays_the_fixed_overhead_and_cpu_devices_share_the_cores():
    """Every call of an iteration on one device, then with a fixed overhead of 0.25 s per call and 0.5 s
    per optimizer step: each call of the schedule is 0.25 s longer, the training calls 2 x 2 x 0.5 s more
    (2 epochs of 2 minibatches). One device on 2 cores: no change. The same calls each on 4 data-parallel
    devices sharing 2 cores: each call takes twice as long (2 of its 4 devices run at a time)."""
    import dataclasses

    w = Workload(TINY, TINY, None, batch=4, prompt_len=50, gen_len=10, old_logprobs_pass=True)
    w = dataclasses.replace(w, num_epochs=2, num_minibatches=2)
    one = CallAllocation((0,))
    calls = {c: one for c in ("actor_gen", "actor_train", "ref_inf", "critic_inf", "critic_train")}
    plan = ExecutionPlan(1, 1, calls)
    free = dataclasses.replace(no_link_costs(1), profile=train_profile())
    base = iteration_schedule(plan, w, free)
    slow = iteration_schedule(plan, w, dataclasses.replace(free, call_overhead_s=0.25, step_overhead_s=0.5))
    assert set(slow.calls) == set(base.calls)
    for name, call in slow.calls.items():
        extra = 0.25 + (4 * 0.5 if name.endswith("_train") else 0.0)
        assert call.end - call.start == pytest.approx(base.calls[name].end - base.calls[name].start + extra)
    # One device: the list schedule is the sum of its calls; 2 cores do not shorten it.
    alone = dataclasses.replace(free, num_cores=2)
    assert estimate_plan(plan, w, alone).seconds_per_iteration == pytest.approx(base.seconds)
    # Each call on 4 data-parallel devices, 2 cores: every call twice as long as with a core per device.
    wide = CallAllocation((0, 1, 2, 3), dp=4)
    plan4 = ExecutionPlan(1, 4, {c: wide for c in calls})
    free4 = dataclasses.replace(no_link_costs(4), profile=train_profile())
    own_cores = iteration_schedule(plan4, w, free4)
    shared = iteration_schedule(plan4, w, dataclasses.replace(free4, num_cores=2))
    for name, call in shared.calls.items():
        alone4 = own_cores.calls[name]
        assert call.end - call.start == pytest.approx(2 * (alone4.end - alone4.start))
    assert estimate_plan(plan4, w, dataclasses.replace(free4, num_cores=2)).seconds_per_iteration == pytest.approx(
        2 * own_cores.seconds
    )


def test_calls_side_by_side_on_shared_cores_take_the_cores_device_seconds():
    """Reference inference on device 0 and critic inference on device 1 after generation on both, 2
    devices and 1 core: side by side in the schedule, but one core computes both, so the iteration
    takes at least the device-seconds of all its calls over that core."""
    import dataclasses

    w = Workload(TINY, TINY, None, batch=4, prompt_len=50, gen_len=10)
    both, a, b = CallAllocation((0, 1), dp=2), CallAllocation((0,)), CallAllocation((1,))
    plan = ExecutionPlan(1, 2, {"actor_gen": both, "actor_train": a, "ref_inf": a, "critic_inf": b, "critic_train": b})
    free = dataclasses.replace(no_link_costs(2), profile=train_profile())
    schedule = iteration_schedule(plan, w, free)
    device_seconds = sum((c.end - c.start) * len(c.devices) for c in schedule.calls.values())
    assert estimate_plan(plan, w, free).seconds_per_iteration == pytest.approx(schedule.seconds)
    one_core = dataclasses.replace(free, num_cores=1)
    scaled = iteration_schedule(plan, w, one_core)  # generation on 2 devices, 1 core: twice as long
    gen = schedule.calls["actor_gen"]
    assert scaled.calls["actor_gen"].end == pytest.approx(2 * (gen.end - gen.start))
    assert estimate_plan(plan, w, one_core).seconds_per_iteration == pytest.approx(device_seconds)


def train_profile() -> Profile:
    """``tiny_profile`` with the training ops: a layer's forward + backward of 100 tokens 0.75 s, the
    head's 0.375 s, Adam's step of a layer 0.01 s."""
    p = tiny_profile()
    key = _shape_key(TINY)
    p.entries += [
        {"op": "train", "shape": key, "tp": 1, "tokens": 100, "context": 0, "seconds": 0.75},
        {"op": "head_train", "shape": key, "tp": 1, "tokens": 100, "context": 0, "seconds": 0.375},
        {"op": "optimizer", "shape": key, "tp": 1, "tokens": 0, "context": 0, "seconds": 0.01},
    ]
    return p
