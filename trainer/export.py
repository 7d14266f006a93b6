"""Export a trained policy as a Hugging Face directory that transformers, vLLM and `python -m eval` load.

    python -m trainer.export RUN_DIR                      # the newest complete checkpoint
    python -m trainer.export RUN_DIR --iteration 200      # checkpoints/iter_000200
    python -m trainer.export RUN_DIR/checkpoints/iter_000200 --out /models/my-policy

Checkpoints hold the policy as torch.distributed.checkpoint shards (``policy/dcp``, written by every
FSDP rank, model and optimizer together). The export reads only the model's tensors from the shards,
in one process, puts them into the architecture of the run's base model (from the run's
``.hydra/config.yaml``) and writes, atomically (a temp dir, then a rename), into ``<checkpoint>/hf/``:

    config.json, model.safetensors      ``save_pretrained`` in the run's model dtype
    tokenizer files                     the base model's tokenizer (training never changes it)
    prompt.yaml                         the chat prompt the policy was trained on (``prompt=`` of eval)
    heldout.jsonl                       the run's held-out problems (``data.name=`` of eval)
    realm_export.json                   run dir, iteration, base model, the trainer's held-out success

so that ``python -m eval model=<checkpoint> data.name=<hf>/heldout.jsonl prompt=trained`` evaluates
the policy on the problems, with the prompt, of the trainer's own held-out evaluation.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXPORT_DIR = "hf"
EXPORT_INFO = "realm_export.json"
PROMPT_FILE = "prompt.yaml"
HELDOUT_FILE = "heldout.jsonl"
_MODEL_PREFIX = "model."


class ExportError(RuntimeError):
    """A run or checkpoint directory that cannot be exported; the message names the path."""


@dataclass(frozen=True)
class CheckpointRef:
    run_dir: Path
    checkpoint: Path
    """``<run_dir>/checkpoints/iter_NNNNNN`` (complete: has COMPLETE)."""
    iteration: int


def is_checkpoint(path: Path) -> bool:
    return (path / "COMPLETE").exists() and (path / "policy").is_dir()


def is_run_dir(path: Path) -> bool:
    return (path / "checkpoints").is_dir()


def find_checkpoint(path: str | Path, iteration: int | None = None) -> CheckpointRef:
    """The checkpoint that ``path`` names: a checkpoint dir, or a run dir (+ ``iteration``, else the newest
    intact one); a checkpoint whose files do not match its manifest is refused, naming the file."""
    from trainer.checkpoint import CheckpointError, checkpoint_name, damage, has_manifest, latest_checkpoint, load_state

    path = Path(path).expanduser().resolve()
    if is_checkpoint(path):
        if iteration is not None and load_state(path)["iteration"] != iteration:
            raise ExportError(f"{path} is iteration {load_state(path)['iteration']}, not --iteration {iteration}")
        checkpoint = path
    elif is_run_dir(path):
        root = path / "checkpoints"
        if iteration is None:
            try:
                found = latest_checkpoint(root)
            except CheckpointError as e:
                raise ExportError(str(e)) from None
            if found is None:
                raise ExportError(f"{root}: no complete checkpoint (is the run still in its first interval?)")
            checkpoint = found
        else:
            checkpoint = root / checkpoint_name(iteration)
            if not is_checkpoint(checkpoint):
                have = sorted(p.name for p in root.glob("iter_*") if is_checkpoint(p))
                raise ExportError(
                    f"{checkpoint}: no complete checkpoint of iteration {iteration} "
                    f"(complete: {', '.join(have) or 'none'}; older ones are pruned, see run.checkpoint_every)"
                )
    else:
        raise ExportError(
            f"{path}: neither a run directory (with checkpoints/) nor a complete checkpoint (with COMPLETE and policy/)"
        )
    problem = damage(checkpoint) if has_manifest(checkpoint) else None
    if problem is not None:
        raise ExportError(f"{checkpoint} is damaged: {problem}")
    return CheckpointRef(
        run_dir=checkpoint.parent.parent, checkpoint=checkpoint, iteration=int(load_state(checkpoint)["iteration"])
    )


def load_run_config(ref: CheckpointRef):
    """The TrainConfig the checkpoint was trained with: the copy it holds (``trainer_state.json``), or for a
    checkpoint written before checkpoints held one, the run's ``.hydra/config.yaml`` that train.py wrote."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from trainer.checkpoint import load_state
    from trainer.config import TrainConfig

    state = load_state(ref.checkpoint)
    path = ref.checkpoint / "trainer_state.json" if "config" in state else ref.run_dir / ".hydra" / "config.yaml"
    if not path.exists():
        raise ExportError(
            f"{path}: missing; the export needs the run's config (written by train.py) "
            "to know the base model and the prompt"
        )
    try:
        saved = OmegaConf.create(state["config"]) if "config" in state else OmegaConf.load(path)
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), saved))
    except (OmegaConfBaseException, ValueError) as e:
        raise ExportError(f"{path}: {' '.join(str(e).split())}") from None


def read_policy_weights(dcp_dir: Path) -> dict[str, Any]:
    """The policy's model tensors from its DCP shards, HF-named, in one process (optimizer state unread).

    Returns {name: tensor} in the dtype the trainer stored (float32 master weights).
    """
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not (dcp_dir / ".metadata").exists():
        raise ExportError(f"{dcp_dir}: no .metadata (not a torch.distributed.checkpoint directory)")
    metadata = dcp.FileSystemReader(str(dcp_dir)).read_metadata()
    state: dict[str, Any] = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith(_MODEL_PREFIX) and isinstance(meta, TensorStorageMetadata):
            state[key[len(_MODEL_PREFIX) :]] = torch.empty(meta.size, dtype=meta.properties.dtype)
    if not state:
        raise ExportError(f"{dcp_dir}: holds no model tensors (keys: {sorted(metadata.state_dict_metadata)[:5]}...)")
    with warnings.catch_warnings():  # DCP warns that it 'assumes the intent' to load in one process: it is.
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({"model": state}, checkpoint_id=str(dcp_dir), no_dist=True)
    return state


def build_policy(base_dir: Path, state: dict[str, Any], dtype: str):
    """The base model's architecture holding ``state``; fails if a weight is missing or unexpected."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(base_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = model.load_state_dict(state, strict=False, assign=True)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = set(result.missing_keys) - tied
    if missing or result.unexpected_keys:
        raise ExportError(
            f"checkpoint does not match {base_dir}/config.json: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(result.unexpected_keys)[:5]}"
        )
    model.tie_weights()
    return model.to(getattr(torch, dtype)).eval()


def _write_prompt(path: Path, system_prompt: str, prompt_suffix: str) -> None:
    from omegaconf import OmegaConf

    from trainer.rollout import rollout_template

    t = rollout_template(system_prompt, prompt_suffix)
    # The fields mathtask.prompts.load_template reads: the template the held-out evaluation renders.
    OmegaConf.save(OmegaConf.create({"name": "trained", "system": t.system, "user": t.user, "chat": True}), path)


def _write_heldout(path: Path, cfg) -> int:
    from trainer.loop import load_data

    _, heldout = load_data(cfg)
    with path.open("w", encoding="utf-8") as f:
        for p in heldout:
            f.write(
                json.dumps(
                    {
                        "id": p.id,
                        "question": p.question,
                        "answer": p.answer,
                        "dataset": p.dataset,
                        **({"solution": p.solution} if p.solution else {}),
                    },
                    ensure_ascii=False,
                )
                + "\n"
            )
    return len(heldout)


def _trainer_heldout_success(run_dir: Path, iteration: int) -> float | None:
    """The trainer's greedy held-out success logged at ``iteration`` (metrics.jsonl), if it evaluated then."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return None
    found = None
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line) if line.strip() else {}
        if row.get("iteration") == iteration and "heldout/success" in row:
            found = float(row["heldout/success"])
    return found


def export(ref: CheckpointRef, out: Path | None = None, base_dir: Path | None = None, log=print) -> Path:
    """Write the HF directory of ``ref``'s policy (default ``<checkpoint>/hf``); returns its path."""
    from transformers import AutoTokenizer

    from models.registry import resolve_model_dir

    cfg = load_run_config(ref)
    base_dir = base_dir or resolve_model_dir(cfg.model)
    out = (out or ref.checkpoint / EXPORT_DIR).resolve()
    if out.exists() and not (out / EXPORT_INFO).exists():  # replaced below: only an earlier export may be
        raise ExportError(
            f"{out} exists and is not an export of a realm policy (no {EXPORT_INFO}); choose another --out"
        )
    log(f"[export] {ref.checkpoint} (iteration {ref.iteration}, base {base_dir}) -> {out}")
    model = build_policy(base_dir, read_policy_weights(ref.checkpoint / "policy" / "dcp"), cfg.model.dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(base_dir).save_pretrained(tmp)
        _write_prompt(tmp / PROMPT_FILE, cfg.rollout.system_prompt, cfg.rollout.prompt_suffix)
        num_heldout = _write_heldout(tmp / HELDOUT_FILE, cfg)
        info = {
            "run_dir": str(ref.run_dir),
            "checkpoint": str(ref.checkpoint),
            "iteration": ref.iteration,
            "base_model": str(base_dir),
            "model_name": cfg.model.name,
            "dtype": cfg.model.dtype,
            "heldout": {
                "name": cfg.data.heldout,
                "limit": cfg.data.heldout_limit,
                "num_problems": num_heldout,
                "max_new_tokens": cfg.rollout.max_new_tokens,
            },
            "trainer_heldout_success": _trainer_heldout_success(ref.run_dir, ref.iteration),
        }
        (tmp / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def exported_dir(path: str | Path, iteration: int | None = None, log=print) -> Path:
    """The HF directory of a run dir or checkpoint: ``<checkpoint>/hf``, exported first if it is not there."""
    ref = find_checkpoint(path, iteration)
    out = ref.checkpoint / EXPORT_DIR
    if (out / EXPORT_INFO).exists():
        return out
    return export(ref, log=log)


def main(argv: list[str] | None = None) -> int:
    from common.cli import ArgumentParser, fail, positive

    parser = ArgumentParser(prog="python -m trainer.export", description=__doc__.split("\n")[0])
    parser.add_argument("path", help="a run directory (outputs/...) or one of its checkpoints/iter_NNNNNN")
    parser.add_argument("--iteration", type=positive(int), default=None, help="which checkpoint (default: the newest)")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: <checkpoint>/hf)")
    parser.add_argument(
        "--base",
        type=Path,
        default=None,
        help="base model directory (default: the run config's model, resolved as training did)",
    )
    args = parser.parse_args(argv)
    from models.registry import ModelNotAvailable

    try:
        out = export(
            find_checkpoint(args.path, args.iteration),
            out=args.out,
            base_dir=args.base,
            log=lambda m: print(m, file=sys.stderr, flush=True),
        )
    except (ExportError, ModelNotAvailable) as e:
        fail(str(e))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
