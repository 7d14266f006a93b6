"""Layouts as data: worked examples of boxes, and shapes from HF configs vs real HF models."""

import pytest
import torch

from reallocation.layout import (
    Layout,
    ModelSpec,
    box_numel,
    chunk_interval,
    intersect,
    pipeline_stage_of_layer,
    subtract,
)
from tests.reallocation.realloc_testlib import tiny_spec


def test_chunk_interval_matches_torch_chunk():
    # FSDP2 and DTensor Shard use torch.chunk: ceil-sized chunks, trailing chunks short or empty.
    for n in range(0, 13):
        for k in range(1, 6):
            chunks = torch.arange(n).chunk(k) if n else []
            sizes = [len(c) for c in chunks] + [0] * (k - len(chunks))
            got = [chunk_interval(n, k, i) for i in range(k)]
            assert [b - a for a, b in got] == sizes
            assert got[0][0] == 0 and all(got[i][1] == got[i + 1][0] for i in range(k - 1))


def test_subtract_partitions_the_difference():
    a = ((0, 10), (0, 6))
    b = ((3, 5), (2, 8))
    pieces = subtract(a, b)
    assert sum(box_numel(p) for p in pieces) == box_numel(a) - box_numel(intersect(a, b))
    assert all(intersect(p, b) is None for p in pieces)
    assert all(intersect(p, q) is None for i, p in enumerate(pieces) for q in pieces[i + 1 :])
    assert subtract(a, ((20, 30), (0, 1))) == [a]


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
@pytest.mark.parametrize("tied", [True, False])
def test_model_spec_matches_hf_model(model_type, tied):
    transformers = pytest.importorskip("transformers")
    cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[model_type]
    config = cls(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    model = model_cls(config)
    spec = ModelSpec.from_hf_config(config)
    # Same names, order and shapes as named_parameters (which drops a tied lm_head).
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == list(spec.shapes().items())
    assert spec.num_params() == sum(p.numel() for p in model.parameters())


def test_fsdp_boxes_are_uneven_dim0_chunks():
    spec = tiny_spec(vocab_size=130)
    params = {p.name: p for p in spec.params()}
    layout = Layout(fsdp=4)
    embed = params["model.embed_tokens.weight"]  # [130, 64] -> 33, 33, 33, 31 rows
    assert [layout.box(embed, r, spec) for r in range(4)] == [
        ((0, 33), (0, 64)),
        ((33, 66), (0, 64)),
        ((66, 99), (0, 64)),
        ((99, 130), (0, 64)),
    ]
    norm = params["model.norm.weight"]  # [64] -> 16 each
    assert layout.box(norm, 3, spec) == ((48, 64),)


def test_tp_boxes_column_row_vocab_and_kv_replication():
    spec = tiny_spec()  # 4 heads, 2 kv heads, head_dim 16, intermediate 96
    p = {x.name: x for x in spec.params()}
    tp4 = Layout(tp=4)
    # Column-parallel q: one head (16 rows) per rank.
    assert tp4.box(p["model.layers.0.self_attn.q_proj.weight"], 2, spec) == ((32, 48), (0, 64))
    # 2 kv heads over 4 ranks: ranks 0,1 hold kv head 0, ranks 2,3 kv head 1 (vLLM's rule).
    k = p["model.layers.0.self_attn.k_proj.weight"]
    assert [tp4.box(k, r, spec) for r in range(4)] == [((0, 16), (0, 64))] * 2 + [((16, 32), (0, 64))] * 2
    assert tp4.box(p["model.layers.0.self_attn.k_proj.bias"], 3, spec) == ((16, 32),)
    # Row-parallel o/down split dim 1; norms replicated.
    assert tp4.box(p["model.layers.1.mlp.down_proj.weight"], 1, spec) == ((0, 64), (24, 48))
    assert tp4.box(p["model.layers.1.input_layernorm.weight"], 1, spec) == ((0, 64),)
    # Vocab-parallel embedding; vLLM pads 100 -> 128 and gives each of 2 ranks 64 rows.
    small = tiny_spec(vocab_size=100)
    embed = small.params()[0]
    assert Layout(tp=2).box(embed, 1, small) == ((50, 100), (0, 64))
    assert Layout(tp=2, vocab_pad_to=64).box(embed, 1, small) == ((64, 100), (0, 64))


def test_tp_then_fsdp_chunks_the_tp_local_shard():
    spec = tiny_spec()
    q = spec.params()[1]  # q_proj.weight [64, 64]
    layout = Layout(fsdp=2, tp=2)  # rank = f * 2 + t
    # tp rank 1 holds rows 32..64; fsdp rank 1 of that holds 48..64.
    assert layout.box(q, 3, spec) == ((48, 64), (0, 64))
    assert layout.coords(3) == (0, 0, 1, 1)


def test_pipeline_stages_and_tied_embedding():
    assert [pipeline_stage_of_layer(layer, 5, 2) for layer in range(7)] == [0, 0, 0, 0, 1, 1, 1]
    spec = tiny_spec(num_layers=4)
    holdings = Layout(pp=2, tp=2).holdings(spec)
    assert set(holdings["model.embed_tokens.weight"]) == {0, 1, 2, 3}  # tied: first and last stage
    assert set(holdings["model.layers.1.mlp.up_proj.weight"]) == {0, 1}
    assert set(holdings["model.layers.2.mlp.up_proj.weight"]) == {2, 3}
    assert set(holdings["model.norm.weight"]) == {2, 3}
    untied = Layout(pp=2).holdings(tiny_spec(num_layers=4, tied=False))
    assert set(untied["model.embed_tokens.weight"]) == {0} and set(untied["lm_head.weight"]) == {1}


def test_layout_ranks_map_to_global_ranks():
    spec = tiny_spec()
    holdings = Layout(tp=2, ranks=(5, 7)).holdings(spec)
    assert holdings["model.embed_tokens.weight"] == {5: ((0, 64), (0, 64)), 7: ((64, 128), (0, 64))}
    with pytest.raises(ValueError):
        Layout(tp=2, ranks=(1,))


def test_head_misaligned_tp_falls_back_to_even_chunks():
    # 2 kv heads (32 rows) over 3 ranks: no replication rule applies, so DTensor-style chunks.
    spec = tiny_spec()
    k = spec.params()[3]
    assert k.name.endswith("k_proj.weight")
    assert [Layout(tp=3).box(k, r, spec) for r in range(3)] == [
        ((0, 11), (0, 64)),
        ((11, 22), (0, 64)),
        ((22, 32), (0, 64)),
    ]
