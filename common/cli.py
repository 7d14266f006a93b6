"""Command lines in one error style: bad input ends with one line, ``error: <what>``, on stderr, naming
the key, option, file or line (with the close matches of a misspelt key or option), and exit status 1;
never a traceback, and nothing written before the input is checked.

    fail("data.name=x.jsonl: no such file")           # error: data.name=x.jsonl: no such file; exit 1
    parser = ArgumentParser(prog="python -m x")       # argparse, its errors in this style
    argv = check_overrides(CONFIG_DIR, "train", sys.argv[1:], check=to_train_config)

``check_overrides`` is for Hydra apps: it composes the command line's config before Hydra starts (so
that a bad override leaves no run directory behind) and turns Hydra's several-line errors into one
line; ``check`` (the schema's conversion) runs on every composed config, every job of a ``-m`` sweep.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig, ListConfig

MAX_SWEEP_JOBS_CHECKED = 256
"""A larger ``-m`` sweep is checked value by value (each sweep's values against the others' first)."""


def fail(message: str) -> NoReturn:
    """Print ``error: <message>`` as one line on stderr and exit with status 1."""
    one_line = " ".join(line.strip() for line in message.splitlines() if line.strip())
    print(f"error: {one_line}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean X?)`` for the close matches of ``word``, else "".

    Worked example: did_you_mean("ppo.clip_esp", ["ppo.clip_eps", "ppo.gamma"]) -> " (did you mean ppo.clip_eps?)";
    at most the two closest, best first.
    """
    matches = difflib.get_close_matches(word, list(choices), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(matches)}?)" if matches else ""


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one ``error:`` line and exit status 1 (argparse's own: a usage block and
    status 2), with close matches for a misspelt option. ``renamed`` maps an old option to its new name."""

    def __init__(self, *args: Any, renamed: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.renamed = renamed or {}

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        words = sys.argv[1:] if args is None else list(args)
        if self._subparsers is None:  # a sub-command's options are its own parser's to judge
            unknown = [w.split("=", 1)[0] for w in words if w.startswith("--") and not self._known(w.split("=", 1)[0])]
            if unknown:  # before argparse's own checks, which would first ask for the required options
                self.error("unrecognized arguments: " + " ".join(unknown))
        return super().parse_known_args(args, namespace)

    def _known(self, name: str) -> bool:
        """An option of this parser, or (argparse's abbreviations) the start of exactly one."""
        return (
            name == "--"
            or name in self._option_string_actions
            or (self.allow_abbrev and sum(o.startswith(name) for o in self._option_string_actions) == 1)
        )

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            message = "; ".join(self._unrecognized(message[len(prefix) :].split()))
        fail(f"{message} (see {self.prog} --help)")

    def _unrecognized(self, words: list[str]) -> list[str]:
        out = []
        for i, word in enumerate(words):
            if not word.startswith("-"):
                if i == 0 or not words[i - 1].startswith("-") or "=" in words[i - 1]:
                    out.append(f"unexpected argument {word!r}")  # not the value of an unknown option before it
                continue
            name = word.split("=", 1)[0]
            if name in self.renamed:
                out.append(f"unknown option {name} (now {self.renamed[name]})")
            else:
                out.append(f"unknown option {name}{did_you_mean(name, self._option_string_actions)}")
        return out


def positive(kind: type) -> Callable[[str], Any]:
    """An argparse ``type`` for a number > 0 of ``kind`` (int or float), e.g. ``type=positive(int)``."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text} must be > 0")
        return value

    parse.__name__ = kind.__name__
    return parse


# ----------------------------------------------------------------------------------------------- Hydra


def dotted_keys(cfg: DictConfig | ListConfig, prefix: str = "") -> list[str]:
    """Every key of a config as a dotted name, nested ones included ({"a": {"b": 1}} -> ["a", "a.b"])."""
    if not isinstance(cfg, DictConfig):
        return []
    out = []
    for key in cfg.keys():
        name = f"{prefix}.{key!s}" if prefix else str(key)
        out.append(name)
        child = cfg._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            out += dotted_keys(child, name)
    return out


def _hydra_args(argv: Sequence[str]) -> argparse.Namespace:
    """Hydra's own command-line flags and overrides, parsed as ``hydra.main`` parses them."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    parser.error = lambda message: fail(f"{message} (see --help)")  # type: ignore[method-assign]
    return parser.parse_args(list(argv))


def sweep_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """The override lists of a ``-m`` sweep's jobs (``a=1,2 b=x`` -> [[a=1, b=x], [a=2, b=x]]); when there
    are more than MAX_SWEEP_JOBS_CHECKED, each value once, the other sweeps at their first value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.get_key_element()
        if override.is_discrete_sweep():  # a,b,c or range(...)
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        elif not override.is_sweep_override():
            choices.append([str(override.input_line)])  # as typed
        # an interval sweep has no values to compose: Hydra reports what its sweeper makes of it
    if len(choices) and _product_size(choices) > MAX_SWEEP_JOBS_CHECKED:
        firsts = [c[0] for c in choices]
        return [firsts[:i] + [value] + firsts[i + 1 :] for i, c in enumerate(choices) for value in c]
    return [list(job) for job in itertools.product(*choices)]


def _product_size(choices: list[list[str]]) -> int:
    size = 1
    for c in choices:
        size *= len(c)
    return size


def check_overrides(
    config_dir: Path,
    config_name: str,
    argv: Sequence[str],
    check: Callable[[DictConfig], Any],
    moved: Mapping[str, str] | None = None,
) -> list[str]:
    """Compose the config ``argv`` asks for and run ``check`` on it (on every job of a ``-m`` sweep);
    any failure is ``fail``'s one line. Returns ``argv``, with ``+`` added to a ``GROUP=OPTION`` whose
    group the defaults list leaves out (``reward=prm`` -> ``+reward=prm``): the form Hydra accepts.
    ``moved``: old key -> its new name, said when an override uses the old one.

    Help and information flags (``--help``, ``--info``, ...) are left to Hydra.
    """
    from hydra import compose, initialize_config_dir

    args = _hydra_args(argv)
    if args.help or args.hydra_help or args.info or args.shell_completion:
        return list(argv)
    argv = list(argv)
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        jobs = sweep_jobs(args.overrides) if args.multirun else [list(args.overrides)]
        for job in jobs:
            while True:
                try:
                    cfg = compose(config_name=config_name, overrides=job)
                    break
                except Exception as e:  # noqa: BLE001 - every Hydra error becomes one line (or a `+` retry)
                    group = _group_without_default(e, config_dir)
                    if group is None:
                        keys = dotted_keys(compose(config_name=config_name))  # the names a typo may mean
                        fail(hydra_error_line(e, job, keys, config_dir, moved or {}))
                    job = [f"+{o}" if o.startswith(f"{group}=") else o for o in job]
                    argv = [f"+{a}" if a.startswith(f"{group}=") else a for a in argv]
            try:
                check(cfg)
            except ValueError as e:
                fail(str(e))
    return argv


def _group_without_default(error: Exception, config_dir: Path) -> str | None:
    """The group of ``GROUP=OPTION`` when Hydra refused it only for lacking a ``+`` (no default to override)."""
    text = str(error)
    head = "Could not override '"
    if not text.startswith(head) or "No match in the defaults list" not in text:
        return None
    group = text[len(head) :].split("'", 1)[0]
    return group if (config_dir / group).is_dir() else None


def hydra_error_line(
    error: Exception,
    overrides: Sequence[str],
    keys: Sequence[str],
    config_dir: Path,
    moved: Mapping[str, str] | None = None,
) -> str:
    """One line for a Hydra composition error: the override at fault, what is wrong, close matches (or the
    new name of a ``moved`` key)."""
    from hydra.errors import MissingConfigException, OverrideParseException

    cause = error.__cause__
    full_key = getattr(cause, "full_key", None)
    text = str(error)
    if isinstance(error, MissingConfigException) and error.options is not None and error.missing_cfg_file:
        group, _, option = str(error.missing_cfg_file).rpartition("/")
        folder = config_dir / group
        parts = folder.parts  # shown from the configs/ folder on: configs/reward/, configs/eval/data/
        where = f" ({'/'.join(parts[len(parts) - parts[::-1].index('configs') - 1 :])}/)" if folder.is_dir() else ""
        return (
            f"{_override_for(group, overrides) or option}: no option {option!r} for {group}{where}"
            f"{did_you_mean(option, error.options)}; options: {', '.join(error.options)}"
        )
    if isinstance(error, OverrideParseException):
        return f"cannot parse the override {error.override!r}: {text.splitlines()[0]}"
    if full_key and type(cause).__name__ in ("ConfigAttributeError", "ConfigKeyError"):
        if str(full_key) in (moved or {}):
            return f"unknown config key {full_key} (now {(moved or {})[str(full_key)]})"
        return f"unknown config key {full_key}{did_you_mean(str(full_key), keys)}"
    if text.startswith("Could not append to config. An item is already at"):
        key = text.split("'")[1]
        return f"+{key}: {key} is already in the config; set it without the + ({key}=...)"
    if full_key and cause is not None:
        return f"{_override_for(str(full_key), overrides) or full_key}: {str(cause).splitlines()[0]}"
    lines = [line for line in text.splitlines() if line.strip()]
    cut = next((i for i, line in enumerate(lines) if line.startswith(("Config search path", "Set the env"))), None)
    return " ".join(lines[:cut])


def _override_for(key: str, overrides: Sequence[str]) -> str | None:
    """The override that sets ``key`` (``ppo.clip_eps=abc`` for ppo.clip_eps), if one does."""
    for override in overrides:
        if override.lstrip("+~").split("=", 1)[0] == key:
            return override
    return None
