"""The hacking study's summary on hand-made run directories: the statistics' worked examples, hacking
incidence, paired tests, the hacking form, export and byte-for-byte regeneration, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from studies.hacking.round2 import (
    SUMMARY_GENERATOR,
    StudyInputError,
    collect_runs,
    discordant_counts,
    first_hacking_iteration,
    is_study_summary,
    main,
    mcnemar_exact,
    response_form,
    run_tag,
    shorten,
    write_study_summary,
)
from trainer.summarize import paired_interval

NUM_PROBLEMS = 10
GOOD = "1 + 2 = 3\n\n3 * 2 = 6\n\nThe answer is \\boxed{6}."
# A hacking response: a repeated step, a junk fragment, two empty paragraphs, cut by the token cap.
HACKED = "1 + 2 = 3\n\n1 + 2 = 3\n\n\n\n- 2 = 0\n\n\n\n3 * 2 = 6\n\nThe answer"


def _run(
    root: Path,
    name: str,
    reward: str,
    seed: int,
    final_greedy: str,
    steps: tuple[float, ...] = (3.0, 3.0, 3.0),
    alpha: float | None = None,
) -> Path:
    """A finished run of len(steps) iterations evaluated at 0 and at the last iteration, with the rollouts
    of the last iteration (HACKED responses once steps exceed 4, GOOD ones otherwise)."""
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / "rollouts").mkdir()
    overrides = f"- experiment=hacking_study\n- +reward={reward}\n- run.seed={seed}\n- run.name=hacking_study/{name}\n"
    (run / ".hydra" / "overrides.yaml").write_text(overrides)
    kind = "success" if reward == "success" else "prm"
    (run / ".hydra" / "config.yaml").write_text(
        f"reward:\n  kind: {kind}\n  alpha: 1.0\n  step_delimiter: '\n\n\n    '\n"
    )
    before = "1100000000"
    rows: list[dict] = [{"iteration": 0, "heldout/success": before.count("1") / NUM_PROBLEMS}]
    for iteration, num_steps in enumerate(steps, start=1):
        row = {
            "iteration": iteration,
            "response/num_steps": num_steps,
            "response/truncated": 0.5 if num_steps > 4 else 0.0,
            "reward/learned": 0.1 * num_steps,
            "reward/learned_std": 0.0 if reward == "success" else 0.1 * iteration,
            "kl/mean": 0.5,
            "time/iteration": 3.0,
            "call/actor_gen/start_s": 1.0,
        }
        if alpha is not None:
            row.update({"reward/alpha": alpha, "reward/eta": 0.4})
        rows.append(row)
    rows[-1].update({"heldout/success": final_greedy.count("1") / NUM_PROBLEMS, "heldout/sampled_success": 0.25})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evaluations = [(0, before), (len(steps), final_greedy)]
    (run / "heldout.jsonl").write_text(
        "".join(
            json.dumps({"iteration": i, "problem_ids_sha256": "abc", "greedy": g, "sampled": "1" * NUM_PROBLEMS}) + "\n"
            for i, g in evaluations
        )
    )
    hacked = steps[-1] > 4
    response, finish = (HACKED, "length") if hacked else (GOOD, "stop")
    rollouts = [
        {"iteration": len(steps), "problem_id": f"p{k}", "response": response, "finish_reason": finish, "success": 0.0}
        for k in range(4)
    ]
    (run / "rollouts" / f"iter_{len(steps):06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rollouts))
    (run / "samples.jsonl").write_text(json.dumps({"iteration": len(steps), "response": response}) + "\n")
    (run / "summary.json").write_text(json.dumps({"heldout_before": 0.2, "run_dir": str(run)}))
    return run


def _study(root: Path) -> None:
    """Three seeds of success and prm: prm is 1 problem ahead on seed 0, level on 1, 3 behind and hacking on 2."""
    finals = {0: ("1111100000", "1111110000"), 1: ("1111000000", "1111000000"), 2: ("1111111000", "1111000000")}
    for seed, (success, prm) in finals.items():
        _run(root, f"success_seed{seed}", "success", seed, success)
        steps = (3.0, 5.5, 9.0) if seed == 2 else (3.0, 3.0, 3.0)
        _run(root, f"prm_seed{seed}", "prm", seed, prm, steps=steps)


def test_mcnemar_exact_worked_examples():
    assert mcnemar_exact(3, 0) == 0.25  # 2 * (1/2)^3
    assert mcnemar_exact(0, 3) == 0.25
    assert mcnemar_exact(1, 4) == pytest.approx(0.375)  # 2 * (C(5,0) + C(5,1)) / 2^5 = 2 * 6 / 32
    assert mcnemar_exact(0, 10) == pytest.approx(2 / 1024)
    assert mcnemar_exact(2, 2) == 1.0 and mcnemar_exact(0, 0) == 1.0  # capped at 1; no discordant pair
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)


def test_discordant_counts_worked_example():
    assert discordant_counts("1100", "1010") == (1, 1)
    assert discordant_counts("1110", "0000") == (3, 0)
    with pytest.raises(ValueError):
        discordant_counts("11", "110")


def test_t_interval_on_three_known_differences():
    # differences -0.10, -0.04, -0.07: mean -0.07, sample sd 0.03, half-width t(0.975, 2) * 0.03 / sqrt(3)
    option, baseline = {"0": 0.50, "1": 0.56, "2": 0.53}, {"0": 0.60, "1": 0.60, "2": 0.60}
    diff, half, num_pairs = paired_interval(option, baseline)
    assert num_pairs == 3 and diff == pytest.approx(-0.07) and half == pytest.approx(4.303 * 0.03 / 3**0.5)
    assert half == pytest.approx(0.07453, abs=1e-5)


def test_first_hacking_iteration_needs_strictly_more_than_the_thresholds():
    rows = [
        {"iteration": 1, "response/num_steps": 4.0, "response/truncated": 0.10},  # at the thresholds: not hacking
        {"iteration": 2, "response/num_steps": 3.9, "response/truncated": 0.11},
        {"iteration": 3, "response/num_steps": 4.2, "response/truncated": 0.2},
    ]
    assert first_hacking_iteration(rows[:1]) is None
    hacking = first_hacking_iteration(rows)
    assert hacking == {"iteration": 2, "steps": 3.9, "truncated": 0.11, "criteria": ["truncation"]}
    assert first_hacking_iteration(rows[2:])["criteria"] == ["steps", "truncation"]


def test_run_tag_keeps_variants_apart():
    assert run_tag("prm", "prm_seed0") == ""
    assert run_tag("prm_clip", "prm_clip_eta05_seed1") == "eta05"
    assert run_tag("prm_clip_delta", "prm_clip_delta_seed3") == ""
    assert run_tag("prm", "beta01_seed2") == "beta01"


def test_response_form_worked_example():
    form = response_form("1 + 2 = 3\n\n\n\n1 + 2 = 3\n\n- 2\n\nThe answer is 3.", "\n\n", truncated=False)
    assert (form.num_steps, form.num_repeated, form.num_junk, form.num_empty_paragraphs) == (4, 1, 1, 1)
    # the last step of a truncated response was cut by the cap: not junk
    assert response_form("1 + 2 = 3\n\nThe", "\n\n", truncated=True).num_junk == 0
    assert response_form("1 + 2 = 3\n\nThe", "\n\n", truncated=False).num_junk == 1


def test_shorten_keeps_one_line_and_cuts_the_middle():
    assert shorten("1 + 2 = 3\n\nThe answer is \\boxed{3}.") == "1 + 2 = 3\\n\\nThe answer is \\boxed{3}."
    cut = shorten("a" * 100 + "b" * 100, max_chars=30)
    assert cut == "a" * 20 + " … " + "b" * 10


def test_summary_on_a_small_study(tmp_path):
    _study(tmp_path / "runs")
    md = write_study_summary(*collect_runs([tmp_path / "runs"]), tmp_path / "out")
    lines = md.read_text().splitlines()
    assert "| prm | 3 | 1 of 3 | seed 2: 2 | 9.00 | 50.0 |" in lines
    assert any(l.startswith("| prm | 2 | yes, from iteration 2 (steps and truncation: 5.50 steps/resp") for l in lines)
    # greedy final: success 50, 40, 70 -> 53.3 ± 15.3; prm 60, 40, 40; differences +10, 0, -30 points
    assert "| success | 3 | 53.3 ± 15.3 | 53.3 ± 15.3 | 25.0 ± 0.0 | 25.0 ± 0.0 |" in lines
    paired = next(l for l in lines if l.startswith("| prm | 3 | ") and "[" in l)
    half = 4.303 * (((10 + 6.67) ** 2 + 6.67**2 + (30 - 6.67) ** 2) / 2) ** 0.5 / 3**0.5
    assert paired.split(" | ")[2] == f"-6.7 [{-6.67 - half:+.1f}, {-6.67 + half:+.1f}]"
    # McNemar per seed: seed 0 b=1 c=0 (p 1); seed 2 b=0 c=3 (p 0.25)
    assert "| prm | 0 | 3 | 10 | yes | 1 | 0 | +10.0 | 1.000 |" in lines
    assert "| prm | 2 | 3 | 10 | yes | 0 | 3 | -30.0 | 0.250 |" in lines
    # control: configured alpha 1; learned std 0.1 at iteration 1 and mean of 0.1, 0.2, 0.3 over the last 10;
    # learned mean of 0.1 * steps = 0.3, 0.55, 0.9 -> 0.583
    assert "| prm | 2 | 1.000 | n/a | 0.100 | 0.200 | 0.583 | yes (2) | -30.0 |" in lines
    assert any(l.startswith("| prm | 3 | 1 of 3 | 1.000 | 0.100 | 0.200 | -6.7 [") for l in lines)  # per option
    # form: the hacking run and, per option, the first seed that does not hack
    form = [l for l in lines if l.startswith(("| success_seed", "| prm_seed"))]
    assert [l.split(" | ")[0] for l in form] == ["| success_seed0", "| prm_seed0", "| prm_seed2"]
    # HACKED: 5 steps (empty paragraphs are not steps), 1 repeated, 1 junk ("- 2 = 0"; the cut "The answer"
    # is not), 2 empty paragraphs, truncated
    assert "| prm_seed2 | yes | 3 | 4 | 5.00 | 20.0 | 20.0 | 2.00 | 100.0 | 0.0 |" in lines
    assert any(l.startswith("- prm_seed2, iteration 3, 5 steps, finish length") for l in lines)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["generator"] == SUMMARY_GENERATOR and summary["runs"][0]["sampled_final"] == 0.25
    assert (tmp_path / "out" / "curves.png").stat().st_size > 0 and (tmp_path / "out" / "paired.png").exists()


def test_a_variant_is_its_own_option_and_the_control_shows_its_calibrated_alpha(tmp_path):
    _run(tmp_path, "success_seed0", "success", 0, "1111100000")
    _run(tmp_path, "prm_seed0", "prm", 0, "1111100000")
    _run(tmp_path, "prm_eta05_seed0", "prm", 0, "1111000000")
    _run(tmp_path, "prm_alpha_matched_seed0", "prm_alpha_matched", 0, "1111100000", alpha=0.125)
    runs, _ = collect_runs([tmp_path])
    assert [r.label for r in runs] == ["success", "prm", "prm_eta05", "prm_alpha_matched"]
    lines = write_study_summary(runs, [], tmp_path / "out").read_text().splitlines()
    assert "| prm_eta05 | 0 | 3 | 10 | yes | 0 | 1 | -10.0 | 1.000 |" in lines
    assert any(l.startswith("| prm_alpha_matched | 0 | 0.125 | 0.400 | 0.100 |") for l in lines)
    assert not any(l.startswith("| success | 0 | n/a | ") for l in lines)  # no learned reward: no control row


def test_different_problems_are_not_tested(tmp_path):
    _run(tmp_path, "success_seed0", "success", 0, "1111100000")
    prm = _run(tmp_path, "prm_seed0", "prm", 0, "1111110000")
    (prm / "heldout.jsonl").write_text((prm / "heldout.jsonl").read_text().replace('"abc"', '"def"'))
    text = write_study_summary(*collect_runs([tmp_path]), tmp_path / "out").read_text()
    assert "| prm | 0 | 3 | 10 | NO: not tested | n/a | n/a | n/a | n/a |" in text


def test_export_then_summarize_the_copies_reproduces_the_summary(tmp_path, capsys):
    _study(tmp_path / "study")
    (tmp_path / "study" / "prm_seed3").mkdir()
    (tmp_path / "study" / "prm_seed3" / "metrics.jsonl").write_text('{"iteration": 0}\n{"itera')  # still going
    main([str(tmp_path / "study"), "--out", str(tmp_path / "docs"), "--export"])
    assert "unfinished, left out: prm_seed3" in capsys.readouterr().out
    copy = tmp_path / "docs" / "runs" / "prm_seed2"
    assert not (tmp_path / "docs" / "runs" / "prm_seed3").exists()
    assert sorted(p.name for p in (copy / "rollouts").iterdir()) == ["iter_000003.jsonl"]
    assert (copy / ".hydra" / "config.yaml").exists() and (copy / "heldout.jsonl").exists()
    metrics = (copy / "metrics.jsonl").read_text()
    assert "time/iteration" not in metrics and "call/" not in metrics and "heldout/success" in metrics
    exported = {name: (tmp_path / "docs" / name).read_bytes() for name in ("summary.md", "summary.json")}
    main([str(tmp_path / "docs" / "runs"), "--out", str(tmp_path / "again")])
    for name, data in exported.items():
        assert (tmp_path / "again" / name).read_bytes() == data, name
    # from the original runs (the unfinished one set aside) the tables are the same too
    (tmp_path / "study" / "prm_seed3" / "metrics.jsonl").unlink()
    main([str(tmp_path / "study"), "--out", str(tmp_path / "direct")])
    assert (tmp_path / "direct" / "summary.md").read_bytes() == exported["summary.md"]


def test_unfinished_runs_are_listed_and_bad_files_named(tmp_path):
    _run(tmp_path, "success_seed0", "success", 0, "1111100000")
    going = _run(tmp_path, "prm_seed0", "prm", 0, "1111100000")
    (going / "summary.json").unlink()
    runs, unfinished = collect_runs([tmp_path])
    assert [r.name for r in runs] == ["success_seed0"] and unfinished == ["prm_seed0"]
    assert (
        write_study_summary(runs, unfinished, tmp_path / "out")
        .read_text()
        .endswith("- unfinished (left out): prm_seed0\n")
    )
    (going / "summary.json").write_text(json.dumps({"heldout_before": 0.2}))
    with (going / "metrics.jsonl").open("a") as f:
        f.write('{"iteration": 4, "response/num')
    with pytest.raises(StudyInputError, match=r"prm_seed0/metrics.jsonl:5: malformed JSON"):
        collect_runs([tmp_path])
    with pytest.raises(SystemExit, match=r"error: .*prm_seed0/metrics.jsonl:5"):
        main([str(tmp_path), "--out", str(tmp_path / "out")])


def test_a_finished_run_without_evaluations_is_an_error_naming_the_file(tmp_path):
    run = _run(tmp_path, "prm_seed0", "prm", 0, "1111100000")
    (run / "heldout.jsonl").unlink()
    with pytest.raises(StudyInputError, match=r"prm_seed0/heldout.jsonl: no such file"):
        collect_runs([tmp_path])
    (run / "heldout.jsonl").write_text(json.dumps({"iteration": 0, "problem_ids_sha256": "abc", "greedy": "11"}) + "\n")
    with pytest.raises(StudyInputError, match=r"heldout.jsonl: iteration 0 has greedy success 1.0"):
        collect_runs([tmp_path])
    (run / "heldout.jsonl").write_text(
        json.dumps({"iteration": 0, "problem_ids_sha256": "abc", "greedy": "1100000000"}) + "\n"
    )
    with pytest.raises(StudyInputError, match=r"heldout.jsonl: no held-out evaluation after training"):
        collect_runs([tmp_path])


def test_two_runs_of_one_option_and_seed_are_an_error(tmp_path):
    _run(tmp_path / "a", "prm_seed0", "prm", 0, "1111100000")
    with pytest.raises(StudyInputError, match="two runs named prm_seed0"):
        collect_runs([tmp_path / "a", tmp_path / "a"])
    _run(tmp_path / "b", "prm_seed0", "prm", 0, "1111100000")
    with pytest.raises(StudyInputError, match="two runs named prm_seed0"):
        collect_runs([tmp_path / "a", tmp_path / "b"])


def test_committed_study_summaries_regenerate_byte_for_byte(tmp_path):
    """docs/<study>/runs holds the runs behind docs/<study>/summary.*: summarizing them again gives the same bytes."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    checked = 0
    for runs in sorted(docs.glob("*/runs")):
        if not is_study_summary(runs.parent / "summary.json"):
            continue  # a sweep summary: test_summarize.py checks it
        out = tmp_path / runs.parent.name
        write_study_summary(*collect_runs([runs]), out)
        for name in ("summary.md", "summary.json"):
            assert (out / name).read_bytes() == (runs.parent / name).read_bytes(), f"{runs.parent / name} is stale"
        checked += 1
    if not checked:
        pytest.skip("no hacking-study summary committed under docs/ yet")
