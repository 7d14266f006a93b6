"""A run directory before training starts: what a launch checks before it writes there, and the config
snapshot it then writes.

- ``check_resume``: a relaunch into a directory with a checkpoint resumes from it only when the settings
  that change the math are the checkpoint's (``MATH_KEYS``: algorithm, model, critic, reward, data, rollout,
  PPO, SFT warm-up, seed); otherwise it refuses, listing the changed keys, unless ``run.resume=false``.
- ``save_run_config``: ``.hydra/config.yaml`` and ``.hydra/overrides.yaml`` (what ``trainer.export``,
  ``trainer.summarize`` and the W&B logger read), written atomically once the checks pass, so that a
  failed relaunch leaves the directory as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.config import to_plain
from common.files import atomic_write_text
from trainer.checkpoint import CheckpointError, complete_checkpoints, latest_checkpoint, load_state
from trainer.config import MOVED_KEYS, TrainConfig

MATH_KEYS = ("algorithm", "model", "critic", "reward", "data", "rollout", "ppo", "sft", "run.seed")
"""Settings a resumed run must share with its checkpoint. Not among them: the number of iterations (a
run may be extended), how often it evaluates, checkpoints or logs, and the cluster and plan (placement
does not change the math)."""
CONFIG_FILE = Path(".hydra") / "config.yaml"
PROCESS_RECORD = "processes.json"
"""The launch's processes (``runtime.processes``): what the next launch ends if the driver was killed."""
OVERRIDES_FILE = Path(".hydra") / "overrides.yaml"


class ResumeError(ValueError):
    """A relaunch whose settings differ from its checkpoint's; the message lists the keys."""


def math_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The MATH_KEYS of a plain config (``to_plain(TrainConfig)``), flattened to dotted keys.

    A config without ``algorithm`` (written before it existed) was PPO's: its keys under their old names
    (``MOVED_KEYS``) are read as ``algorithm``'s and the rest of ``algorithm`` as PPO's defaults.

    Worked example: {"run": {"seed": 3, "name": "x"}, "ppo": {"clip_eps": 0.2}} -> {"ppo.clip_eps": 0.2, "run.seed": 3}
    (and the algorithm's defaults).
    """
    from ppo.config import AlgorithmConfig

    flat = _flatten(config)
    if "algorithm" not in config:
        flat = {**_flatten({"algorithm": to_plain(AlgorithmConfig())}), **flat}
        for old, new in MOVED_KEYS.items():
            if old in flat:
                flat[new] = flat.pop(old)
    return {k: v for k, v in flat.items() if any(k == m or k.startswith(f"{m}.") for m in MATH_KEYS)}


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def changed_settings(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key (old -> new)`` for every math setting that differs, in key order."""
    a, b = math_settings(old), math_settings(new)
    return [
        f"{k} ({a.get(k, 'unset')!r} -> {b.get(k, 'unset')!r})" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
    ]


def checkpoint_config(run_dir: Path, checkpoint: Path) -> dict[str, Any] | None:
    """The plain config the checkpoint was trained with: its own copy, or for a checkpoint written before
    checkpoints kept one, the run directory's ``.hydra/config.yaml`` (None when neither is there)."""
    state = load_state(checkpoint)
    if "config" in state:
        return state["config"]
    path = run_dir / CONFIG_FILE
    if not path.exists():
        return None
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return to_plain(OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.load(path))))
    except (OmegaConfBaseException, ValueError):  # a config of an older schema: nothing to compare against
        return None


def check_resume(cfg: TrainConfig, run_dir: Path, log: Callable[[str], None] = print) -> str:
    """What a launch into ``run_dir`` will do ("a fresh start", "resumes from ... at iteration N"); raises
    ResumeError when another launch still runs there, when no checkpoint there is intact (each damaged
    one passed over is a line to ``log``), or when the newest intact one was trained with other math
    settings and ``run.resume`` is on."""
    from runtime.processes import in_use_by

    driver = in_use_by(run_dir / PROCESS_RECORD)
    if driver is not None:
        raise ResumeError(
            f"another launch (pid {driver.pid}) is running in {run_dir}: wait for it or stop it, or choose another run.name"
        )
    if not cfg.run.resume:
        if complete_checkpoints(run_dir / "checkpoints"):
            return "a fresh start (run.resume=false: the checkpoints there are not read, and are pruned as new ones are written)"
        return "a fresh start (no checkpoint in the run directory)"
    try:
        checkpoint = latest_checkpoint(run_dir / "checkpoints", log)
    except CheckpointError as e:
        raise ResumeError(
            f"{e}. Start over in this directory with run.resume=false, or choose another run.name"
        ) from None
    if checkpoint is None:
        return "a fresh start (no checkpoint in the run directory)"
    old = checkpoint_config(run_dir, checkpoint)
    changed = [] if old is None else changed_settings(old, to_plain(cfg))
    if changed:
        raise ResumeError(
            f"{checkpoint} was trained with other settings: {', '.join(changed)}. Relaunch with the checkpoint's "
            "settings, choose another run.name, or start over in this directory with run.resume=false"
        )
    return f"resumes from {checkpoint} (iteration {load_state(checkpoint)['iteration']}), same settings"


def save_run_config(run_dir: Path, config_yaml: str, overrides: list[str]) -> None:
    """The launch's composed config and command-line overrides, where Hydra would have written them."""
    import yaml

    atomic_write_text(run_dir / CONFIG_FILE, config_yaml)
    atomic_write_text(run_dir / OVERRIDES_FILE, yaml.safe_dump(list(overrides), default_flow_style=False))


def remove_unused(run_dir: Path) -> None:
    """Remove a run directory that holds nothing but the config snapshot (a launch that failed before it
    wrote anything else), then its parents below the working directory while they are empty (Hydra made
    ``outputs/<date>/`` for it); a directory with anything more is left as it is."""
    import shutil

    if not run_dir.is_dir() or not {p.name for p in run_dir.iterdir()} <= {CONFIG_FILE.parent.name}:
        return
    shutil.rmtree(run_dir)
    cwd = Path.cwd().resolve()
    for parent in run_dir.resolve().parents:
        if parent == cwd or cwd not in parent.parents:
            break
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break
