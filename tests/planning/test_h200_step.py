"""The cost model on the H200 policy steps it can be held against (``bench/h200_step.py``): the shipped
profile's prices, worked by hand from ``planning/profiles/h200.json``, and every measured point within the
error ``docs/plan_search.md`` states."""

from __future__ import annotations

import pytest

from bench.h200_step import GIB, MEASURED, h200, predict


@pytest.fixture(scope="module")
def hw():
    return h200()


def test_the_measured_fsdp_step_is_its_host_floor_plus_the_whole_model_step(hw):
    """8 rows x 1024 tokens under FSDP2 at a world of 1: the layers compute for 0.171 s (28 x the profiled
    layer's forward + backward, plus the LM head), under the profile's FSDP2 train floor, 0.2088 s (its
    ``overheads`` row, ``fsdp.train``); the step adds the whole-model step, 0.0369 s (``fsdp.step``: the
    fused Adam the layers price, 0.0105 s, plus the rest). Measured 0.262 s (1.07x)."""
    seconds, _ = predict("fsdp", 8, False, hw)
    assert seconds == pytest.approx(0.20885 + 0.03687, abs=1e-4)


def test_the_plain_four_row_step(hw):
    """realm's single-replica path, 4 rows: the plain train floor 0.1187 s beats the layers' 0.099 s, and the
    plain whole-model step is 0.0220 s. Measured 0.167 and 0.160 s."""
    seconds, _ = predict("plain", 4, False, hw)
    assert seconds == pytest.approx(0.11871 + 0.02202, abs=1e-4)


def test_the_step_memory_is_training_state_activations_and_logits(hw):
    """1,543,714,304 parameters x 16 B (float32 weights, gradients, Adam m and v) = 23.00 GiB; 8,192 tokens x
    17 values x 2 B x 1,536 hidden x 28 layers = 11.16 GiB; float32 logits twice, 2 x 8,192 x 151,936 x 4 B
    = 9.27 GiB: 43.43 GiB, against 46.9 measured."""
    _, nbytes = predict("fsdp", 8, False, hw)
    want = 1_543_714_304 * 16 + 8192 * 17 * 2 * 1536 * 28 + 2 * 8192 * 151_936 * 4
    assert nbytes == want
    assert nbytes / GIB == pytest.approx(43.43, abs=0.01)


def test_every_measured_point_is_within_the_stated_error(hw):
    """docs/plan_search.md: measured / predicted 0.91-1.38 for time, 0.75-1.33 for peak memory."""
    for p in MEASURED:
        seconds, nbytes = predict(p.path, p.rows, p.checkpointing, hw)
        assert 0.90 <= p.seconds / seconds <= 1.40, p
        if p.peak_gib is not None:
            assert 0.74 <= p.peak_gib / (nbytes / GIB) <= 1.34, p
