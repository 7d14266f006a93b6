"""Named model shapes for planning: the ReaL paper's LLaMA-2 sizes, realm's Qwen2.5-Math models, or
any HF directory with a ``config.json``.

Shapes come from the published HF configs (``config.json`` of each model):

- ``llama-2-7b`` / ``-13b`` / ``-70b``: meta-llama/Llama-2-*-hf (32000-token vocabulary, untied head;
  70B uses 8 kv heads);
- ``llama-2-34b``: LLaMA-2 34B was never released; we use CodeLlama-34B's shape (48 layers, hidden
  8192, 8 kv heads) with LLaMA-2's 32000-token vocabulary;
- ``qwen2.5-math-1.5b`` / ``-7b``: Qwen/Qwen2.5-Math-*B (q/k/v bias; 1.5B ties its embedding).
"""

from __future__ import annotations

from pathlib import Path

from reallocation.layout import ModelSpec

NAMED_SPECS: dict[str, ModelSpec] = {
    "llama-2-7b": ModelSpec(
        num_layers=32,
        hidden_size=4096,
        intermediate_size=11008,
        num_heads=32,
        num_kv_heads=32,
        head_dim=128,
        vocab_size=32000,
        tie_word_embeddings=False,
    ),
    "llama-2-13b": ModelSpec(
        num_layers=40,
        hidden_size=5120,
        intermediate_size=13824,
        num_heads=40,
        num_kv_heads=40,
        head_dim=128,
        vocab_size=32000,
        tie_word_embeddings=False,
    ),
    "llama-2-34b": ModelSpec(
        num_layers=48,
        hidden_size=8192,
        intermediate_size=22016,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        vocab_size=32000,
        tie_word_embeddings=False,
    ),
    "llama-2-70b": ModelSpec(
        num_layers=80,
        hidden_size=8192,
        intermediate_size=28672,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        vocab_size=32000,
        tie_word_embeddings=False,
    ),
    "qwen2.5-math-1.5b": ModelSpec(
        num_layers=28,
        hidden_size=1536,
        intermediate_size=8960,
        num_heads=12,
        num_kv_heads=2,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
        qkv_bias=True,
    ),
    "qwen2.5-math-7b": ModelSpec(
        num_layers=28,
        hidden_size=3584,
        intermediate_size=18944,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        vocab_size=152064,
        tie_word_embeddings=False,
        qkv_bias=True,
    ),
    # realm's tiny model (configs/model/tiny.yaml: models.config defaults, vocabulary 400) and
    # SmolLM2-135M (HuggingFaceTB/SmolLM2-135M config.json): the CPU calibration models.
    "tiny": ModelSpec(
        num_layers=2,
        hidden_size=128,
        intermediate_size=384,
        num_heads=2,
        num_kv_heads=1,
        head_dim=64,
        vocab_size=400,
        tie_word_embeddings=True,
        qkv_bias=True,
    ),
    "smollm2-135m": ModelSpec(
        num_layers=30,
        hidden_size=576,
        intermediate_size=1536,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        vocab_size=49152,
        tie_word_embeddings=True,
    ),
}
ALIASES = {"7b": "llama-2-7b", "13b": "llama-2-13b", "34b": "llama-2-34b", "70b": "llama-2-70b"}


def named_spec(name_or_hf_dir: str) -> ModelSpec:
    """A named shape (case-insensitive; "7b" .. "70b" mean LLaMA-2) or an HF dir's ``config.json``."""
    key = name_or_hf_dir.lower()
    key = ALIASES.get(key, key)
    if key in NAMED_SPECS:
        return NAMED_SPECS[key]
    path = Path(name_or_hf_dir)
    config = path / "config.json" if path.is_dir() else path
    if config.name == "config.json" and config.is_file():
        return ModelSpec.from_config_json(config)
    raise ValueError(
        f"unknown model {name_or_hf_dir!r}: expected one of {sorted(NAMED_SPECS)} "
        "or an HF model directory with a config.json"
    )


def size_in_billions(spec: ModelSpec) -> float:
    return spec.num_params() / 1e9
