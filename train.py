"""realm's entry point: check the command line, compose the config, build the parts, train.

python train.py                      # success reward, tiny model, synthetic task, local CPU
python train.py +reward=prm_delta    # + PRM with the Delta refinement (reward=prm_delta works too)
python train.py run.dry_run=true experiment=reward_paper_7b cluster=gpu_2x8   # what the run would hit, no Ray

Bad input (a key, value, option, data file, model path, a plan that does not fit, a relaunch whose
settings differ from its checkpoint's) ends with one line, ``error: ...``, and exit status 1, before
anything is written into the run directory.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from common.cli import check_overrides, fail
from trainer.compose import to_train_config
from trainer.config import MOVED_KEYS, register_configs

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
register_configs()


# An absolute config path: the same configs/ whether run as `python train.py` or as the installed realm-train.
@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from trainer.loop import train
    from trainer.run_dir import save_run_config

    typed = to_train_config(cfg)  # checked before Hydra started (cli), so this cannot fail here
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    created = not any(run_dir.iterdir())  # Hydra has just made it: nothing of an earlier launch is there
    if typed.run.dry_run:
        dry_run(typed, run_dir, created)
        return
    with bad_input_fails(run_dir, created):
        from trainer.run_dir import check_resume

        check_resume(typed, run_dir)
        save_run_config(run_dir, OmegaConf.to_yaml(cfg), list(hydra_cfg.overrides.task))
        try:
            train(typed, run_dir)
        except Exception:
            if hydra_cfg.mode == RunMode.MULTIRUN:
                # Hydra reports a failed sweep job only after the whole sweep: say it now, then let it go on.
                print(
                    f"[sweep] job {hydra_cfg.job.num} ({' '.join(hydra_cfg.overrides.task)}) failed:\n"
                    f"{traceback.format_exc()}",
                    file=sys.stderr,
                    flush=True,
                )
            raise


@contextmanager
def bad_input_fails(run_dir: Path, created: bool) -> Iterator[None]:
    """Bad input, not a bug: one ``error:`` line, exit status 1. Completed checkpoints stay as they are; a
    run directory that this launch created and that holds nothing but its config snapshot is removed.
    A full disk, wherever a write found it, is one line too, with the checkpoint a relaunch resumes from."""
    from common.files import DiskFull, is_disk_full
    from mathtask.data import DataError
    from models.registry import ModelNotAvailable
    from runtime.processes import RunInUse
    from trainer.checkpoint import CheckpointError
    from trainer.loop import TrainingError
    from trainer.run_dir import ResumeError, remove_unused

    try:
        yield
    except (DataError, ModelNotAvailable, TrainingError, ResumeError, CheckpointError, RunInUse) as e:
        if created:
            remove_unused(run_dir)
        fail(str(e))
    except Exception as e:
        if not is_disk_full(e):
            raise
        said = str(e) if isinstance(e, DiskFull) else f"no space left on device under {run_dir} ({type(e).__name__})"
        fail(f"{said}. {resume_after_disk_full(run_dir)}")


def resume_after_disk_full(run_dir: Path) -> str:
    """What a relaunch does once there is room: the checkpoint it resumes from."""
    from trainer.checkpoint import CheckpointError, latest_checkpoint

    try:
        checkpoint = latest_checkpoint(run_dir / "checkpoints", log=lambda _: None)
    except CheckpointError:
        checkpoint = None
    start = f"resumes from {checkpoint}" if checkpoint else "starts from the beginning (no checkpoint yet)"
    return f"Free space there, then the same command {start}"


def dry_run(cfg, run_dir: Path, created: bool) -> None:
    """Print what a run would hit (``trainer.preflight``); exit 1 with the first problem as the last line."""
    from trainer.preflight import preflight
    from trainer.run_dir import remove_unused

    lines, problems = preflight(cfg, run_dir)
    print("\n".join(lines), flush=True)
    if problems:
        if created:
            remove_unused(run_dir)
        more = f" (and {len(problems) - 1} more above)" if len(problems) > 1 else ""
        fail(problems[0] + more)


def cli() -> None:
    """``python train.py`` and the ``realm-train`` command: the command line checked against the schema
    (one ``error:`` line for bad input, before Hydra creates a run directory), then the run."""
    sys.argv[1:] = check_overrides(CONFIG_DIR, "train", sys.argv[1:], check=to_train_config, moved=MOVED_KEYS)
    main()


if __name__ == "__main__":
    cli()
