"""Checkpoints are atomic: a write that dies midway leaves the previous checkpoint usable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mathtask.synthetic import generate_problems
from trainer.checkpoint import (
    MANIFEST,
    CheckpointError,
    damage,
    latest_checkpoint,
    load_state,
    save_checkpoint,
)
from trainer.rollout import iteration_problems, pad_batch


def _write(d: Path) -> None:
    (d / "policy").mkdir()
    (d / "policy" / "weights.bin").write_bytes(b"\x00" * 1024)


def test_save_then_latest(tmp_path):
    save_checkpoint(tmp_path, 5, {"iteration": 5}, _write, keep_last=2)
    save_checkpoint(tmp_path, 10, {"iteration": 10}, _write, keep_last=2)
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "iter_000010" and load_state(latest) == {"iteration": 10}


def test_failed_write_keeps_previous(tmp_path):
    save_checkpoint(tmp_path, 5, {"iteration": 5}, _write, keep_last=2)

    def dies_midway(d: Path) -> None:
        _write(d)
        raise KeyboardInterrupt  # what a Ctrl-C during the write looks like

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 10, {"iteration": 10}, dies_midway, keep_last=2)
    assert latest_checkpoint(tmp_path).name == "iter_000005"
    assert not list(tmp_path.glob("*.tmp-*"))


def test_sigkill_during_write_keeps_previous(tmp_path):
    """A real SIGKILL while the parts are being written: nothing to clean up, previous one wins."""
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from trainer.checkpoint import save_checkpoint
        root = Path({str(tmp_path)!r})
        save_checkpoint(root, 5, {{"iteration": 5}}, lambda d: (d / "a").write_text("ok"), keep_last=2)
        def slow(d):
            (d / "partial").write_text("half")
            (root / "started").write_text("1")
            time.sleep(60)
        save_checkpoint(root, 10, {{"iteration": 10}}, slow, keep_last=2)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2])
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "writer did not start"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "iter_000005" and load_state(latest)["iteration"] == 5
    # The next successful save prunes the half-written leftovers.
    save_checkpoint(tmp_path, 10, {"iteration": 10}, _write, keep_last=2)
    assert latest_checkpoint(tmp_path).name == "iter_000010"
    assert not list(tmp_path.glob("*.tmp-*"))


@pytest.mark.parametrize("keep_last", [1, 3])
def test_only_the_newest_keep_last_checkpoints_stay(tmp_path, keep_last):
    # Iterations 5, 10, 15, 20 saved: keep_last=1 leaves iteration 20; keep_last=3 leaves 10, 15 and 20.
    for iteration in (5, 10, 15, 20):
        save_checkpoint(tmp_path, iteration, {"iteration": iteration}, _write, keep_last=keep_last)
    kept = sorted(p.name for p in tmp_path.glob("iter_*"))
    assert kept == ["iter_000010", "iter_000015", "iter_000020"][3 - keep_last :]


def test_corrupt_pointer_falls_back_to_scan(tmp_path):
    save_checkpoint(tmp_path, 5, {"iteration": 5}, _write, keep_last=2)
    (tmp_path / "latest").write_text("iter_999999\n")
    assert latest_checkpoint(tmp_path).name == "iter_000005"


def test_the_manifest_lists_every_file_with_its_size_and_sha256(tmp_path):
    import hashlib
    import json

    ckpt = save_checkpoint(tmp_path, 5, {"iteration": 5}, _write, keep_last=2)
    files = json.loads((ckpt / MANIFEST).read_text())["files"]
    assert sorted(files) == ["policy/weights.bin", "trainer_state.json"]
    assert files["policy/weights.bin"] == {"size": 1024, "sha256": hashlib.sha256(b"\x00" * 1024).hexdigest()}
    assert damage(ckpt) is None


def _cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


def _overwrite(path: Path) -> None:  # same size, other bytes: only the checksum can tell
    path.write_bytes(b"\x01" * path.stat().st_size)


@pytest.mark.parametrize(
    "harm, said",
    [
        (_cut_short, "policy/weights.bin is 100 bytes, the manifest says 1024"),
        (_overwrite, "policy/weights.bin does not match its SHA-256 in the manifest (overwritten)"),
        (Path.unlink, "policy/weights.bin is missing"),
    ],
)
def test_a_damaged_newest_checkpoint_is_said_in_one_line_and_the_previous_one_is_used(tmp_path, harm, said):
    save_checkpoint(tmp_path, 5, {"iteration": 5}, _write, keep_last=2)
    newest = save_checkpoint(tmp_path, 10, {"iteration": 10}, _write, keep_last=2)
    harm(newest / "policy" / "weights.bin")
    lines: list[str] = []
    assert latest_checkpoint(tmp_path, lines.append).name == "iter_000005"
    assert lines == [f"[checkpoint] {newest} is damaged ({said}): going back to the one before it"]


def test_a_damaged_trainer_state_or_manifest_is_found_too(tmp_path):
    save_checkpoint(tmp_path, 5, {"iteration": 5}, _write, keep_last=2)
    newest = save_checkpoint(tmp_path, 10, {"iteration": 10}, _write, keep_last=2)
    (newest / "trainer_state.json").write_text('{"iteration": 11}')
    assert damage(newest) == "trainer_state.json is 17 bytes, the manifest says 21"
    (newest / MANIFEST).write_text("{")
    assert damage(newest) == f"{MANIFEST} is unreadable (JSONDecodeError)"
    assert latest_checkpoint(tmp_path, lambda _: None).name == "iter_000005"


def test_with_no_intact_checkpoint_left_the_error_names_the_directory_and_each_problem(tmp_path):
    for iteration in (5, 10):
        save_checkpoint(tmp_path, iteration, {"iteration": iteration}, _write, keep_last=2)
    _cut_short(tmp_path / "iter_000010" / "policy" / "weights.bin")
    (tmp_path / "iter_000005" / "policy" / "weights.bin").unlink()
    with pytest.raises(CheckpointError) as e:
        latest_checkpoint(tmp_path, lambda _: None)
    assert str(e.value) == (
        f"no intact checkpoint in {tmp_path} (iter_000010: policy/weights.bin is 100 bytes, the manifest says "
        "1024; iter_000005: policy/weights.bin is missing)"
    )


def test_a_checkpoint_from_before_manifests_loads_with_a_line_saying_it_is_not_checked(tmp_path):
    ckpt = save_checkpoint(tmp_path, 5, {"iteration": 5}, _write, keep_last=2)
    (ckpt / MANIFEST).unlink()
    lines: list[str] = []
    assert latest_checkpoint(tmp_path, lines.append) == ckpt
    assert lines == [f"[checkpoint] {ckpt} has no {MANIFEST} (an older checkpoint): not checked"]


def test_a_checkpoint_of_an_earlier_iteration_removes_the_later_ones(tmp_path):
    """A run that went back (a damaged checkpoint, run.resume=false) leaves that future behind: a later
    relaunch must not resume from it."""
    for iteration in (5, 10, 15):
        save_checkpoint(tmp_path, iteration, {"iteration": iteration}, _write, keep_last=3)
    save_checkpoint(tmp_path, 6, {"iteration": 6}, _write, keep_last=3)
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_000005", "iter_000006"]


def test_data_order_depends_only_on_seed_and_iteration():
    problems = generate_problems(10, seed=0)
    # 4 prompts per iteration over 10 problems: iteration 2 spans epochs 0 and 1 (positions 8..11).
    a = [p.id for p in iteration_problems(problems, 2, 4, seed=7)]
    b = [p.id for p in iteration_problems(problems, 2, 4, seed=7)]
    assert a == b and len(a) == 4
    epoch0 = [p.id for it in range(2) for p in iteration_problems(problems, it, 4, seed=7)] + a[:2]
    assert sorted(epoch0) == sorted(p.id for p in problems)  # every problem once per epoch


def test_pad_batch_layout_worked_example():
    batch = pad_batch([[5, 6], [7]], [[1, 2, 3], [4]], pad_id=0)
    # P = 2 prompt columns (left-padded), T = 3 response columns (right-padded).
    assert batch["input_ids"].tolist() == [[5, 6, 1, 2, 3], [0, 7, 4, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4], [0, 0, 1, 1, 1]]
    assert batch["response_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
