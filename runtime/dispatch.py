"""How the driver feeds a shard method and reads its results, declared on the method (pure data).

Every method the driver calls on the device processes' shards carries a ``Dispatch`` (the decorator
``dispatch``, as verl's ``@register(dispatch_mode=...)`` declares a worker method's split and gather,
without its metaclass): how the call's input is split over the devices that run it, and how their
results become one. The driver (``runtime.driver.PlanRuntime.submit``) reads it from the method it
is given, so a call site names the method itself (``PolicyShard.update``) and find-usages finds it::

    @dispatch(Split.replica_rows, Gather.concat)
    def compute_logprobs(self, batch, num_microbatches=1) -> Tensor: ...

    old = runtime.task(Call.actor_inf, Role.actor, PolicyShard.compute_logprobs, alloc, batch, num_microbatches)
    (logprobs,) = runtime.run(old)      # [rows, T]: each replica's reporting device's rows, in order
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar


class Split(Enum):
    """How a call's input reaches the devices that run it."""

    replica_rows = "replica_rows"
    """Inference: each replica (pp stages of tp devices) a contiguous slice of the rows, every device
    of the replica the same slice."""
    ppo_shares = "ppo_shares"
    """Training: each data-parallel share its rows of every PPO minibatch (``ppo.batch.update_rows``,
    shuffled by the iteration, the call's second argument), every device of the share (its stages and
    tp ranks) the same rows, with the minibatch sizes and the micro-batches each is cut into."""
    broadcast = "broadcast"
    """The same arguments to every device that holds the role (checkpoints, calibration)."""


class Gather(Enum):
    """How the results of a call's devices become the call's result."""

    concat = "concat"
    """Each replica's reporting device's [rows, ...] tensor, concatenated in replica order."""
    merge_rewards = "merge_rewards"
    """Each replica's reporting device's RewardBatch, merged (``rewards.types.merge_reward_batches``)."""
    first = "first"
    """One device's result: the first share's (every device returns the same global stats), or for a
    broadcast the first instance's reporting device's (a reward replica's calibration)."""
    none = "none"
    """Nothing (collective side effects such as checkpoints)."""


@dataclass(frozen=True)
class Dispatch:
    split: Split
    gather: Gather


F = TypeVar("F", bound=Callable[..., Any])


def dispatch(split: Split, gather: Gather) -> Callable[[F], F]:
    """Declare how the driver splits a shard method's input and gathers its results."""

    def mark(method: F) -> F:
        method.__dict__["dispatch"] = Dispatch(split, gather)
        return method

    return mark


def dispatch_of(method: Callable[..., Any]) -> Dispatch:
    """The ``Dispatch`` a shard method declares; a method without one cannot be called from the driver."""
    found = getattr(method, "dispatch", None)
    if not isinstance(found, Dispatch):
        raise TypeError(f"{getattr(method, '__qualname__', method)} declares no @dispatch(split, gather)")
    return found
