"""Hydra DictConfig -> typed TrainConfig, with errors that name the offending key."""

from __future__ import annotations

from omegaconf import DictConfig

from common.config import ConfigError, to_typed_config
from trainer.config import TrainConfig

__all__ = ["ConfigError", "to_train_config"]


def to_train_config(cfg: DictConfig) -> TrainConfig:
    return to_typed_config(cfg, TrainConfig, "trainer/config.py")
