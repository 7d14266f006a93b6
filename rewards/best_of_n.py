"""Best-of-N with a reward model: ``eval.best_of_n``'s reranking, scored by an ORM or a PRM.

    python -m rewards.best_of_n RUN_DIR --rm builtin:synthetic-prm --kind prm
    python -m rewards.best_of_n RUN_DIR --rm /models/math-shepherd --kind prm --aggregations min,last

RUN_DIR is an evaluation run with n > 1 samples per problem (``python -m eval ... num_samples=16
temperature=0.7``); the curves, table and plot are written into it (see ``eval.best_of_n``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eval.best_of_n import Scorer, aggregate, run_best_of_n
from rewards.config import RewardKind, RewardModelConfig
from rewards.reward_model import load_reward_model
from rewards.segment import split_steps


def reward_model_scorer(path: str, kind: str, step_delimiter: str = "") -> Scorer:
    """An ``eval.best_of_n.Scorer`` that reads a reward model; ``builtin:`` ones are trained if not cached."""
    model_dir = Path(path)
    if path.startswith("builtin:"):
        from rewards.train_rm import ensure_builtin

        model_dir = ensure_builtin(path)
    rm = load_reward_model(model_dir, RewardModelConfig(path=path), RewardKind(kind))
    delimiter = step_delimiter or rm.info.get("step_delimiter", "\n\n")

    def score(pairs: Sequence[tuple[str, str]]) -> list[Any]:
        questions = [q for q, _ in pairs]
        if kind == "orm":
            return rm.score_outcomes(questions, [r for _, r in pairs])
        return rm.score_steps(questions, [split_steps(r, delimiter) for _, r in pairs])

    return score


def main(argv: list[str] | None = None) -> int:
    from common.cli import ArgumentParser, fail

    parser = ArgumentParser(
        prog="python -m rewards.best_of_n", description="Rerank sampled responses with a reward model."
    )
    parser.add_argument("run_dir", help="an evaluation run directory with n > 1 samples per problem")
    parser.add_argument(
        "--rm", required=True, help="reward model directory or builtin:synthetic-prm / builtin:synthetic-orm"
    )
    parser.add_argument("--kind", choices=("orm", "prm"), required=True)
    parser.add_argument("--aggregations", default="min,last,product", help="PRM aggregations (comma-separated)")
    parser.add_argument(
        "--step-delimiter", default="", help="PRM step delimiter (default: the RM's own, else a blank line)"
    )
    args = parser.parse_args(argv)
    aggregations = [a for a in args.aggregations.split(",") if a]
    run_dir = Path(args.run_dir)
    try:
        for a in aggregations:
            aggregate([1.0], a)  # validate names before the (slow) scoring
        scorer = reward_model_scorer(args.rm, args.kind, args.step_delimiter)
        result = run_best_of_n(run_dir, scorer, args.kind, aggregations, args.rm)
    except (ValueError, OSError) as e:
        fail(str(e))
    print(json.dumps(result["curves"]), file=sys.stderr)
    print(run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
