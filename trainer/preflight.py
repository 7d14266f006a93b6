"""`python train.py run.dry_run=true`: what a run would hit, checked before Ray starts or any weights load.

    config   keys and values (train.py's command line checked them against the schema already)
    data     every record of the training and held-out sets parses; how many there are
    models   the policy, the critic and the reward model are where the run will look, without a download
    function a user reward function (``reward.function``) imports and takes the four parameters
    resume   what a launch into the run directory does (``trainer.run_dir.check_resume``)
    plan     the execution plan, one line per call, and whether it fits the devices' memory

``preflight`` returns the report's lines and the problems found; train.py prints the lines and, when
there is a problem, exits with status 1 and the first problem as its last line. Only a dry run that
finds nothing wrong writes into the run directory (its plan.yaml).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trainer.config import TrainConfig


def preflight(cfg: TrainConfig, run_dir: Path | None) -> tuple[list[str], list[str]]:
    """Every check of the module docstring, in order; (report lines, problems)."""
    from mathtask.data import DataError
    from models.registry import ModelNotAvailable
    from planning.execution_plan import PlanError
    from rewards.reward_model import RewardModelError
    from trainer.loop import TrainingError
    from trainer.run_dir import ResumeError

    lines = ["config: ok (schema: trainer/config.py)"]
    problems: list[str] = []

    def check(label: str, describe: Callable[[], str]) -> None:
        try:
            lines.append(f"{label}: {describe()}")
        except (DataError, ModelNotAvailable, RewardModelError, ResumeError, TrainingError, PlanError) as e:
            lines.append(f"{label}: FAILED: {e}")
            problems.append(f"{label}: {e}")

    check("data", lambda: describe_data(cfg))
    check("model", lambda: _locate_model(cfg.model))
    if cfg.algorithm.has_critic and not cfg.critic.from_policy:
        check("critic", lambda: _locate_model(cfg.critic.model))
    if cfg.reward.has_model:
        check("reward model", lambda: _locate_reward_model(cfg.reward.model.path))
    if cfg.reward.function:
        check("reward function", lambda: _import_reward_function(cfg))
    if run_dir is not None:
        from trainer.run_dir import check_resume

        notes: list[str] = []  # a damaged checkpoint passed over, one line each
        check("resume", lambda: " ".join([check_resume(cfg, run_dir, notes.append), *notes]))
    from trainer.plan_select import PLAN_FILE, plan_report

    longest: list[int | None] = [None]

    def prompts() -> str:
        longest[0] = longest_training_prompt(cfg)
        if longest[0] is None:
            return "the policy's tokenizer is not here yet: time is priced at rollout.max_prompt_tokens"
        return f"the longest training prompt is {longest[0]} tokens (the plan's time is priced at it, as the run's)"

    check("prompts", prompts)
    try:
        report = plan_report(cfg, longest_prompt=longest[0])
    except PlanError as e:
        lines.append(f"plan: FAILED: {e}")
        return lines, problems + [f"plan: {e}"]
    lines += report.lines
    problems += [report.problem] if report.problem else []
    if run_dir is not None and not problems:  # a failed check writes nothing
        report.plan.save(run_dir / PLAN_FILE)
        lines.append(f"written: {run_dir / PLAN_FILE} (run it with cluster.plan=<that path>)")
    return lines + [report.summary], problems


def _import_reward_function(cfg: TrainConfig) -> str:
    """``reward.function`` imported and its signature checked (``trainer.loop.check_reward_function``)."""
    from trainer.loop import check_reward_function

    check_reward_function(cfg)
    r = cfg.reward
    form = "lists in, a list out" if r.function_batched else "one response per call"
    return f"{r.function} imports and takes (prompt, response, answer, metadata); {form}; weight {r.function_weight:g}"


def describe_data(cfg: TrainConfig) -> str:
    """``2000 training prompts (synthetic), 200 held-out problems (synthetic)``: every record is read."""
    from trainer.loop import load_data

    train, heldout = load_data(cfg)
    return f"{len(train)} training prompts ({cfg.data.name}), {len(heldout)} held-out problems ({cfg.data.heldout})"


def longest_training_prompt(cfg: TrainConfig) -> int | None:
    """Tokens of the longest rendered training prompt, at which the run prices its plan
    (``trainer.loop.longest_prompt``), when the policy's tokenizer is on this machine already; None when it
    is not (nothing is built or downloaded here). A prompt over ``rollout.max_prompt_tokens`` raises DataError."""
    from transformers import AutoTokenizer

    from models.registry import cached_model_dir
    from trainer.loop import load_data, longest_prompt, render_prompts

    model_dir = cached_model_dir(cfg.model)
    if model_dir is None:
        return None
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError):  # a hub cache with the config but not the tokenizer's files
        return None
    train, _ = load_data(cfg)
    return longest_prompt(render_prompts(cfg, tokenizer, train)[1], train)


def _locate_model(model) -> str:
    from models.registry import locate_model

    return f"{model.name}: {locate_model(model)}"


def _locate_reward_model(path: str) -> str:
    from rewards.build import locate_reward_model

    return f"{path}: {locate_reward_model(path)}"
