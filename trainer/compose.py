"""Hydra DictConfig -> typed TrainConfig, with errors that name the offending key."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainer.config import TrainConfig


class ConfigError(ValueError):
    pass


def to_train_config(cfg: DictConfig) -> TrainConfig:
    try:
        typed = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(f"bad config value: {e}") from None
    except ValueError as e:  # raised by a schema's __post_init__, message names the key
        raise ConfigError(str(e)) from None
    assert isinstance(typed, TrainConfig), type(typed)
    return typed
