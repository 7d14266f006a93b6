"""The optimisation settings of training: the algorithm (advantage estimator, KL term), the policy update
(epochs, clipping, learning rates) and the SFT warm-up. Plain dataclasses, part of the run's typed config
(``trainer.config.TrainConfig``), read by the math in this package and by the device processes that run the
updates."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from common.schedule import LRSchedule
from ppo.critic_free import Estimator


class KLController(Enum):
    fixed = "fixed"
    adaptive = "adaptive"
    """Ziegler et al. 2019: beta moves so that the observed KL tracks kl_target."""


class ValueClip(Enum):
    none = "none"
    """Plain regression on the returns."""
    raw = "raw"
    """PPO's clipped value loss with a range of value_clip_eps in reward units."""
    return_std = "return_std"
    """Clipped, with a range of value_clip_eps times the iteration's return standard deviation."""


class KLPlacement(Enum):
    reward = "reward"
    """-beta * KL_t on every token's reward (PPO, RLOO, REINFORCE++)."""
    loss = "loss"
    """+beta * KL in the policy loss, aggregated like it (GRPO)."""


class KLEstimator(Enum):
    """Per-token estimates of KL(pi || pi_ref) from x = log pi(a) - log pi_ref(a), a ~ pi (Schulman, "Approximating
    KL divergence", 2020)."""

    k1 = "k1"
    """x: unbiased, can be negative per token; its gradient as a loss term is 0 in expectation (use in the reward)."""
    k2 = "k2"
    """x^2 / 2: biased, >= 0."""
    k3 = "k3"
    """exp(-x) - 1 + x: unbiased, >= 0, low variance (GRPO's loss term)."""


class LossAgg(Enum):
    """How the per-token policy losses of a minibatch become one number (verl's ``loss_agg_mode``)."""

    token_mean = "token_mean"
    """Sum over the minibatch's tokens / its number of tokens (PPO; DAPO)."""
    seq_mean_token_mean = "seq_mean_token_mean"
    """The mean over responses of each response's token mean (GRPO as published): short responses weigh more
    per token."""
    seq_mean_token_sum_norm = "seq_mean_token_sum_norm"
    """Sum over tokens / (responses x a constant, ``algorithm.loss_agg_num_tokens``) (Dr. GRPO): no length
    normalisation per response."""


@dataclass
class AlgorithmConfig:
    """The RL algorithm: how advantages are estimated and where the KL term goes. The schema's defaults are PPO
    with a critic (``configs/algorithm/ppo.yaml`` adds nothing); ``configs/algorithm/`` has the critic-free
    ones (grpo, dr_grpo, rloo, reinforce_pp), each a set of these keys. The update itself (epochs, minibatches,
    clipping, learning rates) is ``ppo`` for every algorithm: all use the PPO-clip surrogate."""

    name: str = "ppo"
    """What runs and reports call it (the ``algorithm=`` option that set the keys below)."""
    estimator: Estimator = Estimator.gae
    """gae (a critic's values; the only one that trains a critic), grpo, rloo or reinforce_pp (ppo.critic_free)."""
    group_std: bool = True
    """grpo only: divide by the group's std of totals (false: Dr. GRPO)."""
    gamma: float = 1.0
    """Discount over tokens: GAE's, and the critic-free rewards-to-go's."""
    lam: float = 1.0
    """GAE's lambda (gae only)."""
    whiten_advantages: bool = True
    """gae only: whiten the advantages over the batch."""
    kl_coef: float = 0.01
    """beta. 0 turns the reference model off: no ref_inf call, no reference weights placed."""
    kl_in: KLPlacement = KLPlacement.reward
    kl_estimator: KLEstimator = KLEstimator.k1
    kl_controller: KLController = KLController.fixed
    """adaptive needs kl_in=reward (it steers the reward's beta)."""
    kl_target: float = 0.1
    kl_horizon: int = 10000
    loss_agg: LossAgg = LossAgg.token_mean
    loss_agg_num_tokens: int = 0
    """seq_mean_token_sum_norm's constant; 0: rollout.max_new_tokens."""

    @property
    def has_critic(self) -> bool:
        return self.estimator == Estimator.gae

    @property
    def has_reference(self) -> bool:
        return self.kl_coef != 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"algorithm.gamma={self.gamma}, algorithm.lam={self.lam}: both must lie in [0, 1]")
        if self.kl_coef < 0:
            raise ValueError(f"algorithm.kl_coef={self.kl_coef}: must be >= 0")
        if self.kl_controller == KLController.adaptive and self.kl_in != KLPlacement.reward:
            raise ValueError(
                "algorithm.kl_controller=adaptive steers the reward's beta: it needs algorithm.kl_in=reward "
                f"(got {self.kl_in.value})"
            )
        if self.loss_agg_num_tokens < 0:
            raise ValueError(f"algorithm.loss_agg_num_tokens={self.loss_agg_num_tokens}: must be >= 0")
        if self.estimator == Estimator.gae and self.kl_in == KLPlacement.loss:
            raise ValueError("algorithm.estimator=gae puts the KL term in the reward its critic learns: kl_in=reward")


@dataclass
class PPOConfig:
    """The policy update every algorithm runs (the PPO-clip surrogate over epochs x minibatches), and the
    critic's when the algorithm has one."""

    num_epochs: int = 2
    """Passes over each iteration's rollouts."""
    num_minibatches: int = 4
    clip_eps: float = 0.2
    value_clip: ValueClip = ValueClip.none
    """No value clipping by default: the critic head starts at 0 and the returns' scale differs by reward
    (about 0.2 for success only, 1-5 for raw PRM), so a fixed clip range holds back the large-return
    critics (docs/rewards.md, "The critic's value loss"; docs/mini_repro.md: explained variance per option)."""
    value_clip_eps: float = 0.2
    """The value-clip range when value_clip is raw or return_std (ppo.losses.value_clip_range)."""
    entropy_coef: float = 0.0
    max_grad_norm: float = 1.0
    actor_lr: float = 1e-4
    critic_lr: float = 1e-3
    lr_schedule: LRSchedule = LRSchedule.constant
    num_warmup_iterations: int = 0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.num_epochs < 1 or self.num_minibatches < 1:
            raise ValueError("ppo.num_epochs and ppo.num_minibatches must be >= 1")
        if not self.clip_eps > 0 or not self.value_clip_eps > 0:
            raise ValueError("ppo.clip_eps and ppo.value_clip_eps must be > 0")


def reuses_update_logprobs(algorithm: AlgorithmConfig, ppo: PPOConfig) -> bool:
    """Whether the update's own logprobs, detached, serve as the old ones, with no forward of their own (no
    ``actor_inf`` call): true when the policy takes exactly one optimizer step per batch of rollouts
    (``ppo.num_epochs == 1`` and ``ppo.num_minibatches == 1``) and nothing reads the old logprobs before the
    update (no critic, whose GAE rewards carry the KL term, and no KL term in the reward).

    Why it is exact: the one step's minibatch is the whole batch under the weights that sampled it, so
    pi_old = pi there; the ratio exp(log pi - log pi.detach()) is exactly 1 and its gradient that of log pi,
    which is the unskipped path's up to the rounding of a second forward (TRL's GRPOTrainer and verl skip it
    the same way). PPO's defaults (2 epochs x 4 minibatches) keep the forward.

    Worked examples: grpo with ppo.num_epochs=1 ppo.num_minibatches=1 (KL in the loss) -> True; the same with
    ppo.num_minibatches=2 -> False; rloo (KL in the reward) with one step -> False; ppo (a critic) -> False.
    """
    one_step = ppo.num_epochs == 1 and ppo.num_minibatches == 1
    kl_in_reward = algorithm.has_reference and algorithm.kl_in == KLPlacement.reward
    return one_step and not algorithm.has_critic and not kl_in_reward


@dataclass
class SFTConfig:
    """Supervised warm-up on reference solutions before PPO (used by the tiny-model default run)."""

    num_steps: int = 1000
    """The most the warm-up trains (exactly this many with ``target_success`` 0)."""
    batch_size: int = 32
    lr: float = 1e-3
    lr_schedule: LRSchedule = LRSchedule.constant
    num_warmup_steps: int = 0
    lr_floor: float = 0.0
    """The schedule's final multiplier (``common/schedule.py``)."""
    target_success: float = 0.4
    """Stop the warm-up at the first check where greedy success on the held-back check problems reaches
    this (``num_steps`` is then the most it trains). 0: train exactly ``num_steps``. A capability target
    instead of a step count, because the same step count lands far apart across seeds and CPUs."""
    check_every: int = 25
    num_check_problems: int = 200
    """Training problems held back from the warm-up to check it on (never the held-out set)."""

    def __post_init__(self) -> None:
        if self.num_steps < 0:
            raise ValueError(f"sft.num_steps={self.num_steps}: must be >= 0")
        if not 0.0 <= self.target_success <= 1.0:
            raise ValueError(f"sft.target_success={self.target_success}: must lie in [0, 1]")
        if self.target_success > 0 and (self.check_every < 1 or self.num_check_problems < 1):
            raise ValueError(
                f"sft.check_every={self.check_every}, sft.num_check_problems={self.num_check_problems}: "
                "both must be >= 1 when sft.target_success > 0"
            )
