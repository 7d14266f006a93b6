"""HF <-> vLLM parameter names and shapes for Llama/Qwen2 (no vllm import).

Two ways to load weights into vLLM:

- Through vLLM's loaders (what the plan runtime does, CPU and GPU, any TP):
  ``model_runner.reload_weights(weights_iterator=...)`` takes ``(hf_name, tensor)`` pairs in the
  checkpoint's shapes, cuts each TP rank's part itself, fuses q/k/v and gate/up, and re-runs the
  backend's weight processing (the CPU backend repacks linear weights, so copying into parameters
  is not enough there). An engine rank receives only its own box of each parameter (the destination
  layout is ``vllm_layout(tp, dp)``) and hands the loader ``checkpoint_shaped(shard, box, shape)``:
  its box in place, zeros elsewhere, which the loader cuts away again. Nothing beyond the box
  crosses the wire; the zero-padded tensor lives one parameter at a time on the receiving rank.
- Straight into vLLM's parameters (kernel format, GPU only): each TP worker copies its shard into
  its parameters, whose names and shapes are vLLM's own:

  ======================================  =================================================
  vLLM parameter (per TP rank)            built from (HF, this rank's TP shard)
  ======================================  =================================================
  ``...self_attn.qkv_proj.weight``        cat(q, k, v) on dim 0: ``[(nh/tp + kv) * hd, H]``
  ``...self_attn.qkv_proj.bias``          cat(q, k, v) biases (Qwen2)
  ``...mlp.gate_up_proj.weight``          cat(gate, up) on dim 0: ``[2 * I/tp, H]``
  ``model.embed_tokens.weight``           vocab rows, zero-padded to ``pad64(V) / tp`` rows
  ``lm_head.weight`` (untied only)        same as the embedding
  everything else                         same name, same shard
  ======================================  =================================================

  where ``kv = max(1, nkv / tp)`` kv heads: with ``nkv < tp`` each kv head is replicated on
  ``tp / nkv`` ranks (``layout.KV``). ``to_vllm_shards`` does the fusing with shape checks and
  a key-count check; ``vllm_local_shapes`` is the expected table, to compare against the
  engine's ``named_parameters()`` (``check_vllm_params``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping

import torch

from reallocation.layout import Box, Layout, ModelSpec, Shape, box_shape, full_box

# vLLM's DEFAULT_VOCAB_PADDING_SIZE (vllm/model_executor/layers/vocab_parallel_embedding.py).
VLLM_VOCAB_PAD_TO = 64

# HF projection -> (vLLM fused parameter, position in the fusion).
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}
_NUM_PARTS = {"self_attn.qkv_proj": 3, "mlp.gate_up_proj": 2}
_LAYER = re.compile(r"^(model\.layers\.\d+\.)([a-z_]+\.[a-z_]+)\.(weight|bias)$")
_VOCAB = {"model.embed_tokens.weight", "lm_head.weight"}


def checkpoint_shaped(shard: torch.Tensor, box: Box, shape: Shape) -> torch.Tensor:
    """``shard`` (the part ``box`` of a tensor of ``shape``) placed in a zero tensor of ``shape``:
    the form vLLM's weight loaders take, which cut a TP rank's part out of checkpoint-shaped tensors.

    A full box returns ``shard`` itself. Worked example: rows 2..3 of a (4, 2) tensor::

        checkpoint_shaped(torch.ones(2, 2), ((2, 4), (0, 2)), (4, 2))
        # [[0, 0], [0, 0], [1, 1], [1, 1]]
    """
    if tuple(shard.shape) != box_shape(box):
        raise ValueError(f"shard of shape {tuple(shard.shape)} does not fill box {box}")
    if box == full_box(shape):
        return shard
    out = shard.new_zeros(shape)
    out[tuple(slice(start, stop) for start, stop in box)] = shard
    return out


def vllm_layout(tp: int, dp: int = 1, ranks: tuple[int, ...] | None = None, pp: int = 1) -> Layout:
    """The layout of ``dp`` vLLM engines of ``pp`` stages of tensor parallel size ``tp`` (vocab split
    like vLLM; blocks split into stages as ``Layout`` does, which the engine tells vLLM to follow)."""
    name = f"vllm_tp{tp}" + (f"_pp{pp}" if pp > 1 else "") + (f"x{dp}" if dp > 1 else "")
    return Layout(pp=pp, dp=dp, tp=tp, ranks=ranks, vocab_pad_to=VLLM_VOCAB_PAD_TO, name=name)


def hf_to_vllm_name(hf_name: str) -> tuple[str, int | None]:
    """``(vLLM name, index of this part in the fused tensor or None)``.

    >>> hf_to_vllm_name("model.layers.3.self_attn.k_proj.weight")
    ('model.layers.3.self_attn.qkv_proj.weight', 1)
    """
    m = _LAYER.match(hf_name)
    if m and m.group(2) in _FUSED:
        fused, index = _FUSED[m.group(2)]
        return f"{m.group(1)}{fused}.{m.group(3)}", index
    return hf_name, None


def vllm_local_shapes(model: ModelSpec, tp: int = 1) -> dict[str, Shape]:
    """vLLM parameter name -> shape on one TP rank (tied LM head omitted, as vLLM aliases it)."""
    if model.num_heads % tp or model.intermediate_size % tp:
        raise ValueError(
            f"tp={tp} must divide num_heads={model.num_heads} and intermediate_size={model.intermediate_size}"
        )
    if model.num_kv_heads >= tp and model.num_kv_heads % tp or model.num_kv_heads < tp and tp % model.num_kv_heads:
        raise ValueError(f"tp={tp} and num_kv_heads={model.num_kv_heads} must divide one another")
    padded_vocab = -(-model.vocab_size // VLLM_VOCAB_PAD_TO) * VLLM_VOCAB_PAD_TO
    if padded_vocab % tp:
        raise ValueError(f"padded vocab {padded_vocab} is not divisible by tp={tp}")
    layout = vllm_layout(tp)
    shapes: dict[str, Shape] = {}
    for spec in model.params():
        name, index = hf_to_vllm_name(spec.name)
        if name in _VOCAB:
            shapes[name] = (padded_vocab // tp, model.hidden_size)
            continue
        box = layout.box(spec, 0, model)  # every TP rank's shard has this shape
        assert box is not None
        local = box_shape(box)
        if index:  # a later part of a fused tensor: stack its rows under the earlier parts
            local = (shapes[name][0] + local[0],) + local[1:]
        shapes[name] = local
    return shapes


def to_vllm_shards(
    pairs: Iterable[tuple[str, torch.Tensor]],
    model: ModelSpec,
    tp: int = 1,
    *,
    strict: bool = True,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Turn one vLLM TP rank's HF-named shards into its vLLM parameters.

    ``pairs`` are ``(hf_name, shard)`` for the rank's box in ``vllm_layout(tp)`` (what
    ``sync.iter_layout_weights`` yields), in any order; q/k/v and gate/up parts are held until
    their fused tensor is complete. Every output is checked against ``vllm_local_shapes``; with
    ``strict``, the end of the stream checks that every vLLM parameter came out exactly once.
    """
    expected = vllm_local_shapes(model, tp)
    pending: dict[str, dict[int, torch.Tensor]] = {}
    produced: set[str] = set()

    def emit(name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor]:
        if name not in expected:
            raise KeyError(f"{name} is not a vLLM parameter of this model")
        if tuple(tensor.shape) != expected[name]:
            raise ValueError(f"{name}: shape {tuple(tensor.shape)} != vLLM's {expected[name]}")
        if name in produced:
            raise ValueError(f"{name} produced twice")
        produced.add(name)
        return name, tensor

    for hf_name, shard in pairs:
        name, index = hf_to_vllm_name(hf_name)
        if index is None:
            if name in _VOCAB and shard.shape[0] < expected.get(name, shard.shape)[0]:
                # vLLM's padding rows are never read for real tokens; zeros keep them inert.
                padded = shard.new_zeros(expected[name])
                padded[: shard.shape[0]].copy_(shard)
                shard = padded
            yield emit(name, shard)
            continue
        parts = pending.setdefault(name, {})
        parts[index] = shard
        layer = _LAYER.match(name)
        assert layer is not None  # fused parts (q/k/v, gate/up) are always layer parameters
        if len(parts) == _NUM_PARTS[layer.group(2)]:
            del pending[name]
            yield emit(name, torch.cat([parts[i] for i in range(len(parts))], dim=0))
    if strict:
        if pending:
            raise ValueError(f"incomplete fused parameters: {sorted(pending)[:5]}")
        missing = sorted(set(expected) - produced)
        if missing:
            raise ValueError(f"{len(missing)} vLLM parameters never produced, e.g. {missing[:5]}")


def check_vllm_params(model: ModelSpec, tp: int, named_shapes: Mapping[str, Shape]) -> None:
    """Raise unless an engine's ``{name: shape}`` (one TP rank, e.g. from its
    ``named_parameters()``) matches ``vllm_local_shapes`` in keys and shapes.

    Extra engine-side buffers (e.g. rotary caches) are not parameters and should not be passed.
    """
    expected = vllm_local_shapes(model, tp)
    got = {n: tuple(s) for n, s in named_shapes.items()}
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    wrong = sorted(n for n in set(expected) & set(got) if expected[n] != got[n])
    if missing or extra or wrong:
        raise ValueError(
            f"vLLM parameters differ: {len(expected)} expected, {len(got)} given; missing {missing[:5]}, "
            f"extra {extra[:5]}, wrong shapes {[(n, got[n], expected[n]) for n in wrong[:5]]}"
        )
