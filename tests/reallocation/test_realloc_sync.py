"""Weight sync entry points that need no extra processes (multi-rank sync is covered in
tests/models/test_parallelize.py on real FSDP2 / TP models), and the NCCL path (gpu marker)."""

import pytest
import torch


def test_iter_full_weights_without_a_process_group():
    # A single unsharded trainer process: the sync yields its own parameters, deduplicated.
    import torch.distributed as dist
    from torch import nn

    from reallocation.sync import iter_full_weights

    assert not dist.is_initialized()
    emb = nn.Embedding(8, 4)
    model = nn.ModuleDict({"embed": emb, "head": nn.Linear(4, 8, bias=False)})
    model["head"].weight = emb.weight  # tied
    got = list(iter_full_weights(model, dtype=torch.bfloat16))
    assert [n for n, _ in got] == ["embed.weight"]
    assert torch.equal(got[0][1], emb.weight.detach().to(torch.bfloat16))


def _nccl_pairs(rank, world_size):
    from reallocation.layout import Layout
    from reallocation.plan import make_plan
    from reallocation.reshard import reshard
    from tests.reallocation.realloc_testlib import mismatches, reference_weights, shards_of, tiny_spec

    spec = tiny_spec()
    ref = {n: t.cuda() for n, t in reference_weights(spec.shapes()).items()}
    bad = []
    for src_layout, dst_layout in [
        (Layout(fsdp=world_size), Layout(tp=world_size)),
        (Layout(tp=world_size), Layout(dp=world_size)),
    ]:
        src, dst = src_layout.holdings(spec), dst_layout.holdings(spec)
        got, _ = reshard(
            make_plan(src, dst, spec.shapes()), shards_of(src, ref, rank), dtype=torch.float32, bucket_bytes=64 << 10
        )
        bad += mismatches(dst, ref, got, rank)
    return bad


@pytest.mark.gpu
def test_reshard_over_nccl():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    from tests.reallocation.realloc_testlib import run_ranks

    assert run_ranks(_nccl_pairs, 2, backend="nccl") == [[], []]
