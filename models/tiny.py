"""Tiny Qwen2/Llama models with a locally trained byte-level BPE tokenizer, deterministic by seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from models.config import Arch, TinyArchConfig

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(vocab_size: int, out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from mathtask.synthetic import corpus

    tok = Tokenizer(models.BPE())
    # Digits stay single tokens so that a small model can learn column arithmetic.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|pad|>", bos_token=None, unk_token=None
    )
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(out_dir)
    return hf


def hf_config_fields(cfg: TinyArchConfig, vocab_size: int) -> dict[str, Any]:
    """The HF config.json fields of a tiny model (its shape): what ``build_tiny`` writes, and what a
    plan reads before the model is built (``vocab_size`` then being the tokenizer's target size)."""
    return dict(
        model_type=cfg.arch.value,
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
    )


def build_tiny(cfg: TinyArchConfig, out_dir: Path) -> None:
    """Write a tiny causal LM + tokenizer to ``out_dir``."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tok = build_tokenizer(cfg.vocab_size, out_dir)
    config_cls, model_cls = (
        (Qwen2Config, Qwen2ForCausalLM) if cfg.arch == Arch.qwen2 else (LlamaConfig, LlamaForCausalLM)
    )
    fields = {k: v for k, v in hf_config_fields(cfg, len(tok)).items() if k != "model_type"}
    config = config_cls(
        **fields,
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(cfg.seed)
    model = model_cls(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out_dir)
