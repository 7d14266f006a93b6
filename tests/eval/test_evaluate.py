"""evaluate(): worked examples with a scripted generate function and the real grader.

The scripted generator answers problem i with the gold answer when ``i`` is in a chosen set, so
every expected accuracy is a count a person can check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from eval.evaluate import ResumeError, evaluate, read_samples
from mathtask.data import Problem
from mathtask.prompts import TEMPLATES, PromptTemplate, exemplar_solution, load_template, with_fewshot

RAW = TEMPLATES["raw"]  # plain text: no tokenizer needed


def make_problems(num: int) -> list[Problem]:
    return [
        Problem(
            id=f"p{i}",
            question=f"What is {i} + {i}?",
            answer=str(2 * i),
            dataset="gsm8k",
            metadata={"subject": "Algebra" if i % 2 else "Geometry", "level": 1 + i % 3},
        )
        for i in range(num)
    ]


@dataclass
class Done:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str = "stop"


class Scripted:
    """Answers "What is i + i?" correctly iff (i, sample index) is in ``correct``; records calls."""

    def __init__(self, correct: set[tuple[int, int]], fail_after_calls: int | None = None):
        self.correct = correct
        self.fail_after_calls = fail_after_calls
        self.calls: list[list[str]] = []

    def __call__(self, prompts, *, n, temperature, top_p, max_new_tokens, seed, **kwargs):
        if self.fail_after_calls is not None and len(self.calls) >= self.fail_after_calls:
            raise KeyboardInterrupt("simulated kill")
        self.calls.append(list(prompts))
        outs = []
        for prompt in prompts:
            i = int(prompt.rsplit("What is ", 1)[1].split(" ")[0])
            outs.append(
                [
                    Done(
                        f"{i} + {i} = {2 * i if (i, s) in self.correct else 2 * i + 1}. The answer is "
                        f"\\boxed{{{2 * i if (i, s) in self.correct else 2 * i + 1}}}.",
                        tuple(range(10 + i)),
                    )
                    for s in range(n)
                ]
            )
        return outs


def test_greedy_accuracy_and_records():
    problems = make_problems(4)
    gen = Scripted(correct={(0, 0), (1, 0), (3, 0)})
    result = evaluate(gen, problems, RAW, log=None)
    s = result.summary
    assert s["accuracy"]["mean"] == 0.75 and s["accuracy"]["ci_method"] == "wilson"
    assert s["num_problems"] == 4 and s["num_samples_per_problem"] == 1
    # p0 (Geometry, level 1) right, p1 (Algebra, 2) right, p2 (Geometry, 3) wrong, p3 (Algebra, 1) right.
    assert s["by_subject"]["Algebra"]["mean"] == 1.0 and s["by_subject"]["Geometry"]["mean"] == 0.5
    assert s["by_level"]["3"]["mean"] == 0.0 and s["by_level"]["1"]["mean"] == 1.0
    assert s["length"]["mean"] == (10 + 11 + 12 + 13) / 4
    r = result.records[2]
    assert r["id"] == "p2" and r["sample_index"] == 0 and r["correct"] is False
    assert r["extracted"] == "5" and r["gold"] == "4" and r["prompt"] == "Question: What is 2 + 2?\nAnswer:"
    assert s["settings"]["template"]["name"] == "raw" and s["settings"]["template"]["stop"] == list(RAW.stop)


def test_sampling_pass_at_k_and_maj_at_k():
    problems = make_problems(2)
    # p0: samples 0 and 1 of 4 correct; p1: only sample 3.
    gen = Scripted(correct={(0, 0), (0, 1), (1, 3)})
    s = evaluate(gen, problems, RAW, num_samples=4, temperature=0.7, log=None).summary
    assert s["accuracy"]["mean"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    # pass@2: p0 = 1 - C(2,2)/C(4,2) = 5/6; p1 = 1 - C(3,2)/C(4,2) = 1/2.
    assert s["pass@k"]["2"]["mean"] == pytest.approx((5 / 6 + 1 / 2) / 2)
    # Wrong answers differ (2i+1 is one value per problem, so they do vote together): p0 votes
    # {0: 2, 1: 2} -> tie, first seen "0" (right); p1 votes {3: 3, 2: 1} -> wrong.
    assert s["maj@k"]["4"]["mean"] == 0.5


def test_chunks_report_progress_with_eta():
    lines: list[str] = []
    evaluate(Scripted(correct=set()), make_problems(5), RAW, chunk_size=2, log=lines.append)
    assert len(lines) == 3  # chunks of 2, 2, 1
    assert lines[0].startswith("[eval] 2/5 (40%) [00:00<00:00,") and "problem" in lines[0] and "tokens/s]" in lines[0]
    assert lines[-1].startswith("[eval] 5/5 (100%)")


def test_resume_after_a_kill_regenerates_nothing_finished(tmp_path):
    problems = make_problems(5)
    correct = {(0, 0), (3, 0), (4, 0)}
    path = tmp_path / "samples.jsonl"

    # First attempt dies after its first chunk of 2 problems.
    with pytest.raises(KeyboardInterrupt):
        evaluate(Scripted(correct, fail_after_calls=1), problems, RAW, chunk_size=2, samples_path=path, log=None)
    first = {r["id"] for r in read_samples(path)}
    assert len(first) == 2  # problems go in a seeded random order: any 2 of the 5
    # A torn line from the moment of the kill is ignored.
    with path.open("a") as f:
        f.write('{"id": "p9", "sample_ind')

    second = Scripted(correct)
    lines: list[str] = []
    result = evaluate(second, problems, RAW, chunk_size=2, samples_path=path, log=lines.append)
    generated = [p for call in second.calls for p in call]
    assert len(generated) == 3 and not any(f"What is {pid[1:]} " in p for pid in first for p in generated)
    assert lines[0] == f"[eval] resuming: 2/5 problems already in {path}"
    assert result.summary["accuracy"]["mean"] == 3 / 5
    assert result.summary["timing"]["num_problems_resumed"] == 2
    assert [r["id"] for r in read_samples(path)] == ["p0", "p1", "p2", "p3", "p4"]

    # Same records as one uninterrupted run.
    fresh = evaluate(Scripted(correct), problems, RAW, log=None)
    assert [json.dumps(r, sort_keys=True) for r in result.records] == [
        json.dumps(r, sort_keys=True) for r in fresh.records
    ]

    # A finished run resumes with nothing left to generate.
    third = Scripted(correct)
    evaluate(third, problems, RAW, samples_path=path, log=None)
    assert third.calls == []


def test_resume_refuses_a_file_from_another_evaluation(tmp_path):
    path = tmp_path / "samples.jsonl"
    problems = make_problems(2)
    evaluate(Scripted(set()), problems, RAW, samples_path=path, log=None)
    other = PromptTemplate(name="other", user="Q: {question}\nA:", chat=False)
    with pytest.raises(ResumeError, match="different prompt"):
        evaluate(Scripted(set()), problems, other, samples_path=path, log=None)


def test_bad_arguments():
    with pytest.raises(ValueError, match="no problems"):
        evaluate(Scripted(set()), [], RAW, log=None)
    with pytest.raises(ValueError, match="greedy samples are identical"):
        evaluate(Scripted(set()), make_problems(1), RAW, num_samples=2, temperature=0.0, log=None)
    dup = make_problems(2) + make_problems(1)
    with pytest.raises(ValueError, match="unique.*'p0'"):
        evaluate(Scripted(set()), dup, RAW, log=None)
    with pytest.raises(ValueError, match="tokenizer is needed"):
        evaluate(Scripted(set()), make_problems(1), TEMPLATES["qwen_math_cot"], log=None)


def test_plain_string_completions_are_accepted():
    def gen(prompts, **kw):
        return [["The answer is \\boxed{0}."] for _ in prompts]

    result = evaluate(gen, make_problems(2), RAW, log=None)
    assert [r["correct"] for r in result.records] == [True, False]


def test_chat_templates_render_with_the_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = TEMPLATES["qwen_math_cot"].render("What is 1 + 1?", tok)
    assert text == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
        "<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n"
    )
    # Braces in questions are not format fields.
    assert "{x}" in TEMPLATES["qwen_math_cot_user"].render("Find {x}.", tok)


def test_fewshot_exemplars_come_from_the_training_split():
    t = with_fewshot(TEMPLATES["raw"], "gsm8k_train", 2, seed=0)
    assert t.name == "raw+2shot" and len(t.fewshot) == 2 and len(t.fewshot_ids) == 2
    question, solution = t.fewshot[0]
    # Calculator annotations are stripped and the "#### N" line becomes the template's answer line.
    assert "<<" not in solution and "####" not in solution
    assert solution.rsplit("\n", 1)[1].startswith("The answer is $\\boxed{")
    text = t.render("What is 2 + 2?")
    assert text.startswith("Question: ") and text.count("Question:") == 3 and text.endswith("What is 2 + 2?\nAnswer:")
    assert with_fewshot(TEMPLATES["raw"], "gsm8k_train", 2, seed=0) == t  # fixed seed
    p = Problem(id="x", question="q", answer="7", dataset="gsm8k", solution="3+4 = <<3+4=7>>7\n#### 7")
    assert exemplar_solution(p, TEMPLATES["gsm8k_cot"]) == "3+4 = 7\nThe answer is 7."


def test_template_files(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text('user: "Problem: {question}\\nSolution:"\nchat: false\nstop: ["Problem:"]\n')
    t = load_template(str(f))
    assert t.name == "mine" and t.stop == ("Problem:",) and t.render("1+1?") == "Problem: 1+1?\nSolution:"
    (tmp_path / "bad.yaml").write_text("user: no placeholder\n")
    with pytest.raises(ValueError, match="must contain \\{question\\}"):
        load_template(str(tmp_path / "bad.yaml"))
    with pytest.raises(ValueError, match="unknown prompt 'nope'"):
        load_template("nope")
