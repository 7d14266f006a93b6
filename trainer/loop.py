"""Placeholder until the PPO loop lands: builds the parts and says so."""
from __future__ import annotations

from models.registry import resolve_model_dir
from trainer.config import TrainConfig
from eval.data import load_problems


def train(cfg: TrainConfig) -> None:
    model_dir = resolve_model_dir(cfg.model)
    problems = load_problems(cfg.data.name, limit=cfg.data.limit, seed=cfg.data.seed,
                             synthetic_difficulty=cfg.data.synthetic_difficulty)
    print(f"built: model {cfg.model.name} at {model_dir}; {len(problems)} training prompts from {cfg.data.name}; "
          f"reward {cfg.reward.kind.value}/{cfg.reward.refinement.value}")
    print("PPO loop not implemented yet: no training happened.")
