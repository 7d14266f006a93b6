"""Calls start by readiness (runtime.schedule), worked on a simulated clock: a call ends its duration
after it starts, and waiting advances the clock to the next end."""

from __future__ import annotations

import pytest

from runtime.schedule import Scheduler, Task


class SimClock:
    """Futures that are ready at a time; ``wait_any`` moves the clock to the earliest pending one."""

    def __init__(self) -> None:
        self.now = 0.0
        self.starts: dict[str, float] = {}

    def wait_any(self, futures: list) -> list:
        self.now = min(end for _, end in futures)
        return [f for f in futures if f[1] <= self.now]

    def task(self, call: str, devices: set[int], seconds: float, after: tuple[Task, ...] = ()) -> Task:
        def start() -> list:
            self.starts[call] = self.now
            return [(call, self.now + seconds)]

        return Task(call, frozenset(devices), start, lambda handle: (call, self.now), after)


def test_a_call_that_cannot_start_does_not_hold_back_one_whose_devices_are_free():
    """Priority order rew, actor_inf, ref, critic. At 0: rew (device 0), ref (2, 3) and critic (1) start;
    actor_inf needs device 0, busy with rew until 3, so it starts at 3 and ends at 4. Queues per device
    would have run critic after actor_inf on device 1 (4 to 5): readiness saves a second."""
    sim = SimClock()
    scheduler = Scheduler(lambda handle: handle, sim.wait_any)
    tasks = [
        sim.task("rew_inf", {0}, 3.0),
        sim.task("actor_inf", {0, 1}, 1.0),
        sim.task("ref_inf", {2, 3}, 2.0),
        sim.task("critic_inf", {1}, 1.0),
    ]
    for t in tasks:
        scheduler.add(t)
    results = scheduler.wait(*tasks)
    assert scheduler.order == ["rew_inf", "ref_inf", "critic_inf", "actor_inf"]
    assert sim.starts == {"rew_inf": 0.0, "ref_inf": 0.0, "critic_inf": 0.0, "actor_inf": 3.0}
    assert results == [("rew_inf", 3.0), ("actor_inf", 4.0), ("ref_inf", 2.0), ("critic_inf", 1.0)]


def test_reallocation_waits_for_its_own_training_and_its_devices():
    """actor_train on (0, 1) for 2 s, critic_train on (2, 3) for 1 s; realloc_actor over (0, 1, 2) after
    actor_train, realloc_critic over (2, 3) after critic_train, 1 s each. realloc_critic starts at 1 (its
    training is done, its devices free) and holds device 2 until 2, when realloc_actor starts."""
    sim = SimClock()
    scheduler = Scheduler(lambda handle: handle, sim.wait_any)
    actor = scheduler.add(sim.task("actor_train", {0, 1}, 2.0))
    critic = scheduler.add(sim.task("critic_train", {2, 3}, 1.0))
    realloc_actor = scheduler.add(sim.task("realloc_actor", {0, 1, 2}, 1.0, after=(actor,)))
    realloc_critic = scheduler.add(sim.task("realloc_critic", {2, 3}, 1.0, after=(critic,)))
    assert scheduler.wait(actor, critic) == [("actor_train", 2.0), ("critic_train", 1.0)]
    scheduler.wait(realloc_actor, realloc_critic)
    assert sim.starts == {"actor_train": 0.0, "critic_train": 0.0, "realloc_critic": 1.0, "realloc_actor": 2.0}
    assert scheduler.order == ["actor_train", "critic_train", "realloc_critic", "realloc_actor"]


def test_a_call_waiting_for_one_never_added_fails_instead_of_hanging():
    sim = SimClock()
    scheduler = Scheduler(lambda handle: handle, sim.wait_any)
    ghost = sim.task("actor_train", {0}, 1.0)
    stuck = scheduler.add(sim.task("realloc_actor", {0}, 1.0, after=(ghost,)))
    with pytest.raises(RuntimeError, match="realloc_actor"):
        scheduler.wait(stuck)
