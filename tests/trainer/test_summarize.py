"""The sweep summary on hand-made run directories: seeds averaged per reward, rows in paper order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.summarize import mean_std, paired_interval, run_row, write_summary


def _run(root: Path, reward: str, seed: int, steps: list[float], heldout_after: float) -> Path:
    run = root / f"+reward={reward},run.seed={seed}"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(f"- run.seed={seed}\n- +reward={reward}\n- experiment=mini_repro\n")
    rows = [{"iteration": 0, "heldout/success": 0.5}]
    for i, s in enumerate(steps, start=1):
        rows.append(
            {
                "iteration": i,
                "response/num_steps": s,
                "response/length": 10.0 * s,
                "reward/success": 0.25 * i,
                "reward/learned": s / 2,
                "reward/step_score": 0.5,
                "kl/mean": 0.1 * i,
            }
        )
    rows[-1].update({"heldout/success": heldout_after, "heldout/sampled_success": heldout_after - 0.1})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"heldout_before": 0.5, "heldout_after": heldout_after}))
    return run


def test_mean_std_and_paired_interval_worked_example():
    assert mean_std([0.4, 0.6]) == (0.5, pytest.approx(0.1414, abs=1e-4))  # sqrt(((0.1)^2 * 2) / 1)
    assert mean_std([0.4])[1] != mean_std([0.4])[1]  # one seed: no spread (nan)
    # differences 0.05, 0.02, 0.08: mean 0.05, sd 0.03, half-width t(0.975, 2) * 0.03 / sqrt(3) = 0.0745
    diff, half, n = paired_interval({"0": 0.65, "1": 0.52, "2": 0.78, "3": 0.9}, {"0": 0.6, "1": 0.5, "2": 0.7})
    assert (n, diff) == (3, pytest.approx(0.05)) and half == pytest.approx(4.303 * 0.03 / 3**0.5)
    diff, half, n = paired_interval({"0": 0.7}, {"0": 0.6})
    assert (n, diff) == (1, pytest.approx(0.1)) and half != half


def test_summary_has_the_spread_over_seeds_and_paired_differences(tmp_path):
    for seed, (success, prm) in enumerate([(0.6, 0.65), (0.5, 0.52), (0.7, 0.78)]):
        _run(tmp_path, "success", seed, [3.0, 3.0], heldout_after=success)
        _run(tmp_path, "prm", seed, [3.0, 4.0], heldout_after=prm)
    md, _ = write_summary(tmp_path, tmp_path / "out")
    text = md.read_text()
    spread = next(l for l in text.splitlines() if l.startswith("| prm | 3 | ") and "±" in l)
    assert spread.split(" | ")[2] == "0.650 ± 0.130"  # greedy after: 0.65, 0.52, 0.78
    paired = next(l for l in text.splitlines() if l.startswith("| prm | 3 | ") and "[" in l)
    # greedy: differences 0.05, 0.02, 0.08 -> +0.050 +- 0.0745; sampled is greedy - 0.1 in _run: the same
    assert paired.split(" | ")[2] == "+0.050 [-0.025, +0.125]"


def test_run_row_reads_first_last_and_means(tmp_path):
    row = run_row(_run(tmp_path, "prm", 1, [3.0, 4.0, 5.0], heldout_after=0.4))
    assert (row["reward"], row["seed"], row["iterations"]) == ("prm", "1", 3)
    assert (row["steps_first"], row["steps_last"]) == (3.0, 5.0)
    assert (row["length_first"], row["length_last"]) == (30.0, 50.0)
    assert row["success_mean"] == 0.5  # (0.25 + 0.5 + 0.75) / 3
    assert row["learned_mean"] == 2.0  # (1.5 + 2 + 2.5) / 3
    assert (row["greedy_before"], row["greedy_after"]) == (0.5, 0.4)
    assert abs(row["sampled_after"] - 0.3) < 1e-12 and abs(row["kl_last"] - 0.3) < 1e-12
    assert row["orm_score_mean"] != row["orm_score_mean"]  # nan: a PRM run logs no ORM score
    assert row["steps_max"] == 5.0 and row["greedy_curve"] == [[0, 0.5], [3, 0.4]]


def test_summary_lists_each_runs_greedy_curve(tmp_path):
    _run(tmp_path, "success", 0, [3.0, 3.0], heldout_after=0.6)
    _run(tmp_path, "prm", 0, [3.0, 4.5, 4.0], heldout_after=0.4)
    md, _ = write_summary(tmp_path, tmp_path / "out")
    text = md.read_text()
    assert "| success | 0 | 0: 0.500 / 2: 0.600 | 0.500 | 3.000 | 0.200 | nan |" in text
    assert "| prm | 0 | 0: 0.500 / 3: 0.400 | 0.300 | 4.500 | 0.300 | nan |" in text


def test_summary_averages_seeds_in_paper_order(tmp_path):
    _run(tmp_path, "prm_delta", 0, [3.0, 3.0], heldout_after=0.6)
    _run(tmp_path, "prm", 0, [3.0, 5.0], heldout_after=0.4)
    _run(tmp_path, "prm", 1, [3.0, 7.0], heldout_after=0.2)
    (_run(tmp_path, "prm", 2, [9.0], heldout_after=0.0) / "summary.json").unlink()  # still going
    md, png = write_summary(tmp_path, tmp_path / "out")
    lines = md.read_text().splitlines()
    first_table = md.read_text().split("Over seeds")[0].splitlines()
    rows = [l for l in first_table if l.startswith("| prm")]
    assert [r.split(" | ")[0] for r in rows] == ["| prm", "| prm_delta"]
    prm = rows[0].split(" | ")
    # reward, seeds, greedy before, after (mean of 0.4 and 0.2), sampled after, steps first, last (mean of 5, 7)
    assert prm[1:7] == ["2", "0.500", "0.300", "0.200", "3.000", "6.000"]
    assert png is not None and png.stat().st_size > 0
    assert "unfinished (left out): " in lines[-1] and lines[-1].endswith("run.seed=2")
    assert json.loads((tmp_path / "out" / "summary.json").read_text())[0]["reward"] == "prm"


def test_export_then_summarize_the_copies_reproduces_the_summary(tmp_path):
    from trainer.summarize import export_runs

    sweep = tmp_path / "sweep"
    run = _run(sweep, "prm", 0, [3.0, 5.0], heldout_after=0.4)
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"iteration": 3, "response/num_steps": 6.0, "time/iteration": 9.9}) + "\n")
    (run / "samples.jsonl").write_text(
        "".join(json.dumps({"iteration": i, "response": f"r{i}"}) + "\n" for i in (1, 2, 3, 3))
    )
    _run(sweep, "success", 0, [3.0, 3.0], heldout_after=0.6)
    docs = tmp_path / "docs"
    copies = export_runs(sweep, docs / "runs")
    assert [c.name for c in copies] == ["+reward=prm,run.seed=0", "+reward=success,run.seed=0"]
    copy = copies[0]
    assert "time/iteration" not in (copy / "metrics.jsonl").read_text()
    assert [json.loads(line)["response"] for line in (copy / "samples.jsonl").read_text().splitlines()] == ["r3", "r3"]
    write_summary(sweep, tmp_path / "from_sweep")
    write_summary(docs / "runs", docs)
    # the copies carry everything the table needs: same table, same rows
    assert (docs / "summary.md").read_text() == (tmp_path / "from_sweep" / "summary.md").read_text()
    assert (docs / "summary.json").read_text() == (tmp_path / "from_sweep" / "summary.json").read_text()


def _written_by_a_study(path: Path) -> bool:
    """Whether ``path`` names its generator (studies.hacking.round2, studies.algorithms); trainer.summarize's is a list."""
    return (
        path.is_file()
        and isinstance(summary := json.loads(path.read_text(encoding="utf-8")), dict)
        and "generator" in summary
    )


def test_committed_summaries_regenerate_byte_for_byte(tmp_path):
    """docs/<sweep>/runs holds the runs behind docs/<sweep>/summary.*: summarizing them again gives the same bytes."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    checked = 0
    for runs in sorted(docs.glob("*/runs")):
        if _written_by_a_study(runs.parent / "summary.json"):
            continue  # a study module's summary (its "generator"): that module's own test regenerates it
        out = tmp_path / runs.parent.name
        write_summary(runs, out)
        for name in ("summary.md", "summary.json"):
            assert (out / name).read_bytes() == (runs.parent / name).read_bytes(), f"{runs.parent / name} is stale"
        checked += 1
    if not checked:
        import pytest

        pytest.skip("no docs/*/runs committed yet")
