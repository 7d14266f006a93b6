"""Layouts as data: which rank holds which slice of which parameter.

A *layout* places one model on a set of ranks with four parallel degrees, ordered outermost to
innermost like a row-major ``DeviceMesh`` of shape ``(pp, dp, fsdp, tp)``:

- ``pp``   pipeline stages; each stage holds a contiguous run of layers.
- ``dp``   plain data-parallel replicas (every replica holds the same shards).
- ``fsdp`` FSDP2 / ZeRO-3 sharding: each parameter's local tensor is split on dim 0 into ``fsdp``
           chunks with ``torch.chunk`` semantics (chunk = ceil(n / fsdp); trailing ranks may get a
           short or empty chunk). This is exactly what ``fully_shard`` does, also on top of a TP
           ``DTensor`` (it chunks the TP-local tensor), so a real FSDP2 module's
           ``param.to_local()`` is the source shard this layout describes.
- ``tp``   tensor parallel: q/k/v/gate/up are column-parallel (split dim 0 of weight and bias),
           o/down are row-parallel (split dim 1 of the weight, bias replicated), the embedding and
           LM head are vocab-parallel (split dim 0), norms are replicated. k/v are split by kv
           head; when ``num_kv_heads < tp`` each kv head is replicated on ``tp // num_kv_heads``
           consecutive TP ranks (vLLM's rule). Degrees that do not align with heads (tp=4 with 9 heads
           and 3 kv heads) fall back to DTensor's even chunking of the rows: still a valid data
           layout, though no attention implementation computes with it (``apply_tp`` and
           ``names.vllm_local_shapes`` reject such degrees).

Every rank's piece of a parameter is a *box*: a tuple of ``(start, stop)`` per dim of the full
tensor. For one layout, the distinct boxes of a parameter partition it (replicas hold equal boxes,
shards hold disjoint ones); the planner relies on that.

Parameter shapes come from an HF config alone (``ModelSpec.from_hf_config``); no model instance is
needed. Example, for a SmolLM2-135M-sized Llama on 4 ranks::

    spec = ModelSpec.from_hf_config(config)
    train = Layout(fsdp=4)                          # FSDP2 over 4 ranks
    gen = Layout(dp=2, tp=2, vocab_pad_to=64)       # 2 vLLM replicas with TP=2
    train.holdings(spec)["model.embed_tokens.weight"]  # {0: ((0, 12288), (0, 576)), 1: ...}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# A box is one (start, stop) interval per dim of the full tensor.
Box = tuple[tuple[int, int], ...]
Shape = tuple[int, ...]
# Holdings: parameter name -> global rank -> the box that rank holds (ranks holding nothing omitted).
Holdings = dict[str, dict[int, Box]]

# Partition kinds of a parameter under tensor parallelism.
COLUMN = "column"  # split dim 0 (q/gate/up weight and bias)
KV = "kv"  # split dim 0 by kv head, replicated when num_kv_heads < tp (k/v weight and bias)
ROW = "row"  # split dim 1 (o/down weight)
VOCAB = "vocab"  # split dim 0 over the (padded) vocabulary (embedding, LM head)
REPLICATED = "replicated"  # norms, row-parallel biases


def box_numel(box: Box) -> int:
    return math.prod(stop - start for start, stop in box)


def full_box(shape: Shape) -> Box:
    return tuple((0, n) for n in shape)


def box_shape(box: Box) -> Shape:
    return tuple(stop - start for start, stop in box)


def intersect(a: Box, b: Box) -> Box | None:
    """The overlap of two boxes, or None when it is empty."""
    out = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b))
    return out if all(start < stop for start, stop in out) else None


def subtract(a: Box, b: Box | None) -> list[Box]:
    """``a`` minus ``b`` as at most ``2 * ndim`` disjoint boxes (peel ``a`` one dim at a time)."""
    overlap = intersect(a, b) if b is not None else None
    if overlap is None:
        return [a]
    pieces: list[Box] = []
    rest = list(a)
    for dim, ((a0, a1), (o0, o1)) in enumerate(zip(a, overlap)):
        if a0 < o0:
            pieces.append(tuple(rest[:dim]) + ((a0, o0),) + tuple(rest[dim + 1 :]))
        if o1 < a1:
            pieces.append(tuple(rest[:dim]) + ((o1, a1),) + tuple(rest[dim + 1 :]))
        rest[dim] = (o0, o1)
    return pieces


def local_slices(box: Box, within: Box) -> tuple[slice, ...]:
    """Slices that select ``box`` (global coordinates) from a local tensor that holds ``within``."""
    return tuple(slice(b0 - w0, b1 - w0) for (b0, b1), (w0, _) in zip(box, within))


def chunk_interval(n: int, num_chunks: int, index: int, chunk: int | None = None) -> tuple[int, int]:
    """Interval of chunk ``index`` when ``n`` items are cut into ``num_chunks`` pieces.

    Same as ``torch.chunk`` (and so FSDP2 and DTensor ``Shard``): every chunk has
    ``ceil(n / num_chunks)`` items except the tail, and chunks past the end are empty. ``chunk``
    overrides the chunk size (vLLM splits the padded vocabulary evenly).
    """
    size = chunk if chunk is not None else -(-n // num_chunks)
    return min(index * size, n), min((index + 1) * size, n)


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: HF name, full shape, TP partition kind and the pipeline layers that use it.

    ``layers`` are pipeline layer ids: 0 = embedding, 1..L = decoder blocks, L+1 = final norm and
    LM head. A tied embedding lists both 0 and L+1 (it lives on the first and the last stage).
    """

    name: str
    shape: Shape
    kind: str
    layers: tuple[int, ...]


REQUIRED_CONFIG_FIELDS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
"""The fields of an HF config.json a ModelSpec cannot do without (the others have Llama/Qwen2 defaults)."""


@dataclass(frozen=True)
class ModelSpec:
    """The shape-relevant part of an HF Llama/Qwen2 config."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool = False  # Qwen2 always; Llama when attention_bias
    o_bias: bool = False  # Llama when attention_bias
    mlp_bias: bool = False  # Llama when mlp_bias

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelSpec:
        """Build from a ``transformers`` LlamaConfig / Qwen2Config (or anything with those fields)."""
        model_type = getattr(config, "model_type", "llama")
        attention_bias = bool(getattr(config, "attention_bias", False))
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        return cls(
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_heads=num_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            vocab_size=config.vocab_size,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            # Qwen2's attention hard-codes bias=True on q/k/v and False on o.
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type != "qwen2" and attention_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
        )

    @classmethod
    def from_config_json(cls, path: Path) -> ModelSpec:
        """Build from an HF ``config.json``; a ValueError names the file and what is wrong with it.

        The one reader of a model's shape from disk (the plan's model specs, the search CLI's HF dirs)."""
        import json

        try:
            config = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: cannot read the model's shape ({e})") from None
        missing = [k for k in REQUIRED_CONFIG_FIELDS if k not in config]
        if missing:
            raise ValueError(f"{path}: no {missing[0]} (not a Llama/Qwen2 config.json)")
        return cls.from_hf_config(SimpleNamespace(**config))

    def params(self) -> list[ParamSpec]:
        """Parameters in HF ``named_parameters()`` order (tied LM head omitted, as HF does)."""
        return list(_params(self))

    def _build_params(self) -> list[ParamSpec]:
        hidden, inter, hd = self.hidden_size, self.intermediate_size, self.head_dim
        q_rows, kv_rows = self.num_heads * hd, self.num_kv_heads * hd
        last = self.num_layers + 1
        embed_layers = (0, last) if self.tie_word_embeddings else (0,)
        out = [ParamSpec("model.embed_tokens.weight", (self.vocab_size, hidden), VOCAB, embed_layers)]
        for i in range(self.num_layers):
            p, layer = f"model.layers.{i}.", (i + 1,)

            def add(name: str, shape: Shape, kind: str) -> None:
                out.append(ParamSpec(p + name, shape, kind, layer))  # noqa: B023 - called within this iteration

            add("self_attn.q_proj.weight", (q_rows, hidden), COLUMN)
            if self.qkv_bias:
                add("self_attn.q_proj.bias", (q_rows,), COLUMN)
            add("self_attn.k_proj.weight", (kv_rows, hidden), KV)
            if self.qkv_bias:
                add("self_attn.k_proj.bias", (kv_rows,), KV)
            add("self_attn.v_proj.weight", (kv_rows, hidden), KV)
            if self.qkv_bias:
                add("self_attn.v_proj.bias", (kv_rows,), KV)
            add("self_attn.o_proj.weight", (hidden, q_rows), ROW)
            if self.o_bias:
                add("self_attn.o_proj.bias", (hidden,), REPLICATED)
            add("mlp.gate_proj.weight", (inter, hidden), COLUMN)
            if self.mlp_bias:
                add("mlp.gate_proj.bias", (inter,), COLUMN)
            add("mlp.up_proj.weight", (inter, hidden), COLUMN)
            if self.mlp_bias:
                add("mlp.up_proj.bias", (inter,), COLUMN)
            add("mlp.down_proj.weight", (hidden, inter), ROW)
            if self.mlp_bias:
                add("mlp.down_proj.bias", (hidden,), REPLICATED)
            add("input_layernorm.weight", (hidden,), REPLICATED)
            add("post_attention_layernorm.weight", (hidden,), REPLICATED)
        out.append(ParamSpec("model.norm.weight", (hidden,), REPLICATED, (last,)))
        if not self.tie_word_embeddings:
            out.append(ParamSpec("lm_head.weight", (self.vocab_size, hidden), VOCAB, (last,)))
        return out

    def shapes(self) -> dict[str, Shape]:
        return {p.name: p.shape for p in self.params()}

    def num_params(self) -> int:
        return _num_params(self)


@lru_cache(maxsize=256)
def _params(model: ModelSpec) -> tuple[ParamSpec, ...]:
    return tuple(model._build_params())  # specs are immutable: build once per model shape


@lru_cache(maxsize=256)
def _num_params(model: ModelSpec) -> int:
    return sum(math.prod(p.shape) for p in _params(model))


def pipeline_stage_of_layer(layer: int, num_layers: int, pp: int) -> int:
    """Stage of pipeline layer ``layer`` (0 = embedding, 1..L blocks, L+1 = head).

    Blocks are split into ``pp`` contiguous runs as evenly as possible (earlier stages get the
    extra block); the embedding goes to the first stage and the final norm / head to the last.
    """
    if layer <= 0:
        return 0
    if layer > num_layers:
        return pp - 1
    # Stage s gets blocks [s*q + min(s, r), ...) with q, r = divmod(L, pp): the remainder goes
    # to the early stages, so stage sizes differ by at most one block.
    q, r = divmod(num_layers, pp)
    block = layer - 1
    for stage in range(pp):
        start = stage * q + min(stage, r)
        if start <= block < start + q + (1 if stage < r else 0):
            return stage
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Layout:
    """``pp x dp x fsdp x tp`` ranks (row-major, tp innermost) holding one model.

    ``ranks`` maps the layout's rank index (0..size-1) to global ranks; by default
    ``range(size)``. ``vocab_pad_to`` > 1 splits the vocabulary like vLLM: pad it to a multiple of
    ``vocab_pad_to`` (vLLM uses 64), give each TP rank ``padded // tp`` rows, and clip to the real
    vocabulary (the padding rows exist only in vLLM's tensors, see ``names.py``).
    """

    pp: int = 1
    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    ranks: tuple[int, ...] | None = None
    vocab_pad_to: int = 1
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for degree in (self.pp, self.dp, self.fsdp, self.tp):
            if degree < 1:
                raise ValueError(f"parallel degrees must be >= 1: {self}")
        if self.ranks is not None:
            if len(self.ranks) != self.size or len(set(self.ranks)) != self.size:
                raise ValueError(f"need {self.size} distinct ranks, got {self.ranks}")

    @property
    def size(self) -> int:
        return self.pp * self.dp * self.fsdp * self.tp

    @property
    def global_ranks(self) -> tuple[int, ...]:
        return self.ranks if self.ranks is not None else tuple(range(self.size))

    def __str__(self) -> str:
        if self.name:
            return self.name
        parts = [
            f"{k}{v}" for k, v in (("pp", self.pp), ("tp", self.tp), ("dp", self.dp), ("fsdp", self.fsdp)) if v > 1
        ]
        return "".join(parts) or "single"

    def coords(self, index: int) -> tuple[int, int, int, int]:
        """``(pp, dp, fsdp, tp)`` coordinates of layout rank ``index``."""
        index, t = divmod(index, self.tp)
        index, f = divmod(index, self.fsdp)
        p, d = divmod(index, self.dp)
        return p, d, f, t

    def tp_interval(self, spec: ParamSpec, tp_rank: int, model: ModelSpec) -> tuple[int, int]:
        """Interval of the TP-split dim held by ``tp_rank``."""
        n = spec.shape[0] if spec.kind != ROW else spec.shape[1]
        if spec.kind == KV and self.tp > model.num_kv_heads and self.tp % model.num_kv_heads == 0:
            head = tp_rank // (self.tp // model.num_kv_heads)
            return head * model.head_dim, (head + 1) * model.head_dim
        if spec.kind == VOCAB and self.vocab_pad_to > 1:
            padded = -(-n // self.vocab_pad_to) * self.vocab_pad_to
            if padded % self.tp:
                raise ValueError(f"padded vocab {padded} is not divisible by tp={self.tp}")
            return chunk_interval(n, self.tp, tp_rank, chunk=padded // self.tp)
        return chunk_interval(n, self.tp, tp_rank)

    def box(self, spec: ParamSpec, index: int, model: ModelSpec) -> Box | None:
        """The box of ``spec`` held by layout rank ``index``, or None when it holds nothing."""
        p, _, f, t = self.coords(index)
        stages = {pipeline_stage_of_layer(layer, model.num_layers, self.pp) for layer in spec.layers}
        if p not in stages:
            return None
        box = list(full_box(spec.shape))
        if self.tp > 1 and spec.kind != REPLICATED:
            dim = 1 if spec.kind == ROW else 0
            box[dim] = self.tp_interval(spec, t, model)
        if self.fsdp > 1:
            # FSDP2 chunks the (TP-local) tensor on dim 0.
            start, stop = box[0]
            lo, hi = chunk_interval(stop - start, self.fsdp, f)
            box[0] = (start + lo, start + hi)
        out = tuple(box)
        return out if box_numel(out) > 0 else None

    def holdings(self, model: ModelSpec, params: Iterable[ParamSpec] | None = None) -> Holdings:
        """Parameter name -> global rank -> box, for every rank of this layout."""
        out: Holdings = {}
        for spec in params if params is not None else model.params():
            per_rank: dict[int, Box] = {}
            for index, rank in enumerate(self.global_ranks):
                box = self.box(spec, index, model)
                if box is not None:
                    per_rank[rank] = box
            out[spec.name] = per_rank
        return out


def single_rank_holdings(shapes: Mapping[str, Shape], rank: int = 0) -> Holdings:
    """Every parameter in full on one rank (the TP=1 generation layout of the CPU path)."""
    return {name: {rank: full_box(shape)} for name, shape in shapes.items()}
