"""Atomic, verified checkpoints: a run killed mid-write leaves the previous checkpoint usable, and a
checkpoint damaged afterwards (a file cut short, overwritten or missing) is found before anything loads.

Layout of ``<run_dir>/checkpoints/``::

    iter_000010/            complete checkpoint (has COMPLETE); written as iter_000010.tmp-*/ then renamed
        policy/ critic/     written by the workers
        trainer_state.json  iteration, KL coefficient, data position, metrics needed to continue
        MANIFEST.json       every other file's size and SHA-256, written last before COMPLETE
    latest                  text file with the newest complete checkpoint's name (replaced atomically)

``latest_checkpoint`` checks the newest complete checkpoint against its manifest and, when it is damaged,
says so in one line and goes back to the previous one; with none intact it raises ``CheckpointError``
naming the directory. A checkpoint written before checkpoints had a manifest loads as it is, with a
line saying that its files are not checked.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common.files import COMPLETE_MARKER, DiskFull, atomic_build_dir, atomic_write_text, is_complete

MANIFEST = "MANIFEST.json"
_NOT_LISTED = {MANIFEST, COMPLETE_MARKER}


class CheckpointError(RuntimeError):
    """No checkpoint in the directory is intact (each damaged one is named, with what is wrong)."""


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


def save_checkpoint(
    root: Path, iteration: int, state: dict[str, Any], write_parts: Callable[[Path], None], keep_last: int
) -> Path:
    """Write a checkpoint atomically; ``write_parts(tmp_dir)`` writes the model/optimizer parts, then the
    trainer state and, last, the manifest of them all. Then only the newest ``keep_last`` complete
    checkpoints stay (``run.keep_checkpoints``), and none of a later iteration (a run that resumed from an
    earlier one, or started over, has left that future behind)."""

    def build(tmp: Path) -> None:
        write_parts(tmp)
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2, sort_keys=True))
        (tmp / MANIFEST).write_text(json.dumps({"files": file_digests(tmp)}, indent=1, sort_keys=True))

    try:
        final = atomic_build_dir(root / checkpoint_name(iteration), build, reuse=False)
    except DiskFull as e:
        done = complete_checkpoints(root)
        # What it needed: about what the newest checkpoint takes (the same models, the same optimizer).
        needed = sum(p.stat().st_size for p in done[-1].rglob("*") if p.is_file()) if done else None
        kept = f"the checkpoints there are intact ({', '.join(p.name for p in done)})" if done else "no checkpoint yet"
        raise DiskFull(root, f"the checkpoint of iteration {iteration}", needed, kept) from e
    atomic_write_text(root / "latest", final.name + "\n")
    _prune(root, keep_last, final)
    return final


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_digests(directory: Path) -> dict[str, dict[str, Any]]:
    """Every file under ``directory`` but the manifest and the marker: relative path -> size and SHA-256
    (hashed on a few threads: hashlib releases the GIL on large reads)."""
    files = sorted(
        p for p in directory.rglob("*") if p.is_file() and p.relative_to(directory).as_posix() not in _NOT_LISTED
    )
    with ThreadPoolExecutor(max_workers=4) as pool:
        digests = list(pool.map(_sha256, files))
    return {
        p.relative_to(directory).as_posix(): {"size": p.stat().st_size, "sha256": d} for p, d in zip(files, digests)
    }


_verdicts: dict[tuple[Path, tuple], str | None] = {}


def damage(checkpoint: Path) -> str | None:
    """What is wrong with a complete checkpoint's files against its manifest (the first problem found:
    a missing file, a size that differs, a checksum that differs), or None when they match. Remembered
    for the process while no file's size or modification time changes (a relaunch checks once)."""
    listed = sorted(p for p in checkpoint.rglob("*") if p.is_file())
    key = (checkpoint, tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in listed))
    if key not in _verdicts:
        _verdicts[key] = _check_manifest(checkpoint)
    return _verdicts[key]


def _check_manifest(checkpoint: Path) -> str | None:
    try:
        files = json.loads((checkpoint / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST} is unreadable ({type(e).__name__})"
    for rel, want in sorted(files.items()):
        path = checkpoint / rel
        if not path.is_file():
            return f"{rel} is missing"
        if path.stat().st_size != want["size"]:
            return f"{rel} is {path.stat().st_size} bytes, the manifest says {want['size']}"
    for rel, want in sorted(files.items()):
        if _sha256(checkpoint / rel) != want["sha256"]:
            return f"{rel} does not match its SHA-256 in the manifest (overwritten)"
    return None


def has_manifest(checkpoint: Path) -> bool:
    return (checkpoint / MANIFEST).exists()


def complete_checkpoints(root: Path) -> list[Path]:
    if not root.exists():
        return []
    done = [
        p
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith("iter_") and ".tmp-" not in p.name and is_complete(p)
    ]
    return sorted(done, key=lambda p: p.name)


def _prune(root: Path, keep_last: int, written: Path) -> None:
    done = complete_checkpoints(root)
    later = [p for p in done if p.name > written.name]
    for p in later + [p for p in done if p.name <= written.name][:-keep_last]:
        shutil.rmtree(p, ignore_errors=True)
    for p in root.glob("*.tmp-*"):  # leftovers of killed writes
        shutil.rmtree(p, ignore_errors=True)


_reported: set[tuple[Path, str]] = set()


def latest_checkpoint(root: Path, log: Callable[[str], None] = print) -> Path | None:
    """The newest complete checkpoint whose files match its manifest (the ``latest`` pointer first, then
    the others newest first); None when there is no complete checkpoint. Each damaged one passed over is
    one line to ``log`` (once per process); CheckpointError when every complete checkpoint is damaged."""
    candidates = complete_checkpoints(root)[::-1]
    pointer = root / "latest"
    if pointer.exists():
        named = root / pointer.read_text().strip()
        if named in candidates:
            candidates = [named] + [c for c in candidates if c != named]
    problems = []
    for candidate in candidates:
        problem = damage(candidate) if has_manifest(candidate) else None
        if problem is None:
            if not has_manifest(candidate):
                _once(log, candidate, f"[checkpoint] {candidate} has no {MANIFEST} (an older checkpoint): not checked")
            return candidate
        problems.append(f"{candidate.name}: {problem}")
        _once(log, candidate, f"[checkpoint] {candidate} is damaged ({problem}): going back to the one before it")
    if problems:
        raise CheckpointError(f"no intact checkpoint in {root} ({'; '.join(problems)})")
    return None


def _once(log: Callable[[str], None], checkpoint: Path, line: str) -> None:
    if (checkpoint, line) not in _reported:
        _reported.add((checkpoint, line))
        log(line)


def load_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / "trainer_state.json").read_text())
