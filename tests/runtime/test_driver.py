"""The driver's own helpers: how a batch is cut over data-parallel replicas."""

from __future__ import annotations

import pytest
import torch

from runtime.driver import _row_slices


def test_row_slices_cover_the_batch_in_order():
    batch = {"x": torch.arange(10)}
    assert [p["x"].tolist() for p in _row_slices(batch, 3)] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    with pytest.raises(ValueError, match="2 rows cannot feed 3"):
        _row_slices({"x": torch.arange(2)}, 3)
