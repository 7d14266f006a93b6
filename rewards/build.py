"""The reward function the trainer calls: responses in, a [B, T] token-level reward tensor out.

For response b with T_b tokens and steps 1..K_b ending on tokens e_1 <= ... <= e_K = T_b - 1:

    token_rewards[b, T_b - 1]  += Correct(q, s)                      (every kind)
    token_rewards[b, T_b - 1]  += alpha * ORM(q, s)                  (kind orm)
    token_rewards[b, e_k]      += alpha * r_k,  r = refine(c_1..c_K)  (kind prm)

The trainer adds -beta * (log pi - log pi_ref) on every token and runs GAE (gamma = 1 in the paper).
Success is always graded by mathtask.grade, so the training reward and the evaluation metric agree.
Steps are always counted, whatever the kind, because step inflation is how PRM hacking shows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

import torch

from rewards.config import BUILTIN_REWARD_MODELS, Refinement, RewardConfig, RewardKind
from rewards.eta import eta_for_zero_fraction, zero_fraction
from rewards.refine import refine_batched
from rewards.reward_model import Body, RewardModel, RewardModelError, load_reward_model
from rewards.segment import SegmentedResponse, Step, segment_response
from rewards.types import RewardBatch, RewardFn, RewardSample, function_metrics
from rewards.user_fn import FunctionRef, UserRewardFunction, check_value

__all__ = [
    "RewardBatch",
    "RewardFn",
    "RewardSample",
    "ShapedReward",
    "build_reward_fn",
    "place_token_rewards",
    "resolve_reward_model",
]


class GradeFn(Protocol):
    """mathtask.grade.grade_many's shape: one result with .correct and .extracted per response."""

    def __call__(self, responses: list[str], golds: list[str], datasets: list[str]) -> list[Any]: ...


class StepScorer(Protocol):
    """A PRM: c_k in [0, 1] for every step of every response."""

    def score_steps(self, questions: Sequence[str], steps: Sequence[Sequence[Step]]) -> list[list[float]]: ...


class OutcomeScorer(Protocol):
    """An ORM: one score in [0, 1] per response."""

    def score_outcomes(self, questions: Sequence[str], responses: Sequence[str]) -> list[float]: ...


def place_token_rewards(
    lengths: torch.Tensor,
    final_rewards: torch.Tensor,
    step_rewards: torch.Tensor,
    step_end_index: torch.Tensor,
    step_mask: torch.Tensor,
    num_tokens: int,
) -> torch.Tensor:
    """The [B, T] token-level reward tensor.

    lengths [B] long: response lengths T_b (0 allowed: that row stays 0).
    final_rewards [B]: added on token T_b - 1 (success, plus alpha * ORM).
    step_rewards [B, S]: added on token step_end_index[b, k] where step_mask[b, k]; steps that end on
        the same token add up there.
    Returns [B, num_tokens] float32, 0 past each response.
    """
    batch = lengths.shape[0]
    rewards = torch.zeros(batch, num_tokens, dtype=torch.float32)
    if num_tokens == 0:
        return rewards
    rewards.scatter_add_(1, step_end_index.long() * step_mask, (step_rewards * step_mask).float())
    has_tokens = lengths > 0
    rows = torch.arange(batch)[has_tokens]
    rewards[rows, lengths[has_tokens] - 1] += final_rewards[has_tokens].float()
    return rewards


def _default_grade(responses: list[str], golds: list[str], datasets: list[str]) -> list[Any]:
    from mathtask.grade import grade_many

    return grade_many(responses, golds, datasets=datasets)


def step_layout(segments: Sequence[SegmentedResponse]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where each response's steps end, padded to the most steps S in the batch.

    Returns num_steps [B] long, step_end_index [B, S] long (token index of step k's last token, 0
    past the response's steps) and step_mask [B, S] bool.
    Worked example: steps ending on tokens (2, 5) and (4,) -> num_steps [2, 1],
    step_end_index [[2, 5], [4, 0]], step_mask [[True, True], [True, False]].
    """
    batch = len(segments)
    num_steps = torch.tensor([seg.num_steps for seg in segments], dtype=torch.long)
    max_steps = int(num_steps.max()) if batch else 0
    step_end_index = torch.zeros(batch, max_steps, dtype=torch.long)
    step_mask = torch.zeros(batch, max_steps, dtype=torch.bool)
    for b, seg in enumerate(segments):
        step_end_index[b, : seg.num_steps] = torch.tensor(seg.end_token_index, dtype=torch.long)
        step_mask[b, : seg.num_steps] = True
    return num_steps, step_end_index, step_mask


class ShapedReward:
    """RewardFn: success + alpha * (ORM on the final token | refined PRM step rewards on step-end tokens).

    The pieces are passed in (composition): a grader, a reward model (or None for success only) and
    the policy tokenizer that segments responses. Tests pass stand-ins with known scores.
    """

    def __init__(
        self,
        cfg: RewardConfig,
        policy_tokenizer,
        reward_model: StepScorer | OutcomeScorer | None = None,
        grade_fn: GradeFn | Callable[..., list[Any]] | None = None,
        user_fn: UserRewardFunction | None = None,
    ):
        """``user_fn``: the user's reward function (``reward.function``; built here from the config when None)."""
        if cfg.has_model and reward_model is None:
            raise RewardModelError(f"reward.kind={cfg.kind.value} needs a reward model")
        self.cfg = cfg
        self.tokenizer = policy_tokenizer
        self.reward_model = reward_model
        self.grade_fn = grade_fn or _default_grade
        self.eta = cfg.eta
        self.alpha = cfg.alpha
        self._calibrate = cfg.eta_zero_fraction is not None or cfg.alpha_matched_to is not None
        if user_fn is None and cfg.function:
            user_fn = UserRewardFunction(FunctionRef.parse(cfg.function), cfg.function_timeout_s, cfg.function_batched)
        self.user_fn = user_fn
        self.function_eta: float | None = None
        """Clip's threshold for the function's step rewards (calibrated on its first ones, as eta is)."""

    def calibration(self) -> dict[str, float]:
        """What the first call calibrated (Clip's eta, the control's alpha, the function's eta): a resumed run
        or another replica loads it with ``set_calibration`` so that every call uses the first rollouts'."""
        out = {"eta": self.eta, "alpha": self.alpha}
        if self.function_eta is not None:
            out["function_eta"] = self.function_eta
        return out

    def set_calibration(self, state: dict[str, float]) -> None:
        """Fix eta and alpha (turns off calibration on the first call)."""
        if not 0.0 <= state["eta"] <= 1.0:
            raise ValueError(f"eta={state['eta']}: must lie in [0, 1]")
        self.eta, self.alpha, self._calibrate = state["eta"], state["alpha"], False
        self.function_eta = state.get("function_eta", self.function_eta)

    def __call__(self, samples: Sequence[RewardSample]) -> RewardBatch:
        cfg = self.cfg
        batch = len(samples)
        lengths = torch.tensor([len(s.response_token_ids) for s in samples], dtype=torch.long)
        num_tokens = int(lengths.max()) if batch else 0
        graded = self.grade_fn(
            [s.response_text for s in samples], [s.gold for s in samples], [s.dataset for s in samples]
        )
        success = torch.tensor([float(g.correct) for g in graded], dtype=torch.float32)
        segments = [segment_response(s.response_token_ids, self.tokenizer, cfg.step_delimiter) for s in samples]
        num_steps, step_end_index, step_mask = step_layout(segments)
        step_rewards = torch.zeros(step_mask.shape)
        learned = torch.zeros(batch)
        step_scores: list[list[float]] = [[] for _ in samples]
        metrics: dict[str, float] = {}
        if cfg.kind == RewardKind.orm:
            learned = self._orm_rewards(samples, segments, lengths, metrics)
        elif cfg.kind == RewardKind.prm:
            step_scores = self._score_steps(samples, segments)
            step_rewards = self._prm_step_rewards(step_scores, step_mask, metrics)
            learned = step_rewards.sum(dim=1)
        final = success * (cfg.kind != RewardKind.function) + learned * (cfg.kind == RewardKind.orm)
        values = None
        if self.user_fn is not None:
            values, fn_final, fn_steps = self._function_rewards(samples, segments, step_mask)
            final, step_rewards = final + fn_final, step_rewards + fn_steps
            metrics.update(function_metrics(self.user_fn.name, values))
        token_rewards = place_token_rewards(lengths, final, step_rewards, step_end_index, step_mask, num_tokens)
        if batch:
            metrics.update(self._batch_metrics(success, learned, step_rewards, step_mask, num_steps, lengths))
        return RewardBatch(
            token_rewards=token_rewards,
            success=success,
            learned=learned,
            step_scores=step_scores,
            num_steps=num_steps,
            extracted=[g.extracted for g in graded],
            metrics=metrics,
            function_values=values,
            function_name=None if self.user_fn is None else self.user_fn.name,
        )

    def _batch_metrics(
        self,
        success: torch.Tensor,
        learned: torch.Tensor,
        step_rewards: torch.Tensor,
        step_mask: torch.Tensor,
        num_steps: torch.Tensor,
        lengths: torch.Tensor,
    ) -> dict[str, float]:
        metrics = {
            "reward/success": float(success.mean()),
            "reward/learned": float(learned.mean()),
            "reward/learned_std": float(learned.std(correction=0)),
            "reward/num_steps": float(num_steps.float().mean()),
            "reward/response_tokens": float(lengths.float().mean()),
        }
        if self.cfg.has_model:
            # How much of the batch the learned reward reaches at all: Clip-Delta leaves most steps at exactly 0.
            metrics["reward/nonzero_response_fraction"] = float((learned != 0).float().mean())
            if self.cfg.kind == RewardKind.prm and step_mask.any():
                metrics["reward/nonzero_step_fraction"] = float((step_rewards[step_mask] != 0).float().mean())
        return metrics

    def _function_rewards(
        self, samples: Sequence[RewardSample], segments: Sequence[SegmentedResponse], step_mask: torch.Tensor
    ) -> tuple[list[float | list[float]], torch.Tensor, torch.Tensor]:
        """The user's function on every response: its values as returned, its weighted outcome part [B] and its
        weighted, refined per-step part [B, S] (refined as this option refines PRM scores, with its own eta)."""
        cfg, fn = self.cfg, self.user_fn
        assert fn is not None
        calls = [
            (
                s.question,
                s.response_text,
                s.gold,
                {
                    "problem_id": s.problem_id,
                    "dataset": s.dataset,
                    "prompt_text": s.prompt_text,
                    "steps": seg.contents,
                    "truncated": s.truncated,
                },
            )
            for s, seg in zip(samples, segments)
        ]
        ids = [s.problem_id or f"#{i}" for i, s in enumerate(samples)]
        raw = fn(calls, ids)
        values = [check_value(v, seg.num_steps, fn.ref, pid) for v, seg, pid in zip(raw, segments, ids)]
        final = torch.tensor([v if isinstance(v, float) else 0.0 for v in values])
        per_step = torch.zeros(step_mask.shape)
        is_list = torch.tensor([isinstance(v, list) for v in values], dtype=torch.bool)
        for b, v in enumerate(values):
            if isinstance(v, list) and v:
                per_step[b, : len(v)] = torch.tensor(v)
        lists = [v for v in values if isinstance(v, list)]
        refined = self._refine_function_steps(per_step, step_mask & is_list[:, None], lists)
        return values, cfg.function_weight * final, cfg.function_weight * refined

    def _refine_function_steps(
        self, per_step: torch.Tensor, mask: torch.Tensor, lists: list[list[float]]
    ) -> torch.Tensor:
        """The option's refinement of the function's step values [B, S] where ``mask`` (responses it returned a
        list for); Clip's threshold read off its first step values as ``eta_zero_fraction`` says, else reward.eta."""
        cfg = self.cfg
        clipped = cfg.refinement in (Refinement.clip, Refinement.clip_delta)
        if clipped and self.function_eta is None:
            fraction = cfg.eta_zero_fraction
            self.function_eta = (
                eta_for_zero_fraction(lists, fraction) if fraction is not None and any(lists) else cfg.eta
            )
        eta = cfg.eta if self.function_eta is None else self.function_eta
        return refine_batched(per_step, mask, cfg.refinement, eta)

    def run_reward_model(self, samples: Sequence[RewardSample]) -> None:
        """The reward model's part of ``__call__`` alone, on the same inputs, results dropped: the
        ranks of a sharded reward model other than the one that reports run this beside its
        ``__call__`` (their forward is collective with it), without grading the responses again."""
        segments = [segment_response(s.response_token_ids, self.tokenizer, self.cfg.step_delimiter) for s in samples]
        if self.cfg.kind == RewardKind.orm:
            self._outcome_scores(samples, segments)
        elif self.cfg.kind == RewardKind.prm:
            self._score_steps(samples, segments)

    def _outcome_scores(self, samples: Sequence[RewardSample], segments: Sequence[SegmentedResponse]) -> list[float]:
        orm = cast(OutcomeScorer, self.reward_model)  # kind orm: the constructor required one
        return orm.score_outcomes([s.question for s in samples], [seg.text for seg in segments])

    def _orm_rewards(
        self,
        samples: Sequence[RewardSample],
        segments: Sequence[SegmentedResponse],
        lengths: torch.Tensor,
        metrics: dict[str, float],
    ) -> torch.Tensor:
        """alpha * ORM score per response [B] (0 for an empty response); adds the mean score to ``metrics``."""
        scores = torch.tensor(self._outcome_scores(samples, segments))
        metrics["reward/orm_score"] = float(scores.mean()) if len(samples) else 0.0
        return self.alpha * scores * (lengths > 0)

    def _prm_step_rewards(
        self, step_scores: list[list[float]], step_mask: torch.Tensor, metrics: dict[str, float]
    ) -> torch.Tensor:
        """alpha * refine(c_1..c_K) per step [B, S] (0 past each response's steps).

        The first call calibrates eta (``eta_zero_fraction``) and alpha (``alpha_matched_to``); adds the
        mean step score, the zero-clip fraction, eta and alpha to ``metrics``.
        """
        cfg = self.cfg
        scores = torch.zeros(step_mask.shape)
        for b, c in enumerate(step_scores):
            scores[b, : len(c)] = torch.tensor(c)
        if self._calibrate:
            self._calibrate_on(step_scores, scores, step_mask)
        step_rewards = self.alpha * refine_batched(scores, step_mask, cfg.refinement, self.eta)
        if step_mask.any():
            metrics["reward/step_score"] = float(scores[step_mask].mean())
            metrics["reward/zero_clip_fraction"] = zero_fraction(step_scores, self.eta)
        if cfg.refinement in (Refinement.clip, Refinement.clip_delta) or cfg.alpha_matched_to is not None:
            metrics["reward/eta"] = self.eta
        if cfg.alpha_matched_to is not None:
            metrics["reward/alpha"] = self.alpha
        return step_rewards

    def _calibrate_on(self, step_scores: list[list[float]], scores: torch.Tensor, step_mask: torch.Tensor) -> None:
        """eta = the score quantile that gives ``eta_zero_fraction`` of the steps 0 under Clip; then, for
        the control, alpha = alpha * std_b(sum_k target_refine(c)_bk) / std_b(sum_k c_bk) over responses b."""
        cfg = self.cfg
        if cfg.eta_zero_fraction is not None:
            self.eta = eta_for_zero_fraction(step_scores, cfg.eta_zero_fraction)
        if cfg.alpha_matched_to is not None:
            target = refine_batched(scores, step_mask, cfg.alpha_matched_to, self.eta).sum(dim=1).std(correction=0)
            raw = refine_batched(scores, step_mask, cfg.refinement, self.eta).sum(dim=1).std(correction=0)
            if not float(raw) > 0:
                raise RewardModelError("alpha_matched_to: the raw PRM reward has no spread on the first rollouts")
            self.alpha = cfg.alpha * float(target / raw)
        self._calibrate = False

    def _score_steps(self, samples: Sequence[RewardSample], segments: Sequence[SegmentedResponse]) -> list[list[float]]:
        """c_k for every response with at least one step (an empty response has none)."""
        scored = [b for b, seg in enumerate(segments) if seg.num_steps]
        out: list[list[float]] = [[] for _ in samples]
        prm = cast(StepScorer, self.reward_model)  # kind prm: the constructor required one
        results = prm.score_steps([samples[b].question for b in scored], [segments[b].steps for b in scored])
        for b, c in zip(scored, results):
            if len(c) != segments[b].num_steps:
                raise RewardModelError(f"reward model returned {len(c)} scores for {segments[b].num_steps} steps")
            out[b] = c
        return out


def resolve_reward_model(path: str) -> Path:
    """A local HF directory for reward.model.path: a trained built-in, a directory, or a hub id.

    Only finds: training a built-in is its own step (``rewards.train_rm.ensure_builtin``, which the
    training driver runs before start, or ``python -m rewards.train_rm kind=prm``).
    """
    if path in BUILTIN_REWARD_MODELS:
        from common.files import is_complete
        from rewards.rm_config import builtin_config, default_output_dir

        cfg = builtin_config(path)
        target = default_output_dir(cfg)
        if not is_complete(target):
            raise RewardModelError(
                f"reward.model.path={path} is not trained yet ({target}): train it with "
                f"`python -m rewards.train_rm kind={cfg.kind.value}` (train.py does this before it starts)"
            )
        return target
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").exists():
            raise RewardModelError(f"reward.model.path={path}: {local} has no config.json (not an HF model directory)")
        return local
    if local.exists() or path.startswith((".", "/", "~")):
        raise RewardModelError(f"reward.model.path={path}: no such reward-model directory")
    from models.config import ModelConfig, ModelSource
    from models.registry import ModelNotAvailable, resolve_model_dir

    try:
        return resolve_model_dir(ModelConfig(name="reward-model", source=ModelSource.hf, path=path))
    except ModelNotAvailable as e:
        raise RewardModelError(f"reward.model.path={path}: {e}") from None


def locate_reward_model(path: str) -> str:
    """Where ``resolve_reward_model`` will find ``path``, said without training or downloading anything
    (the dry run's check); RewardModelError when a run would not find it."""
    if path in BUILTIN_REWARD_MODELS:
        from common.files import is_complete
        from rewards.rm_config import builtin_config, default_output_dir

        target = default_output_dir(builtin_config(path))
        return f"{target} (cached)" if is_complete(target) else f"trained into {target} before the run starts"
    local = Path(path).expanduser()
    if local.is_dir() or local.exists() or path.startswith((".", "/", "~")):
        return str(resolve_reward_model(path))
    from models.config import ModelConfig, ModelSource
    from models.registry import ModelNotAvailable, locate_model

    try:
        return locate_model(ModelConfig(name="reward-model", source=ModelSource.hf, path=path))
    except ModelNotAvailable as e:
        raise RewardModelError(f"reward.model.path={path}: {e}") from None


def build_reward_fn(
    cfg: RewardConfig,
    policy_tokenizer,
    device: str = "cpu",
    shard: Callable[[Any], Body | None] | None = None,
    num_microbatches: int = 1,
    compute_dtype: str = "float32",
    on_host: bool = False,
) -> RewardFn:
    """Load what ``cfg`` needs (a missing or mismatched reward model fails here, before any rollout);
    ``shard``, ``num_microbatches``, ``compute_dtype``, ``on_host``: how to shard the reward model, split
    its calls, in which dtype it loads and whether it starts in host memory (``load_reward_model``)."""
    if not cfg.has_model:
        return ShapedReward(cfg, policy_tokenizer)
    model_dir = resolve_reward_model(cfg.model.path)
    reward_model: RewardModel = load_reward_model(
        model_dir, cfg.model, cfg.kind, device, shard, num_microbatches, compute_dtype, on_host
    )
    trained_with = reward_model.info.get("step_delimiter")
    if cfg.kind == RewardKind.prm and trained_with is not None and trained_with != cfg.step_delimiter:
        raise RewardModelError(
            f"the PRM in {model_dir} was trained on steps joined by {trained_with!r}, but reward.step_delimiter="
            f"{cfg.step_delimiter!r} would cut the policy's responses differently; set reward.step_delimiter={trained_with!r}"
        )
    return ShapedReward(cfg, policy_tokenizer, reward_model)
