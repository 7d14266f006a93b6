"""Config helpers: the one converter from a composed Hydra config to its schema dataclass (every
failure a ConfigError naming the key) and the JSON-ready form of a config value. The schemas live
with what they configure (trainer/config.py is the root; eval/__main__.py has the evaluation CLI's)."""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

T = TypeVar("T")


class ConfigError(ValueError):
    """A key or value the schema rejects; the message names it."""


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
        name = f"{prefix}.{key!s}" if prefix else str(key)
        if declared is not None and key not in declared:
            found.append(name)
            continue
        child = cfg._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)) and not child._is_none() and not child._is_missing():
            found += unknown_keys(child, name)
    return found


def to_typed_config(cfg: DictConfig, schema: type[T], schema_file: str) -> T:
    """``OmegaConf.to_object`` with every failure as a ConfigError naming the key (``schema_file``
    is where a user looks up the declared keys)."""
    unknown = unknown_keys(cfg)
    if unknown:
        from common.cli import did_you_mean, dotted_keys

        known = [k for k in dotted_keys(cfg) if not any(k == u or k.startswith(f"{u}.") for u in unknown)]
        named = ", ".join(f"{key}{did_you_mean(key, known)}" for key in unknown)
        raise ConfigError(f"unknown config key{'s' if len(unknown) > 1 else ''} {named}; the schema is {schema_file}")
    try:
        typed = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        raise ConfigError(f"bad config value: {e}") from None
    except ValueError as e:  # raised by a schema's __post_init__, message names the key
        raise ConfigError(str(e)) from None
    if not isinstance(typed, schema):
        raise ConfigError(f"the config composes to {type(typed).__name__}, not {schema.__name__}")
    return typed


def to_plain(x: Any) -> Any:
    """JSON-ready data from a config value: dataclasses become dicts, enums their values, tuples lists.

    Worked example: a dataclass ``DataConfig(name="gsm8k")`` becomes ``{"name": "gsm8k", ...}``, an Enum
    member its value, ``(1, 2)`` the list ``[1, 2]``; cache keys hash its JSON.
    """
    if isinstance(x, Enum):
        return x.value
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: to_plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {k: to_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_plain(v) for v in x]
    return x
