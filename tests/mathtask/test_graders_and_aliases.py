"""`python -m eval` conveniences: `limit=`, `model=PATH`, `grader=math_verify` and the graders' agreement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from common.config import ConfigError
from eval.__main__ import EvalError, model_path_overrides, run_eval, run_key, to_eval_config
from eval.evaluate import grader_agreement
from eval.report import render_markdown
from mathtask.grading.math_verify import grade_many_math_verify

REPO = Path(__file__).resolve().parents[2]


def config(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "configs" / "eval"), version_base="1.3"):
        return to_eval_config(compose("eval", overrides=list(overrides)))


def test_limit_is_an_alias_of_data_limit():
    assert config("data=gsm8k", "limit=40").data.limit == 40
    assert config("data=gsm8k", "data.limit=40").data.limit == 40
    # One key afterwards: the run key (and so the default run directory) is the same either way.
    assert run_key(config("limit=40"), Path("m")) == run_key(config("data.limit=40"), Path("m"))
    with pytest.raises(ConfigError, match="limit=-1"):
        config("limit=-1")


def test_model_path_becomes_an_hf_source_and_names_stay_group_choices(tmp_path):
    hf = tmp_path / "my-policy"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert model_path_overrides(["model=smollm2-135m", "data=gsm8k"]) == ["model=smollm2-135m", "data=gsm8k"]
    assert model_path_overrides([f"model={hf}", "limit=5"]) == [
        "model.source=hf",
        f"model.path={hf}",
        "model.dtype=bfloat16",
        "limit=5",
    ]
    # An explicit dtype wins over the directory's.
    assert model_path_overrides([f"model={hf}", "model.dtype=float32"]) == [
        "model.source=hf",
        f"model.path={hf}",
        "model.dtype=float32",
    ]
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("model:\n  dtype: float16\n")
    assert model_path_overrides([f"model={run}/checkpoints/iter_000004"])[-1] == "model.dtype=float16"


def test_a_directory_that_is_not_a_run_or_model_is_refused(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    cfg = config("model.source=hf", f"model.path={tmp_path}", "data=synthetic")
    with pytest.raises(EvalError, match="no complete checkpoint"):
        run_eval(cfg)


def test_math_verify_grades_values_not_strings():
    responses = [
        "So the answer is \\boxed{0.5}.",
        "\\boxed{\\frac{2}{4}}",
        "It is \\boxed{3}.",
        "I am not sure.",
        "The answer is 18.",
    ]
    golds = ["\\frac{1}{2}", "\\frac12", "4", "7", "18"]
    got = grade_many_math_verify(responses, golds, ["math"] * 5)
    assert [g.correct for g in got] == [True, True, False, False, True]
    assert got[3].reason == "no_answer" and got[2].reason == "not_equal"


def test_agreement_worked_example():
    records = [{"correct_by": {"realm": a, "math_verify": b}} for a, b in ((1, 1), (1, 0), (0, 0), (0, 0))]
    g = grader_agreement(records, ["realm", "math_verify"])
    assert g["accuracy"] == {"realm": 0.5, "math_verify": 0.25}
    assert g["agreement"] == 0.75 and g["realm_only"] == 1 and g["math_verify_only"] == 0


class _AlwaysFour:
    def __init__(self, model_dir, **kwargs):
        from models.vllm_engine import EngineInfo

        self.info = EngineInfo(
            model_dir=str(model_dir),
            tokenizer_dir=str(kwargs.get("tokenizer_dir")),
            dtype="float32",
            max_model_len=kwargs["max_model_len"],
            tensor_parallel_size=1,
            device="cpu",
        )

    def generate(self, prompts, *, n=1, logprobs=True, **kwargs):
        from models.vllm_engine import Completion

        # "4.0" is 4 for both graders; "four" for neither.
        return [
            [Completion("\\boxed{4.0}" if i % 2 else "four", (1, 2), None, "stop")] * n for i, _ in enumerate(prompts)
        ]

    def close(self):
        pass


def test_grader_math_verify_reports_both_accuracies(monkeypatch, tiny_model_dir, tmp_path):
    import models.vllm_engine

    monkeypatch.setattr(models.vllm_engine, "VLLMEngine", _AlwaysFour)
    data = tmp_path / "four.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"p{i}", "question": f"2 + 2 ({i})?", "answer": "4"}) + "\n" for i in range(4))
    )
    cfg = config(
        "model.source=hf",
        f"model.path={tiny_model_dir}",
        f"data.name={data}",
        "grader=math_verify",
        f"out_dir={tmp_path / 'out'}",
        "chunk_size=4",
    )
    summary = json.loads((run_eval(cfg) / "summary.json").read_text())
    assert summary["settings"]["grader"] == "math_verify"
    assert summary["graders"]["accuracy"] == {"math_verify": 0.5, "realm": 0.5}
    assert summary["graders"]["agreement"] == 1.0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| math_verify | 50.0 |" in report and "| realm | 50.0 |" in report and "Same verdict on 100.0%" in report
    assert "Graders" not in render_markdown({k: v for k, v in summary.items() if k != "graders"}, [])
