"""FSDP2 and DTensor tensor parallelism for HF Llama/Qwen2 models, applied from outside.

The trainer builds an ordinary ``transformers`` model (``*ForCausalLM``, ``*ForTokenClassification``
or ``*ForSequenceClassification``) and calls::

    mesh = make_mesh(dp=2, tp=2)                 # DeviceMesh ("dp", "tp"); gloo on CPU, NCCL on GPU
    apply_tp(model, mesh["tp"])                  # if tp > 1: before FSDP, like torchtitan
    apply_fsdp(model, mesh["dp"], param_dtype=torch.bfloat16)
    # or both at once: parallelize(model, mesh)

The resulting shards are exactly ``Layout(fsdp=dp, tp=tp)`` (``layout.py``): column-parallel
q/k/v/gate/up, row-parallel o/down, vocab-parallel embedding and LM head, replicated norms and
classification heads, then FSDP2's dim-0 chunking of every (TP-local) parameter.

TP needs ``num_heads`` and ``num_kv_heads`` divisible by ``tp``: HF's attention derives the
local head count from the projection width and keeps the global q/kv group ratio, which only
holds when both head counts shrink by the same factor (no kv replication in training).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn


def make_mesh(dp: int = 1, tp: int = 1, device_type: str | None = None):
    """A 2-D ``DeviceMesh`` with dims ``("dp", "tp")`` over the default process group."""
    from torch.distributed.device_mesh import init_device_mesh

    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    return init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))


def _base(model: nn.Module) -> Any:
    """The decoder stack (``model.model`` for HF Llama/Qwen2 heads), with ``.layers`` and ``.embed_tokens``."""
    base = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    if base is None or not hasattr(base, "layers"):
        raise TypeError(f"expected an HF Llama/Qwen2 model with .{getattr(model, 'base_model_prefix', 'model')}.layers")
    return base


def apply_tp(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """Shard ``model`` in place with DTensor tensor parallelism over the 1-D ``tp_mesh``.

    Activations between blocks stay replicated (no sequence parallelism); logits come out
    replicated and full-vocab, so the model's outputs and loss code are unchanged.
    """
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    tp = tp_mesh.size()
    config: Any = model.config
    num_kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if config.num_attention_heads % tp or num_kv % tp:
        raise ValueError(
            f"tp={tp} must divide num_attention_heads={config.num_attention_heads} and num_key_value_heads={num_kv}"
        )
    base = _base(model)
    for layer in base.layers:
        if not hasattr(layer, "self_attn"):  # a block another pipeline stage holds
            continue
        parallelize_module(
            layer,
            tp_mesh,
            {
                "self_attn.q_proj": ColwiseParallel(),
                "self_attn.k_proj": ColwiseParallel(),
                "self_attn.v_proj": ColwiseParallel(),
                "self_attn.o_proj": RowwiseParallel(),
                "mlp.gate_proj": ColwiseParallel(),
                "mlp.up_proj": ColwiseParallel(),
                "mlp.down_proj": RowwiseParallel(),
            },
        )
    # On pipeline stages (runtime/device/pipeline.py) the embedding may be absent and the head a pass-through.
    head: Any = model.lm_head if isinstance(getattr(model, "lm_head", None), nn.Linear) else None
    embed: Any = base.embed_tokens
    tied = head is not None and embed is not None and head.weight is embed.weight
    if embed is not None:
        # RowwiseParallel on an Embedding shards the vocabulary (dim 0) and all-reduces the output.
        parallelize_module(embed, tp_mesh, RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()))
    if head is not None:
        parallelize_module(head, tp_mesh, ColwiseParallel(output_layouts=Replicate()))
        if tied:
            # parallelize_module replaced each module's Parameter with its own DTensor; both are
            # Shard(0) over the same mesh, so re-tying keeps one shared, sharded tensor.
            head.weight = base.embed_tokens.weight
    return model


def apply_fsdp(
    model: nn.Module,
    dp_mesh: Any,
    *,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = torch.float32,
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
) -> nn.Module:
    """Wrap each decoder block and then the root with FSDP2 ``fully_shard`` over ``dp_mesh``.

    ``param_dtype`` is the compute dtype for the all-gathered parameters (e.g. bf16); the sharded
    parameters the optimizer sees keep the model's dtype. The embedding, final norm and (tied)
    LM head belong to the root group, so a tied weight is sharded once.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    # FSDP2 warns, every forward, when a wrapped model returns a view (the critic's and a value-head reward
    # model's one-column scores are): only an in-place op on that output would skip its pre-backward
    # hook, and none is made; sharded training takes one process's step
    # (tests/runtime/test_shards.py::test_two_gloo_ranks_match_one_unsharded_process).
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor", category=UserWarning)
    kwargs: dict[str, Any] = {
        "mesh": dp_mesh,
        "reshard_after_forward": reshard_after_forward,
        "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
    }
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in _base(model).layers:
        fully_shard(layer, **kwargs)
    # The root's parameters are used first (embedding) and last (head): keep them gathered.
    fully_shard(model, **{**kwargs, "reshard_after_forward": False})
    return model


def parallelize(model: nn.Module, mesh: Any, **fsdp_kwargs) -> nn.Module:
    """``apply_tp`` over ``mesh["tp"]`` (when its size > 1), then ``apply_fsdp`` over ``mesh["dp"]``."""
    if mesh["tp"].size() > 1:
        apply_tp(model, mesh["tp"])
    return apply_fsdp(model, mesh["dp"], **fsdp_kwargs)
