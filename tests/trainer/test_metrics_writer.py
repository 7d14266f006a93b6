"""metrics.jsonl and samples.jsonl after a resume or a restart hold each iteration once."""

from __future__ import annotations

import json

from trainer.metrics import MetricsWriter


def _iterations(path):
    return [json.loads(line)["iteration"] for line in path.read_text().splitlines()]


def _attempt(run_dir, iterations, resume_from_iteration=None):
    writer = MetricsWriter(run_dir, resume_from_iteration=resume_from_iteration)
    for it in iterations:
        writer.log(it, {"reward/success": 0.1 * it})
        writer.log_samples(it, [{"response": f"r{it}a"}, {"response": f"r{it}b"}])
    writer.close()


def test_resume_drops_rows_past_the_checkpoint_in_metrics_and_samples(tmp_path):
    _attempt(tmp_path, [0, 1, 2, 3])  # stopped after iteration 3; the last checkpoint is iteration 2
    _attempt(tmp_path, [3, 4], resume_from_iteration=2)
    assert _iterations(tmp_path / "metrics.jsonl") == [0, 1, 2, 3, 4]
    assert _iterations(tmp_path / "samples.jsonl") == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_a_fresh_start_in_a_used_run_dir_drops_the_earlier_attempt(tmp_path):
    _attempt(tmp_path, [0, 1, 2])  # stopped before its first checkpoint
    _attempt(tmp_path, [0, 1])
    assert _iterations(tmp_path / "metrics.jsonl") == [0, 1]
    assert _iterations(tmp_path / "samples.jsonl") == [0, 0, 1, 1]


def test_heldout_rows_pair_problems_and_survive_a_resume(tmp_path):
    """heldout.jsonl: one row per evaluation, a 0/1 per problem (greedy) and a count of correct samples,
    in the run's problem order; a resume drops the rows past the checkpoint like metrics.jsonl's."""
    ids = ["p0", "p1", "p2"]
    writer = MetricsWriter(tmp_path)
    writer.log_heldout(0, ids, [True, False, True], [4, 0, 2])
    writer.log_heldout(10, ids, [True, True, False], [3, 1, 0])
    writer.close()
    MetricsWriter(tmp_path, resume_from_iteration=5).close()
    rows = [json.loads(line) for line in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["greedy"], r["sampled"]) for r in rows] == [(0, "101", "402")]


def test_rollouts_name_problems_by_id(tmp_path):
    writer = MetricsWriter(tmp_path)
    record = {"problem_id": "p7", "question": "1 + 1?", "gold": "2", "response": "2", "success": 1.0}
    writer.write_rollouts(20, [record, record])
    writer.close()
    lines = (tmp_path / "rollouts" / "iter_000020.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"iteration": 20, "problem_id": "p7", "response": "2", "success": 1.0}
    ] * 2
