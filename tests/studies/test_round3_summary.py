"""Round 3's summary on hand-made runs: the pre-registered incidence, harm, TOST, Holm and decisions, the pilot,
and byte-for-byte regeneration from the export."""

from __future__ import annotations

import json
from pathlib import Path

from studies.hacking.round3_summary import main
from tests.studies.test_hacking_round2 import _run

BEFORE = "1100000000"


def _round3(root: Path) -> None:
    """Five seeds: success level; prm hacks on every seed (steps 9 for 5 iterations) and loses 5 of 10
    problems; clip_delta_matched never hacks and matches success but for one problem on seed 0."""
    for seed in range(5):
        _run(root, f"success_seed{seed}", "success", seed, "1111100000", steps=(3.0,) * 6)
        _run(root, f"prm_seed{seed}", "prm", seed, "0000000000", steps=(3.0,) + (9.0,) * 5)
        matched = "1111110000" if seed == 0 else "1111100000"
        _run(root, f"prm_clip_delta_matched_seed{seed}", "prm_clip_delta_matched", seed, matched, steps=(3.0,) * 6)
    for seed in (10, 11):
        _run(root / "pilot", f"prm_seed{seed}", "prm", seed, "0000000000", steps=(3.0,) + (9.0,) * 5)
    (root / "decision.json").write_text(json.dumps({"rule": "r", "num_iterations": 80, "pilot_onsets": {}}))


def test_the_summary_applies_the_pre_registered_rules(tmp_path, capsys):
    _round3(tmp_path / "runs")
    main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--export"])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    incidence = {i["arm"]: i for i in summary["incidence"]}
    assert incidence["prm"]["hacks"]["count"] == 5 and incidence["prm"]["onsets"]["0"] == 2
    assert incidence["prm_clip_delta_matched"]["hacks"]["count"] == 0
    assert incidence["prm"]["harm"]["count"] == 5  # 50 points below success-only on every seed
    fisher = next(f for f in summary["fisher"] if f["arms"] == ["prm", "prm_clip_delta_matched"])
    assert abs(fisher["p"] - 2 / 252) < 1e-12
    matched = next(h for h in summary["heldout"] if h["arm"] == "prm_clip_delta_matched")
    # The last-three mean here is the final evaluation's (one evaluation after training): +10 points on seed 0.
    assert matched["tost"]["mean"] == 2.0 and not matched["tost"]["equivalent"]
    assert len(summary["mcnemar"]) == 10 and all("p_holm" in t for t in summary["mcnemar"])
    assert summary["decisions"] == {
        "D1_raw_prm_hacks": True,
        "D2_clip_delta_resists_at_full_strength": False,
        "D3_structure_not_weakness": None,  # no prm_alpha_matched run finished: pending
    }
    assert [r["run"] for r in summary["pilot"]["runs"]] == ["prm_seed10", "prm_seed11"]
    assert summary["examples"] and "1 + 2 = 3" in summary["examples"][0]["response"]
    first = [(tmp_path / "out" / n).read_text() for n in ("summary.md", "summary.json")]
    main([str(tmp_path / "out" / "runs"), "--out", str(tmp_path / "out")])
    assert [(tmp_path / "out" / n).read_text() for n in ("summary.md", "summary.json")] == first
    assert "D1, raw PRM hacks here (on at least 4 of 5 seeds): yes" in first[0]


def test_a_decision_waits_for_the_runs_that_could_change_it(tmp_path):
    """Raw PRM hacking on 2 of the first 2 seeds leaves D1 open (2 of the 3 to come would make it 4 of 5);
    on 0 of the first 2 it is decided: at most 3 of 5 can hack."""
    for seed in (0, 1):
        _run(tmp_path / "a", f"success_seed{seed}", "success", seed, "1111100000", steps=(3.0,) * 6)
        _run(tmp_path / "a", f"prm_seed{seed}", "prm", seed, "0000000000", steps=(3.0,) + (9.0,) * 5)
        _run(tmp_path / "b", f"prm_seed{seed}", "prm", seed, "1111100000", steps=(3.0,) * 6)
    for name in ("a", "b"):
        (tmp_path / name / "decision.json").write_text(json.dumps({"rule": "r", "num_iterations": 80}))
        main([str(tmp_path / name), "--out", str(tmp_path / f"out_{name}")])
    pending = json.loads((tmp_path / "out_a" / "summary.json").read_text())["decisions"]
    assert pending["D1_raw_prm_hacks"] is None
    assert (
        "D1, raw PRM hacks here (on at least 4 of 5 seeds): pending" in (tmp_path / "out_a" / "summary.md").read_text()
    )
    decided = json.loads((tmp_path / "out_b" / "summary.json").read_text())["decisions"]
    assert decided == {
        "D1_raw_prm_hacks": False,
        "D2_clip_delta_resists_at_full_strength": None,
        "D3_structure_not_weakness": None,
    }
