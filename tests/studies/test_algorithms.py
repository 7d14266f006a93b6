"""studies/algorithms.py on runs made up with numbers a person can check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studies.algorithms import main, option_of


def _run(
    root: Path,
    name: str,
    overrides: list[str],
    before: float,
    after: float,
    seconds: float,
    midway: dict[int, float] | None = None,
    num_iterations: int = 2,
) -> None:
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    rows = [{"iteration": 0, "heldout/success": before}]
    rows += [
        {
            "iteration": i,
            "reward/success": 0.3,
            "kl/mean": 0.1 * i,
            "response/length": 28.0,
            "response/num_steps": 3.0,
            "response/truncated": 0.0,
            "time/iteration": seconds,
            "call/actor_gen/start_s": 0.0,
        }
        for i in range(1, num_iterations + 1)
    ]
    for i, success in (midway or {}).items():
        rows[i]["heldout/success"] = success
    rows[-1]["heldout/success"] = after
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(
        json.dumps({"heldout_before": before, "heldout_after": after, "run_dir": str(run)})
    )


def test_options_pair_with_ppo_by_seed_and_regenerate_from_the_export(tmp_path):
    runs = tmp_path / "runs"
    for seed, (ppo, grpo) in enumerate([(0.70, 0.75), (0.72, 0.71), (0.68, 0.74)]):
        _run(runs, f"ppo_seed{seed}", [f"run.seed={seed}"], 0.45, ppo, 4.0)
        _run(runs, f"grpo_seed{seed}", ["algorithm=grpo", f"run.seed={seed}"], 0.45, grpo, 3.0)
    _run(runs, "grpo_prm_seed0", ["algorithm=grpo", "+reward=prm", "run.seed=0"], 0.45, 0.5, 3.5)
    _run(runs, "rloo_seed0", ["algorithm=rloo", "run.seed=0"], 0.45, 0.72, 3.0)  # one pair: no t interval
    # Twice PPO's iterations: compared with PPO's final (0.70) at PPO's last iteration (0.66), not at its own end.
    _run(
        runs, "grpo_cd_seed0", ["algorithm=grpo", "+reward=prm_clip_delta", "run.seed=0"], 0.45, 0.9, 3.0, {2: 0.66}, 4
    )
    main([str(runs), "--out", str(tmp_path / "out"), "--export"])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    grpo = next(o for o in summary["options"] if o["option"] == "grpo")
    # differences +0.05, -0.01, +0.06: mean 0.0333, sd 0.0379, half-width 4.303 * 0.0379 / sqrt(3) = 0.0941
    assert grpo["vs_ppo"]["mean"] == pytest.approx(0.1 / 3) and grpo["vs_ppo"]["half_width"] == pytest.approx(
        0.0941, abs=1e-4
    )
    assert grpo["seconds_per_iteration"] == 3.0 and grpo["min_gain"] == pytest.approx(0.26)
    table = (tmp_path / "out" / "summary.md").read_text()
    assert "| grpo | 0 1 2 | 0.450 ± 0.000 | 0.733 ± 0.021 |" in table and "| grpo+prm | 0 |" in table
    assert "| +2.0 (1 pair, no interval) |" in table
    assert "| grpo+prm_clip_delta | 0 | 0.450 | 0.900 | 0.450 | +0.450 | -4.0 (1 pair, no interval) |" in table
    assert (tmp_path / "out" / "curves.png").exists() and (tmp_path / "out" / "process_rewards.png").exists()
    first = (tmp_path / "out" / "summary.md").read_text(), (tmp_path / "out" / "summary.json").read_text()
    main([str(tmp_path / "out" / "runs"), "--out", str(tmp_path / "out")])
    assert ((tmp_path / "out" / "summary.md").read_text(), (tmp_path / "out" / "summary.json").read_text()) == first
    assert option_of({"algorithm": "rloo", "reward": "prm_clip_delta"}) == "rloo+prm_clip_delta"


def test_committed_comparison_regenerates_byte_for_byte(tmp_path):
    """docs/algorithms/runs holds the runs behind docs/algorithms/summary.*: summarizing them again gives the same bytes."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "algorithms"
    if not (docs / "runs").is_dir():
        pytest.skip("no docs/algorithms/runs committed")
    main([str(docs / "runs"), "--out", str(tmp_path)])
    for name in ("summary.md", "summary.json"):
        assert (tmp_path / name).read_bytes() == (docs / name).read_bytes(), f"{docs / name} is stale"
