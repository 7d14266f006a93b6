"""A full disk on a real small filesystem (tests/small_fs.py): a checkpoint, a metrics line, an atomic
report and a figure that do not fit each fail with one message naming the directory and what it needed,
and leave what was written before as it was; once there is room, writing goes on."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from tests.small_fs import SmallFilesystem

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from common.files import DiskFull, append_text, atomic_save_figure, atomic_write_text
    from trainer.checkpoint import latest_checkpoint, save_checkpoint
    from trainer.metrics import panel_grid

    run, step = Path(sys.argv[1]), sys.argv[2]
    root = run / "checkpoints"

    def parts(d):
        (d / "policy").mkdir()
        (d / "policy" / "weights.bin").write_bytes(b"\\1" * (256 << 10))

    def attempt(name, write):
        try:
            write()
            return {name: "ok"}
        except DiskFull as e:
            return {name: str(e)}

    out = {}
    if step == "before":
        for it in (1, 2):
            save_checkpoint(root, it, {"iteration": it}, parts, keep_last=2)
        append_text(run / "metrics.jsonl", json.dumps({"iteration": 1}) + "\\n")
        atomic_write_text(run / "summary.json", "{}")
    else:
        out.update(attempt("checkpoint", lambda: save_checkpoint(root, 3, {"iteration": 3}, parts, keep_last=2)))
        out.update(attempt("metrics", lambda: append_text(run / "metrics.jsonl", "x" * (128 << 10) + "\\n")))
        out.update(attempt("summary", lambda: atomic_write_text(run / "summary.json", "y" * (128 << 10))))
        fig, (ax,) = panel_grid(1)
        ax.imshow([[i * j % 7 for i in range(600)] for j in range(600)])
        out.update(attempt("figure", lambda: atomic_save_figure(fig, run / "curves.png", dpi=300)))
        out["latest"] = latest_checkpoint(root).name
    print(json.dumps(out))
    """
)


def _run(fs: SmallFilesystem, run: Path, step: str) -> dict:
    proc = fs.run([sys.executable, "-c", SCRIPT, str(run), step], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_writes_that_find_the_disk_full_say_where_and_what_and_keep_what_was_there(tmp_path):
    with SmallFilesystem(tmp_path / "fs", "4m") as fs:
        run = fs.path / "run"
        _run(fs, run, "before")
        view = fs.view(run)
        before = {p.relative_to(view): p.read_bytes() for p in view.rglob("*") if p.is_file()}
        fs.fill(leave=64 << 10)
        out = _run(fs, run, "full")
        ckpts = run / "checkpoints"
        assert out["checkpoint"].startswith(
            f"no space left on device: writing the checkpoint of iteration 3 into {ckpts} needed 256.3 KiB, "
        ), out["checkpoint"]
        assert out["checkpoint"].endswith(" free there (the checkpoints there are intact (iter_000001, iter_000002))")
        assert out["metrics"].startswith(
            f"no space left on device: writing metrics.jsonl into {run} needed 128.0 KiB, "
        )
        assert out["summary"].startswith(f"no space left on device: writing summary.json into {run} needed 128.0 KiB, ")
        assert out["figure"].startswith(f"no space left on device: writing curves.png into {run} needed more room, ")
        assert out["latest"] == "iter_000002"
        after = {p.relative_to(view): p.read_bytes() for p in view.rglob("*") if p.is_file()}
        assert after == before, "every file written before is as it was, and nothing half-written is left"
        fs.free_up()
        again = _run(fs, run, "full")
        assert {k: again[k] for k in ("checkpoint", "metrics", "summary", "figure")} == dict.fromkeys(
            ("checkpoint", "metrics", "summary", "figure"), "ok"
        )
        assert again["latest"] == "iter_000003"
