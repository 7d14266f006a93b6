"""A real small filesystem for tests of a full disk: a size-limited tmpfs mounted in a private mount
namespace, held open by a sleeping process.

    with SmallFilesystem(tmp_path / "fs", "64m") as fs:
        fs.run([sys.executable, "train.py", f"hydra.run.dir={fs.path}/run"])   # sees the tmpfs at fs.path
        fs.view(fs.path / "run" / "metrics.jsonl").read_text()               # the test reads it from here
        fs.fill(leave=1 << 20)                                                # 1 MiB free from now on
        fs.free_up()

Commands run inside the namespace (``nsenter --mount``); the test process reads and writes the tmpfs
through ``/proc/<holder>/root``, which resolves paths in the holder's namespace. Needs root (or a user
namespace) and a kernel that allows nested mount namespaces; where it refuses, ``SmallFilesystem``
skips the test, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest


class SmallFilesystem:
    def __init__(self, path: Path, size: str):
        self.path, self.size = Path(path).resolve(), size
        self.holder: subprocess.Popen | None = None

    def __enter__(self) -> SmallFilesystem:
        if shutil.which("unshare") is None or shutil.which("nsenter") is None:
            pytest.skip("needs unshare and nsenter (util-linux) for a private mount namespace")
        self.path.mkdir(parents=True, exist_ok=True)
        script = 'mount -t tmpfs -o size="$1" realm-small-fs "$0" && echo ready && exec sleep 86400'
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(self.path), self.size],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.holder.stdout is not None and self.holder.stderr is not None
        if self.holder.stdout.readline().strip() != "ready":
            reason = self.holder.stderr.read().strip()
            self.holder.wait()
            pytest.skip(f"the kernel refuses a tmpfs in a private mount namespace here: {reason}")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.holder is not None:
            self.holder.kill()
            self.holder.wait()

    def command(self, cmd: list[str]) -> list[str]:
        assert self.holder is not None
        return ["nsenter", f"--target={self.holder.pid}", "--mount", "--", *cmd]

    def run(self, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """``cmd`` inside the namespace (it sees the tmpfs at ``self.path``)."""
        return subprocess.run(self.command(cmd), **kwargs)

    def view(self, path: Path) -> Path:
        """Where this process reaches ``path`` of the namespace (under /proc/<holder>/root)."""
        assert self.holder is not None
        return Path(f"/proc/{self.holder.pid}/root") / Path(path).resolve().relative_to("/")

    def free(self) -> int:
        stat = os.statvfs(self.view(self.path))
        return stat.f_bavail * stat.f_frsize

    def fill(self, leave: int) -> None:
        """Write a ballast file so that about ``leave`` bytes stay free (tmpfs counts whole pages)."""
        ballast = self.view(self.path / ".ballast")
        with ballast.open("ab") as f:
            f.write(b"\0" * max(0, self.free() - leave))

    def free_up(self) -> None:
        self.view(self.path / ".ballast").unlink(missing_ok=True)
