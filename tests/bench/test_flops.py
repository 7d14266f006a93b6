"""bench/flops.py: FLOP counts worked out by hand, and logged forwards attributed to calls and iterations."""

from __future__ import annotations

import pytest

from bench.flops import (
    ModelShape,
    call_matmuls,
    call_of,
    call_report,
    iteration_starts,
    matmul_rate_gflops,
    peak_of,
    record_flops,
    work_by_call,
)

# 1 layer, hidden 4, 2 heads of 2 (q: 4), 1 kv head (k, v: 2 each), MLP 8, vocabulary 10.
SMALL = ModelShape(num_layers=1, hidden=4, num_heads=2, num_kv_heads=1, head_dim=2, intermediate=8, vocab=10)


def _line(kind="logprobs", grad=False, model=1, start=0.0, end=1.0, **counts):
    base = dict(tokens=3, pairs=6, computed_tokens=4, computed_pairs=10, head_tokens=2, head_positions=2)
    return {"kind": kind, "grad": grad, "model": model, "threads": 1, "start": start, "end": end, **base, **counts}


def test_flop_count_worked_example():
    # Linear weights per layer: q 4x4 + k, v 2 x (4x2) + o 4x4 + MLP 3 x (4x8) = 144 -> 288 FLOPs per token.
    assert SMALL.linear_flops_per_token == 288
    # Attention: 4 x 1 layer x 2 heads x head_dim 2 = 16 per causal pair.
    assert SMALL.attention_flops_per_pair == 16
    # One row of 3 real tokens (6 pairs), the head on its 2 response tokens: 3 x 288 + 6 x 16 + 2 x 4 x 10 x 2.
    assert SMALL.forward_flops(tokens=3, pairs=6, head_positions=2) == 864 + 96 + 160 == 1120
    # The same row padded to 4 columns: 4 x 288 + 10 x 16 + 160 = 1472, of which 352 on padding.
    assert record_flops(SMALL, _line()) == (1120, 352)
    # A training pass is 3 forwards; a value model's head is 2 x hidden per token (3 x 8 = 24, not 160).
    assert record_flops(SMALL, _line(grad=True)) == (3 * 1120, 3 * 352)
    assert record_flops(SMALL, _line(kind="values"))[0] == 864 + 96 + 24


def test_smollm2_shape_by_hand():
    # SmolLM2-135M: 30 layers, hidden 576, 9 heads of 64, 3 kv heads, MLP 1536, vocabulary 49,152.
    shape = ModelShape.from_config(
        {
            "num_hidden_layers": 30,
            "hidden_size": 576,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "intermediate_size": 1536,
            "vocab_size": 49152,
        }
    )
    # per layer 576^2 (q) + 2 x 576 x 192 (k, v) + 576^2 (o) + 3 x 576 x 1536 (MLP) = 3,538,944 weights
    assert shape.head_dim == 64 and shape.linear_flops_per_token == 2 * 30 * 3_538_944 == 212_336_640
    assert shape.forward_flops(tokens=0, pairs=0, head_positions=1) == 2 * 576 * 49152


def test_forwards_are_attributed_to_calls_and_iterations():
    # One process (policy 1, reference 2, critic 3): two iterations of inference then training; the second
    # iteration begins after the first's last training pass ends (t = 4).
    lines = [
        _line(model=1, start=0, end=1),  # actor_inf
        _line(model=2, start=1, end=2),  # ref_inf
        _line(kind="values", model=3, start=2, end=3),  # critic_inf
        _line(model=1, grad=True, start=3, end=3.5),  # actor_train
        _line(kind="values", model=3, grad=True, start=3.5, end=4),  # critic_train
        _line(model=1, start=10, end=11),
        _line(model=2, start=11, end=12),
        _line(model=1, grad=True, start=12, end=13),
    ]
    # A second process holding only a reference replica: attributed by time.
    ref_only = [_line(model=7, start=0.5, end=1.5), _line(model=7, start=10.5, end=11.5)]
    logs = {100: lines, 200: ref_only}
    assert iteration_starts(logs) == [4]
    assert [call_of(line, {1}) for line in lines[:5]] == [
        "actor_inf",
        "ref_inf",
        "critic_inf",
        "actor_train",
        "critic_train",
    ]
    shapes = {"actor": SMALL, "critic": SMALL}
    second = work_by_call(shapes, logs, timed=[1])
    assert sorted(second) == ["actor_inf", "actor_train", "ref_inf"]
    assert second["ref_inf"].num_forwards == 2 and second["ref_inf"].flops == 2 * 1120  # both processes
    assert second["actor_train"].flops == 3 * 1120


def test_call_report_divides_by_iterations_and_names_the_peak():
    work = work_by_call({"actor": SMALL, "critic": SMALL}, {1: [_line(), _line(start=5, end=6)]}, timed=[0])
    # 2 forwards of 1120 real FLOPs (+352 padding) in 1 timed iteration, 1e-6 s per call on 1 device, 1 thread.
    report = call_report(work["ref_inf"], 1, 1e-6, 1, peaks=(10.0, 15.0), empty_call_s=None)
    assert report["gflop"] == pytest.approx(2240e-9) and report["gflops"] == pytest.approx(2.24)
    assert report["padding_fraction"] == pytest.approx(704 / (2240 + 704))
    assert report["cores"] == 1 and report["peak_gflops"] == 10.0
    assert report["fraction_of_peak"] == pytest.approx(0.224)
    # Two one-thread device processes add up (2 x 10), one process on every core gets the all-thread peak.
    assert call_report(work["ref_inf"], 1, 1e-6, 2, (10.0, 15.0), None)["peak_gflops"] == 20.0
    assert peak_of(1, 2, 10.0, 15.0, cpu_count=2) == 15.0 and peak_of(1, 2, 10.0, 15.0, cpu_count=4) == 20.0


def test_call_matmuls_lists_each_layer_and_the_head_blocks():
    # SMALL over 5 tokens, the head on 3 positions in blocks of 2 rows: q (5x4 @ 4x4), k and v (5x4 @ 4x2,
    # merged: 2), o (5x4 @ 4x4: the same shape as q, merged), gate and up (5x4 @ 4x8), down (5x8 @ 8x4),
    # the head's blocks of 2 and 1 rows (2x4 @ 4x10, 1x4 @ 4x10).
    forward = call_matmuls(SMALL, tokens=5, head_positions=3, training=False, head_rows=2)
    assert sorted(forward) == sorted(
        [(5, 4, 4, 2), (5, 4, 2, 2), (5, 4, 8, 2), (5, 8, 4, 1), (2, 4, 10, 1), (1, 4, 10, 1)]
    )
    flops = sum(2 * m * k * n * c for m, k, n, c in forward)
    # The layers' FLOPs are linear_flops_per_token's; the head's are 2 x hidden x vocab per position.
    assert flops == 5 * SMALL.linear_flops_per_token + 3 * 2 * 4 * 10
    # Training adds each matmul's two gradients, as many FLOPs each: 3 x the forward's.
    training = call_matmuls(SMALL, tokens=5, head_positions=3, training=True, head_rows=2)
    assert sum(2 * m * k * n * c for m, k, n, c in training) == 3 * flops
    # A value model's scalar head is left out.
    assert sum(2 * m * k * n * c for m, k, n, c in call_matmuls(SMALL, 5, 3, False, value_head=True)) == 5 * 288


def test_matmul_rate_is_flops_over_the_matmuls_time():
    rate = matmul_rate_gflops([(64, 64, 64, 3)], num_threads=1, reps=2)
    assert 0.01 < rate < 10_000  # GFLOPS of a real matmul on this machine, whatever it is
    assert matmul_rate_gflops([], num_threads=1) == 0.0
    report = call_report(
        work_by_call({"actor": SMALL, "critic": SMALL}, {1: [_line()]}, timed=[0])["ref_inf"],
        1,
        1e-6,
        1,
        (10.0, 15.0),
        None,
        matmul_rate=2.0,
    )
    assert report["fraction_of_matmul_rate"] == pytest.approx(1120e-9 / 1e-6 / 2.0)
