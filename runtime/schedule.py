"""Starting calls by readiness, the rule the cost model prices (``planning.estimator``): pure.

A call holds all its devices from its start to its end, and a device runs one call at a time. A call
starts as soon as every call it waits for has finished and all its devices are idle; calls that could
start at the same moment start in the order they were added (the driver adds them in the priority order
actor_gen, rew_inf, actor_inf, ref_inf, critic_inf, actor_train, critic_train, realloc_actor,
realloc_critic); a call that cannot start does not hold back a later one whose devices are free. So calls
on disjoint devices run side by side, and a device never waits in a collective for a partner still busy
with another call (which per-device submission queues would make it do).

Starting and finishing are given as functions (``Task.start`` returns what is in flight; the
``Scheduler``'s ``wait_any`` blocks until some of it is ready), so the rule is tested here without Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Task:
    """One call to schedule: its name (as spans and the timeline show it), the devices it holds, the
    tasks whose results it waits for, how to start it (returns a handle ``finish`` takes), and how to
    turn the finished handle into the call's result."""

    call: str
    devices: frozenset[int]
    start: Callable[[], Any]
    finish: Callable[[Any], Any]
    after: tuple[Task, ...] = ()
    handle: Any = field(default=None, repr=False)
    result: Any = field(default=None, repr=False)
    started: bool = False
    done: bool = False


class Scheduler:
    """Calls added in priority order, started by readiness, finished when waited for.

    ``futures_of(handle)``: what a started task waits on; ``wait_any(futures)``: block until at least one
    is ready and return the ready ones (Ray's ``ray.wait`` in the runtime).
    """

    def __init__(self, futures_of: Callable[[Any], Sequence[Any]], wait_any: Callable[[list[Any]], Sequence[Any]]):
        self.futures_of, self.wait_any = futures_of, wait_any
        self.tasks: list[Task] = []
        self.ready: set[Any] = set()  # futures known to be ready (Ray's ObjectRefs hash by id)
        self.order: list[str] = []  # calls in the order they started (for tests and logs)

    def add(self, task: Task) -> Task:
        self.tasks.append(task)
        self._start_ready()
        return task

    def wait(self, *tasks: Task) -> list[Any]:
        """Run until ``tasks`` are finished (starting whatever becomes ready meanwhile); their results."""
        while not all(t.done for t in tasks):
            running = [t for t in self.tasks if t.started and not t.done]
            if not running:
                blocked = [t.call for t in tasks if not t.done]
                raise RuntimeError(f"calls {blocked} can never start: they wait for calls that were not added")
            pending = [f for t in running for f in self.futures_of(t.handle) if f not in self.ready]
            if pending:
                self.ready.update(self.wait_any(pending))
            for t in running:
                if all(f in self.ready for f in self.futures_of(t.handle)):
                    self._finish(t)
            self._start_ready()
        return [t.result for t in tasks]

    def busy(self) -> frozenset[int]:
        return frozenset(d for t in self.tasks if t.started and not t.done for d in t.devices)

    def _start_ready(self) -> None:
        busy = set(self.busy())
        for t in self.tasks:
            if not t.started and all(a.done for a in t.after) and not (t.devices & busy):
                t.handle, t.started = t.start(), True
                busy |= t.devices
                self.order.append(t.call)

    def _finish(self, task: Task) -> None:
        task.result, task.done = task.finish(task.handle), True
        self.ready.difference_update(self.futures_of(task.handle))
        self.tasks.remove(task)
