"""One iteration's experience, as PPO reads it: the rollouts padded into a batch, what the reward and the
models made of them, and what the advantages derive from that (OpenRLHF's ``Experience``, typed).

Shapes: B rollouts; S = prompt + response columns (prompts left-padded, responses right-padded, as
``trainer.rollout.pad_batch`` lays them out); T = response columns. Every [B, T] tensor is 0 past a
response's last token.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rewards.types import RewardBatch


@dataclass
class Experience:
    # The sequences (trainer.rollout.pad_batch).
    input_ids: Tensor
    """[B, S] long: prompt and response tokens."""
    attention_mask: Tensor
    """[B, S] long: 1 on real tokens."""
    position_ids: Tensor
    """[B, S] long: positions counted over real tokens."""
    response_mask: Tensor
    """[B, T] float: 1 on response tokens."""

    # What the reward says (rew_inf).
    reward: RewardBatch
    """Success, learned reward, step scores and the token rewards they place."""
    scores: Tensor
    """[B, T] float: the reward's token rewards on the batch's response columns (before the KL term)."""

    # What the models say (actor_inf, ref_inf and critic_inf, those the algorithm's graph has).
    old_logprobs: Tensor | None
    """[B, T] float: log pi_old of each response token (the policy that sampled it, recomputed); None: the
    update takes one step and uses its own, detached (``ppo.config.reuses_update_logprobs``: no actor_inf)."""
    ref_logprobs: Tensor | None
    """[B, T] float: log pi_ref of each response token (None: no KL term, no reference model)."""
    values: Tensor | None
    """[B, T] float: the critic's V at each response position (None: a critic-free algorithm)."""

    # What the update learns from (computed on the driver: ppo.advantages or ppo.critic_free).
    advantages: Tensor
    """[B, T] float: GAE advantages (whitened over the batch when asked), or the critic-free estimator's."""
    returns: Tensor
    """[B, T] float: the critic's targets (raw advantages + values), or the rewards-to-go (critic-free)."""
    kl: Tensor | None
    """[B, T] float: log pi_old - log pi_ref per token (None without a reference model or old logprobs)."""
    group: Tensor | None = None
    """[B] long: each response's prompt group (critic-free estimators)."""

    def sequences(self) -> dict[str, Tensor]:
        """What the inference calls read: the padded token batch."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
            "response_mask": self.response_mask,
        }

    def update_batch(self) -> dict[str, Tensor]:
        """What actor_train (and critic_train) read: the sequences with the old logprobs and the advantages, the
        reference logprobs when there are some (a KL loss term reads them), the values and returns when a critic
        trains on them."""
        critic = self.values is not None
        parts: list[tuple[str, Tensor | None]] = [
            ("old_logprobs", self.old_logprobs),
            ("ref_logprobs", self.ref_logprobs),
            ("values", self.values),
            ("advantages", self.advantages),
            ("returns", self.returns if critic else None),
        ]
        return {**self.sequences(), **{k: v for k, v in parts if v is not None}}
