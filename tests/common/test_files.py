"""common.files: every atomic writer leaves the old version or the new one, and no temp files."""

from __future__ import annotations

import json

import pytest

from common.files import (
    COMPLETE_MARKER,
    atomic_build_dir,
    atomic_save_figure,
    atomic_write_json,
    atomic_write_text,
    is_complete,
)


def test_writers_replace_whole_files_and_leave_no_temp_files(tmp_path):
    path = tmp_path / "sub" / "a.json"
    atomic_write_json(path, {"x": 1, "name": "é"})
    atomic_write_json(path, {"x": 2})
    assert json.loads(path.read_text()) == {"x": 2} and path.read_text().endswith("\n")
    atomic_write_text(tmp_path / "b.md", "ok")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a.json", "b.md", "sub"]


def test_figure_is_saved_by_its_suffix_and_closed(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = atomic_save_figure(fig, tmp_path / "curve.png", dpi=20)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not plt.fignum_exists(fig.number)
    assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]


def test_build_dir_reuses_a_complete_build_and_replaces_a_killed_one(tmp_path):
    calls = []

    def build(d):
        calls.append(d)
        (d / "weights").write_text(str(len(calls)))

    target = tmp_path / "cache" / "model"
    assert atomic_build_dir(target, build) == target and is_complete(target)
    atomic_build_dir(target, build)  # cached: not built again
    assert len(calls) == 1 and (target / COMPLETE_MARKER).exists()
    atomic_build_dir(target, build, reuse=False)  # a checkpoint written again
    assert (target / "weights").read_text() == "2"
    (target / COMPLETE_MARKER).unlink()  # as if killed before the marker: rebuilt
    atomic_build_dir(target, build)
    assert (target / "weights").read_text() == "3"


def test_a_failed_build_leaves_nothing_and_old_markers_still_count(tmp_path):
    def broken(d):
        (d / "half").write_text("x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        atomic_build_dir(tmp_path / "m", broken)
    assert list(tmp_path.iterdir()) == []
    old = tmp_path / "old-cache"
    old.mkdir()
    (old / ".complete").write_text("ok\n")  # a cache entry built before the marker was renamed
    assert is_complete(old) and atomic_build_dir(old, broken) == old


def test_a_full_disk_is_recognised_through_causes_and_in_another_process_s_message():
    import errno
    import os

    from common.files import format_bytes, is_disk_full

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    try:
        try:
            raise full
        except OSError as e:
            raise RuntimeError("the checkpoint's collective failed") from e
    except RuntimeError as wrapped:
        assert is_disk_full(wrapped)
    # A Ray task's error carries the remote traceback as text, not the OSError itself.
    remote = RuntimeError(f"ray::RayHost.run() (pid=1)\n  ...\nOSError: [Errno 28] {os.strerror(errno.ENOSPC)}: 'x'")
    assert is_disk_full(remote)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied")) and not is_disk_full(ValueError("x"))
    assert [format_bytes(n) for n in (512, 1536, 10 << 20)] == ["512 bytes", "1.5 KiB", "10.0 MiB"]
