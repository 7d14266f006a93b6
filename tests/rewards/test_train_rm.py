"""Reward-model training: data readers on worked records, a few-step run on the tiny model, the Hydra config."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from rewards.config import Readout, Refinement, RewardConfig, RewardKind, RewardModelConfig
from rewards.rm_config import RMKind, RMTrainConfig, SyntheticRMData, builtin_config, config_key
from rewards.rm_data import RMDataError, RMExample, _junk, load_examples, synthetic_examples, write_examples
from rewards.train_rm import train_reward_model
from tests import tolerance as tol

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_math_shepherd_record(tmp_path):
    record = {
        "input": "What is 2+3*4? Step 1: 3*4 = 12 ки\nStep 2: 2+12 = 15 ки\nStep 3: The answer is: 15 ки",
        "label": "What is 2+3*4? Step 1: 3*4 = 12 +\nStep 2: 2+12 = 15 -\nStep 3: The answer is: 15 -",
    }
    path = tmp_path / "ms.jsonl"
    path.write_text(json.dumps(record) + "\n")
    [ex] = load_examples(path)
    assert ex.question == "What is 2+3*4?"
    assert ex.steps == ("Step 1: 3*4 = 12", "Step 2: 2+12 = 15", "Step 3: The answer is: 15")
    assert ex.step_labels == (1, 0, 0) and ex.final_label == 0


def test_prm800k_record(tmp_path):
    def completion(text, rating):
        return {"text": text, "rating": rating}

    record = {
        "question": {"problem": "What is 1+1?", "ground_truth_answer": "2"},
        "label": {
            "finish_reason": "found_error",
            "steps": [
                {"completions": [completion("1+1 is two.", 1), completion("Hmm.", 0)], "chosen_completion": 0},
                {"completions": [completion("Let me think.", 0)], "chosen_completion": 0},
                {"completions": [completion("So it is 3.", -1)], "chosen_completion": None},
                {"completions": [completion("never reached", 1)], "chosen_completion": 0},
            ],
        },
    }
    path = tmp_path / "prm800k.jsonl"
    path.write_text(json.dumps(record) + "\n")
    [ex] = load_examples(path, "prm800k")
    assert ex.steps == ("1+1 is two.", "Let me think.", "So it is 3.")  # stops at the first bad step
    assert ex.step_labels == (1, 1, 0) and ex.final_label == 0


def test_realm_records_round_trip_and_bad_lines_are_named(tmp_path):
    examples = [RMExample("q", ("a", "b"), (1, 0), 0, "x"), RMExample("q2", ("c",), None, 1, "y")]
    path = tmp_path / "realm.jsonl"
    write_examples(path, examples)
    assert load_examples(path) == examples
    path.write_text('{"steps": ["a"], "step_labels": [1]}\n{"nope": 1}\n')
    with pytest.raises(RMDataError, match=r"realm.jsonl:1: KeyError"):
        load_examples(path)
    path.write_text('{"question": "q", "steps": ["a"], "final_label": 1}\n\n{"question": \n')
    with pytest.raises(RMDataError, match=r"realm.jsonl:3: malformed JSON"):
        load_examples(path)


def test_junk_responses_keep_their_natural_labels():
    steps = ["7 + 5 = 12", "12 * 3 = 36", "The answer is \\boxed{36}."]
    seen = {}
    rng = random.Random(0)
    for _ in range(30):
        kind, s, labels, has_answer = _junk(rng, steps, [1, 1, 1], "36")
        seen[kind] = (s, labels, has_answer)
    s, labels, has_answer = seen["truncated"]
    assert s == steps[: len(s)] and len(s) < 3 and labels == [1] * len(s) and not has_answer
    assert seen["no_box"] == (steps[:2] + ["The answer is 36."], [1, 1, 1], True)
    s, labels, _ = seen["repeated"]
    assert len(s) > 3 and labels == [1] * len(s) and s[-1] == steps[-1]
    # Repeating a step after a slip repeats its label (0).
    kind, s, labels, _ = next(j for j in (_junk(rng, steps, [1, 0, 0], "36") for _ in range(50)) if j[0] == "repeated")
    assert labels == [1 if step == steps[0] else 0 for step in s]


def test_synthetic_examples_are_labelled_by_the_grader():
    from mathtask.grade import grade_many
    from mathtask.synthetic import generate_problems

    problems = generate_problems(3, seed=5)
    examples = synthetic_examples(
        problems, seed=0, num_corrupted=1, num_junk=2, grade=lambda r, g: [x.correct for x in grade_many(r, g)]
    )
    assert len(examples) == 3 * (2 + 2)
    for ex in examples:
        assert len(ex.step_labels) == len(ex.steps)
        if ex.source == "clean":
            assert set(ex.step_labels) == {1} and ex.final_label == 1
        if ex.source == "corrupted":
            assert ex.final_label == 0 and ex.step_labels[-1] == 0
        if ex.source == "truncated":
            assert ex.final_label == 0  # no answer: the grader says incorrect
        if ex.source in ("no_box", "repeated"):
            assert ex.step_labels[-1] == ex.final_label


def tiny_run(kind: RMKind, readout: Readout = Readout.auto) -> RMTrainConfig:
    return RMTrainConfig(
        kind=kind,
        readout=readout,
        num_steps=3,
        num_lm_warmup_steps=1,  # one next-token-only step, then the classifier
        batch_size=8,
        num_warmup_steps=1,
        log_every=2,
        synthetic=SyntheticRMData(num_train_problems=6, num_heldout_problems=3),
    )


@pytest.mark.equivalence
def test_auxiliary_lm_loss_is_the_causal_lm_loss_on_response_tokens(tiny_model_dir):
    """For a step-tag PRM (a causal LM), lm_loss equals HF's own loss with the question and the
    tag read positions masked out (rule 1 of tests/tolerance.py: a forward pass, then the mean over
    the tokens)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rewards.reward_model import make_reader
    from rewards.rm_encode import encode, lm_loss

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    cfg = RMTrainConfig(readout=Readout.step_tag)
    [e] = encode(cfg, tok, [RMExample("Start with 7. Add 5.", ("7 + 5 = 12", "The answer is \\boxed{12}."), (1, 1), 1)])
    question_tokens = len(tok("Start with 7. Add 5.\n\n").input_ids)
    assert e.lm_start == question_tokens and len(e.reads) == 2
    ids = torch.tensor([e.ids])
    reader = make_reader(model, Readout.step_tag, tok)
    with torch.no_grad():
        ours = lm_loss(reader, reader.hidden(ids, torch.ones_like(ids)), ids, [e])
        labels = ids.clone()
        labels[0, : e.lm_start] = -100
        labels[0, [r + 1 for r in e.reads if r + 1 < len(e.ids)]] = -100  # the token after a read position
        expected = model(input_ids=ids, labels=labels).loss
    bound = tol.rounding(tol.Reductions.of(tiny_model_dir).forward(len(e.ids)) + len(e.ids), tol.scale_of(expected))
    tol.assert_close(ours, expected, bound)


@pytest.fixture(scope="module")
def trained_prm(tmp_path_factory):
    out = tmp_path_factory.mktemp("prm")
    return out, train_reward_model(tiny_run(RMKind.prm), out)


def reward_on_one_solution(path, kind: RMKind, tiny_model_dir):
    from transformers import AutoTokenizer

    from rewards.build import build_reward_fn
    from rewards.types import RewardSample

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = RewardConfig(
        kind=RewardKind(kind.value),
        refinement=Refinement.clip_delta if kind == RMKind.prm else Refinement.none,
        model=RewardModelConfig(path=str(path)),
    )
    text = "7 + 5 = 12\n\n12 * 3 = 36\n\nThe answer is \\boxed{36}."
    out = build_reward_fn(cfg, tok)(
        [
            RewardSample(
                "Start with 7. Add 5, then multiply by 3. What is the result?",
                "36",
                "math",
                "",
                text,
                tok(text).input_ids + [tok.eos_token_id],
            )
        ]
    )
    assert out.success.tolist() == [1.0] and out.num_steps.tolist() == [3]
    return out


def test_a_few_training_steps_save_a_loadable_prm(trained_prm, tiny_model_dir):
    path, info = trained_prm
    saved = json.loads((path / "realm_rm.json").read_text())
    assert saved["kind"] == "prm" and saved["readout"] == "value_head" and saved["metrics"] == info["metrics"]
    assert 0.0 <= saved["metrics"]["step_accuracy"] <= 1.0 and 0.0 <= saved["metrics"]["final_accuracy"] <= 1.0
    out = reward_on_one_solution(path, RMKind.prm, tiny_model_dir)
    assert len(out.step_scores[0]) == 3 and all(0.0 <= c <= 1.0 for c in out.step_scores[0])


@pytest.mark.parametrize("kind, readout", [(RMKind.orm, Readout.auto), (RMKind.prm, Readout.step_tag)])
def test_orm_and_step_tag_prm_train_and_load(kind, readout, tmp_path, tiny_model_dir, capsys):
    info = train_reward_model(tiny_run(kind, readout), tmp_path)
    assert "held-out" in capsys.readouterr().err  # progress lines
    assert ("step_accuracy" in info["metrics"]) == (kind == RMKind.prm)
    out = reward_on_one_solution(tmp_path, kind, tiny_model_dir)
    if kind == RMKind.orm:
        assert 0.0 <= out.learned.item() <= 1.0
    else:
        assert len(out.step_scores[0]) == 3


def test_trained_delimiter_and_kind_must_match_the_reward_config(trained_prm, tiny_model_dir):
    from transformers import AutoTokenizer

    from rewards.build import build_reward_fn
    from rewards.reward_model import RewardModelError

    path, _ = trained_prm
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = RewardConfig(kind=RewardKind.prm, step_delimiter="\n", model=RewardModelConfig(path=str(path)))
    with pytest.raises(RewardModelError, match=r"set reward.step_delimiter='\\n\\n'"):
        build_reward_fn(cfg, tok)
    cfg = RewardConfig(kind=RewardKind.orm, model=RewardModelConfig(path=str(path)))
    with pytest.raises(RewardModelError, match="trained as a PRM"):
        build_reward_fn(cfg, tok)


def test_hydra_config_composes_to_the_builtin_defaults():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rewards.train_rm import _register

    _register()
    with initialize_config_dir(config_dir=str(CONFIGS / "rm"), version_base="1.3"):
        prm = OmegaConf.to_object(compose(config_name="train_rm"))
        orm = OmegaConf.to_object(compose(config_name="train_rm", overrides=["kind=orm"]))
        with pytest.raises(Exception, match="readout"):
            OmegaConf.to_object(compose(config_name="train_rm", overrides=["kind=orm", "readout=step_tag"]))
    # `python -m rewards.train_rm [kind=orm]` trains exactly what builtin:synthetic-* resolves to.
    assert config_key(prm) == config_key(builtin_config("builtin:synthetic-prm"))
    assert config_key(orm) == config_key(builtin_config("builtin:synthetic-orm"))
    assert config_key(prm) != config_key(orm)


@pytest.mark.slow
def test_cli_trains_into_output_dir(tmp_path):
    """`python -m rewards.train_rm` end to end (a small run), as a user types it."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "orm"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rewards.train_rm",
            "kind=orm",
            f"output_dir={out}",
            "num_steps=5",
            "num_lm_warmup_steps=2",
            "synthetic.num_train_problems=20",
            "synthetic.num_heldout_problems=5",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[train_rm]" in result.stderr and '"final_accuracy"' in result.stdout
    assert (out / "realm_rm.json").exists() and (out / "config.json").exists() and (out / "tokenizer.json").exists()


@pytest.mark.slow
@pytest.mark.builtin_reward_models("prm", "orm")
@pytest.mark.parametrize("path", ["builtin:synthetic-prm", "builtin:synthetic-orm"])
def test_builtin_reward_models_train_on_first_use_and_beat_a_constant(path):
    """The real built-ins (minutes each): trained once into the cache, then reused.

    Small verifiers of the synthetic task (docs/rewards.md), clearly better than a constant: the thresholds
    below, and the PRM's step accuracy above always answering the majority label.
    """
    from rewards.train_rm import ensure_builtin

    model_dir = ensure_builtin(path)
    assert ensure_builtin(path) == model_dir and (model_dir / "COMPLETE").exists()
    metrics = json.loads((model_dir / "realm_rm.json").read_text())["metrics"]
    # Thresholds below the spread over training seeds measured (PRM step AUC 0.80-0.85, lowest-step
    # final-answer AUC 0.71-0.78; ORM at 2,800 steps final-answer AUC 0.71, 0.85, 0.77 for seeds 0, 1, 2 with
    # torch 2.13 on an AVX-512 EPYC: `python -m rewards.train_rm kind=orm seed=S`), so a different CPU's float
    # reductions pass too. The built-in is seed 0, the lowest of the three.
    assert metrics["final_auc"] > 0.55
    if path.endswith("prm"):
        assert metrics["step_auc"] > 0.75 and metrics["step_accuracy"] > metrics["step_majority_baseline"] + 0.05
        assert metrics["final_min_auc"] > 0.65
    else:
        assert metrics["final_auc"] > 0.65


def test_auc_worked_example():
    from rewards.rm_metrics import auc

    # positives 0.9 and 0.3, negatives 0.8 and 0.1: 0.9 beats both, 0.3 beats only 0.1 -> 3 of 4 pairs.
    assert auc([0.9, 0.8, 0.3, 0.1], [1, 0, 1, 0]) == 0.75
    assert auc([0.5] * 4, [1, 0, 0, 0]) == 0.5  # a constant, whatever the balance


# runpy re-runs the module this file imported, as `python -m` would run it: the warning says so.
@pytest.mark.filterwarnings("ignore:'rewards.train_rm' found in sys.modules:RuntimeWarning")
@pytest.mark.parametrize(
    "override, key", [("+no_such_key=1", "no_such_key"), ("+synthetic.no_such_field=1", "synthetic.no_such_field")]
)
def test_cli_rejects_an_added_unknown_key_before_training(
    override, key, monkeypatch, tmp_path, isolated_config_store, capsys
):
    """`+key=value` lifts Hydra's struct mode; `python -m rewards.train_rm` must still stop at start
    with one line naming the key (not a Hydra traceback)."""
    import runpy

    import models.registry

    def must_not_train(*args, **kwargs):
        raise AssertionError("training started with an unknown key")

    monkeypatch.setattr(models.registry, "resolve_model_dir", must_not_train)  # training's first step
    monkeypatch.setattr(sys, "argv", ["train_rm", override, f"hydra.run.dir={tmp_path}", "hydra.output_subdir=null"])
    with pytest.raises(SystemExit) as info:
        runpy.run_module("rewards.train_rm", run_name="__main__", alter_sys=True)
    err = capsys.readouterr().err
    assert info.value.code == 1 and err.startswith(f"error: unknown config key {key}"), err


@pytest.mark.parametrize("warmup, steps", [(5, 5), (-1, 5)])
def test_lm_warmup_must_leave_classifier_steps(warmup, steps):
    with pytest.raises(ValueError, match=f"num_lm_warmup_steps={warmup}"):
        RMTrainConfig(num_steps=steps, num_lm_warmup_steps=warmup)
    with pytest.raises(ValueError, match="lm_loss_weight"):
        RMTrainConfig(num_steps=10, num_lm_warmup_steps=2, lm_loss_weight=0.0)


def test_prm_solution_score_is_its_lowest_step_across_windows():
    """Scores are encoded in the token ids (id 80 -> 0.8). A: correct, steps 0.8 then 0.9. B: wrong, a
    slip scored 0.2, then a last step that looks fine (0.95). C: wrong, split into two windows, 0.1 in the
    first, a last read of 0.7. Last read: 0.9 vs 0.95 and 0.7 -> AUC 0.5; lowest step: 0.8 vs 0.2 and 0.1
    -> AUC 1.0."""
    import torch

    from rewards.rm_encode import Encoded
    from rewards.rm_metrics import heldout_metrics

    def reader(ids, mask, rows, cols):
        return torch.logit(ids[rows, cols].float() / 100)

    data = [
        Encoded(ids=[80, 90], reads=[0, 1], labels=[1.0, 1.0], source="clean", final_label=1),
        Encoded(ids=[20, 95], reads=[0, 1], labels=[0.0, 0.0], source="corrupted", final_label=0),
        Encoded(ids=[10], reads=[0], labels=[0.0], source="corrupted", final_label=0, is_last_window=False),
        Encoded(ids=[70], reads=[0], labels=[0.0], source="corrupted", final_label=0),
    ]
    metrics = heldout_metrics(reader, data, pad_id=0, kind=RMKind.prm, device="cpu")
    assert metrics["final_auc"] == 0.5  # last reads 0.9 | 0.95, 0.7: beats one of two negatives
    assert metrics["final_min_auc"] == 1.0  # lowest steps 0.8 | 0.2, 0.1 (C's low score is in its first window)
    assert metrics["num_heldout_steps"] == 6  # 2 + 2 + 1 + 1 reads


def test_num_steps_default_per_kind():
    """The ORM (one label per response) trains longer than the PRM; an explicit count wins."""
    assert RMTrainConfig(kind=RMKind.prm).num_steps == 1600
    assert RMTrainConfig(kind=RMKind.orm).num_steps == 2800
    assert RMTrainConfig(kind=RMKind.orm, num_steps=900).num_steps == 900
    with pytest.raises(ValueError, match="num_steps"):
        RMTrainConfig(num_steps=-1)
