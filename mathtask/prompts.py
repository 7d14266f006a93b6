"""Prompt templates: a question -> the exact text the model sees.

A template is data (system text, user text with ``{question}``, chat or raw, stop strings), so the
report can record exactly what was used. Chat templates go through the tokenizer's own chat
template; raw templates are plain text for base models. Any template can be made few-shot with
``with_fewshot``: solved exemplars come before the question, as earlier chat turns or as
``user + answer`` blocks of plain text.

Built-ins (``TEMPLATES``):

=====================  ==========================================================================
qwen_math_cot          Qwen2.5-Math's chain-of-thought prompt: system "Please reason step by step,
                       and put your final answer within \\boxed{}.", user = the question
qwen_math_cot_user     the same instruction appended to the user turn (chat templates that drop or
                       replace the system message)
gsm8k_cot              a GSM8K word-problem prompt asking for "The answer is N." on the last line
raw                    plain text "Question: ...\\nAnswer:" for base models (stops at the next
                       "Question:")
=====================  ==========================================================================
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mathtask.data import DataError, Problem, load_problems

QWEN_MATH_COT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class PromptTemplate:
    name: str
    user: str
    """The question turn; ``{question}`` is replaced by the problem text."""
    system: str = ""
    """System message (chat) or preamble (raw); empty for none."""
    chat: bool = True
    """Render with the tokenizer's chat template (False: plain text for base models)."""
    stop: tuple[str, ...] = ()
    """Stop strings: few-shot raw prompts would otherwise go on to invent the next question."""
    answer_line: str = "The answer is $\\boxed{{{answer}}}$."
    """How an exemplar's final answer is written when its solution has no \\boxed{} (GSM8K)."""
    fewshot: tuple[tuple[str, str], ...] = ()
    """(question, worked solution) exemplars, in order."""
    fewshot_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if "{question}" not in self.user:
            raise ValueError(f"prompt template {self.name!r}: 'user' must contain {{question}}")

    def user_text(self, question: str) -> str:
        # str.replace, not str.format: questions and LaTeX are full of braces.
        return self.user.replace("{question}", question)

    def render(self, question: str, tokenizer: Any = None) -> str:
        """The exact prompt text for ``question`` (special tokens included)."""
        if self.chat:
            if tokenizer is None:
                raise ValueError(f"prompt template {self.name!r} is a chat template: a tokenizer is needed")
            if not getattr(tokenizer, "chat_template", None):
                raise ValueError(
                    f"prompt template {self.name!r} needs a chat template but the tokenizer has none; "
                    "use prompt=raw (plain text) for base models without one"
                )
            messages = [{"role": "system", "content": self.system}] if self.system else []
            for q, a in self.fewshot:
                messages += [{"role": "user", "content": self.user_text(q)}, {"role": "assistant", "content": a}]
            messages.append({"role": "user", "content": self.user_text(question)})
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        parts = [self.system + "\n\n"] if self.system else []
        parts += [f"{self.user_text(q)} {a}\n\n" for q, a in self.fewshot]
        parts.append(self.user_text(question))
        text = "".join(parts)
        # Engines tokenize prompts without adding special tokens; add the BOS a base model expects.
        bos = getattr(tokenizer, "bos_token", None) if tokenizer is not None else None
        if bos and _adds_bos(tokenizer):
            text = bos + text
        return text

    def record(self) -> dict[str, Any]:
        """What the report stores: every field, exemplars included."""
        d = dataclasses.asdict(self)
        d["stop"] = list(self.stop)
        d["fewshot"] = [list(x) for x in self.fewshot]
        d["fewshot_ids"] = list(self.fewshot_ids)
        return d


def _adds_bos(tokenizer: Any) -> bool:
    try:
        ids = tokenizer("a").input_ids
    except Exception:  # noqa: BLE001 - a tokenizer that cannot say: assume no BOS
        return False
    return bool(ids) and ids[0] == getattr(tokenizer, "bos_token_id", None)


TEMPLATES: dict[str, PromptTemplate] = {
    t.name: t
    for t in (
        PromptTemplate(name="qwen_math_cot", system=QWEN_MATH_COT_INSTRUCTION, user="{question}"),
        PromptTemplate(name="qwen_math_cot_user", user="{question}\n" + QWEN_MATH_COT_INSTRUCTION),
        PromptTemplate(
            name="gsm8k_cot",
            user=(
                "Solve the following math word problem. Reason step by step, and finish with a line of the "
                'form "The answer is N." where N is the final number.\n\n{question}'
            ),
            answer_line="The answer is {answer}.",
        ),
        PromptTemplate(
            name="raw", user="Question: {question}\nAnswer:", chat=False, stop=("\nQuestion:", "\n\nQuestion:")
        ),
    )
}


def load_template(spec: str) -> PromptTemplate:
    """A built-in name, or a YAML/JSON file with PromptTemplate fields (name defaults to the file stem)."""
    if spec in TEMPLATES:
        return TEMPLATES[spec]
    path = Path(spec)
    if path.suffix not in (".yaml", ".yml", ".json"):
        raise ValueError(f"unknown prompt {spec!r}: expected one of {', '.join(TEMPLATES)} or a .yaml/.json file")
    if not path.exists():
        raise ValueError(f"prompt file {path}: no such file")
    from omegaconf import OmegaConf

    loaded = OmegaConf.to_container(OmegaConf.load(path))
    if not isinstance(loaded, dict):
        raise ValueError(f"prompt file {path}: expected a mapping of template fields")
    fields: dict[str, Any] = {str(k): v for k, v in loaded.items()}
    known = {f.name for f in dataclasses.fields(PromptTemplate)}
    unknown = set(fields) - known
    if unknown:
        raise ValueError(f"prompt file {path}: unknown fields {sorted(unknown)} (known: {sorted(known)})")
    fields.setdefault("name", path.stem)
    fields["stop"] = tuple(fields.get("stop", ()))
    fields["fewshot"] = tuple(tuple(x) for x in fields.get("fewshot", ()))
    return PromptTemplate(**fields)


# Exemplars come from each dataset's training split, never from the problems under evaluation.
FEWSHOT_SOURCES = {"gsm8k": "gsm8k_train", "math": "math_train", "math500": "math_train", "synthetic": "synthetic"}


def exemplar_solution(problem: Problem, template: PromptTemplate) -> str:
    """A worked solution ending in the final answer in the template's requested form."""
    solution = problem.solution or ""
    if "####" in solution:  # GSM8K: drop calculator annotations <<48/2=24>>, rewrite the "#### N" line
        body = re.sub(r"<<[^<>]*>>", "", solution.rsplit("####", 1)[0]).strip()
        return f"{body}\n{template.answer_line.replace('{answer}', problem.answer)}"
    if "\\boxed" in solution:
        return solution.strip()
    line = template.answer_line.replace("{answer}", problem.answer)
    return f"{solution.strip()}\n{line}" if solution.strip() else line


def with_fewshot(template: PromptTemplate, source: str, num_fewshot: int, seed: int = 0) -> PromptTemplate:
    """``template`` with ``num_fewshot`` exemplars drawn (fixed seed) from dataset ``source``."""
    if num_fewshot <= 0:
        return template
    pool = [p for p in load_problems(source, seed=seed) if p.solution]
    if len(pool) < num_fewshot:
        raise DataError(f"few-shot source {source!r} has {len(pool)} problems with solutions; {num_fewshot} asked")
    chosen = random.Random(seed).sample(pool, num_fewshot)
    return dataclasses.replace(
        template,
        name=f"{template.name}+{num_fewshot}shot",
        fewshot=tuple((p.question, exemplar_solution(p, template)) for p in chosen),
        fewshot_ids=tuple(p.id for p in chosen),
    )


def fewshot_source_for(dataset: str) -> str:
    if dataset not in FEWSHOT_SOURCES:
        raise DataError(f"no default few-shot source for dataset {dataset!r}: set fewshot_source=<dataset or file>")
    return FEWSHOT_SOURCES[dataset]
