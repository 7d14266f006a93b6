"""Hydra DictConfig -> typed TrainConfig, with errors that name the offending key."""
from __future__ import annotations

import dataclasses

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from trainer.config import TrainConfig


class ConfigError(ValueError):
    pass


def unknown_keys(cfg: DictConfig | ListConfig, prefix: str = "") -> list[str]:
    """Dotted names of keys that no schema dataclass declares.

    Struct mode already rejects ``reward.no_such_field=1``, but Hydra's ``+key=value`` adds the key
    with struct mode lifted, and ``OmegaConf.to_object`` then drops it silently: a typo would train
    with the default. This walk finds such keys in every dataclass-typed node (free-form dict fields
    are only descended into).
    """
    found = []
    if isinstance(cfg, ListConfig):
        for i, item in enumerate(cfg):
            if isinstance(item, (DictConfig, ListConfig)):
                found += unknown_keys(item, f"{prefix}[{i}]")
        return found
    schema = OmegaConf.get_type(cfg)
    declared = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    for key in cfg.keys():
        name = f"{prefix}.{key}" if prefix else str(key)
        if declared is not None and key not in declared:
            found.append(name)
            continue
        child = cfg._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)) and not child._is_none() and not child._is_missing():
            found += unknown_keys(child, name)
    return found


def to_train_config(cfg: DictConfig) -> TrainConfig:
    unknown = unknown_keys(cfg)
    if unknown:
        raise ConfigError(f"unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                          "(not in the schema, trainer/config.py; check the spelling)")
    try:
        typed = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(f"bad config value: {e}") from None
    except ValueError as e:  # raised by a schema's __post_init__, message names the key
        raise ConfigError(str(e)) from None
    assert isinstance(typed, TrainConfig), type(typed)
    return typed
