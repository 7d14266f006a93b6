"""Atomic checkpoints: a run killed mid-write leaves the previous checkpoint usable.

Layout of ``<run_dir>/checkpoints/``::

    iter_000010/            complete checkpoint (has COMPLETE); written as iter_000010.tmp-*/ then renamed
        trainer_state.json  iteration, KL coefficient, data position, metrics needed to continue
        policy/ critic/     written by the workers
    latest                  text file with the newest complete checkpoint's name (replaced atomically)
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.files import atomic_build_dir, atomic_write_text, is_complete


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


def save_checkpoint(
    root: Path, iteration: int, state: dict[str, Any], write_parts: Callable[[Path], None], keep_last: int
) -> Path:
    """Write a checkpoint atomically; ``write_parts(tmp_dir)`` writes the model/optimizer parts. Then
    only the newest ``keep_last`` complete checkpoints stay (``run.keep_checkpoints``)."""

    def build(tmp: Path) -> None:
        write_parts(tmp)
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2, sort_keys=True))

    final = atomic_build_dir(root / checkpoint_name(iteration), build, reuse=False)
    atomic_write_text(root / "latest", final.name + "\n")
    _prune(root, keep_last)
    return final


def _complete_checkpoints(root: Path) -> list[Path]:
    if not root.exists():
        return []
    done = [
        p
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith("iter_") and ".tmp-" not in p.name and is_complete(p)
    ]
    return sorted(done, key=lambda p: p.name)


def _prune(root: Path, keep_last: int) -> None:
    for p in _complete_checkpoints(root)[:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)
    for p in root.glob("*.tmp-*"):  # leftovers of killed writes
        shutil.rmtree(p, ignore_errors=True)


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint (the ``latest`` pointer if valid, else a scan)."""
    pointer = root / "latest"
    if pointer.exists():
        candidate = root / pointer.read_text().strip()
        if is_complete(candidate):
            return candidate
    done = _complete_checkpoints(root)
    return done[-1] if done else None


def load_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / "trainer_state.json").read_text())
