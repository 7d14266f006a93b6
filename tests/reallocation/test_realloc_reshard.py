"""Resharding on real gloo ranks: every destination shard equals the same slice of the unsharded
reference, bit for bit, for the issue's layout pairs and back, and the baseline (gather, then
broadcast) agrees. Exactly on every CPU kernel set: resharding copies bytes and casts, it sums nothing.

One spawn per world size runs all pairs (process start-up dominates on 2 cores); each pair is
then checked by its own test.
"""

import pytest
import torch

from reallocation.layout import Layout
from reallocation.plan import lower_bound_elements, make_plan
from reallocation.reshard import reshard, reshard_gather_broadcast
from tests.reallocation.realloc_testlib import mismatches, reference_weights, run_ranks, shards_of, tiny_spec

BUCKET = 64 << 10  # small enough that every pair needs several rounds

PAIRS_4 = {
    "fsdp4->tp2dp2": (Layout(fsdp=4), Layout(dp=2, tp=2)),
    "tp2dp2->dp4": (Layout(dp=2, tp=2), Layout(dp=4)),  # TP(2) -> TP(1) replicas
    "tp4->tp2": (Layout(tp=4), Layout(tp=2)),  # destination on ranks 0, 1 only
    "pp2tp2->tp4": (Layout(pp=2, tp=2), Layout(tp=4)),
}
PAIRS_4.update({f"{k.split('->')[1]}->{k.split('->')[0]}": (b, a) for k, (a, b) in list(PAIRS_4.items())})
PAIRS_2 = {
    "tp2->dp2": (Layout(tp=2), Layout(dp=2)),  # TP(2) -> TP(1) replicas on 2 ranks
    "dp2->tp2": (Layout(dp=2), Layout(tp=2)),
    "fsdp2->tp2": (Layout(fsdp=2), Layout(tp=2)),
    "tp2->fsdp2": (Layout(tp=2), Layout(fsdp=2)),
}


def _run_pairs(rank, world_size, pairs, spec, cast):
    shapes = spec.shapes()
    ref = reference_weights(shapes)
    out = {}
    for key, (src_layout, dst_layout) in pairs.items():
        src, dst = src_layout.holdings(spec), dst_layout.holdings(spec)
        plan = make_plan(src, dst, shapes)
        got, stats = reshard(plan, shards_of(src, ref, rank), dtype=torch.float32, bucket_bytes=BUCKET)
        base = reshard_gather_broadcast(plan, shards_of(src, ref, rank), dtype=torch.float32, bucket_bytes=BUCKET)
        out[key] = dict(
            bad=mismatches(dst, ref, got, rank),
            bad_baseline=mismatches(dst, ref, base, rank),
            received=stats.bytes_received,
            peak=stats.peak_buffer_bytes,
        )
    if cast:
        # fp32 training shards -> bf16 generation shards: cast before sending, exact vs ref.to(bf16).
        src, dst = Layout(fsdp=world_size).holdings(spec), Layout(tp=world_size).holdings(spec)
        got, stats = reshard(make_plan(src, dst, shapes), shards_of(src, ref, rank), dtype=torch.bfloat16)
        bf16 = {n: t.to(torch.bfloat16) for n, t in ref.items()}
        out["cast"] = dict(bad=mismatches(dst, bf16, got, rank), received=stats.bytes_received)
    return out


@pytest.fixture(scope="module")
def results_4():
    return run_ranks(_run_pairs, 4, PAIRS_4, tiny_spec(), True)


@pytest.fixture(scope="module")
def results_2():
    return run_ranks(_run_pairs, 2, PAIRS_2, tiny_spec(tied=False, num_layers=3), False)


def _check(results, pairs, key, spec):
    src_layout, dst_layout = pairs[key]
    for rank, per_rank in enumerate(results):
        r = per_rank[key]
        assert r["bad"] == [], f"rank {rank}: mismatched shards {r['bad'][:5]}"
        assert r["bad_baseline"] == [], f"rank {rank}: baseline mismatched {r['bad_baseline'][:5]}"
        assert r["peak"] <= BUCKET
    # Bytes on the wire == the lower bound (float32).
    lower = lower_bound_elements(src_layout.holdings(spec), dst_layout.holdings(spec)) * 4
    assert sum(per_rank[key]["received"] for per_rank in results) == lower


@pytest.mark.parametrize("key", list(PAIRS_4))
def test_reshard_4_ranks(results_4, key):
    _check(results_4, PAIRS_4, key, tiny_spec())


@pytest.mark.parametrize("key", list(PAIRS_2))
def test_reshard_2_ranks(results_2, key):
    _check(results_2, PAIRS_2, key, tiny_spec(tied=False, num_layers=3))


def test_cast_to_bf16_on_the_wire(results_4):
    for per_rank in results_4:
        assert per_rank["cast"]["bad"] == []
    spec = tiny_spec()
    lower = lower_bound_elements(Layout(fsdp=4).holdings(spec), Layout(tp=4).holdings(spec))
    assert sum(r["cast"]["received"] for r in results_4) == lower * 2  # bf16: 2 bytes per element
