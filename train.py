"""realm's entry point: compose the config, build the parts, train.

python train.py                      # success reward, tiny model, synthetic task, local CPU
python train.py +reward=prm_delta    # + PRM with the Delta refinement
python train.py --cfg job +reward=prm_clip_delta model=qwen2.5-math-1.5b-instruct cluster=gpu_1x8
python train.py run.dry_run=true cluster=gpu_2x8 model=qwen2.5-math-7b-instruct   # the plan, no Ray
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from trainer.config import register_configs

register_configs()


@hydra.main(config_path="configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from mathtask.data import DataError
    from models.registry import ModelNotAvailable
    from trainer.compose import ConfigError, to_train_config
    from trainer.loop import TrainingError, train

    try:
        typed = to_train_config(cfg)
    except ConfigError as e:
        raise SystemExit(f"config error: {e}") from None
    hydra_cfg = HydraConfig.get()
    if typed.run.dry_run:
        from planning.execution_plan import PlanError
        from trainer.plan_select import dry_run_report

        try:
            print("\n".join(dry_run_report(typed, Path(hydra_cfg.runtime.output_dir))), flush=True)
        except PlanError as e:
            raise SystemExit(f"plan error: {e}") from None
        return
    try:
        train(typed, Path(hydra_cfg.runtime.output_dir))
    except (DataError, ModelNotAvailable, TrainingError) as e:
        # Bad input, not a bug: one clear line; completed checkpoints are left as they are.
        raise SystemExit(f"error: {e}") from None
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


if __name__ == "__main__":
    main()
