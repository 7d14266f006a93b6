"""Files written atomically: a reader sees the old file or the new one, never part of one.

Every writer here writes a temporary file (or directory) beside the target and renames it into
place, so a run killed mid-write leaves the previous version or nothing. A directory build also
writes a completion marker last: a cache entry or checkpoint counts only when the marker is there.
This is the only place in the project that writes a file this way; the lowest layer (see the
README's layer order) so that every package can use it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

COMPLETE_MARKER = "COMPLETE"
# Model, SFT and reward-model caches built before the marker had one name: still read as complete.
_LEGACY_MARKERS = (".complete",)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same directory, fsync'd, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    """Indented JSON (non-ASCII kept, unknown types as ``str``) with a final newline."""
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def atomic_save_figure(fig: Any, path: Path, dpi: int = 100) -> Path:
    """Save a matplotlib figure (format from ``path``'s suffix) and close it."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.tmp-", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=dpi)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return path


def is_complete(directory: Path) -> bool:
    return any((directory / marker).exists() for marker in (COMPLETE_MARKER, *_LEGACY_MARKERS))


def atomic_build_dir(target: Path, build: Callable[[Path], object], reuse: bool = True) -> Path:
    """Run ``build(tmp_dir)``, write the completion marker, and rename the result to ``target``.

    ``reuse``: a complete ``target`` is returned as is (a cache); otherwise it is replaced (a
    checkpoint written again). An incomplete ``target`` (a killed build) is always replaced.
    """
    if reuse and is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        build(tmp)
        (tmp / COMPLETE_MARKER).write_text("ok\n")
        if target.exists():
            shutil.rmtree(target)
        try:
            os.replace(tmp, target)
        except OSError:
            if not is_complete(target):  # another process finished the same build first: fine
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
