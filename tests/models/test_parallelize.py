"""apply_fsdp / apply_tp on tiny HF models over gloo: forward matches the unsharded model, every
local shard is exactly the box ``Layout`` predicts, and the weight-sync entries return the
reference weights (full on rank 0; fused vLLM shards per TP rank)."""

import pytest
import torch

from reallocation.layout import Layout, ModelSpec, full_box, local_slices
from reallocation.names import vllm_layout, vllm_local_shapes
from tests import tolerance as tol
from tests.reallocation.realloc_testlib import run_ranks

transformers = pytest.importorskip("transformers")
SHAPE = tol.Reductions(num_layers=2, hidden=64, intermediate=96, head_dim=16, vocab=128)  # ``_model``'s
NUM_TOKENS = 12


def _model(kind: str, tied: bool):
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[kind]
    config = config_cls(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return model_cls(config).eval()


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _check_boxes(model, layout, spec, ref, rank):
    """Names of parameters whose local shard differs from the layout's box of the reference."""
    index = layout.global_ranks.index(rank)
    params = {p.name: p for p in spec.params()}
    bad = []
    for name, param in model.named_parameters():
        box = layout.box(params[name], index, spec)
        local = _local(param).detach()
        want = ref[name][local_slices(box, full_box(ref[name].shape))] if box else ref[name][:0]
        if local.shape != want.shape or not torch.equal(local, want):
            bad.append(name)
    return bad


def _fused_reference(ref, spec, layout, index):
    """What vLLM TP rank ``index`` must hold, built from the full reference weights."""
    from reallocation.names import to_vllm_shards

    pairs = []
    for p in spec.params():
        box = layout.box(p, index, spec)
        pairs.append((p.name, ref[p.name][local_slices(box, full_box(p.shape))]))
    return dict(to_vllm_shards(pairs, spec, layout.tp))


def _worker(rank, world_size, kind, tied, dp, tp):
    import torch.distributed as dist

    from models.parallelize import make_mesh, parallelize
    from reallocation.sync import iter_full_weights, iter_layout_weights

    model = _model(kind, tied)
    ref = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.randint(0, 128, (2, NUM_TOKENS), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
    parallelize(model, make_mesh(dp=dp, tp=tp, device_type="cpu"))
    spec = ModelSpec.from_hf_config(model.config)
    out = {"bad_boxes": _check_boxes(model, Layout(fsdp=dp, tp=tp), spec, ref, rank)}
    with torch.no_grad():
        got = model(ids).logits
    out["max_err"], out["scale"] = float((got - want).abs().max()), tol.scale_of(want)

    full = dict(iter_full_weights(model, dst_rank=0, bucket_bytes=16 << 10))
    if rank == 0:
        out["full_bad"] = [n for n in ref if n not in full or not torch.equal(full[n], ref[n])] + [
            n for n in full if n not in ref
        ]
    else:
        out["full_bad"] = list(full)  # other ranks receive nothing

    # vLLM destination: TP = world size on all ranks, fused names, bf16 on the wire.
    layout = vllm_layout(tp=world_size)
    shards = dict(iter_layout_weights(model, layout, spec, vllm_names=True, dtype=torch.bfloat16, bucket_bytes=8 << 10))
    want_vllm = _fused_reference({n: t.to(torch.bfloat16) for n, t in ref.items()}, spec, layout, rank)
    out["vllm_keys"] = sorted(shards) == sorted(want_vllm) == sorted(vllm_local_shapes(spec, world_size))
    out["vllm_bad"] = [n for n in want_vllm if not torch.equal(shards[n], want_vllm[n])]

    # Training continues to work after a sync (shards were only read).
    model.train()
    loss = model(ids, labels=ids).loss
    loss.backward()
    out["loss_finite"] = bool(torch.isfinite(loss))
    dist.barrier()
    return out


CASES = {  # name: (model, tied, dp, tp); all on 2 ranks, run in one spawn (start-up dominates)
    "fsdp2-llama-tied": ("llama", True, 2, 1),
    "tp2-qwen2-untied": ("qwen2", False, 1, 2),
}


def _all_cases(rank, world_size):
    return {name: _worker(rank, world_size, *args) for name, args in CASES.items()}


@pytest.fixture(scope="module")
def all_results():
    per_rank = run_ranks(_all_cases, 2)
    return {name: [r[name] for r in per_rank] for name in CASES}


@pytest.fixture(params=list(CASES))
def case(request, all_results):
    return request.param, all_results[request.param]


def test_local_shards_match_layout(case):
    _, results = case
    assert all(r["bad_boxes"] == [] for r in results)


def _assert_forward_matches(results) -> None:
    """Rule 1 of tests/tolerance.py for the logits (no log-softmax on their path)."""
    bound = tol.rounding(SHAPE.forward(NUM_TOKENS, lm_head=False), max(r["scale"] for r in results))
    tol.assert_scalars_close({"logits": max(r["max_err"] for r in results)}, {"logits": 0.0}, {"logits": bound})


@pytest.mark.equivalence
def test_forward_matches_unsharded(case):
    _, results = case
    _assert_forward_matches(results)


def test_iter_full_weights_is_exact_on_rank_0(case):
    _, results = case
    assert all(r["full_bad"] == [] for r in results)


def test_vllm_fused_shards_are_exact(case):
    _, results = case
    assert all(r["vllm_keys"] and r["vllm_bad"] == [] for r in results)
    assert all(r["loss_finite"] for r in results)


@pytest.mark.slow
@pytest.mark.equivalence
def test_fsdp2_x_tp2_on_4_ranks():
    results = run_ranks(_worker, 4, "qwen2", True, 2, 2)
    _assert_forward_matches(results)
    for r in results:
        assert r["bad_boxes"] == [] and r["full_bad"] == [] and r["vllm_keys"] and r["vllm_bad"] == []
