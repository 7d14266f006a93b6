"""The plan runtime's pure parts: which shards each device hosts, which process groups a plan
needs, call spans and the timeline picture (the deployment itself: test_runtime_cluster.py)."""

from __future__ import annotations

import pytest
import torch

from reallocation.execution_plan import CallAllocation, ExecutionPlan
from trainer.runtime import (
    Event,
    UnsupportedPlan,
    _row_slices,
    check_supported,
    critic_needs_realloc,
    mesh_groups,
    roles_on,
)
from trainer.timeline import call_spans, plot_timeline


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
    plan = _plan(
        actor_gen=CallAllocation((0, 1), tp=2),
        actor_train=CallAllocation((0,)),
        critic_train=CallAllocation((0,)),
        critic_inf=CallAllocation((0,)),
        ref_inf=CallAllocation((0,)),
    )
    with pytest.raises(UnsupportedPlan, match=r"calls.actor_gen.tp=2: the plan runtime runs dp layouts only"):
        check_supported(plan)


def test_row_slices_cover_the_batch_in_order():
    batch = {"x": torch.arange(10)}
    assert [p["x"].tolist() for p in _row_slices(batch, 3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    with pytest.raises(ValueError, match="2 rows cannot feed 3"):
        _row_slices({"x": torch.arange(2)}, 3)


def test_call_spans_and_timeline(tmp_path):
    t0 = 100.0
    events = [
        Event("actor_train", 0, 102.0, 105.0),
        Event("actor_train", 1, 102.1, 105.2),
        Event("critic_train", 2, 102.0, 104.0),
        Event("reward", -1, 101.0, 101.5),
    ]
    spans = call_spans(events, t0)
    assert spans["call/actor_train/start_s"] == pytest.approx(2.0)
    assert spans["call/actor_train/end_s"] == pytest.approx(5.2)
    assert spans["call/critic_train/end_s"] == pytest.approx(4.0)
    out = plot_timeline(events, t0, tmp_path / "timeline.png")
    assert out.exists() and out.stat().st_size > 1000 and not (tmp_path / "timeline.tmp.png").exists()


def _reallocate(device: int, port: int, model_dir: str, out_dir: str) -> None:
    """One device worker of a 3-device world: the actor's FSDP shards on devices 0 and 1, its
    generation replicas on devices 1 and 2 (device 1 holds half and receives the other half)."""
    from trainer.runtime import DeviceWorker
    from trainer.workers import PolicyWorker

    torch.set_num_threads(1)
    builders = {"actor": (PolicyWorker, {"model_dir": model_dir}, (0, 1))} if device < 2 else {}
    worker = DeviceWorker(device, (0, 1, 2), "127.0.0.1", port, "gloo", [(0, 1), (0, 1, 2)], "float32", builders)
    weights, (counts, start, end) = worker.reallocate("actor", "engine", (0, 1), (1, 2), True)
    torch.save({"weights": weights, "counts": counts}, f"{out_dir}/device{device}.pt")
    torch.distributed.destroy_process_group()


def test_reallocation_sends_each_replica_only_what_it_lacks(tiny_model_dir, tmp_path):
    import torch.multiprocessing as mp
    from transformers import AutoModelForCausalLM

    from tests.conftest import free_port

    mp.spawn(_reallocate, args=(free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=3, join=True)
    out = [torch.load(tmp_path / f"device{d}.pt") for d in range(3)]
    reference = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    total = sum(p.numel() * 4 for p in reference.values())
    assert out[0]["weights"] is None  # a source only
    for device in (1, 2):
        got = dict(out[device]["weights"])
        assert got.keys() == reference.keys()
        assert all(torch.equal(got[n], p.detach()) for n, p in reference.items())
    received = [o["counts"]["bytes_received"] for o in out]
    # Device 2 lacks everything; device 1 lacks what device 0 holds (FSDP: about half of each tensor).
    assert received[0] == 0 and received[2] == total and 0 < received[1] < total
    assert sum(received) == out[0]["counts"]["lower_bound"]
