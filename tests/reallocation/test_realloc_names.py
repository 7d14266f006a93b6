"""HF -> vLLM names and fused shards: worked examples built independently of the layout code,
plus (slow, optional) a check against a real vLLM engine's parameter names."""

import pytest
import torch

from reallocation.layout import full_box, local_slices
from reallocation.names import check_vllm_params, hf_to_vllm_name, to_vllm_shards, vllm_layout, vllm_local_shapes
from tests.reallocation.realloc_testlib import reference_weights, tiny_spec


def test_hf_to_vllm_name():
    assert hf_to_vllm_name("model.layers.0.mlp.up_proj.weight") == ("model.layers.0.mlp.gate_up_proj.weight", 1)
    assert hf_to_vllm_name("model.layers.12.self_attn.q_proj.bias") == ("model.layers.12.self_attn.qkv_proj.bias", 0)
    assert hf_to_vllm_name("model.layers.0.self_attn.o_proj.weight") == ("model.layers.0.self_attn.o_proj.weight", None)
    assert hf_to_vllm_name("lm_head.weight") == ("lm_head.weight", None)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_fused_shards_worked_example(tp):
    # 4 heads of 16, 2 kv heads, intermediate 96, vocab 100 (vLLM pads it to 128).
    spec = tiny_spec(vocab_size=100, tied=False)
    ref = reference_weights(spec.shapes())
    layout = vllm_layout(tp)
    hd, heads_per_rank = 16, 4 // tp
    for t in range(tp):
        pairs = [(p.name, ref[p.name][local_slices(layout.box(p, t, spec), full_box(p.shape))]) for p in spec.params()]
        got = dict(to_vllm_shards(reversed(pairs), spec, tp))  # order does not matter
        assert {n: tuple(v.shape) for n, v in got.items()} == vllm_local_shapes(spec, tp)
        # qkv: this rank's q heads, then its kv head (shared by tp / 2 ranks when tp > 2).
        kv_head = t // (tp // 2) if tp > 2 else None
        q = ref["model.layers.1.self_attn.q_proj.weight"][t * heads_per_rank * hd : (t + 1) * heads_per_rank * hd]
        kv_rows = (
            slice(kv_head * hd, (kv_head + 1) * hd) if kv_head is not None else slice(t * 32 // tp, (t + 1) * 32 // tp)
        )
        k = ref["model.layers.1.self_attn.k_proj.weight"][kv_rows]
        v = ref["model.layers.1.self_attn.v_proj.weight"][kv_rows]
        assert torch.equal(got["model.layers.1.self_attn.qkv_proj.weight"], torch.cat([q, k, v]))
        qb = ref["model.layers.1.self_attn.q_proj.bias"][t * heads_per_rank * hd : (t + 1) * heads_per_rank * hd]
        assert torch.equal(got["model.layers.1.self_attn.qkv_proj.bias"][: len(qb)], qb)
        # gate_up: this rank's gate rows then up rows.
        rows = slice(t * 96 // tp, (t + 1) * 96 // tp)
        gate_up = torch.cat(
            [ref["model.layers.0.mlp.gate_proj.weight"][rows], ref["model.layers.0.mlp.up_proj.weight"][rows]]
        )
        assert torch.equal(got["model.layers.0.mlp.gate_up_proj.weight"], gate_up)
        # Vocab: 128 / tp padded rows per rank, real rows first, zeros after the real vocabulary.
        per = 128 // tp
        lo, hi = min(t * per, 100), min((t + 1) * per, 100)
        emb = got["model.embed_tokens.weight"]
        assert torch.equal(emb[: hi - lo], ref["model.embed_tokens.weight"][lo:hi])
        assert bool((emb[hi - lo :] == 0).all())
        assert torch.equal(got["lm_head.weight"][: hi - lo], ref["lm_head.weight"][lo:hi])


def test_key_count_and_shape_checks():
    spec = tiny_spec(num_layers=1)
    ref = reference_weights(spec.shapes())
    pairs = list(ref.items())
    with pytest.raises(ValueError, match="never produced"):
        list(to_vllm_shards(pairs[:-1], spec, 1))
    with pytest.raises(ValueError, match="shape"):
        list(to_vllm_shards([(n, t[:1]) if "o_proj" in n else (n, t) for n, t in pairs], spec, 1))
    shapes = vllm_local_shapes(spec, 2)
    check_vllm_params(spec, 2, shapes)
    with pytest.raises(ValueError, match="missing"):
        check_vllm_params(spec, 2, {n: s for n, s in shapes.items() if "norm" not in n})
    with pytest.raises(ValueError):
        vllm_local_shapes(spec, 3)  # 4 heads do not split over 3 ranks


_VLLM_SCRIPT = r"""
import json, os, sys
from transformers import LlamaConfig, LlamaForCausalLM
def main(d):
    cfg = LlamaConfig(vocab_size=200, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(d)
    from vllm import LLM
    llm = LLM(model=d, tokenizer=None, skip_tokenizer_init=True, enforce_eager=True, dtype="float32", max_model_len=64)
    def params(worker):
        return [(n, list(p.shape)) for n, p in worker.model_runner.model.named_parameters()]
    print("PARAMS" + json.dumps(llm.collective_rpc(params)[0]))
if __name__ == "__main__":
    main(sys.argv[1])
"""


@pytest.mark.slow
def test_names_match_a_real_vllm_engine(tmp_path):
    """vLLM's own parameter names (TP=1, CPU) are exactly our map's keys. Shapes on CPU may be
    repacked by vLLM's CPU kernels, so only unrepacked ones are compared."""
    pytest.importorskip("vllm")
    import json
    import os
    import subprocess
    import sys

    from reallocation.layout import ModelSpec

    script = tmp_path / "probe.py"
    script.write_text(_VLLM_SCRIPT)
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "model")], env=env, capture_output=True, text=True, timeout=600
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PARAMS")), None)
    assert line, proc.stderr[-3000:]
    got = {n: tuple(s) for n, s in json.loads(line[len("PARAMS") :])}
    spec = ModelSpec(
        num_layers=2,
        hidden_size=128,
        intermediate_size=256,
        num_heads=2,
        num_kv_heads=1,
        head_dim=64,
        vocab_size=200,
        tie_word_embeddings=False,
    )
    want = vllm_local_shapes(spec, 1)
    assert sorted(got) == sorted(want)
    compared = [name for name, shape in got.items() if 0 not in shape]
    assert {name: got[name] for name in compared} == {name: want[name] for name in compared}
    assert "model.embed_tokens.weight" in compared  # (256, 128): vocab 200 padded to 64


def test_checkpoint_shaped_puts_a_box_in_zeros_of_the_full_shape():
    from reallocation.names import checkpoint_shaped

    out = checkpoint_shaped(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), ((2, 4), (0, 2)), (4, 2))
    assert out.tolist() == [[0, 0], [0, 0], [1, 2], [3, 4]]
    column = checkpoint_shaped(torch.tensor([[5.0], [6.0]]), ((0, 2), (1, 2)), (2, 3))  # a row-parallel piece
    assert column.tolist() == [[0, 5, 0], [0, 6, 0]]
    whole = torch.ones(2, 2)
    assert checkpoint_shaped(whole, ((0, 2), (0, 2)), (2, 2)) is whole  # a full box goes in as it is
    with pytest.raises(ValueError, match="does not fill box"):
        checkpoint_shaped(torch.ones(3, 2), ((2, 4), (0, 2)), (4, 2))
