"""Reward models from HF checkpoints: load once, score batches of responses, scores in [0, 1].

- PRM, value head: a token-classification model read at the last token of every step (sigmoid).
- PRM, step tag (Math-Shepherd): a causal LM; a tag is appended after every step and the score is
  P(good) / (P(good) + P(bad)) from the LM's logits at the tag's last token.
- ORM: a sequence-classification head at the last token (sigmoid); a value head read at the last
  token also works.

The reward model may have its own tokenizer: it always gets the question and the response *text*
(``rm_input``) and is tokenized here; step k's score is read at the RM token that completes step k's
last character, so scores map back to the policy's step-end tokens by step index. A causal model
reads every step of a response in one forward pass: the score at step k only sees the prefix.

``realm_rm.json`` in a model dir (written by rewards.train_rm) says how it was trained: readout,
question template, step delimiter, step tag, good/bad tokens, held-out accuracies.

A reward model may be sharded (the plan runtime's ``rew_inf`` replicas: pipeline stages of TP
ranks): ``load_reward_model(shard=...)`` hands the loaded model to the sharding function, which
returns the body to run instead of the model's own (a pipeline stage's part); the ranks of a
replica run the same batches, and only the last stage gets hidden states and scores.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from common.dtypes import torch_dtype
from models.registry import max_context
from rewards.config import Readout, RewardKind, RewardModelConfig
from rewards.segment import Step

RM_INFO_FILE = "realm_rm.json"
DEFAULT_QUESTION_TEMPLATE = "{question}\n\n"
DEFAULT_STEP_TAG = " ки"

# (input_ids, attention_mask) [B, L] -> final hidden states [B, L, H], or None on a pipeline stage
# that passes them on instead of reading scores.
Body = Callable[[Tensor, Tensor], "Tensor | None"]


class RewardModelError(ValueError):
    """A reward model that cannot be loaded or does not fit the reward config; the message says why."""


@dataclass(frozen=True)
class RMFormat:
    """How a question and its steps are written for the reward model (must match its training)."""

    question_template: str = DEFAULT_QUESTION_TEMPLATE
    step_tag: str = ""
    """Appended after each step's content (before its delimiter) when non-empty; the score is read there."""


def rm_input(fmt: RMFormat, question: str, steps: Sequence[Step]) -> tuple[str, list[int]]:
    """The reward model's input text and, per step, the exclusive character offset to read at.

    Without a tag, step k is read where its text (delimiter included) ends, the same point the policy's
    reward for step k sits on; with a tag, right after the tag.
    """
    text = fmt.question_template.replace("{question}", question)
    reads = []
    for step in steps:
        text += step.content
        if fmt.step_tag:
            text += fmt.step_tag
            reads.append(len(text))
            text += step.delimiter
        else:
            text += step.delimiter
            reads.append(len(text))
    return text, reads


def encode_with_reads(
    tokenizer, text: str, read_chars: Sequence[int], keep_chars: int = 0
) -> tuple[list[int], list[int], int]:
    """Token ids of ``text``; per read offset c, the index of the token that completes character c-1; and
    the number of leading tokens that hold the first ``keep_chars`` characters (the question).
    """
    enc = tokenizer(text, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    # Special tokens (BOS) have empty spans; a character split over byte tokens gives them all the same
    # start, and the last of them is the one that completes it.
    spans = [(i, start) for i, (start, end) in enumerate(offsets) if end > start]
    starts = [start for _, start in spans]
    reads = []
    for c in read_chars:
        j = bisect.bisect_left(starts, c) - 1
        reads.append(spans[j][0] if j >= 0 else 0)
    num_kept = next((i for i, start in spans if start >= keep_chars), len(ids)) if keep_chars else 0
    return ids, reads, num_kept


def plan_windows(
    num_tokens: int, reads: Sequence[int], num_kept: int, max_length: int
) -> list[tuple[int, int, list[int]]]:
    """How to score a token sequence longer than the model's ``max_length``: a list of windows
    ``(start, end, reads)``, each read as ``tokens[:num_kept] + tokens[start:end]``.

    The first ``num_kept`` tokens (the question) are in every window, so every score is conditioned
    on the question, and step 1's score (c_1, the one Delta keeps) sees exactly what it would see
    untruncated whenever the question and step 1 fit. The first window continues the sequence
    from ``num_kept``; a read past it opens a window that puts it ``body // 2`` tokens in (half the
    window is context, half covers the reads after it), or as far in as the sequence's end allows.
    Each read is in exactly one window, in order; windows end at their last read. At most half of
    ``max_length`` goes to the question (a longer question is cut, keeping its start).

    Worked example: 20 tokens, question = tokens 0..3 (num_kept 4), reads at 6, 12, 19, max_length 10
    (body 6): window 1 = tokens 4..9 holds read 6; read 12 opens tokens 10..15 (12 is 3 in: 10 = 12 + 1 - 3),
    which ends at 13; read 19 opens 14..19.  -> [(4, 7, [6]), (10, 13, [12]), (14, 20, [19])]
    """
    if not max_length or num_tokens <= max_length:
        return [(num_kept, num_tokens, list(reads))]
    num_kept = min(num_kept, max_length // 2)
    body = max_length - num_kept
    windows: list[tuple[int, int, list[int]]] = []
    i, start = 0, num_kept
    while i < len(reads):
        if reads[i] >= start + body:  # past the current window: open one around it
            start = max(num_kept, min(reads[i] + 1 - body // 2, num_tokens - body))
        covered = []
        while i < len(reads) and reads[i] < start + body:
            covered.append(reads[i])
            i += 1
        windows.append((start, max(covered) + 1, covered))
    return windows


def window_ids(
    ids: Sequence[int], reads: Sequence[int], num_kept: int, max_length: int
) -> list[tuple[list[int], list[int]]]:
    """``plan_windows`` applied: per window, its token ids and its reads as indices into them."""
    if not max_length or len(ids) <= max_length:
        return [(list(ids), list(reads))]
    num_kept = min(num_kept, max_length // 2)
    out = []
    for start, end, covered in plan_windows(len(ids), reads, num_kept, max_length):
        out.append(
            (
                list(ids[:num_kept]) + list(ids[start:end]),
                [r if r < num_kept else num_kept + r - start for r in covered],
            )
        )
    return out


def read_rm_info(model_dir: Path) -> dict[str, Any]:
    path = Path(model_dir) / RM_INFO_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def _infer_readout(model_dir: Path, info: dict[str, Any]) -> Readout:
    if "readout" in info:
        return Readout(info["readout"])
    config = json.loads((Path(model_dir) / "config.json").read_text())
    archs = " ".join(config.get("architectures") or [])
    if "SequenceClassification" in archs:
        return Readout.seq_cls
    if "TokenClassification" in archs:
        return Readout.value_head
    if "CausalLM" in archs:
        return Readout.step_tag
    raise RewardModelError(
        f"{model_dir}: cannot tell the readout from architectures={archs!r}; set reward.model.readout"
    )


def _log_odds(logits: torch.Tensor) -> torch.Tensor:
    """[N, 1] -> the logit; [N, 2] -> l_1 - l_0, so sigmoid gives softmax(.)[:, 1] (class 1 = good).  -> [N]"""
    logits = logits.float()
    if logits.shape[-1] == 1:
        return logits[:, 0]
    if logits.shape[-1] == 2:
        return logits[:, 1] - logits[:, 0]
    raise RewardModelError(f"reward head has {logits.shape[-1]} labels; expected 1 (sigmoid) or 2 (softmax)")


@dataclass
class ScoreReader:
    """A reward model's transformer body plus a head: log-odds of 'good' at given token positions.

    The score is sigmoid(log-odds). Training (rewards.train_rm) puts binary cross-entropy on the same
    log-odds, so a model is trained through exactly the code that reads it. The head runs on the read
    positions only, which is what the HF *ForTokenClassification / *ForSequenceClassification heads
    compute there (a sequence classifier pools the last token; here the last token is a read position).
    """

    model: Any
    head: Callable[[torch.Tensor], torch.Tensor]
    """[N, H] final hidden states -> [N] log-odds."""
    body: Body | None = None
    """Runs instead of the model's own body when set (a sharded model's stage)."""

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """ids, mask [B, L] -> [B, L, H] final (normed) hidden states of the whole model."""
        return self.model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor
    ) -> torch.Tensor | None:
        """ids, mask [B, L]; rows, cols [N] positions to read -> [N] log-odds (None on a stage that
        passed its hidden states on)."""
        hidden = (self.body or self.hidden)(input_ids, attention_mask)
        return None if hidden is None else self.head(hidden[rows, cols])

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., vocab] next-token logits: the LM head, or the tied input embeddings for a
        classifier (used only by train_rm's auxiliary LM loss)."""
        head = self.model.get_output_embeddings()
        if head is not None:
            return head(hidden)
        return hidden @ self.model.get_input_embeddings().weight.T


def _classifier(model) -> Any:
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Module):
            return head
    raise RewardModelError(f"{type(model).__name__} has no 'score' or 'classifier' head")


class RewardModel:
    """A loaded reward model: text in, scores in [0, 1] out, batched by length."""

    def __init__(
        self,
        model,
        tokenizer,
        reader: ScoreReader,
        fmt: RMFormat,
        readout: Readout,
        info: dict[str, Any],
        batch_size: int,
        max_length: int,
        device: str,
        num_microbatches: int = 1,
    ):
        """``num_microbatches``: at least this many forwards per call (an execution plan's
        micro-batches for reward inference); ``batch_size`` still caps the rows of each."""
        self.model, self.tokenizer, self.reader = model, tokenizer, reader
        self.fmt, self.readout, self.info = fmt, readout, info
        self.batch_size, self.max_length, self.device = batch_size, max_length, device
        self.num_microbatches = num_microbatches
        self.pad_id = model.config.pad_token_id

    def _windows(self, question: str, text: str, read_chars: Sequence[int] | None) -> list[tuple[list[int], list[int]]]:
        """The RM input as windows that fit ``max_length``, each starting with the question (see
        ``plan_windows``); ``read_chars=None`` reads the last token (ORM)."""
        keep_chars = len(self.fmt.question_template.replace("{question}", question))
        ids, reads, num_kept = encode_with_reads(self.tokenizer, text, read_chars or [], keep_chars)
        if read_chars is None:
            reads = [len(ids) - 1]
        return window_ids(ids, reads, num_kept, self.max_length)

    def score_steps(self, questions: Sequence[str], steps: Sequence[Sequence[Step]]) -> list[list[float]]:
        """PRM: c_k for every step of every response.  B questions, B step lists -> B lists of K_b scores."""
        windows = [self._windows(q, *rm_input(self.fmt, q, s)) for q, s in zip(questions, steps)]
        scores = self._score([w for ws in windows for w in ws])
        out, position = [], 0
        for ws in windows:
            out.append([c for window_scores in scores[position : position + len(ws)] for c in window_scores])
            position += len(ws)
        return out

    def score_outcomes(self, questions: Sequence[str], responses: Sequence[str]) -> list[float]:
        """ORM: one score per response, read at the last token (question + the response's end if too long).  B -> B."""
        encoded = []
        for question, response in zip(questions, responses):
            text, _ = rm_input(RMFormat(self.fmt.question_template), question, [Step(response, "")])
            (window,) = self._windows(question, text, None)
            encoded.append(window)
        return [scores[0] for scores in self._score(encoded)]

    @torch.inference_mode()
    def _score(self, encoded: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        out: list[list[float]] = [[] for _ in encoded]
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))  # similar lengths pad less
        per_forward = min(self.batch_size, max(1, -(-len(order) // self.num_microbatches)))
        for first in range(0, len(order), per_forward):
            chunk = order[first : first + per_forward]
            width = max(len(encoded[i][0]) for i in chunk)
            ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            rows, cols = [], []
            for b, i in enumerate(chunk):
                tokens, reads = encoded[i]
                ids[b, : len(tokens)] = torch.tensor(tokens)
                mask[b, : len(tokens)] = 1
                rows += [b] * len(reads)
                cols += reads
            if not rows:
                continue
            log_odds = self.reader(
                ids.to(self.device),
                mask.to(self.device),
                torch.tensor(rows, device=self.device),
                torch.tensor(cols, device=self.device),
            )
            # A pipeline stage that passed its hidden states on has no scores: placeholders of the right count.
            scores = [0.0] * len(rows) if log_odds is None else torch.sigmoid(log_odds.float()).tolist()
            position = 0
            for i in chunk:
                count = len(encoded[i][1])
                out[i] = scores[position : position + count]
                position += count
        return out


def _single_token(tokenizer, text: str, what: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise RewardModelError(
            f"reward.model.{what}={text!r} is {len(ids)} tokens for this tokenizer; it must be one token"
        )
    return ids[0]


def auto_model_class(readout: Readout):
    """The transformers Auto class a readout needs."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoModelForTokenClassification

    return {
        Readout.value_head: AutoModelForTokenClassification,
        Readout.step_tag: AutoModelForCausalLM,
        Readout.seq_cls: AutoModelForSequenceClassification,
    }[readout]


def make_reader(model, readout: Readout, tokenizer=None, good_token: str = "+", bad_token: str = "-") -> ScoreReader:
    """The log-odds reader for a loaded model (shared by scoring and training)."""
    if readout == Readout.step_tag:
        # Only two vocabulary rows are needed: never the [B, L, vocab] logits (large for real vocabularies).
        pair = [_single_token(tokenizer, bad_token, "bad_token"), _single_token(tokenizer, good_token, "good_token")]
        lm_head = model.get_output_embeddings()

        def tag_head(hidden: torch.Tensor) -> torch.Tensor:
            if hasattr(lm_head.weight, "full_tensor"):  # a TP-sharded head: its rows are spread over ranks
                return _log_odds(lm_head(hidden)[:, pair])  # [N, vocab] at the read positions only
            logits = hidden @ lm_head.weight[pair].T  # [N, 2]: (bad, good)
            if getattr(lm_head, "bias", None) is not None:
                logits = logits + lm_head.bias[pair]
            return _log_odds(logits)  # log P(good) - log P(bad)

        return ScoreReader(model, tag_head)
    if readout in (Readout.value_head, Readout.seq_cls):
        classifier = _classifier(model)
        return ScoreReader(model, lambda hidden: _log_odds(classifier(hidden)))
    raise RewardModelError(f"readout {readout} must be resolved before building a reader")


def _checked_readout(model_dir: Path, info: dict[str, Any], cfg: RewardModelConfig, kind: RewardKind) -> Readout:
    """How ``model_dir``'s scores are read, refused when it cannot serve ``kind``."""
    readout = cfg.readout if cfg.readout != Readout.auto else _infer_readout(model_dir, info)
    if kind == RewardKind.prm and readout == Readout.seq_cls:
        raise RewardModelError(
            f"{model_dir} is a sequence classifier (one score per response); reward.kind=prm needs "
            "per-step scores: use a value_head or step_tag model"
        )
    if kind == RewardKind.orm and readout == Readout.step_tag:
        raise RewardModelError(
            f"{model_dir} is read with step tags (a PRM); reward.kind=orm needs seq_cls or value_head"
        )
    if "kind" in info and info["kind"] != kind.value:
        raise RewardModelError(f"{model_dir} was trained as a {info['kind'].upper()} but reward.kind={kind.value}")
    return readout


def load_reward_model(
    model_dir: Path,
    cfg: RewardModelConfig,
    kind: RewardKind,
    device: str = "cpu",
    shard: Callable[[Any], Body | None] | None = None,
    num_microbatches: int = 1,
    compute_dtype: str = "float32",
    on_host: bool = False,
) -> RewardModel:
    """Load the reward model in ``model_dir`` for ``kind`` (orm or prm), with config overrides applied.

    The weights load in host memory in ``cfg.dtype`` (``auto``: ``compute_dtype``, the run's); ``shard``
    then puts its part on the device (it shards the model in place, before its head is looked up, and
    returns the body to run instead of the model's own, or None to keep it); an unsharded model moves to
    ``device`` whole, unless ``on_host`` (offloaded: it visits the device for each call).
    ``num_microbatches``: ``RewardModel``'s."""
    from transformers import AutoTokenizer

    model_dir = Path(model_dir)
    info = read_rm_info(model_dir)
    readout = _checked_readout(model_dir, info, cfg, kind)

    def pick(override, key, default):
        return override if override is not None else info.get(key, default)

    step_tag = pick(cfg.step_tag, "step_tag", DEFAULT_STEP_TAG if readout == Readout.step_tag else "")
    if readout == Readout.step_tag and not step_tag:
        raise RewardModelError("readout step_tag needs a non-empty reward.model.step_tag")
    fmt = RMFormat(
        question_template=pick(cfg.question_template, "question_template", DEFAULT_QUESTION_TEMPLATE),
        step_tag=step_tag if kind == RewardKind.prm else "",
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dtype = torch_dtype(compute_dtype if cfg.dtype == "auto" else cfg.dtype)
    model = auto_model_class(readout).from_pretrained(model_dir, dtype=dtype).eval()
    if model.config.pad_token_id is None:  # needed to pad batches (and for seq_cls pooling)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        model.config.pad_token_id = pad if pad is not None else 0
    body = shard(model) if shard is not None else None
    if shard is None and not on_host:
        model.to(device)
    reader = make_reader(
        model, readout, tokenizer, pick(cfg.good_token, "good_token", "+"), pick(cfg.bad_token, "bad_token", "-")
    )
    reader.body = body
    max_length = cfg.max_length or max_context(model_dir) or 0
    return RewardModel(
        model, tokenizer, reader, fmt, readout, info, cfg.batch_size, max_length, device, num_microbatches
    )
