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
trained when missing by this command or by the training driver before it starts (never while a
reward function is built) into ``models.registry.cache_root()/reward_models/``, atomically, keyed
by a hash of the config.

Each run writes its held-out accuracies and AUCs to ``realm_rm.json`` and prints them; the built-in PRM's
on one machine are in docs/rewards.md (``scripts/train_reward_models.sh`` trains both built-ins).
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from common.config import to_plain
from common.files import atomic_build_dir, is_complete
from common.progress import Progress
from common.schedule import LRSchedule, build_lr_scheduler
from rewards.config import Readout
from rewards.reward_model import RM_INFO_FILE, auto_model_class, make_reader
from rewards.rm_config import RMTrainConfig, builtin_config, default_output_dir
from rewards.rm_encode import Encoded, collate, encode, lm_loss, load_data
from rewards.rm_metrics import accuracies_line, heldout_metrics


def ensure_builtin(path: str) -> Path:
    """The cached directory of a built-in reward model, trained now (a minute or two on CPU) if absent."""
    cfg = builtin_config(path)
    target = default_output_dir(cfg)
    if not is_complete(target):
        _log(f"{path} is not cached: training it into {target}")
    return atomic_build_dir(target, lambda tmp: train_reward_model(cfg, tmp))


def _log(message: str) -> None:
    print(f"[train_rm] {message}", file=sys.stderr, flush=True)


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
    train_examples, heldout_examples = load_data(cfg)  # first: a bad data file fails before any model is built
    backbone_dir = resolve_model_dir(cfg.backbone)
    tokenizer = AutoTokenizer.from_pretrained(backbone_dir)
    train, heldout = encode(cfg, tokenizer, train_examples), encode(cfg, tokenizer, heldout_examples)
    _log(
        f"{name}: {len(train)} train / {len(heldout)} held-out responses from {cfg.backbone.name} "
        f"({time.time() - started:.0f} s)"
    )

    readout = cfg.resolved_readout
    extra = {"num_labels": 1} if readout != Readout.step_tag else {}
    torch.manual_seed(cfg.seed)  # here, not earlier: building the backbone on first use draws from torch's RNG too
    model = auto_model_class(readout).from_pretrained(backbone_dir, **extra).to(cfg.device)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
    pad_id = model.config.pad_token_id
    reader = make_reader(model, readout, tokenizer, cfg.good_token, cfg.bad_token)
    _fit(cfg, model, reader, train, heldout, pad_id, lambda msg: _log(f"{name}: {msg} ({time.time() - started:.0f} s)"))
    model.eval()
    metrics = heldout_metrics(reader, heldout, pad_id, cfg.kind, cfg.device)
    baselines = ", ".join(
        f"{k.split('_')[0]} {metrics[k]:.3f}"
        for k in ("step_majority_baseline", "final_majority_baseline")
        if k in metrics
    )
    _log(
        f"{name}: held-out {accuracies_line(metrics)} (majority baselines: {baselines}) ({time.time() - started:.0f} s)"
    )

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
        "train_seconds": round(time.time() - started, 1),
        "config": to_plain(cfg),
    }
    (output_dir / RM_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    return info


def _fit(
    cfg: RMTrainConfig,
    model,
    reader,
    train: Sequence[Encoded],
    heldout: Sequence[Encoded],
    pad_id: int,
    log: Callable[[str], None],
) -> None:
    """``cfg.num_steps`` AdamW steps of BCE on the log-odds at every read (+ the auxiliary LM loss), in
    seeded random batches that cycle through ``train``; every ``log_every`` steps a look at held-out[:256]."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr
    )
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
        if step < cfg.num_lm_warmup_steps:
            loss = lm_loss(reader, hidden, ids, batch)
        else:
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
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.num_steps:
            message = f"step {step + 1}/{cfg.num_steps} loss {sum(running) / len(running):.4f}"
            if step + 1 < cfg.num_steps:
                model.eval()  # a quick look at a fixed slice of the held-out set
                message += f" held-out[:256] {accuracies_line(heldout_metrics(reader, heldout[:256], pad_id, cfg.kind, cfg.device))}"
                model.train()
            log(message)
            running = []
    progress.close()


def _register() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="rm_schema", node=RMTrainConfig)


def main() -> None:
    """``python -m rewards.train_rm``: the command line checked against the schema (one ``error:`` line for
    bad input, exit status 1), then the data read before any model is built, then training."""
    import hydra

    from common.cli import check_overrides, fail
    from common.config import to_typed_config
    from models.registry import ModelNotAvailable
    from rewards.rm_data import RMDataError

    _register()

    config_dir = Path(__file__).resolve().parent.parent / "configs" / "rm"

    @hydra.main(config_path=str(config_dir), config_name="train_rm", version_base="1.3")
    def run(dict_cfg) -> None:
        cfg = to_typed_config(dict_cfg, RMTrainConfig, "rewards/rm_config.py")  # checked before Hydra started
        out = Path(cfg.output_dir) if cfg.output_dir else default_output_dir(cfg)
        try:
            if cfg.output_dir:
                info = train_reward_model(cfg, out)
            else:  # the cache entry builtin:synthetic-<kind> resolves to: write it atomically
                if is_complete(out):
                    _log(f"already trained: {out} (delete it to retrain)")
                atomic_build_dir(out, lambda tmp: train_reward_model(cfg, tmp))
                info = json.loads((out / RM_INFO_FILE).read_text())
        except (RMDataError, ModelNotAvailable) as e:
            fail(str(e))
        print(json.dumps({"output_dir": str(out), **info["metrics"]}, indent=2))

    sys.argv[1:] = check_overrides(
        config_dir, "train_rm", sys.argv[1:], check=lambda c: to_typed_config(c, RMTrainConfig, "rewards/rm_config.py")
    )
    run()


if __name__ == "__main__":
    main()
