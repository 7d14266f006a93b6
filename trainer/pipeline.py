"""Pipeline-parallel inference: one HF model cut into stages, activations passed stage to stage.

A stage is the ordinary ``transformers`` model with what other stages hold taken out
(``keep_stage``): decoder blocks outside its run become parameter-free pass-throughs, the
embedding stays on the first stage (and on the last when the LM head shares it), the final norm
and the head on the last. Parameter names do not change (``model.layers.5.mlp.up_proj.weight``
stays that), so reallocation, which matches shards by HF name, moves weights into stages like into
any other layout. Blocks go to stages as ``reallocation.layout.pipeline_stage_of_layer`` says,
the split the cost model prices.

The stages run HF's own forward: the first from token ids, the others from the hidden states
they receive (``inputs_embeds``); masks and rotary positions are rebuilt from the same batch on
every stage, so stage k computes exactly what blocks of the unsplit model compute. Every stage
sees the same rows and cuts them into the same micro-batches, so each knows the shape it
receives; micro-batch i+1 enters stage 0 while stage 1 computes micro-batch i.

Inference only: the runtime refuses pp > 1 for training calls and generation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from reallocation.layout import pipeline_stage_of_layer
from reallocation.parallelize import _base

# Hidden states travel in float32 whatever the compute dtype: the residual stream's dtype under
# autocast is not the compute dtype, and the receiver must know it in advance.
WIRE_DTYPE = torch.float32


@dataclass(frozen=True)
class PipelineStage:
    """Where one rank sits in its replica's pipeline: ``prev`` / ``next`` are the global ranks it
    receives from and sends to (None at the ends), over ``group`` (the replica's process group)."""

    stage: int
    num_stages: int
    prev: int | None
    next: int | None
    group: Any = None

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1


class _HeldElsewhere(nn.Module):
    """A decoder block another stage holds: hidden states pass through unchanged."""

    def forward(self, hidden_states: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return hidden_states


def stage_blocks(num_layers: int, stage: int, num_stages: int) -> list[int]:
    """Decoder block indices (0-based) that ``stage`` holds; pipeline layer ``i + 1`` is block ``i``."""
    return [i for i in range(num_layers) if pipeline_stage_of_layer(i + 1, num_layers, num_stages) == stage]


def keep_stage(model: nn.Module, stage: int, num_stages: int) -> nn.Module:
    """Take out of ``model`` (in place) what other stages hold; returns it."""
    if num_stages == 1:
        return model
    base = _base(model)
    kept = set(stage_blocks(len(base.layers), stage, num_stages))
    for i in range(len(base.layers)):
        if i not in kept:
            base.layers[i] = _HeldElsewhere()
    head = _head(model)
    first, last = stage == 0, stage == num_stages - 1
    tied = head is not None and base.embed_tokens is not None and head.weight is base.embed_tokens.weight
    if not first and not (last and tied):
        base.embed_tokens = None
    if not last:
        base.norm = _HeldElsewhere()
        if head is not None:
            setattr(model, _head_name(model), None)
    return model


def _head_name(model: nn.Module) -> str:
    return next((name for name in ("lm_head", "score") if getattr(model, name, None) is not None), "")


def _head(model: nn.Module) -> Any:
    name = _head_name(model)
    return getattr(model, name) if name else None


def last_stage_inputs(
    model: nn.Module, pipe: PipelineStage, batch: Mapping[str, Tensor], position_ids: Tensor
) -> Tensor | None:
    """Run this stage's part of the forward on one micro-batch. The last stage gets the hidden
    states its head's forward starts from (``inputs_embeds``); the other stages compute their
    blocks, send the result on and get None. Collective over the replica (every stage calls it
    with the same micro-batch)."""
    hidden: Tensor | None = None
    if not pipe.is_first:
        rows, cols = batch["input_ids"].shape
        config: Any = model.config
        width = int(config.hidden_size)
        hidden = torch.empty(rows, cols, width, dtype=WIRE_DTYPE, device=batch["input_ids"].device)
        dist.recv(hidden, src=pipe.prev, group=pipe.group)
    if pipe.is_last:
        return hidden
    out = _base(model)(
        input_ids=batch["input_ids"] if hidden is None else None,
        inputs_embeds=hidden,
        attention_mask=batch["attention_mask"],
        position_ids=position_ids,
        use_cache=False,
    )
    dist.send(out.last_hidden_state.to(WIRE_DTYPE).contiguous(), dst=pipe.next, group=pipe.group)
    return None
