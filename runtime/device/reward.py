"""The reward function on a device: the grader and, with a reward model, its shard (device process).

One ``RewardShard`` per device of a ``rew_inf`` replica (or, for the grader alone, one in a
device-less actor): the reward model is sharded over the replica like a reference replica, every
device of the replica runs its part of the forward, and the replica's reporting device grades and
returns the ``RewardBatch``.
"""

from __future__ import annotations

from typing import Any

from runtime.device.memory import DeviceMemory
from runtime.dispatch import Gather, Split, dispatch


class RewardShard:
    """Holds the reward function (grader pool, ORM/PRM) next to its model; ``device``: where the
    reward model computes (the rew_inf device's GPU, or CPU).

    ``ranks``: this device's place in a rew_inf replica (``DeviceProcess._ranks``); the reward model
    is then sharded over the replica (``runtime.device.shards.shard_replica``). ``num_microbatches``: the
    plan's for rew_inf (each call's share in at least that many forwards, as the cost model prices it).
    ``offload``: an unsharded reward model's weights wait in host memory between calls and come to
    ``device`` for each (as ``ReferenceShard``'s; on CPU this changes nothing). Only the replica's last
    stage's first device grades and reports; the others run their part of the reward model's forward
    on the same samples and return None.
    """

    def __init__(
        self,
        ranks: Any = None,
        *,
        reward_cfg: Any,
        tokenizer_dir: str,
        device: str = "cpu",
        dtype: str = "float32",
        num_microbatches: int = 1,
        offload: bool = False,
    ):
        import torch
        from transformers import AutoTokenizer

        from rewards.build import build_reward_fn
        from runtime.device.shards import shard_replica

        sharded = ranks is not None and ranks.model_sharded
        if offload and sharded:
            raise ValueError("offload needs an unsharded reward replica (tp = pp = 1)")
        shard = (lambda model: shard_replica(model, ranks)) if sharded else None
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.fn: Any = build_reward_fn(reward_cfg, tokenizer, device, shard, num_microbatches, dtype, on_host=offload)
        self.reports = not sharded or ((ranks.pipeline is None or ranks.pipeline.is_last) and ranks.rank == 0)
        reward_model = getattr(self.fn, "reward_model", None)
        self.offloaded = reward_model.model if offload and reward_model is not None else None
        self.has_model = reward_model is not None
        self.memory = DeviceMemory(torch.device(device))
        if self.offloaded is not None:
            self.memory.to_host("reward", self.offloaded)

    @dispatch(Split.replica_rows, Gather.merge_rewards)
    def score(self, samples):
        if self.offloaded is not None:
            self.memory.to_device("reward", self.offloaded)
        try:
            if self.reports:
                return self.fn(samples)
            self.fn.run_reward_model(samples)
            return None
        finally:
            if self.offloaded is not None:
                self.memory.to_host("reward", self.offloaded)

    def residency(self) -> dict[tuple[str, str], str]:
        if not self.has_model:
            return {}
        return {("reward", "weights"): "host" if "reward" in self.memory.on_host else "device"}

    @dispatch(Split.broadcast, Gather.none)
    def set_calibration(self, state: dict[str, float]) -> None:
        self.fn.set_calibration(state)

    @dispatch(Split.broadcast, Gather.first)
    def calibration(self) -> dict[str, float]:
        """Clip's eta and the reward's alpha in use (after the first call: calibrated)."""
        return self.fn.calibration()
