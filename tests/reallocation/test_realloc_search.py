"""Execution-plan estimator and MCMC search: properties of the cost model, worked reallocation
costs, and search results against the colocated heuristic."""

import pytest

from reallocation.estimator import (
    GENERATE, TRAIN, Allocation, Call, Hardware, estimate_time, fits, realloc_time, static_memory,
)
from reallocation.layout import Layout, ModelSpec
from reallocation.search import candidates, heuristic_plan, mcmc_search, ppo_calls, simulate

QWEN_1_5B = ModelSpec(num_layers=28, hidden_size=1536, intermediate_size=8960, num_heads=12, num_kv_heads=2,
                      head_dim=128, vocab_size=151936, tie_word_embeddings=True, qkv_bias=True)
QWEN_7B = ModelSpec(num_layers=28, hidden_size=3584, intermediate_size=18944, num_heads=28, num_kv_heads=4,
                    head_dim=128, vocab_size=152064, tie_word_embeddings=False, qkv_bias=True)
HW = Hardware()


def test_more_gpus_train_faster_and_7b_training_needs_sharding():
    call = Call("actor_train", "actor", TRAIN, QWEN_1_5B, batch=256, prompt_len=512, gen_len=512)
    times = [estimate_time(call, Allocation(0, n, Layout(fsdp=n)), HW) for n in (1, 2, 4, 8)]
    assert times == sorted(times, reverse=True)
    big = Call("actor_train", "actor", TRAIN, QWEN_7B, batch=256, prompt_len=512, gen_len=512)
    assert not fits(big, Allocation(0, 1, Layout()), HW)  # 7.6B params x 18 bytes > 80 GiB
    assert fits(big, Allocation(0, 8, Layout(fsdp=8)), HW)
    assert static_memory(big, Allocation(0, 8, Layout(fsdp=8))) == pytest.approx(QWEN_7B.num_params() * 18 / 8)


def test_tp_speeds_up_memory_bound_decoding():
    call = Call("actor_gen", "actor", GENERATE, QWEN_7B, batch=8, prompt_len=128, gen_len=256)
    t1 = estimate_time(call, Allocation(0, 1, Layout()), HW)
    t4 = estimate_time(call, Allocation(0, 4, Layout(tp=4)), HW)
    assert t4 < t1 / 2


def test_realloc_time_worked_examples():
    spec = QWEN_1_5B
    same = Allocation(0, 8, Layout(dp=8))
    assert realloc_time(spec, same, same, HW) == 0
    # Every GPU of a dp8 source holds everything a tp8 destination on the same GPUs needs.
    assert realloc_time(spec, same, Allocation(0, 8, Layout(tp=8)), HW) == 0
    # A full copy from GPU 0 to GPU 1: the whole model over NVLink.
    moved = realloc_time(spec, Allocation(0, 1, Layout()), Allocation(1, 1, Layout()), HW)
    latency = 10 * HW.collective_latency_s
    assert moved == pytest.approx(spec.num_params() * 2 / HW.intra_node_bytes_per_s + latency, rel=1e-6)
    # Across nodes the node link is slower.
    two = Hardware(num_nodes=2)
    assert realloc_time(spec, Allocation(0, 1, Layout()), Allocation(8, 1, Layout()), two) > moved


def test_disjoint_meshes_run_concurrently():
    calls = ppo_calls(QWEN_1_5B, QWEN_1_5B, batch=64, prompt_len=256, gen_len=256)
    half, other_half = Allocation(0, 4, Layout(dp=4)), Allocation(4, 4, Layout(dp=4))
    base = {c.name: Allocation(0, 8, Layout(fsdp=8) if c.kind == TRAIN else Layout(dp=8)) for c in calls}
    same_half = simulate(calls, dict(base, rew_inf=half, ref_inf=half), HW).seconds_per_iteration
    split = simulate(calls, dict(base, rew_inf=half, ref_inf=other_half), HW)
    one_call = estimate_time(calls[2], half, HW)  # ref_inf on 4 GPUs
    # Overlapping meshes serialize; disjoint ones overlap, saving one call per iteration.
    assert split.feasible
    assert same_half - split.seconds_per_iteration == pytest.approx(one_call, rel=1e-6)


def test_candidates_are_feasible_and_sorted():
    call = ppo_calls(QWEN_7B, QWEN_7B, batch=128, prompt_len=256, gen_len=256)[4]  # actor_train
    options = candidates(call, HW, max_per_call=20)
    assert options and all(fits(call, a, HW) for a in options)
    times = [estimate_time(call, a, HW) for a in options]
    assert times == sorted(times)
    assert all(QWEN_7B.num_heads % a.layout.tp == 0 for a in options)


def test_search_is_deterministic_and_no_worse_than_heuristic():
    calls = ppo_calls(QWEN_1_5B, QWEN_1_5B, batch=128, prompt_len=256, gen_len=512)
    heuristic = simulate(calls, heuristic_plan(calls, HW), HW)
    assert heuristic.feasible
    a = mcmc_search(calls, HW, steps=300, seed=1, max_per_call=16)
    b = mcmc_search(calls, HW, steps=300, seed=1, max_per_call=16)
    assert a.plan == b.plan and a.cost == b.cost
    assert a.cost <= a.initial_cost
    start = mcmc_search(calls, HW, steps=300, seed=1, max_per_call=10_000, start=heuristic_plan(calls, HW))
    assert start.cost <= heuristic.seconds_per_iteration
    assert start.simulation.feasible


def test_search_finds_a_feasible_plan_where_colocation_overflows():
    two = Hardware(num_nodes=2)
    calls = ppo_calls(QWEN_7B, QWEN_7B, batch=256, prompt_len=512, gen_len=1024)
    assert not simulate(calls, heuristic_plan(calls, two), two).feasible
    result = mcmc_search(calls, two, steps=400, seed=0, max_per_call=32)
    assert result.simulation.feasible
    assert result.cost < result.initial_cost
