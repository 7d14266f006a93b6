"""A plan as the devices see it (runtime.topology, runtime.meshes): which shards each device hosts,
which process groups a plan needs, which layouts the runtime refuses; pure, no processes."""

from __future__ import annotations

import pytest

from planning.execution_plan import CallAllocation, ExecutionPlan
from reallocation.layout import ModelSpec
from runtime.meshes import Pipeline, column_of, grid_groups, grid_of, pipelines_of, row_of, staged_grid
from runtime.topology import (
    UnsupportedPlan,
    check_supported,
    critic_needs_realloc,
    engine_holdings,
    grid_on,
    mesh_groups,
    reward_replicas,
    roles_on,
)


def _plan(**calls: CallAllocation) -> ExecutionPlan:
    return ExecutionPlan(2, 4, calls, source="test")


DISJOINT = _plan(
    actor_gen=CallAllocation((0, 1), dp=2),
    actor_train=CallAllocation((0, 1, 2, 3), dp=4),
    critic_train=CallAllocation((4, 5, 6, 7), dp=4),
    critic_inf=CallAllocation((6, 7), dp=2),
    ref_inf=CallAllocation((5,)),
    rew_inf=CallAllocation((4,)),
)


def test_roles_and_groups_of_a_plan_with_disjoint_inference():
    assert [roles_on(DISJOINT, d) for d in range(8)] == [
        ["actor"],
        ["actor"],
        ["actor"],
        ["actor"],
        ["critic", "reward"],
        ["critic", "ref"],
        ["critic", "critic_inf"],
        ["critic", "critic_inf"],
    ]
    assert critic_needs_realloc(DISJOINT)
    # Training meshes, and the unions that reallocation runs over (actor_gen is inside actor_train).
    assert mesh_groups(DISJOINT) == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_colocated_plan_runs_critic_inference_on_the_training_shards():
    everything = CallAllocation(tuple(range(8)), dp=8)
    plan = _plan(
        actor_gen=CallAllocation((0, 1, 2, 3), dp=4),
        actor_train=everything,
        critic_train=everything,
        critic_inf=everything,
        ref_inf=everything,
    )
    assert not critic_needs_realloc(plan)
    assert roles_on(plan, 7) == ["actor", "critic", "ref"]
    assert mesh_groups(plan) == [tuple(range(8))]


def test_unsupported_layouts_fail_naming_the_call():
    one = CallAllocation((0,))
    calls = dict(actor_train=one, critic_train=one, critic_inf=one, ref_inf=one)
    gen_tp2 = _plan(actor_gen=CallAllocation((0, 1), tp=2), **calls)
    check_supported(gen_tp2)  # generation TP runs (vLLM replicates the one kv head on both ranks)
    for call in ("ref_inf", "critic_train"):  # training and inference run in pipeline stages
        check_supported(_plan(actor_gen=one, **{**calls, call: CallAllocation((0, 1), pp=2)}))
    check_supported(_plan(actor_gen=CallAllocation((0, 1, 2, 3), pp=2, tp=2), **calls))  # and generation
    tp2 = _plan(actor_gen=one, **{**calls, "critic_train": CallAllocation((0, 1), tp=2)})
    check_supported(tp2)  # training TP runs
    spec = ModelSpec(2, 128, 384, num_heads=2, num_kv_heads=1, head_dim=64, vocab_size=400, tie_word_embeddings=True)
    with pytest.raises(UnsupportedPlan, match=r"calls.critic_train.tp=2 does not divide num_key_value_heads=1"):
        check_supported(tp2, {"actor": spec, "critic": spec})
    check_supported(gen_tp2, {"actor": spec, "critic": spec})
    gen_tp3 = _plan(actor_gen=CallAllocation((0, 1, 2), tp=3), **calls)
    with pytest.raises(UnsupportedPlan, match=r"calls.actor_gen.tp=3: tp=3 must divide num_heads=2"):
        check_supported(gen_tp3, {"actor": spec})
    # Reward inference runs in stages of TP ranks; the reward model's own kv heads decide its tp.
    rew_tp2 = _plan(actor_gen=one, rew_inf=CallAllocation((0, 1, 2, 3), pp=2, tp=2), **calls)
    check_supported(rew_tp2, {"actor": spec})  # the actor's shape says nothing about the reward model
    with pytest.raises(UnsupportedPlan, match=r"calls.rew_inf.tp=2 does not divide num_key_value_heads=1"):
        check_supported(rew_tp2, {"actor": spec, "reward": spec})


def test_reward_replicas_report_from_their_last_stages_first_device():
    plan = _plan(**{**DISJOINT.calls, "rew_inf": CallAllocation((7, 4, 5, 6), dp=2, tp=2)})
    assert [pipe.leader for pipe in reward_replicas(plan)] == [4, 6]  # rows (4, 5) and (6, 7), each one TP-2 replica
    assert all("reward" in roles_on(plan, d) for d in (4, 5, 6, 7)) and "reward" not in roles_on(plan, 3)
    assert grid_on(plan, "reward", 5) == Pipeline.of_rows((4, 5))
    staged = _plan(**{**DISJOINT.calls, "rew_inf": CallAllocation((4, 5, 6, 7), pp=2, tp=2)})
    assert [pipe.leader for pipe in reward_replicas(staged)] == [6] and grid_on(
        staged, "reward", 4
    ) == Pipeline.of_rows((4, 5), (6, 7))
    assert {(4, 5), (6, 7), (4, 6), (5, 7), (4, 5, 6, 7)} <= set(mesh_groups(staged))
    assert [
        pipe.leader for pipe in reward_replicas(_plan(**{k: v for k, v in DISJOINT.calls.items() if k != "rew_inf"}))
    ] == []


def test_engine_holdings_are_vllm_boxes_per_generation_row():
    # 2 heads, 1 kv head, vocab 400 (vLLM pads it to 448: 224 rows per TP rank); generation on devices
    # 5 and 4 as one TP-2 engine (a grid row is sorted: device 4 is TP rank 0), world rank = index in
    # the plan's sorted devices 0..5.
    spec = ModelSpec(2, 128, 384, num_heads=2, num_kv_heads=1, head_dim=64, vocab_size=400, tie_word_embeddings=True)
    rest = CallAllocation((0, 1, 2, 3), dp=4)
    plan = _plan(
        actor_gen=CallAllocation((5, 4), tp=2), actor_train=rest, critic_train=rest, critic_inf=rest, ref_inf=rest
    )
    boxes = engine_holdings(plan, spec)
    assert boxes["model.embed_tokens.weight"] == {4: ((0, 224), (0, 128)), 5: ((224, 400), (0, 128))}
    assert boxes["model.layers.0.self_attn.q_proj.weight"] == {4: ((0, 64), (0, 128)), 5: ((64, 128), (0, 128))}
    assert boxes["model.layers.0.self_attn.k_proj.weight"] == {4: ((0, 64), (0, 128)), 5: ((0, 64), (0, 128))}
    assert boxes["model.layers.1.mlp.down_proj.weight"] == {4: ((0, 128), (0, 192)), 5: ((0, 128), (192, 384))}
    assert boxes["model.norm.weight"] == {4: ((0, 128),), 5: ((0, 128),)}
    # Two tp=1 replicas hold everything in full.
    replicas = _plan(**{**plan.calls, "actor_gen": CallAllocation((4, 5), dp=2)})
    assert engine_holdings(replicas, spec)["model.embed_tokens.weight"] == {
        4: ((0, 400), (0, 128)),
        5: ((0, 400), (0, 128)),
    }
    # One engine of 2 stages x TP 2 on devices 2..5 (world ranks 2..5): stage 0 = (2, 3) holds block 0
    # and the embedding, stage 1 = (4, 5) block 1, the norm and the embedding again (the tied LM head).
    staged = _plan(**{**plan.calls, "actor_gen": CallAllocation((2, 3, 4, 5), pp=2, tp=2)})
    boxes = engine_holdings(staged, spec)
    assert set(boxes["model.embed_tokens.weight"]) == {2, 3, 4, 5}
    assert boxes["model.embed_tokens.weight"][3] == boxes["model.embed_tokens.weight"][5] == ((224, 400), (0, 128))
    assert boxes["model.layers.0.self_attn.q_proj.weight"] == {2: ((0, 64), (0, 128)), 3: ((64, 128), (0, 128))}
    assert boxes["model.layers.1.mlp.down_proj.weight"] == {4: ((0, 128), (0, 192)), 5: ((0, 128), (192, 384))}
    assert boxes["model.norm.weight"] == {4: ((0, 128),), 5: ((0, 128),)}
    assert pipelines_of((2, 3, 4, 5), pp=2, tp=2)[0].devices_in_order == (2, 3, 4, 5)  # vLLM's rank order


TENSOR_PARALLEL = _plan(
    actor_gen=CallAllocation((0, 1), dp=2),
    actor_train=CallAllocation((3, 2, 1, 0), dp=2, tp=2),
    critic_train=CallAllocation((4, 5, 6, 7), dp=2, tp=2),
    critic_inf=CallAllocation((4, 5, 6, 7), dp=4),
    ref_inf=CallAllocation((6, 7), tp=2),
)


def test_grids_and_groups_of_a_tensor_parallel_plan():
    plan = TENSOR_PARALLEL
    # Rows are replicas (TP groups), columns FSDP groups; devices sorted whatever the plan's order.
    assert grid_on(plan, "actor", 2) == ((0, 1), (2, 3))
    assert (row_of(((0, 1), (2, 3)), 3), column_of(((0, 1), (2, 3)), 3)) == ((2, 3), (1, 3))
    assert grid_on(plan, "ref", 7) == Pipeline.of_rows((6, 7))
    # Same devices as critic training but another layout: critic inference gets replicas of its own.
    assert critic_needs_realloc(plan) and roles_on(plan, 6) == ["critic", "critic_inf", "ref"]
    assert grid_on(plan, "critic_inf", 5) == Pipeline.of_rows((5,))
    assert mesh_groups(plan) == [
        (0, 1),  # actor replica 0 (TP)
        (0, 1, 2, 3),  # actor_train; also the actor's reallocation union with actor_gen
        (0, 2),  # actor FSDP column 0
        (1, 3),
        (2, 3),
        (4, 5),
        (4, 5, 6, 7),  # critic_train and its union with critic_inf
        (4, 6),
        (5, 7),
        (6,),  # the ref replica's FSDP column of one (a 2-D mesh needs a group per dim)
        (6, 7),
        (7,),
    ]


PIPELINED = _plan(
    actor_gen=CallAllocation((0, 1), dp=2),
    actor_train=CallAllocation((0, 1, 2, 3), dp=4),
    critic_train=CallAllocation((0, 1, 2, 3), dp=4),
    critic_inf=CallAllocation((4, 5, 6, 7), pp=2, tp=2),
    ref_inf=CallAllocation((4, 5, 6, 7), pp=2, dp=2),
)


def test_pipeline_replicas_stages_and_groups():
    """Stages are outermost, as in Layout: ref_inf pp2 dp2 over 4..7 is replica 0 = (4 -> 6),
    replica 1 = (5 -> 7); critic_inf pp2 tp2 is one replica, stage 0 on 4, 5 and stage 1 on 6, 7."""
    assert pipelines_of((7, 6, 5, 4), pp=2, tp=1) == [Pipeline.of_rows((4,), (6,)), Pipeline.of_rows((5,), (7,))]
    assert pipelines_of((4, 5, 6, 7), pp=1, tp=2) == [Pipeline.of_rows((4, 5)), Pipeline.of_rows((6, 7))]  # = grid rows
    assert grid_on(PIPELINED, "ref", 6) == Pipeline.of_rows((4,), (6,))
    critic = grid_on(PIPELINED, "critic_inf", 5)
    assert critic == Pipeline.of_rows((4, 5), (6, 7)) and (critic.leader, critic.stage_of(7)) == (6, 1)
    assert critic_needs_realloc(PIPELINED)  # critic training is pp1 dp4 on other devices
    assert mesh_groups(PIPELINED) == [
        (0, 1, 2, 3),  # training (and the actor's union with generation)
        (0, 1, 2, 3, 4, 5, 6, 7),  # the critic's reallocation union
        (4,),  # critic_inf stage 0's FSDP column of one, as for any TP row
        (4, 5),  # critic_inf stage 0 (TP)
        (4, 5, 6, 7),  # the critic_inf pipeline
        (4, 6),  # ref replica 0's pipeline
        (5,),
        (5, 7),  # ref replica 1's pipeline
        (6,),
        (6, 7),  # critic_inf stage 1 (TP)
        (7,),
    ]
    with pytest.raises(ValueError, match="3 devices cannot form pipelines of pp=2 x tp=1"):
        pipelines_of((0, 1, 2), pp=2, tp=1)


def test_training_stages_are_grids_and_their_columns_pass_activations():
    """actor_train pp2 dp2 over 0..3: stage 0 is FSDP over (0, 1), stage 1 over (2, 3); data share 1
    trains on devices 1 and 3, which pass activations to each other."""
    plan = _plan(**{**PIPELINED.calls, "actor_train": CallAllocation((3, 2, 1, 0), pp=2, dp=2)})
    actor = grid_on(plan, "actor", 3)
    assert actor.stages == (((0,), (1,)), ((2,), (3,))) and actor.column(3) == (1, 3)
    assert staged_grid(range(8), pp=2, tp=2).column(6) == (2, 6)  # row 1, tp rank 0 of each stage
    assert {(0, 1), (2, 3), (0, 2), (1, 3), (0, 1, 2, 3)} <= set(mesh_groups(plan))
    check_supported(plan)


def test_grid_groups_of_plain_data_parallel_need_no_rows_or_columns():
    assert grid_groups(grid_of((3, 1, 2, 0), tp=1)) == [(0, 1, 2, 3)]
    assert grid_groups(((5,),)) == []
    with pytest.raises(ValueError, match="3 devices cannot form rows of tp=2"):
        grid_of((0, 1, 2), tp=2)


def test_the_cost_models_process_groups_are_the_runtimes():
    """planning.communicators.process_groups (the cost model, from layouts alone) gives the groups the device
    processes create (mesh_groups), for disjoint, colocated, tensor-parallel and pipelined plans."""
    from planning.communicators import process_groups

    eight = tuple(range(8))
    plans = [
        DISJOINT,
        _plan(
            actor_gen=CallAllocation((0, 1, 2, 3), dp=4),
            actor_train=CallAllocation(eight, dp=8),
            critic_train=CallAllocation(eight, dp=8),
            critic_inf=CallAllocation(eight, dp=8),
            ref_inf=CallAllocation(eight, dp=8),
        ),
        _plan(
            actor_gen=CallAllocation(eight, pp=2, dp=2, tp=2),
            actor_train=CallAllocation(eight, pp=2, dp=2, tp=2),
            critic_train=CallAllocation((0, 1, 2, 3), dp=2, tp=2),
            critic_inf=CallAllocation((4, 5, 6, 7), pp=2, tp=2),
            ref_inf=CallAllocation(eight, dp=4, tp=2),
            rew_inf=CallAllocation((6, 7), pp=2),
        ),
        _plan(
            actor_gen=CallAllocation((4, 5, 6, 7), tp=4),
            actor_train=CallAllocation((0, 1, 2, 3), pp=4),
            ref_inf=CallAllocation((2, 3, 4, 5), pp=2, dp=2),
        ),
    ]
    for plan in plans:
        assert process_groups(plan.calls) == mesh_groups(plan)
