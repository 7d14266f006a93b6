"""Typed model config: one home for every model default."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from common.dtypes import check_dtype


class ModelSource(Enum):
    tiny = "tiny"
    """Built locally from `tiny` (architecture + seed), with a locally trained tokenizer."""
    gguf = "gguf"
    """A GGUF file shipped inside a Python package, dequantized once into a cached HF directory."""
    hf = "hf"
    """A local HF directory or a hub id (hub ids need a reachable hub)."""


class Arch(Enum):
    qwen2 = "qwen2"
    llama = "llama"


@dataclass
class TinyArchConfig:
    arch: Arch = Arch.qwen2
    hidden_size: int = 128
    """head_dim = hidden_size / num_heads must be >= 32 for vLLM-CPU; 64 is safe."""
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 384
    vocab_size: int = 400
    """Target BPE vocab size of the locally trained tokenizer (special tokens included)."""
    max_position_embeddings: int = 512
    seed: int = 0
    """Weights and tokenizer are deterministic functions of this config."""


@dataclass
class ModelShape:
    """The shape fields of an HF config.json, copied into a model's config so that plans can be
    validated and costed (`run.dry_run=true`) without the weights. Zero: not given; read the
    model directory's config.json instead."""

    model_type: str = "qwen2"
    num_hidden_layers: int = 0
    hidden_size: int = 0
    intermediate_size: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    vocab_size: int = 0
    tie_word_embeddings: bool = False

    @property
    def given(self) -> bool:
        return self.num_hidden_layers > 0


@dataclass
class ModelConfig:
    name: str = "tiny"
    """Human-readable name; used in cache paths and reports."""
    source: ModelSource = ModelSource.tiny
    path: str = ""
    """source=hf: a local directory or a hub id. source=gguf: `<python package>/<file.gguf>`."""
    dtype: str = "float32"
    """Training/generation dtype: float32, bfloat16 or float16."""
    tiny: TinyArchConfig = field(default_factory=TinyArchConfig)
    """Only read when source=tiny."""
    hub_hint: str = ""
    """Shown when the model is not available locally: how to get it."""
    shape: ModelShape = field(default_factory=ModelShape)
    """source=hf/gguf: the model's config.json shape fields (optional; source=tiny derives them)."""

    def __post_init__(self) -> None:
        check_dtype(self.dtype, "model.dtype")
        if self.source in (ModelSource.hf, ModelSource.gguf) and not self.path:
            raise ValueError(f"model.path is required when model.source={self.source.value} (model {self.name!r})")
        shape = self.shape
        if shape.given:
            for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size"):
                if getattr(shape, key) < 1:
                    raise ValueError(
                        f"model.shape.{key}={getattr(shape, key)}: must be >= 1 when "
                        f"model.shape.num_hidden_layers is given (model {self.name!r})"
                    )
            if shape.num_attention_heads % shape.num_key_value_heads or shape.hidden_size % shape.num_attention_heads:
                raise ValueError(
                    f"model.shape: num_attention_heads={shape.num_attention_heads} must be a multiple of "
                    f"num_key_value_heads={shape.num_key_value_heads} and divide "
                    f"hidden_size={shape.hidden_size} (model {self.name!r})"
                )
        if self.source == ModelSource.tiny:
            head_dim, rem = divmod(self.tiny.hidden_size, self.tiny.num_heads)
            if rem:
                raise ValueError("model.tiny.hidden_size must be divisible by model.tiny.num_heads")
            if self.tiny.num_heads % self.tiny.num_kv_heads:
                raise ValueError("model.tiny.num_heads must be a multiple of model.tiny.num_kv_heads")
            if head_dim < 32:
                raise ValueError(f"model.tiny head_dim={head_dim} < 32: vLLM on CPU rejects it (use 64)")
