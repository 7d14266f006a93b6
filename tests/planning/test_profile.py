"""Calibration profile: interpolation worked by hand, file errors, the estimator reading a profile,
and (slow) predicted vs measured calls on 1/2/4 gloo ranks; (gpu) the CUDA profiler."""

import json

import pytest

from planning.estimator import Workload, call_seconds, hardware
from planning.execution_plan import CallAllocation
from planning.profile import Profile, _shape_key, check, measure, spearman
from planning.shapes import named_spec

TINY = named_spec("tiny")


def hand_profile() -> Profile:
    key = _shape_key(TINY)
    rows = [
        {"op": "train", "shape": key, "tp": 1, "tokens": 100, "context": 0, "seconds": 1.0},
        {"op": "train", "shape": key, "tp": 1, "tokens": 300, "context": 0, "seconds": 2.0},
        {"op": "forward", "shape": key, "tp": 1, "tokens": 100, "context": 0, "seconds": 0.25},
        {"op": "forward", "shape": key, "tp": 1, "tokens": 300, "context": 0, "seconds": 0.2},  # noisy: raised to 0.25
        {"op": "head_train", "shape": key, "tp": 1, "tokens": 100, "context": 0, "seconds": 0.5},
        {"op": "head_forward", "shape": key, "tp": 1, "tokens": 100, "context": 0, "seconds": 0.125},
        {"op": "optimizer", "shape": key, "tp": 1, "tokens": 0, "context": 0, "seconds": 0.01},
        {"op": "decode", "shape": key, "tp": 1, "tokens": 4, "context": 64, "seconds": 0.002},
    ]
    fields = {k: getattr(TINY, k) for k in TINY.__dataclass_fields__}
    return Profile("hand-made", rows, {key: fields})


def test_interpolation_worked_by_hand():
    p = hand_profile()
    assert p.seconds("train", TINY, tokens=200) == pytest.approx(1.5)  # halfway between 1.0 and 2.0
    assert p.seconds("train", TINY, tokens=600) == pytest.approx(4.0)  # proportional past the grid
    assert p.seconds("train", TINY, tokens=10) == pytest.approx(1.0)  # no faster below the grid
    assert p.seconds("forward", TINY, tokens=300) == pytest.approx(0.25)  # monotone in tokens
    assert p.seconds("train", TINY, tokens=200, tp=2) == pytest.approx(0.75)  # tp 2 not measured: FLOPs / 2
    assert p.seconds("decode", TINY, tokens=4, context=128) == pytest.approx(0.004)  # longer cache, linear
    # A shape not measured scales by per-token layer FLOPs: 7B's layer over tiny's.
    ratio = (2 * 4096 * 128 * 64 + 3 * 4096 * 11008) / (128 * 64 * 6 + 3 * 128 * 384)
    assert p.seconds("train", named_spec("llama-2-7b"), tokens=200) == pytest.approx(1.5 * ratio)


def test_estimator_composes_the_profile():
    p = hand_profile()
    hw = hardware("cpu", 1, 4, p)
    w = Workload(TINY, TINY, None, batch=2, prompt_len=100, gen_len=0)
    one = CallAllocation((0,))
    # Training 200 tokens on one rank: 2 layers x 1.5 s + head 2 x 0.5 s (past its one grid point:
    # proportional) + 2 x 0.01 s Adam.
    assert call_seconds("actor_train", TINY, one, w, hw) == pytest.approx(2 * 1.5 + 1.0 + 2 * 0.01)
    # Inference on 2 data-parallel ranks: 100 tokens each, 2 x 0.25 + 0.125, no communication.
    assert call_seconds("ref_inf", TINY, CallAllocation((0, 1), dp=2), w, hw) == pytest.approx(2 * 0.25 + 0.125)


def test_tensor_parallel_training_is_priced_with_the_unfused_adam_step_it_runs():
    """A TP layout's parameters mix DTensors and plain tensors, so its AdamW takes torch's default path
    (``common.optim.fusable``); a profile that timed that path prices it there, and only there."""
    from dataclasses import replace

    base = hand_profile()
    key = _shape_key(TINY)
    unfused_row = {"op": "optimizer_unfused", "shape": key, "tp": 1, "tokens": 0, "context": 0, "seconds": 0.04}
    with_unfused = replace(base, entries=[*base.entries, unfused_row])
    w = Workload(TINY, TINY, None, batch=2, prompt_len=100, gen_len=0)

    def train(profile: Profile, alloc: CallAllocation) -> float:
        return call_seconds("actor_train", TINY, alloc, w, hardware("cpu", 1, 4, profile))

    one, tp2 = CallAllocation((0,)), CallAllocation((0, 1), tp=2)
    assert train(with_unfused, one) == pytest.approx(train(base, one))  # tp 1: the fused step, as before
    # tp 2 (not measured: the one-device step / 2): 1 step x 2 layers x (0.04 - 0.01) / 2 more.
    assert train(with_unfused, tp2) - train(base, tp2) == pytest.approx(2 * (0.04 - 0.01) / 2)


def test_generation_in_waves_pays_for_its_smaller_decode_steps():
    """One wave of 256 sequences against 16 waves of 16, prefill priced free so that the decode steps show.
    A decode step of 256 sequences costs 4x one of 16 (batching pays), so the 16 waves cost 4x the one."""
    key = _shape_key(TINY)
    rows = [
        {"op": "forward", "shape": key, "tp": 1, "tokens": 1, "context": 0, "seconds": 0.0},
        {"op": "head_forward", "shape": key, "tp": 1, "tokens": 16, "context": 0, "seconds": 0.001},
        {"op": "head_forward", "shape": key, "tp": 1, "tokens": 256, "context": 0, "seconds": 0.004},
        {"op": "decode", "shape": key, "tp": 1, "tokens": 16, "context": 64, "seconds": 0.01},
        {"op": "decode", "shape": key, "tp": 1, "tokens": 256, "context": 64, "seconds": 0.04},
    ]
    fields = {k: getattr(TINY, k) for k in TINY.__dataclass_fields__}
    hw = hardware("cpu", 1, 1, Profile("hand-made", rows, {key: fields}))
    # 8 new tokens at a 60-token prompt: cache 60 + 8 / 2 = 64; one prefill slot, then 7 decode steps.
    w = Workload(TINY, TINY, None, batch=256, prompt_len=60, gen_len=8)
    # One wave: head 0.004 at prefill, then 7 x (2 layers x 0.04 + head 0.004).
    assert call_seconds("actor_gen", TINY, CallAllocation((0,)), w, hw) == pytest.approx(0.004 + 7 * 0.084)
    # 16 waves of 16: 16 x (0.001 + 7 x (2 x 0.01 + 0.001)).
    waves = call_seconds("actor_gen", TINY, CallAllocation((0,), num_microbatches=16), w, hw)
    assert waves == pytest.approx(16 * (0.001 + 7 * 0.021))
    # Without the 256-sequence point (decode measured up to 16 only, as before), 256 sequences are 16 x the
    # 16-sequence step and the one wave costs as much as the sixteen: 2.272 against 2.368.
    hw16 = hardware("cpu", 1, 1, Profile("hand-made", rows[:-1], {key: fields}))
    assert call_seconds("actor_gen", TINY, CallAllocation((0,)), w, hw16) == pytest.approx(0.004 + 7 * (0.32 + 0.004))


def test_profile_file_errors_name_the_problem(tmp_path):
    path = tmp_path / "p.json"
    hand_profile().save(path)
    assert Profile.load(path).entries == hand_profile().entries
    data = json.loads(path.read_text())
    data["entries"][0]["op"] = "backward"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"p.json: entries\[0\] .* unknown op 'backward'"):
        Profile.load(path)
    path.write_text("{}")
    with pytest.raises(ValueError, match="missing key 'device'"):
        Profile.load(path)


def test_spearman_worked_examples():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # One swapped neighbour pair out of 4: 1 - 6 * 2 / (4 * 15) = 0.8.
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)


def test_measure_tiny_on_cpu_gives_every_op():
    p = measure(
        {"tiny": TINY},
        device="cpu",
        grid=dict(batches=(1,), seqs=(8,), decode_batches=(1, 2), contexts=(16,), tps=(1,)),
        progress=False,
    )
    assert {r["op"] for r in p.entries} == {
        "forward",
        "train",
        "optimizer",
        "optimizer_unfused",
        "decode",
        "head_forward",
        "head_train",
    }
    assert all(r["seconds"] > 0 for r in p.entries)
    assert sorted(r["tokens"] for r in p.entries if r["op"] == "decode") == [1, 2]  # decode_batches, not batches


@pytest.mark.slow
def test_predicted_vs_measured_calls_rank_correlate(tmp_path):
    import torch

    torch.set_num_threads(1)
    profile = measure(
        {m: named_spec(m) for m in ("tiny", "smollm2-135m")},
        device="cpu",
        grid=dict(batches=(1, 4), seqs=(16, 64), decode_batches=(1, 4), contexts=(32,), tps=(1,)),
        progress=False,
    )
    result = check(profile, progress=False)
    assert len(result["rows"]) >= 8
    print(f"spearman {result['spearman']:.2f}, median relative error {result['median_relative_error']:.0%}")
    assert result["spearman"] >= 0.8


@pytest.mark.gpu
def test_cuda_profile(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    p = measure(
        {"qwen2.5-math-1.5b": named_spec("qwen2.5-math-1.5b")},
        device="cuda",
        grid=dict(batches=(1, 8), seqs=(128,), decode_batches=(1, 8), contexts=(256,), tps=(1, 2)),
        progress=False,
    )
    p.save(tmp_path / "p.json")
    assert "bfloat16" in p.device and all(r["seconds"] > 0 for r in p.entries)
    spec = named_spec("qwen2.5-math-1.5b")
    assert p.seconds("train", spec, tokens=1024) > p.seconds("forward", spec, tokens=1024)


def test_search_uses_the_profile_it_is_given():
    from planning.search import search

    w = Workload(TINY, TINY, None, batch=8, prompt_len=100, gen_len=4)
    analytic = search(w, hardware("cpu", 1, 2), seconds_budget=1).cost
    measured = search(w, hardware("cpu", 1, 2, hand_profile()), seconds_budget=1).cost
    # Same workload and cluster shape, different cost source: the caches must not mix them.
    assert measured.call_seconds["actor_train"] != pytest.approx(analytic.call_seconds["actor_train"])


def test_measure_takes_the_one_dtype_table():
    with pytest.raises(ValueError, match=r"dtype='fp8': expected float32, bfloat16 or float16"):
        measure({}, device="cpu", grid={}, dtype="fp8", progress=False)


def test_profile_keeps_the_machines_cores_and_call_overhead(tmp_path):
    """A CPU profile carries its machine's cores and fixed per-call and per-step seconds to the cost
    model; a profile written before they existed loads without them (None, 0, 0)."""
    p = hand_profile()
    p.num_cores, p.call_overhead_s, p.step_overhead_s = 2, 0.02, 0.04
    p.save(tmp_path / "p.json")
    loaded = Profile.load(tmp_path / "p.json")
    assert (loaded.num_cores, loaded.call_overhead_s, loaded.step_overhead_s) == (2, 0.02, 0.04)
    hw = hardware("cpu", 1, 4, loaded)
    assert (hw.num_cores, hw.call_overhead_s, hw.step_overhead_s) == (2, 0.02, 0.04)
    assert (hardware("h100", 1, 8).num_cores, hardware("h100", 1, 8).call_overhead_s) == (None, 0.0)
    old = json.loads((tmp_path / "p.json").read_text())
    del old["num_cores"], old["call_overhead_s"], old["step_overhead_s"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert (Profile.load(tmp_path / "old.json").num_cores, Profile.load(tmp_path / "old.json").call_overhead_s) == (
        None,
        0.0,
    )


def _overheads_profile() -> Profile:
    """A hand-made profile whose only whole-model floor is a 2-layer tiny model's."""
    p = hand_profile()
    fields = {k: getattr(TINY, k) for k in TINY.__dataclass_fields__}
    p.overheads = {
        "tiny": {
            "spec": fields,
            "rows": 1,
            "tokens": 16,
            "plain": {"forward": 0.01, "train": 0.04, "step": 0.02},
            "fsdp": {"forward": 0.03, "train": 0.08, "step": None},
        }
    }
    return p


def test_whole_model_floor_scales_by_layers_worked_by_hand():
    """The host floor grows with the kernels launched, so with layers, not with width: a 28-layer model of
    tiny's layer shape pays 14 x the 2-layer floor; a path or kind not measured (or none at all) is 0."""
    from dataclasses import replace

    p = _overheads_profile()
    assert p.overhead("train", TINY) == pytest.approx(0.04)
    assert p.overhead("train", replace(TINY, num_layers=28)) == pytest.approx(0.04 * 14)
    assert p.overhead("forward", TINY, fsdp=True) == pytest.approx(0.03)
    assert p.overhead("step", TINY, fsdp=True) == 0.0  # measured as None (no room for Adam's state)
    # Another layer shape: the nearest measured one, scaled by layers (here 32 / 2).
    assert p.overhead("train", named_spec("llama-2-7b")) == pytest.approx(0.04 * 16)
    assert hand_profile().overhead("train", TINY) == 0.0


def test_overheads_and_process_memory_survive_a_save_and_old_profiles_load_without_them(tmp_path):
    p = _overheads_profile()
    p.process_memory = {"context_bytes": 5.5e8, "nccl_bytes": 5.9e8}
    p.save(tmp_path / "p.json")
    loaded = Profile.load(tmp_path / "p.json")
    assert loaded.overheads == p.overheads and loaded.process_memory == p.process_memory
    old = json.loads((tmp_path / "p.json").read_text())
    del old["overheads"], old["process_memory"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert (Profile.load(tmp_path / "old.json").overheads, Profile.load(tmp_path / "old.json").process_memory) == (
        {},
        {},
    )


def test_measure_overheads_on_cpu_times_both_paths():
    """The tiny model's whole-model floor on CPU, on realm's single-replica path and under FSDP2 (a
    one-rank gloo group with a file rendezvous): every kind measured, each a positive time."""
    from planning.profile import OVERHEAD_KINDS, measure_overheads

    out = measure_overheads({"tiny": TINY}, device="cpu", repeats=1, progress=False)["tiny"]
    assert (out["rows"], out["tokens"], out["dtype"]) == (1, 16, "float32")
    for path in ("plain", "fsdp"):
        assert all(out[path][kind] > 0 for kind in OVERHEAD_KINDS), out


def test_the_host_floor_prices_many_small_micro_batches_and_flips_the_choice():
    """A micro-batch takes at least the host's floor (``Profile.overhead``). Worked example on the tiny
    shape (2 layers): a layer's training pass costs 1 s per 100 tokens (linear), the head almost nothing,
    the floor of a whole training micro-batch is 3 s and of a forward 1 s. 4 rows of 100 tokens:

    - one micro-batch: 2 layers x 4 s = 8 s (past the floor);
    - 4 micro-batches: each 2 x 1 s = 2 s of compute but 3 s of host: 12 s (8 s without the floor);
    - one micro-batch with activation checkpointing: 8 x 4/3 = 10.67 s (floor 3 + 1 s, below it).

    Without the floor the search would rather split into 4 micro-batches than recompute (8 < 10.67); with it,
    recomputing one micro-batch wins (10.67 < 12). An optimizer step pays the whole-model step's excess over
    the Adam the layers price: 0.05 - 2 x 0.01 = 0.03 s.
    """
    key = _shape_key(TINY)
    fields = {k: getattr(TINY, k) for k in TINY.__dataclass_fields__}
    rows = [
        {"op": op, "shape": key, "tp": 1, "tokens": t, "context": 0, "seconds": s * t / 100}
        for op, s in (("train", 1.0), ("forward", 1 / 3), ("head_train", 1e-9), ("head_forward", 1e-9))
        for t in (100, 400)
    ] + [{"op": "optimizer", "shape": key, "tp": 1, "tokens": 0, "context": 0, "seconds": 0.01}]
    bare = Profile("hand-made", rows, {key: fields})
    floored = Profile("hand-made", rows, {key: fields})
    floored.overheads = {"tiny": {"spec": fields, "plain": {"forward": 1.0, "train": 3.0, "step": 0.05}}}
    w = Workload(TINY, TINY, None, batch=4, prompt_len=100, gen_len=0)
    one, four = CallAllocation((0,)), CallAllocation((0,), num_microbatches=4)
    recompute = CallAllocation((0,), activation_checkpointing=True)
    adam = 2 * 0.01

    def price(profile: Profile, alloc: CallAllocation) -> float:
        return call_seconds("actor_train", TINY, alloc, w, hardware("h200", 1, 1, profile)) - adam

    assert (price(bare, one), price(bare, four), price(bare, recompute)) == pytest.approx((8.0, 8.0, 32 / 3))
    step = 0.05 - adam
    assert (price(floored, one), price(floored, four), price(floored, recompute)) == pytest.approx(
        (8.0 + step, 12.0 + step, 32 / 3 + step)
    )
