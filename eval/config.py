"""Typed configs for datasets and evaluation."""
from __future__ import annotations

from dataclasses import dataclass, field

from models.config import ModelConfig


@dataclass
class DataConfig:
    name: str = "synthetic"
    """A built-in dataset name (see eval.data), a .jsonl/.json/.parquet path, or hf:<id>[:<split>]."""
    heldout: str = "synthetic"
    """The held-out set the trainer reports success on (for `synthetic`: its held-out split)."""
    limit: int = 0
    """Use a fixed-seed subset of this many prompts (0 = all)."""
    heldout_limit: int = 0
    seed: int = 0
    synthetic_difficulty: int = 2
    synthetic_num_train: int = 2000
    synthetic_num_heldout: int = 200


@dataclass
class EvalDataConfig:
    """One evaluation set: ``configs/eval/data/*.yaml``."""

    name: str = "math500"
    """A built-in dataset name (see eval.data), a .jsonl/.json/.parquet path, or hf:<id>[:<split>]."""
    limit: int = 0
    """Evaluate a fixed-seed random subset of this many problems (0 = all)."""
    seed: int = 0
    prompt: str = "qwen_math_cot"
    """The dataset's default prompt template (eval.prompts); the top-level `prompt` overrides it."""


@dataclass
class EvalConfig:
    """``python -m eval``: one model on one dataset. See configs/eval/eval.yaml."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: EvalDataConfig = field(default_factory=EvalDataConfig)
    prompt: str = ""
    """A template name from eval.prompts.TEMPLATES or a .yaml/.json file of template fields ("" = data.prompt)."""
    num_fewshot: int = 0
    """Prepend this many solved exemplars from the dataset's training split (fixed seed)."""
    fewshot_source: str = ""
    """Where exemplars come from ("" = gsm8k_train for gsm8k, math_train for MATH)."""
    num_samples: int = 1
    """Samples per problem: 1 with temperature 0 is greedy accuracy; n > 1 gives pass@k / maj@k."""
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 1024
    seed: int = 0
    """Sampling seed (each request gets its own generator seeded with it)."""
    ks: list[int] = field(default_factory=list)
    """k's for pass@k / maj@k (empty: 1, 2, 4, ... up to num_samples)."""
    max_model_len: int = 4096
    """Engine context length (capped at the model's max_position_embeddings)."""
    chunk_size: int = 64
    """Problems per generation call: the granularity of progress lines and of resume."""
    kv_cache_gib: int = 0
    """CPU KV cache in GiB (0 = enough for one chunk at full length, 1 to 8). It bounds how many
    sequences vLLM-CPU runs at once: 1 GiB holds ~23k tokens of SmolLM2-135M (fp32)."""
    tokenizer: str = ""
    """Tokenizer directory when the model directory has none (e.g. a bare training checkpoint)."""
    out_dir: str = ""
    """Run directory ("" = outputs/eval/<model>-<data>-<hash of the settings>, so a rerun resumes)."""
    resume: bool = True
    """Continue from the run directory's samples.jsonl; false deletes it and starts over."""

    def __post_init__(self) -> None:
        if self.num_samples < 1:
            raise ValueError(f"num_samples={self.num_samples}: need >= 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"temperature={self.temperature}, top_p={self.top_p}: need temperature >= 0, 0 < top_p <= 1")
        if self.temperature == 0 and self.num_samples > 1:
            raise ValueError(f"num_samples={self.num_samples} with temperature=0: greedy samples are identical; "
                             "set temperature > 0 (e.g. temperature=0.6)")
        if self.max_new_tokens < 1 or self.chunk_size < 1:
            raise ValueError("max_new_tokens and chunk_size must be >= 1")
        if any(not 1 <= k <= self.num_samples for k in self.ks):
            raise ValueError(f"ks={list(self.ks)}: each k must be in [1, num_samples={self.num_samples}]")
