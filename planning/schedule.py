"""The order in which one PPO iteration's calls run: the rule the plan runtime dispatches by and the
cost model simulates, as pure data and one pure function (``list_schedule``).

The calls of one iteration, each with the calls whose outputs it needs::

    actor_gen                                   (first: the prompts are its only input)
    rew_inf, actor_inf, ref_inf, critic_inf     after actor_gen (actor_inf: the old logprobs, a
                                                forward of the actor on actor_train's devices)
    actor_train, critic_train                   after all four inference calls (the driver computes
                                                advantages from all of them)
    realloc_actor                               after actor_train, over actor_train's and actor_gen's devices
    realloc_critic                              after critic_train, over critic_train's and critic_inf's
                                                devices (only when critic inference has devices or a
                                                layout of its own)

The rule (list scheduling, as ReaL's simulator dispatches by ready time, ReaLHF
``csrc/search/simulate.cpp``): a device runs one call at a time, and a call holds all its devices from
its start to its end. A call starts as soon as its inputs are done and every one of its devices is
idle; calls that can start at the same moment start in ``CALL_ORDER``; a call that cannot start does
not hold back a later one whose devices are free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

INFERENCE_CALLS = ("rew_inf", "actor_inf", "ref_inf", "critic_inf")
CALL_ORDER = ("actor_gen", *INFERENCE_CALLS, "actor_train", "critic_train", "realloc_actor", "realloc_critic")
"""Every call of an iteration, in the priority order of calls that can start at the same moment."""
CALL_INPUTS: dict[str, tuple[str, ...]] = {
    "actor_gen": (),
    **{call: ("actor_gen",) for call in INFERENCE_CALLS},
    "actor_train": INFERENCE_CALLS,
    "critic_train": INFERENCE_CALLS,
    "realloc_actor": ("actor_train",),
    "realloc_critic": ("critic_train",),
}
"""The calls whose outputs a call needs (a call missing from an iteration counts as done)."""


def list_schedule(
    seconds: Mapping[str, float],
    devices: Mapping[str, Sequence[int]],
    inputs: Mapping[str, tuple[str, ...]] = CALL_INPUTS,
    order: Sequence[str] = CALL_ORDER,
) -> dict[str, tuple[float, float]]:
    """Each call's ``(start, end)`` under the module docstring's rule, all devices idle at time 0.

    ``seconds`` and ``devices`` name the calls of this iteration (a subset of ``order``, which lists
    every call after its inputs); ``devices`` may be any resource ids, e.g. groups of GPUs that every
    call uses all or none of.

    Worked example: actor_gen on device 0 (1 s), ref_inf on 0 (2 s), critic_inf on 1 (1 s): both
    inference calls become ready at 1 s; ref_inf takes device 0 until 3 s and critic_inf device 1
    until 2 s, at the same moment, neither waiting for the other.
    """
    # One scan in priority order per moment suffices: a call's inputs come before it in ``order``, and
    # a call that starts only makes devices busy (one of 0 s frees them at once).
    pending = [(c, [i for i in inputs[c] if i in seconds], devices[c], seconds[c]) for c in order if c in seconds]
    busy_until: dict[int, float] = {}
    times: dict[str, tuple[float, float]] = {}
    now = 0.0
    while pending:
        waiting = []
        for item in pending:
            call, needs, used, duration = item
            if all(i in times and times[i][1] <= now for i in needs) and all(
                busy_until.get(d, 0.0) <= now for d in used
            ):
                times[call] = (now, now + duration)
                for d in used:
                    busy_until[d] = now + duration
            else:
                waiting.append(item)
        pending = waiting
        if pending:
            later = [end for _, end in times.values() if end > now]
            if not later:
                raise ValueError(f"calls {[c for c, *_ in pending]} can never start: check their inputs")
            now = min(later)
    return times
