"""Pipeline parallelism: one HF model cut into stages, activations passed stage to stage.

A stage is the ordinary ``transformers`` model with what other stages hold taken out
(``keep_stage``): decoder blocks outside its run, and on all but the last stage the final norm
and the head, become parameter-free pass-throughs; the embedding stays on the first stage (and on
the last when the LM head shares it). Parameter names do not change (``model.layers.5.mlp.up_proj.weight``
stays that), so reallocation and checkpoints, which match tensors by name, treat stages like any
other layout. Blocks go to stages as ``reallocation.layout.pipeline_stage_of_layer`` says, the
split the cost model prices.

Every stage runs the whole model's own forward (so FSDP's root hooks, masks and rotary positions
work unchanged): the first from token ids, the others from the hidden states they receive
(``inputs_embeds``); a non-last stage's "logits" are its output hidden states, since its norm and
head pass through. Every stage sees the same rows and cuts them into the same micro-batches, so each
knows the shape it receives.

Micro-batch i+1 enters stage 0 while stage 1 computes micro-batch i (inference,
``last_stage_inputs``). Training (``train_microbatches``) follows 1F1B, as Megatron-LM and ReaL do:
a few forwards ahead, then one forward and one backward in turn, so a stage keeps at most pp
micro-batches' activations; the loss on the last stage; the embedding shared by the first and last stages gets the sum of both
gradients (``sync_tied_grads``, as Megatron-LM's embedding group does) and the gradient norm is
summed over stages (``pipeline_grad_norm``). Each step's sends and receives between neighbours go
out as one batch (``common.p2p``), so that they cannot wait on each other on NCCL.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from common import p2p
from models.parallelize import _base
from ppo.batch import position_ids
from reallocation.layout import pipeline_stage_of_layer

# Hidden states travel in float32 whatever the compute dtype: the residual stream's dtype under
# autocast is not the compute dtype, and the receiver must know it in advance.
WIRE_DTYPE = torch.float32


@dataclass(frozen=True)
class PipelineStage:
    """Where one rank sits in its model's pipeline.

    ``prev`` / ``next``: the global ranks it receives from and sends to (None at the ends) over
    ``group``, this rank's pipeline column (the rank at the same dp/tp position in every stage:
    activations, gradient norms and stats travel along it); ``first`` / ``last``: the global ranks
    of that column's first and last stage; ``tie_group``: the first and last of the column (the
    shared embedding's gradients); ``model_group``: every rank of the model, all stages
    (checkpoints and full state dicts)."""

    stage: int
    num_stages: int
    prev: int | None
    next: int | None
    first: int
    last: int
    group: Any = None
    tie_group: Any = None
    model_group: Any = None

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1


class _HeldElsewhere(nn.Module):
    """A block, norm or head another stage holds: hidden states pass through unchanged."""

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
            setattr(model, _head_name(model), _HeldElsewhere())
    return model


def shares_embedding(model: nn.Module) -> bool:
    """Whether the LM head is the embedding (held by the first and the last stage)."""
    config: Any = model.config
    return bool(getattr(config, "tie_word_embeddings", False)) and hasattr(model, "lm_head")


def _head_name(model: nn.Module) -> str:
    return next((name for name in ("lm_head", "score") if isinstance(getattr(model, name, None), nn.Linear)), "")


def _head(model: nn.Module) -> Any:
    name = _head_name(model)
    return getattr(model, name) if name else None


def _stage_output(model: nn.Module, batch: Mapping[str, Tensor], position_ids: Tensor, hidden: Tensor | None) -> Tensor:
    """A non-last stage's output hidden states (its norm and head pass through)."""
    return model(
        input_ids=batch["input_ids"] if hidden is None else None,
        inputs_embeds=hidden,
        attention_mask=batch["attention_mask"],
        position_ids=position_ids,
        use_cache=False,
    ).logits


def last_stage_inputs(
    model: nn.Module, pipe: PipelineStage, batch: Mapping[str, Tensor], position_ids: Tensor
) -> Tensor | None:
    """Run this stage's part of the forward on one micro-batch. The last stage gets the hidden
    states its head's forward starts from (``inputs_embeds``); the other stages compute their
    blocks, send the result on and get None. Collective over the pipeline column (every stage
    calls it with the same micro-batch)."""
    p2p = _PointToPoint(model, pipe)
    hidden = p2p.recv_forward(batch)
    if pipe.is_last:
        return hidden
    p2p.exchange(send_next=_stage_output(model, batch, position_ids, hidden))
    return None


def stage_hidden(model: nn.Module, pipe: PipelineStage, input_ids: Tensor, attention_mask: Tensor) -> Tensor | None:
    """A frozen model's body (``model.base_model``, no head) run as one stage: ids, mask [B, L] ->
    the final hidden states [B, L, H] on the last stage; the other stages send their output on and
    get None. Collective over the pipeline column, which runs the same batches in the same order
    (a sharded reward model: ``rewards.reward_model.ScoreReader.body``)."""
    p2p = _PointToPoint(model, pipe)
    received = p2p.recv_forward({"input_ids": input_ids})
    dtype = next(p.dtype for p in model.parameters())
    out = _base(model)(
        input_ids=input_ids if received is None else None,
        inputs_embeds=None if received is None else received.to(dtype),
        attention_mask=attention_mask,
        use_cache=False,
    ).last_hidden_state
    if pipe.is_last:
        return out
    p2p.exchange(send_next=out)
    return None


def train_microbatches(
    model: nn.Module,
    pipe: PipelineStage,
    micros: Sequence[Mapping[str, Tensor]],
    last_stage_loss: Callable[[Mapping[str, Tensor], Tensor], tuple[Tensor, dict[str, Tensor]]],
    scale: float,
    autocast: Callable[[], AbstractContextManager],
) -> list[tuple[Tensor, dict[str, Tensor]]]:
    """Forward and backward of one minibatch's micro-batches through the stages, on the 1F1B
    schedule of Megatron-LM and ReaL: stage s runs ``pp - s - 1`` forwards ahead, then alternates
    one forward and one backward, then finishes the backwards; so it holds at most ``pp - s``
    micro-batches' activations. Collective over the pipeline column.

    The last stage computes ``last_stage_loss(micro, hidden)`` from the hidden states it receives
    and backpropagates ``loss * scale``; every stage sends the gradient of its input back. Returns
    the (loss, stats) of each micro-batch on the last stage, [] on the others.
    """
    results: list[tuple[Tensor, dict[str, Tensor]]] = []
    held: deque[tuple[Tensor | None, Tensor]] = deque()  # (input, output) awaiting their backward

    def forward(i: int, hidden: Tensor | None) -> None:
        with autocast():
            if pipe.is_last:
                assert hidden is not None
                loss, stats = last_stage_loss(micros[i], hidden)
                results.append((loss, stats))
                out = loss * scale
            else:
                out = _stage_output(model, micros[i], position_ids(micros[i]), hidden)
        held.append((hidden, out))

    def backward(grad: Tensor | None) -> Tensor | None:
        hidden, out = held.popleft()
        out.backward() if grad is None else out.backward(grad.to(out.dtype))
        if hidden is None:
            return None
        return (hidden.grad if hidden.grad is not None else torch.zeros_like(hidden)).contiguous()

    p2p = _PointToPoint(model, pipe)
    num_warmup = min(pipe.num_stages - pipe.stage - 1, len(micros))
    for i in range(num_warmup):
        forward(i, p2p.recv_forward(micros[i]))
        p2p.exchange(send_next=held[-1][1])
    hidden = p2p.recv_forward(micros[num_warmup]) if num_warmup < len(micros) else None
    for i in range(num_warmup, len(micros)):
        forward(i, hidden)
        grad = p2p.exchange(send_next=held[-1][1], recv_next=held[0][1])
        grad_in = backward(grad)
        last = i == len(micros) - 1
        hidden = p2p.exchange(send_prev=grad_in, recv_prev=None if last else micros[i + 1])
    for _ in range(num_warmup):
        grad_in = backward(p2p.exchange(recv_next=held[0][1]))
        p2p.exchange(send_prev=grad_in)
    return results


class _PointToPoint:
    """A stage's sends and receives to its neighbours in the column (nothing past either end).

    ``exchange`` posts all of one step's sends and receives as one batch (``common.p2p``): in the
    1F1B steady state stage s sends activations to s+1 while s+1 sends a gradient to s, and on NCCL
    the two sends, posted alone, would each wait for a receive queued behind the other's send."""

    def __init__(self, model: nn.Module, pipe: PipelineStage):
        self.model, self.pipe = model, pipe
        _open_column(pipe, next(model.parameters()).device)

    def recv_forward(self, micro: Mapping[str, Tensor]) -> Tensor | None:
        return self.exchange(recv_prev=micro)

    def exchange(
        self,
        *,
        send_next: Tensor | None = None,
        recv_next: Tensor | None = None,
        send_prev: Tensor | None = None,
        recv_prev: Mapping[str, Tensor] | None = None,
    ) -> Any:
        """Send activations on / gradients back, and receive the gradient shaped like output
        ``recv_next`` or the hidden states of micro-batch ``recv_prev``; returns what arrived."""
        pipe, ops, received = self.pipe, [], None
        if send_next is not None and not pipe.is_last:
            wire = send_next.detach().to(WIRE_DTYPE).contiguous()
            ops.append(dist.P2POp(dist.isend, wire, pipe.next, pipe.group))
        if send_prev is not None and not pipe.is_first:
            ops.append(dist.P2POp(dist.isend, send_prev, pipe.prev, pipe.group))
        if recv_next is not None and not pipe.is_last:
            received = torch.empty(recv_next.shape, dtype=WIRE_DTYPE, device=recv_next.device)
            ops.append(dist.P2POp(dist.irecv, received, pipe.next, pipe.group))
        if recv_prev is not None and not pipe.is_first:
            rows, cols = recv_prev["input_ids"].shape
            config: Any = self.model.config
            received = torch.empty(
                rows, cols, int(config.hidden_size), dtype=WIRE_DTYPE, device=recv_prev["input_ids"].device
            )
            ops.append(dist.P2POp(dist.irecv, received, pipe.prev, pipe.group))
        p2p.exchange(ops)
        if recv_prev is not None and received is not None and torch.is_grad_enabled():
            received.requires_grad_()  # a training stage backpropagates into what it received
        return received


_opened_columns: set[Any] = set()
"""The column groups this process has opened for batched point-to-point (``_open_column``)."""


def _open_column(pipe: PipelineStage, device: torch.device) -> None:
    """Before a column's first batch of sends and receives, one barrier over the whole column
    (``common.p2p.barrier``: NCCL's first batched call in a group must involve all its ranks, and
    the first exchange of a column of 3 or more stages involves only stages 0 and 1). Every function
    that builds a ``_PointToPoint`` is collective over the column, so all its stages reach this
    point at the same call."""
    if pipe.group not in _opened_columns:
        p2p.barrier(pipe.group, device)
        _opened_columns.add(pipe.group)


def _local(t: Tensor) -> Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def sync_tied_grads(model: nn.Module, pipe: PipelineStage) -> None:
    """Sum the shared embedding's gradient over the first and last stage, which both hold it
    (the first uses it to embed, the last as the LM head); their shards line up, as both stages
    have the same dp x tp grid. Collective over the column's first and last rank."""
    if not shares_embedding(model) or not (pipe.is_first or pipe.is_last):
        return
    weight = _base(model).embed_tokens.weight
    grad: Any = weight.grad if weight.grad is not None else torch.zeros_like(weight)
    placements = getattr(weight, "placements", None)
    if placements is not None and grad.placements != placements:
        # A vocab-parallel embedding's gradient comes back replicated; the head's, sharded like the weight.
        grad = grad.redistribute(weight.device_mesh, placements)
    weight.grad = grad
    dist.all_reduce(_local(grad), group=pipe.tie_group)


def counted_in_norm(model: nn.Module, pipe: PipelineStage) -> list[nn.Parameter]:
    """This stage's parameters for the global gradient norm: the last stage's copy of the shared
    embedding is left out, so that it counts once."""
    params = [p for p in model.parameters() if p.grad is not None]
    if pipe.is_last and not pipe.is_first and shares_embedding(model):
        tied = _base(model).embed_tokens.weight
        params = [p for p in params if p is not tied]
    return params


def sum_over_stages(value: Tensor, pipe: PipelineStage) -> Tensor:
    """``value`` summed over the column's stages (each stage's gradient norms squared, say)."""
    value = value.clone()
    dist.all_reduce(value, group=pipe.group)
    return value


def from_last_stage(obj: Any, pipe: PipelineStage) -> Any:
    """The last stage's ``obj`` (stats), on every stage of the column."""
    box = [obj]
    dist.broadcast_object_list(box, src=pipe.last, group=pipe.group)
    return box[0]
