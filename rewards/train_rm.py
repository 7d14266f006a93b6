"""Train an ORM or a PRM and save it as an HF directory the reward configs load.

    python -m rewards.train_rm                      # PRM on the synthetic task -> the builtin:synthetic-prm cache entry
    python -m rewards.train_rm kind=orm             # ORM on the synthetic task -> builtin:synthetic-orm
    python -m rewards.train_rm data=prm.jsonl data_format=math_shepherd backbone.source=hf \\
        backbone.path=/models/qwen2.5-math-1.5b readout=step_tag output_dir=/models/my-prm

The saved directory holds the model (``*ForTokenClassification`` for a value-head PRM,
``*ForCausalLM`` for a step-tag PRM, ``*ForSequenceClassification`` for an ORM), its tokenizer and
``realm_rm.json``: the readout, the input format (question template, step delimiter, step tag) and the
held-out step-label and final-label accuracies.

Training uses the reward model's own reader (``rewards.reward_model.make_reader``) on the same RM inputs
(``rewards.reward_model.rm_input``) as scoring does, so what is trained is what is read. The loss is binary
cross-entropy on the log-odds at every step end (PRM) or at the last token (ORM), plus
``lm_loss_weight`` times a next-token loss on the correct solutions (see that field for why).

``builtin:synthetic-prm`` / ``builtin:synthetic-orm`` are this script with its defaults (kind set):
trained on first use into ``models.registry.cache_root()/reward_models/``, atomically, keyed by a
hash of the config.

Measured (``scripts/train_reward_models.sh``: both side by side, 1 thread each, on an idle 2-core CPU:
284 s of training each, 4 min 50 s of wall time for both; held-out: 200 problems, 800 responses, 2468
steps; deterministic for a given machine: a loaded machine gave the same numbers):

    PRM  step accuracy 0.691 (majority 0.569, AUC 0.786)   final accuracy 0.656 (majority 0.699, AUC 0.666)
    ORM                                                   final accuracy 0.691 (majority 0.699, AUC 0.678)

These are weak verifiers: a 2-layer, 128-wide model separates good from bad steps (median score 0.58
vs 0.40) but hardly carries an earlier slip forward to the final answer, so at threshold 0.5 its
final verdict is no better than "always wrong". They behave like real PRMs where it matters for the
reward-shaping experiments: repeating a correct step raises the raw PRM return (1.51 -> 2.82 for
three repeats of step 1 on a held-out problem). More steps help (step AUC rises steadily with
``num_steps``); so does a larger backbone, at a price on CPU.
"""
from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import random
import sys
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Sequence

import torch

from eval.files import atomic_build_dir, is_complete
from eval.progress import Progress
from models.config import ModelConfig
from models.schedule import LRSchedule, build_lr_scheduler
from rewards.config import Readout, RewardKind
from rewards.reward_model import (DEFAULT_QUESTION_TEMPLATE, DEFAULT_STEP_TAG, RM_INFO_FILE, RMFormat, auto_model_class,
                            encode_with_reads, make_reader, rm_input, window_ids)
from rewards.rm_data import RMExample, load_examples, synthetic_examples
from rewards.segment import Step


class RMKind(Enum):
    prm = "prm"
    orm = "orm"


@dataclass
class SyntheticRMData:
    """RM training data from the synthetic task (eval.synthetic)."""

    num_train_problems: int = 2000
    num_heldout_problems: int = 200
    difficulty: int = 2
    """The default PPO run's difficulty (configs/data/synthetic.yaml)."""
    num_corrupted: int = 2
    """Corrupted solutions (one arithmetic slip, Math-Shepherd labels) per problem, besides the correct one."""
    num_junk: int = 1
    """Degenerate responses (cut off, no box, a step repeated) per problem, labelled naturally."""
    seed: int = 1
    """Problem stream; the default PPO held-out questions (eval.config.DataConfig) are excluded."""


@dataclass
class RMTrainConfig:
    kind: RMKind = RMKind.prm
    readout: Readout = Readout.auto
    """auto: value_head for a PRM, seq_cls for an ORM. step_tag trains a causal LM's good/bad tokens."""
    data: str = "synthetic"
    """`synthetic`, or a .jsonl in realm / Math-Shepherd / PRM800K format (rewards.rm_data)."""
    data_format: str = "auto"
    heldout_data: str = ""
    """A held-out .jsonl; empty: hold out `heldout_fraction` of `data` (synthetic: its own held-out problems)."""
    heldout_fraction: float = 0.1
    synthetic: SyntheticRMData = field(default_factory=SyntheticRMData)
    backbone: ModelConfig = field(default_factory=ModelConfig)
    """The model to start from (a causal LM); default: the tiny model, so the policy and RM share a tokenizer."""
    question_template: str = DEFAULT_QUESTION_TEMPLATE
    step_delimiter: str = "\n\n"
    """Joins the steps in the RM input: the delimiter the policy's responses are cut at (reward.step_delimiter)."""
    step_tag: str = DEFAULT_STEP_TAG
    """step_tag readout only: appended after every step."""
    good_token: str = "+"
    bad_token: str = "-"
    lm_loss_weight: float = 1.0
    """Weight of an auxiliary next-token loss on the response tokens of the correct solutions in each batch
    (the classifiers predict tokens through their tied input embeddings). A from-scratch tiny model
    does not learn to check arithmetic from sparse step labels within minutes (held-out step accuracy
    stays near the majority baseline); learning to compute the next step at the same time is what makes
    a verifier possible (real PRMs start from a pretrained math LM for the same reason). Set 0 for a
    backbone that already knows the domain."""
    num_steps: int = 1000
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.01
    num_warmup_steps: int = 50
    max_length: int = 512
    seed: int = 0
    log_every: int = 200
    device: str = "cpu"
    num_threads: int = 1
    """torch CPU threads while training (0: torch's default). One thread: on a small machine shared with
    other work (or a training run's other workers), more threads spin against each other and run slower."""
    output_dir: str = ""
    """Where to save; empty: the cache entry `builtin:synthetic-<kind>` resolves to (for synthetic data)."""

    def __post_init__(self) -> None:
        if self.kind == RMKind.orm and self.readout == Readout.step_tag:
            raise ValueError("readout=step_tag is a PRM readout; an ORM uses seq_cls or value_head")
        if self.kind == RMKind.prm and self.readout == Readout.seq_cls:
            raise ValueError("readout=seq_cls gives one score per response; a PRM uses value_head or step_tag")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction={self.heldout_fraction}: must lie in (0, 1)")
        if self.num_steps < 1 or self.batch_size < 1:
            raise ValueError("num_steps and batch_size must be >= 1")
        if not self.output_dir and self.data != "synthetic":
            raise ValueError("output_dir is required when training on a file")

    @property
    def resolved_readout(self) -> Readout:
        if self.readout != Readout.auto:
            return self.readout
        return Readout.value_head if self.kind == RMKind.prm else Readout.seq_cls

    @property
    def fmt(self) -> RMFormat:
        return RMFormat(self.question_template, self.step_tag if self.resolved_readout == Readout.step_tag else "")


# Fields that do not change the trained model: left out of the cache key.
_NOT_IN_KEY = ("output_dir", "device", "log_every", "num_threads")


def _plain(x: Any) -> Any:
    if isinstance(x, Enum):
        return x.value
    if dataclasses.is_dataclass(x):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    return x


def config_key(cfg: RMTrainConfig) -> str:
    blob = {k: v for k, v in _plain(cfg).items() if k not in _NOT_IN_KEY}
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]


def default_output_dir(cfg: RMTrainConfig) -> Path:
    from models.registry import cache_root

    return cache_root() / "reward_models" / f"synthetic-{cfg.kind.value}-{config_key(cfg)}"


def builtin_config(path: str) -> RMTrainConfig:
    """The training config behind `builtin:synthetic-prm` / `builtin:synthetic-orm`."""
    kinds = {"builtin:synthetic-prm": RMKind.prm, "builtin:synthetic-orm": RMKind.orm}
    if path not in kinds:
        raise ValueError(f"unknown built-in reward model {path!r}; expected one of {sorted(kinds)}")
    return RMTrainConfig(kind=kinds[path])


def ensure_builtin(path: str) -> Path:
    """The cached directory of a built-in reward model, trained now (a minute or two on CPU) if absent."""
    cfg = builtin_config(path)
    target = default_output_dir(cfg)
    if not is_complete(target):
        _log(f"{path} is not cached: training it into {target}")
    return atomic_build_dir(target, lambda tmp: train_reward_model(cfg, tmp))


def _log(message: str) -> None:
    print(f"[train_rm] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- data


def load_data(cfg: RMTrainConfig) -> tuple[list[RMExample], list[RMExample]]:
    """(train, held-out) examples; held-out questions never appear in training."""
    if cfg.data == "synthetic":
        return _synthetic_data(cfg)
    examples = load_examples(cfg.data, cfg.data_format)
    if cfg.heldout_data:
        return examples, load_examples(cfg.heldout_data, cfg.data_format)
    questions = sorted({ex.question for ex in examples})
    random.Random(cfg.seed).shuffle(questions)
    heldout_questions = set(questions[: max(1, int(len(questions) * cfg.heldout_fraction))])
    return ([ex for ex in examples if ex.question not in heldout_questions],
            [ex for ex in examples if ex.question in heldout_questions])


def _grade(responses: list[str], golds: list[str]) -> list[bool]:
    from eval.grade import grade_many

    return [r.correct for r in grade_many(responses, golds, datasets="math")]


def _synthetic_data(cfg: RMTrainConfig) -> tuple[list[RMExample], list[RMExample]]:
    from eval.config import DataConfig
    from eval.synthetic import generate_problems, split_problems

    s = cfg.synthetic
    ppo = DataConfig()
    _, ppo_heldout = split_problems(ppo.synthetic_num_train, ppo.synthetic_num_heldout, seed=ppo.seed, difficulty=s.difficulty)
    excluded = {p.question for p in ppo_heldout}
    num_total = s.num_train_problems + s.num_heldout_problems
    problems = [p for p in generate_problems(num_total + len(excluded), seed=s.seed, difficulty=s.difficulty)
                if p.question not in excluded][:num_total]
    train, heldout = problems[: s.num_train_problems], problems[s.num_train_problems :]
    return (synthetic_examples(train, s.seed, s.num_corrupted, s.num_junk, _grade),
            synthetic_examples(heldout, s.seed + 1, s.num_corrupted, s.num_junk, _grade))


@dataclass
class Encoded:
    ids: list[int]
    reads: list[int]
    """Token positions where the score is read: one per step (PRM) or the last token (ORM)."""
    labels: list[float]
    source: str
    final_label: int
    lm_start: int | None = None
    """First response token of a correct solution (the auxiliary LM loss trains on tokens from here); else None."""
    is_last_window: bool = True
    """False for all but the last window of an input split to fit max_length: its last read is not the final one."""


def encode(cfg: RMTrainConfig, tokenizer, examples: Sequence[RMExample]) -> list[Encoded]:
    """RM inputs exactly as ``rewards.reward_model.RewardModel`` builds them when scoring: an input longer
    than ``max_length`` becomes several windows that each start with the question (``plan_windows``)."""
    out = []
    for ex in examples:
        steps = [Step(s, cfg.step_delimiter) for s in ex.steps[:-1]] + [Step(ex.steps[-1], "")]
        prefix = cfg.question_template.replace("{question}", ex.question)
        if cfg.kind == RMKind.prm:
            if ex.step_labels is None:
                raise ValueError(f"PRM training needs step labels; a {ex.source!r} example has none")
            text, read_chars = rm_input(cfg.fmt, ex.question, steps)
            labels = [float(x) for x in ex.step_labels]
        else:
            if ex.final_label is None:
                raise ValueError(f"ORM training needs final labels; a {ex.source!r} example has none")
            text, _ = rm_input(RMFormat(cfg.question_template), ex.question, [Step("".join(s.text for s in steps), "")])
            read_chars, labels = [len(text)], [float(ex.final_label)]
        ids, reads, num_kept = encode_with_reads(tokenizer, text, read_chars, len(prefix))
        if cfg.kind == RMKind.orm:
            reads = [len(ids) - 1]
        final_label = int(ex.final_label if ex.final_label is not None else ex.step_labels[-1])
        windows = window_ids(ids, reads, num_kept, cfg.max_length)
        position = 0
        for w, (window, window_reads) in enumerate(windows):
            lm_start = None
            if w == 0 and is_correct_solution(ex):  # the LM loss imitates the first window's response tokens
                lm_start = num_kept if num_kept < len(window) else None
            out.append(Encoded(window, window_reads, labels[position : position + len(window_reads)], ex.source,
                               final_label, lm_start, is_last_window=w == len(windows) - 1))
            position += len(window_reads)
    return out


def lm_loss(reader, hidden: torch.Tensor, ids: torch.Tensor, batch: Sequence[Encoded]) -> torch.Tensor:
    """Mean next-token NLL over the response tokens of the batch's correct solutions (0 if none).

    hidden [B, L, H], ids [B, L]: position t predicts token t + 1. Read positions are left out: a
    step-tag PRM reads its good/bad logits there.
    """
    rows, cols = [], []
    for b, e in enumerate(batch):
        if e.lm_start is not None:
            positions = [t for t in range(e.lm_start - 1, len(e.ids) - 1) if t not in e.reads]
            rows += [b] * len(positions)
            cols += positions
    if not rows:
        return hidden.new_zeros(())
    rows_t, cols_t = torch.tensor(rows, device=ids.device), torch.tensor(cols, device=ids.device)
    logits = reader.lm_logits(hidden[rows_t, cols_t])  # [M, vocab]
    return torch.nn.functional.cross_entropy(logits.float(), ids[rows_t, cols_t + 1])


def collate(batch: Sequence[Encoded], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, mask [B, L]; rows, cols, labels [N] of every read."""
    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    rows, cols, labels = [], [], []
    for b, e in enumerate(batch):
        ids[b, : len(e.ids)] = torch.tensor(e.ids)
        mask[b, : len(e.ids)] = 1
        rows += [b] * len(e.reads)
        cols += e.reads
        labels += e.labels
    return ids, mask, torch.tensor(rows), torch.tensor(cols), torch.tensor(labels)


# -------------------------------------------------------------------------------------------- training


def auc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """Area under the ROC curve: the chance that a random positive outscores a random negative (ties
    count half). 0.5 for a constant score, whatever the class balance; nan if one class is absent."""
    positives = [s for s, y in zip(scores, labels) if y]
    negatives = [s for s, y in zip(scores, labels) if not y]
    if not positives or not negatives:
        return float("nan")
    ranked = sorted(negatives)
    wins = sum(bisect.bisect_left(ranked, p) + 0.5 * (bisect.bisect_right(ranked, p) - bisect.bisect_left(ranked, p))
               for p in positives)
    return wins / (len(positives) * len(negatives))


@torch.inference_mode()
def heldout_metrics(reader, data: Sequence[Encoded], pad_id: int, kind: RMKind, device: str, batch_size: int = 64) -> dict[str, Any]:
    """Held-out accuracies at threshold 0.5, with what a constant would get, and AUCs.

    step_*: every step's score vs its label (PRM). final_*: the score at the last read (the last step
    for a PRM, the response for an ORM) vs the final label. The majority baseline is the accuracy of
    always answering the more common label; AUC is threshold-free (0.5 = no better than a constant).
    """
    step_scores: list[float] = []
    step_labels: list[int] = []
    final_scores: list[float] = []
    final_labels = [e.final_label for e in data if e.is_last_window]
    for first in range(0, len(data), batch_size):
        batch = data[first : first + batch_size]
        ids, mask, rows, cols, _ = collate(batch, pad_id)
        scores = torch.sigmoid(reader(ids.to(device), mask.to(device), rows.to(device), cols.to(device))).cpu().tolist()
        position = 0
        for e in batch:
            mine = scores[position : position + len(e.reads)]
            position += len(e.reads)
            if e.is_last_window:
                final_scores.append(mine[-1])
            step_scores += mine
            step_labels += [int(y >= 0.5) for y in e.labels]

    def accuracy(scores: Sequence[float], labels: Sequence[int]) -> float:
        return sum((s >= 0.5) == bool(y) for s, y in zip(scores, labels)) / len(labels)

    def majority(labels: Sequence[int]) -> float:
        return max(sum(labels), len(labels) - sum(labels)) / len(labels)

    by_source: dict[str, list[int]] = {}
    for e, s in zip([e for e in data if e.is_last_window], final_scores):
        by_source.setdefault(e.source, []).append(int((s >= 0.5) == bool(e.final_label)))
    metrics: dict[str, Any] = {
        "final_accuracy": accuracy(final_scores, final_labels),
        "final_majority_baseline": majority(final_labels),
        "final_auc": auc(final_scores, final_labels),
        "num_heldout_responses": len(data),
        "final_accuracy_by_source": {k: sum(v) / len(v) for k, v in sorted(by_source.items())},
    }
    if kind == RMKind.prm:
        metrics.update(step_accuracy=accuracy(step_scores, step_labels), step_majority_baseline=majority(step_labels),
                       step_auc=auc(step_scores, step_labels), num_heldout_steps=len(step_labels))
    return metrics


def is_correct_solution(ex: RMExample) -> bool:
    """Every step good and the final answer right: the text the auxiliary LM loss imitates."""
    return ex.final_label == 1 and (ex.step_labels is None or all(ex.step_labels))


def _accuracies(metrics: dict[str, Any]) -> str:
    keys = ("step_accuracy", "step_auc", "final_accuracy", "final_auc")
    return ", ".join(f"{k} {metrics[k]:.3f}" for k in keys if k in metrics)


def train_reward_model(cfg: RMTrainConfig, output_dir: Path | str | None = None) -> dict[str, Any]:
    """Train, evaluate on the held-out split, save to ``output_dir``; returns the saved realm_rm.json."""
    threads = torch.get_num_threads()
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    try:
        return _train(cfg, Path(output_dir or cfg.output_dir or default_output_dir(cfg)))
    finally:
        torch.set_num_threads(threads)


def _train(cfg: RMTrainConfig, output_dir: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from models.registry import resolve_model_dir

    name = f"{cfg.kind.value} ({cfg.resolved_readout.value}, data={cfg.data})"
    started = time.time()
    backbone_dir = resolve_model_dir(cfg.backbone)
    tokenizer = AutoTokenizer.from_pretrained(backbone_dir)
    train_examples, heldout_examples = load_data(cfg)
    train, heldout = encode(cfg, tokenizer, train_examples), encode(cfg, tokenizer, heldout_examples)
    _log(f"{name}: {len(train)} train / {len(heldout)} held-out responses from {cfg.backbone.name} "
         f"({time.time() - started:.0f} s)")

    readout = cfg.resolved_readout
    extra = {"num_labels": 1} if readout != Readout.step_tag else {}
    torch.manual_seed(cfg.seed)  # here, not earlier: building the backbone on first use draws from torch's RNG too
    model = auto_model_class(readout).from_pretrained(backbone_dir, **extra).to(cfg.device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if model.config.pad_token_id is None:
        model.config.pad_token_id = pad_id
    pad_id = model.config.pad_token_id
    reader = make_reader(model, readout, tokenizer, cfg.good_token, cfg.bad_token)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    scheduler = build_lr_scheduler(optimizer, LRSchedule.cosine, cfg.num_warmup_steps, cfg.num_steps, floor=0.1)
    rng = random.Random(cfg.seed)
    order: list[int] = []
    model.train()
    running = []
    progress = Progress(cfg.num_steps, f"[train_rm] {cfg.kind.value}", unit="step", every=cfg.log_every)
    for step in range(cfg.num_steps):
        if len(order) < cfg.batch_size:
            order += rng.sample(range(len(train)), len(train))
        batch = [train[i] for i in order[: cfg.batch_size]]
        del order[: cfg.batch_size]
        ids, mask, rows, cols, labels = (x.to(cfg.device) for x in collate(batch, pad_id))
        hidden = reader.hidden(ids, mask)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(reader.head(hidden[rows, cols]), labels)
        if cfg.lm_loss_weight > 0:
            loss = loss + cfg.lm_loss_weight * lm_loss(reader, hidden, ids, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        running.append(loss.item())
        progress.update(1, f"loss {running[-1]:.4f}")
        if (step + 1) % cfg.log_every == 0 and step + 1 < cfg.num_steps:
            model.eval()  # a quick look at a fixed slice of the held-out set
            peek = heldout_metrics(reader, heldout[:256], pad_id, cfg.kind, cfg.device)
            model.train()
            _log(f"{name}: step {step + 1}/{cfg.num_steps} loss {sum(running) / len(running):.4f} "
                 f"held-out[:256] {_accuracies(peek)} ({time.time() - started:.0f} s)")
            running = []
    progress.close()
    model.eval()
    metrics = heldout_metrics(reader, heldout, pad_id, cfg.kind, cfg.device)
    seconds = time.time() - started
    baselines = ", ".join(f"{k.split('_')[0]} {metrics[k]:.3f}" for k in ("step_majority_baseline", "final_majority_baseline")
                          if k in metrics)
    _log(f"{name}: step {cfg.num_steps}/{cfg.num_steps} loss {sum(running) / max(len(running), 1):.4f} "
         f"held-out {_accuracies(metrics)} (majority baselines: {baselines}) ({seconds:.0f} s)")

    output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    info = {
        "kind": cfg.kind.value,
        "readout": readout.value,
        "question_template": cfg.question_template,
        "step_delimiter": cfg.step_delimiter,
        "step_tag": cfg.fmt.step_tag,
        "good_token": cfg.good_token,
        "bad_token": cfg.bad_token,
        "metrics": metrics,
        "num_train_responses": len(train),
        "train_seconds": round(seconds, 1),
        "config": _plain(cfg),
    }
    (output_dir / RM_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return info


def _register() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="rm_schema", node=RMTrainConfig)


def main() -> None:
    import hydra
    from omegaconf import OmegaConf

    _register()

    @hydra.main(config_path="../configs/rm", config_name="train_rm", version_base="1.3")
    def run(dict_cfg) -> None:
        cfg: RMTrainConfig = OmegaConf.to_object(dict_cfg)
        out = Path(cfg.output_dir) if cfg.output_dir else default_output_dir(cfg)
        if cfg.output_dir:
            info = train_reward_model(cfg, out)
        else:  # the cache entry builtin:synthetic-<kind> resolves to: write it atomically
            if is_complete(out):
                _log(f"already trained: {out} (delete it to retrain)")
            atomic_build_dir(out, lambda tmp: train_reward_model(cfg, tmp))
            info = json.loads((out / RM_INFO_FILE).read_text())
        print(json.dumps({"output_dir": str(out), **info["metrics"]}, indent=2))

    run()


if __name__ == "__main__":
    main()
