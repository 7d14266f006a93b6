"""A user reward function end to end through train.py: its values in the metrics and the samples, with PPO and a
critic-free algorithm, and a failure mid-run one line naming the function, the exception and the problem, with
the last complete checkpoint kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_train_smoke import SMALL

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "reward_functions.py"


def _start(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
    return subprocess.Popen(
        [sys.executable, "train.py", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_function_that_fails_mid_run_stops_it_with_one_line_and_keeps_the_checkpoint(tmp_path):
    """The function raises once a marker file exists; the marker appears after the first checkpoint."""
    fn = tmp_path / "flaky.py"
    fn.write_text(
        "from pathlib import Path\n\n"
        "def flaky(prompt, response, answer, metadata):\n"
        "    if Path(__file__).with_name('FAIL').exists():\n"
        "        raise RuntimeError('the marker is there')\n"
        "    return 0.0\n"
    )
    run = tmp_path / "run"
    proc = _start(
        [
            f"reward.function={fn}:flaky",
            "run.num_iterations=4",
            "run.checkpoint_every=1",
            *SMALL,
            f"hydra.run.dir={run}",
        ]
    )
    first = run / "checkpoints" / "iter_000001" / "COMPLETE"
    deadline = time.monotonic() + 900
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    (tmp_path / "FAIL").touch()
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 1, out[-2000:] + err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        f"error: reward.function={fn}:flaky raised RuntimeError: the marker is there (at flaky.py:5)"
    )
    assert "on problem " in last and "Last complete checkpoint: " in last and "iter_00000" in last
    assert first.exists()  # kept: the failure wrote nothing over it
    assert "Traceback" not in err


@pytest.mark.slow
@pytest.mark.builtin_reward_models("prm")
@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_outcome_and_per_step_functions_train_with_every_algorithm(algorithm, tmp_path):
    for name, reward in (("boxed_format", "success"), ("step_brevity", "prm_clip_delta")):
        run = tmp_path / name
        args = [f"algorithm={algorithm}", f"+reward={reward}", f"reward.function={EXAMPLES}:{name}"]
        proc = _start([*args, "reward.function_weight=0.5", "run.num_iterations=2", *SMALL, f"hydra.run.dir={run}"])
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, out[-2000:] + err[-2000:]
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert f"reward/{name}" in rows[-1] and f"reward/{name}_nonzero_fraction" in rows[-1]
        sample = json.loads((run / "samples.jsonl").read_text().splitlines()[-1])
        assert name in json.dumps(sample)
