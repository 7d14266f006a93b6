"""Files written atomically: a reader sees the old file or the new one, never part of one.

Every writer here writes a temporary file (or directory) beside the target and renames it into
place, so a run killed mid-write leaves the previous version or nothing. A directory build also
writes a completion marker last: a cache entry or checkpoint counts only when the marker is there.
This is the only place in the project that writes a file this way; the lowest layer (see the
README's layer order) so that every package can use it.

A write that finds the disk full raises ``DiskFull``, naming the directory, what was being written and
how much it needed, after removing its temporary file: the previous version stays as it was. Lines
appended to a log (``append_text``) are either all there or not at all.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(OSError):
    """No space left on the device (or the quota) while writing ``what`` into ``directory``."""

    def __init__(self, directory: Path, what: str, needed: int | None = None, detail: str = ""):
        self.directory, self.what, self.needed = Path(directory), what, needed
        free = free_bytes(self.directory)
        need = f"needed {format_bytes(needed)}" if needed is not None else "needed more room"
        have = f", {format_bytes(free)} free there" if free is not None else ""
        more = f" ({detail})" if detail else ""
        self.message = f"no space left on device: writing {what} into {self.directory} {need}{have}{more}"
        super().__init__(errno.ENOSPC, self.message)

    def __str__(self) -> str:
        return self.message


def free_bytes(directory: Path) -> int | None:
    """Bytes free to this user on ``directory``'s filesystem (its nearest existing parent's), or None."""
    for path in (directory, *directory.parents):
        if path.exists():
            try:
                return shutil.disk_usage(path).free
            except OSError:
                return None
    return None


def format_bytes(num: int) -> str:
    """``format_bytes(1536) == "1.5 KiB"``, ``format_bytes(10 << 20) == "10.0 MiB"``."""
    size = float(num)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{num} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` is, or was caused by, a full disk or quota: an OSError with ENOSPC/EDQUOT in its
    chain, or, for errors carried over from another process (a Ray task's, a distributed checkpoint's),
    the OS's words for them in the message."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [error]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return True
        stack += [e.__cause__, e.__context__, getattr(e, "cause", None)]
    text = str(error)
    return any(os.strerror(code) in text for code in _FULL_ERRNOS)


def append_text(path: Path, text: str) -> None:
    """Append ``text`` (whole lines) to ``path``: on a failed write the file is cut back to its length
    before, so a reader never sees part of a line (a full disk raises ``DiskFull``)."""
    data = text.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        rest = memoryview(data)
        try:
            while rest:  # unbuffered: nothing is left in a buffer to be written after the cut
                rest = rest[os.write(fd, rest) :]
        except OSError as e:
            os.ftruncate(fd, size)
            if e.errno in _FULL_ERRNOS:
                raise DiskFull(path.parent, path.name, len(data)) from e
            raise
    finally:
        os.close(fd)


COMPLETE_MARKER = "COMPLETE"
# Model, SFT and reward-model caches built before the marker had one name: still read as complete.
_LEGACY_MARKERS = (".complete",)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file in the same directory, fsync'd, then a rename."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    except OSError as e:
        if e.errno in _FULL_ERRNOS:
            raise DiskFull(path.parent, path.name, len(data)) from e
        raise
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            raise DiskFull(path.parent, path.name, len(data)) from e
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, obj: Any) -> None:
    """Indented JSON (non-ASCII kept, unknown types as ``str``) with a final newline."""
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def atomic_save_figure(fig: Any, path: Path, dpi: int = 100) -> Path:
    """Save a matplotlib figure (format from ``path``'s suffix) and close it."""
    import matplotlib.pyplot as plt

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.tmp-", suffix=path.suffix, dir=path.parent)
        os.close(fd)
    except BaseException:
        plt.close(fig)
        raise
    try:
        fig.savefig(tmp, dpi=dpi)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if is_disk_full(e):
            # What it needed: about the size of the picture it replaces, when there is one.
            raise DiskFull(path.parent, path.name, path.stat().st_size if path.exists() else None) from e
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
    except Exception as e:
        if is_disk_full(e) and not isinstance(e, DiskFull):
            shutil.rmtree(tmp, ignore_errors=True)  # the room it took, back before the message says what is free
            raise DiskFull(target.parent, target.name, detail=_first_line(e)) from e
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _first_line(error: BaseException) -> str:
    """The line of ``error``'s message with the OS's words for a full disk (a remote error's message is
    its whole traceback), or ""."""
    words = tuple(os.strerror(code) for code in _FULL_ERRNOS)
    return next((line.strip()[:200] for line in str(error).splitlines() if any(w in line for w in words)), "")
