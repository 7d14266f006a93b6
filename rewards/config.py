"""Typed reward config: the `reward/` config group composes onto this schema.

The reward of one response (Gao et al. 2024, section 1; docs/rewards.md), before the trainer adds
the per-token KL term:

- success:  Correct(q, s) in {0, 1} on the final token (the shared grader, mathtask.grade);
- orm:      success + alpha * ORM(q, s) on the final token;
- prm:      success + alpha * r_k on the last token of every step k, r = refinement(c_1..c_K).

Bad values fail here, when the config is composed, with the key named. A reward model that cannot
be found fails when the reward function is built (`rewards.build.build_reward_fn`), before any rollout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from common.dtypes import check_dtype


class RewardKind(Enum):
    success = "success"
    """Correct(q, s) in {0, 1} on the final token only."""
    orm = "orm"
    """success + alpha * ORM(q, s) on the final token."""
    prm = "prm"
    """success + alpha * refined PRM step rewards on each step's last token."""
    function = "function"
    """The user's function alone (``reward.function``; no success reward on the tokens, success still logged)."""


class Refinement(Enum):
    none = "none"
    """Raw PRM: r_k = c_k (hackable: more steps, more reward)."""
    clip = "clip"
    """r_k = min(c_k - eta, 0)."""
    delta = "delta"
    """r_k = c_k - c_{k+1} (k < K-1), r_{K-1} = c_{K-1}, r_K = 0."""
    clip_delta = "clip_delta"
    """Clip, then Delta on the clipped scores."""


class Readout(Enum):
    """How a reward model's scores in [0, 1] are read from its outputs."""

    auto = "auto"
    """From the model dir's realm_rm.json (written by rewards.train_rm), else from its architecture."""
    value_head = "value_head"
    """A token-classification head (num_labels 1: sigmoid; 2: softmax[1]) read at each step's last token."""
    step_tag = "step_tag"
    """A causal LM, Math-Shepherd style: P(good) / (P(good) + P(bad)) at the step-tag token after each step."""
    seq_cls = "seq_cls"
    """A sequence-classification head at the last token (sigmoid): ORM only."""


BUILTIN_REWARD_MODELS = ("builtin:synthetic-prm", "builtin:synthetic-orm")


@dataclass
class RewardModelConfig:
    path: str = ""
    """HF directory of the reward model, a hub id, or `builtin:synthetic-prm` / `builtin:synthetic-orm`
    (trained on the synthetic task on first use, from the tiny model, and cached; see rewards.train_rm)."""
    readout: Readout = Readout.auto
    question_template: str | None = None
    """Text before the response in the RM input; `{question}` is replaced. None: the model dir's
    realm_rm.json, else "{question}\\n\\n". Math-Shepherd checkpoints want "{question} "."""
    step_tag: str | None = None
    """step_tag readout: the tag appended to each step's text, e.g. " ки" (Math-Shepherd). None: from
    realm_rm.json, else none (value_head) or " ки" (step_tag)."""
    good_token: str | None = None
    """step_tag readout: the 'good step' token (default "+"); must be one token."""
    bad_token: str | None = None
    """step_tag readout: the 'bad step' token (default "-"); must be one token."""
    batch_size: int = 16
    """Responses per reward-model forward pass."""
    max_length: int = 0
    """Longest RM input in tokens (0: the model's max_position_embeddings); longer inputs keep their end."""
    dtype: str = "auto"
    """The reward model's weights: auto (the run's compute dtype, model.dtype, as the cost model prices
    them), float32, bfloat16 or float16 (GPU)."""

    def __post_init__(self) -> None:
        if self.path.startswith("builtin:") and self.path not in BUILTIN_REWARD_MODELS:
            raise ValueError(
                f"reward.model.path={self.path!r}: unknown built-in; expected one of {BUILTIN_REWARD_MODELS}"
            )
        if self.batch_size < 1:
            raise ValueError(f"reward.model.batch_size={self.batch_size}: must be >= 1")
        if self.dtype != "auto":
            check_dtype(self.dtype, "reward.model.dtype")


@dataclass
class RewardConfig:
    kind: RewardKind = RewardKind.success
    refinement: Refinement = Refinement.none
    alpha: float = 1.0
    """Weight of the learned reward relative to the success reward (weight 1)."""
    eta: float = 0.5
    """Clip threshold in [0, 1]: under Clip a step scoring c_k >= eta gets 0, a lower one c_k - eta < 0."""
    eta_zero_fraction: float | None = None
    """If set (clip / clip_delta only), eta is recalibrated on the first reward call (the initial
    rollouts): eta = the (1 - eta_zero_fraction) quantile of their raw step scores, so that this
    fraction of steps gets zero reward under Clip (rewards.eta). The reward paper suggests most steps
    get 0, e.g. 0.8. The chosen eta is reported in RewardBatch.metrics["reward/eta"]."""
    alpha_matched_to: Refinement | None = None
    """A control for the hacking study (PRM only): if set, alpha is recalibrated on the first reward call so
    that the learned reward per response has the standard deviation it would have under this other
    refinement (eta from eta_zero_fraction), on the same rollouts: alpha = alpha * std(target) / std(own).
    Raw PRM matched to Clip-Delta (``prm_alpha_matched``) scales the hackable reward down; Clip-Delta matched
    to raw PRM (``prm_clip_delta_matched``) scales the refined reward up to the hackable one's strength.
    Together they separate "a refinement stops hacking" from "a weaker learned signal stops hacking". The
    chosen alpha is reported in RewardBatch.metrics["reward/alpha"] and kept in checkpoints."""
    step_delimiter: str = "\n\n"
    """Where the policy's response is cut into steps. Must match how the PRM was trained (checked
    against realm_rm.json when the model has one)."""
    model: RewardModelConfig = field(default_factory=RewardModelConfig)
    function: str = ""
    """``FILE.py:NAME``: a reward function of the user's own (rewards/user_fn.py has its contract), added to
    this option's reward with ``function_weight`` (``+reward=function``: it alone). It returns a float (on the
    last token, as the success reward) or a list with one float per step (on each step's last token, refined
    as this option refines PRM scores)."""
    function_weight: float = 1.0
    function_timeout_s: float = 10.0
    """The most one call of the function may take; past it the run stops with one line naming it."""
    function_batched: bool = False
    """The function takes lists (prompts, responses, answers, metadatas) and returns a list: one call per chunk
    of responses instead of one per response."""

    @property
    def has_model(self) -> bool:
        """A learned reward model (ORM or PRM) is part of this reward."""
        return self.kind in (RewardKind.orm, RewardKind.prm)

    def __post_init__(self) -> None:
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"reward.eta={self.eta}: must lie in [0, 1]")
        if self.has_model and not self.model.path:
            raise ValueError(f"reward.kind={self.kind.value} needs reward.model.path (an HF dir or builtin:...)")
        if self.kind not in (RewardKind.prm, RewardKind.function) and self.refinement != Refinement.none:
            raise ValueError(
                f"reward.refinement={self.refinement.value} only applies to reward.kind=prm (and a per-step reward.function)"
            )
        self._check_function()
        if not self.step_delimiter:
            raise ValueError("reward.step_delimiter must be a non-empty string")
        clipped = (Refinement.clip, Refinement.clip_delta)
        if self.alpha_matched_to is not None and (
            self.kind != RewardKind.prm or self.refinement == self.alpha_matched_to
        ):
            raise ValueError(
                "reward.alpha_matched_to scales one PRM refinement to another's spread: it needs reward.kind=prm "
                f"and a reward.refinement other than itself (got {self.kind.value}, {self.refinement.value}, "
                f"matched to {self.alpha_matched_to.value})"
            )
        if self.eta_zero_fraction is not None:
            if not 0.0 <= self.eta_zero_fraction <= 1.0:
                raise ValueError(f"reward.eta_zero_fraction={self.eta_zero_fraction}: must lie in [0, 1]")
            if self.refinement not in clipped and self.alpha_matched_to not in clipped:
                raise ValueError(
                    f"reward.eta_zero_fraction is set but reward.refinement={self.refinement.value} has no eta "
                    "(use clip or clip_delta)"
                )
        if self.kind == RewardKind.orm and self.model.readout == Readout.step_tag:
            raise ValueError(
                "reward.model.readout=step_tag gives per-step scores; reward.kind=orm needs seq_cls or value_head"
            )
        if self.kind == RewardKind.prm and self.model.readout == Readout.seq_cls:
            raise ValueError(
                "reward.model.readout=seq_cls gives one score per response; reward.kind=prm needs value_head or step_tag"
            )

    def _check_function(self) -> None:
        if self.function:
            from rewards.user_fn import FunctionRef

            FunctionRef.parse(self.function)
        elif self.kind == RewardKind.function:
            raise ValueError("+reward=function needs reward.function=FILE.py:NAME (rewards/user_fn.py: the contract)")
        if not self.function_timeout_s > 0:
            raise ValueError(f"reward.function_timeout_s={self.function_timeout_s}: must be > 0")
