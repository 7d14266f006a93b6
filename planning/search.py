"""Execution-plan search (ReaL-style): give every PPO call an allocation so that the estimated
steady-state iteration is shortest, among plans that fit in GPU memory.

- Candidates per call (``candidates.py``): ReaL's device meshes x (pp, dp, tp) x micro-batches,
  checkpointing and offload, each fitting alone, Pareto-pruned per mesh (no top-k cut: small
  meshes survive at scale).
- The search starts from the best baseline that fits (``baselines.py``: ReaL-Heuristic,
  symmetric, disjoint), so it never returns a worse plan, and alternates two moves until the time
  budget runs out: *descent* tries every candidate of one call at a time and keeps the best
  fitting plan (candidates slower alone than the current iteration are skipped: they cannot
  help); *Metropolis* re-picks a random call's candidate at random and accepts a worse plan with
  probability ``exp(-beta * relative increase)`` (ReaL's MCMC move), with plans that overflow
  memory priced by their overflow so that the chain can cross them but never end on one.
- ``search_plan`` returns only a plan that fits; when nothing fits it raises ``NoFitError`` with
  the smallest overflow seen.

CLI (``python -m planning.search --help``), in train.py's words (model names as ``model=``, ``cluster.*``,
``rollout.*``)::

    python -m planning.search --actor llama-2-7b --num-nodes 1 --devices-per-node 8 --num-prompts 512 \\
        --max-prompt-tokens 128 --max-new-tokens 896 --seconds 30 --out plan.yaml
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from common.cli import ArgumentParser, did_you_mean, fail, positive
from planning.builders import BASELINES, baselines
from planning.candidates import candidates
from planning.config import HARDWARE
from planning.estimator import Hardware, PlanCost, Workload, estimate_plan, evaluator, hardware
from planning.execution_plan import CallAllocation, ExecutionPlan
from planning.shapes import NAMED_SPECS, named_spec
from reallocation.layout import ModelSpec

__all__ = ["NoFitError", "SearchReport", "Workload", "estimate_plan", "hardware", "named_spec", "search", "search_plan"]


class NoFitError(ValueError):
    """No plan fits in GPU memory; ``overflow_bytes`` is the smallest overflow found."""

    def __init__(self, message: str, overflow_bytes: float) -> None:
        super().__init__(message)
        self.overflow_bytes = overflow_bytes


@dataclass
class SearchReport:
    plan: ExecutionPlan
    cost: PlanCost
    baselines: dict[str, tuple[ExecutionPlan | None, PlanCost | None]]
    search_seconds: float
    num_evaluations: int
    start: str  # the baseline the search started from
    cpu_seconds: float = 0.0  # this process's CPU time (the wall time also counts waiting for other jobs)


def _penalized(cost: PlanCost, hw: Hardware) -> float:
    """Overflowing plans cost more the more they overflow (for the chain's moves only)."""
    return cost.seconds_per_iteration * (1 + 4 * cost.overflow_bytes / hw.usable_memory_bytes) + (
        1e3 if not cost.fits else 0.0
    )


def search(
    workload: Workload,
    hw: Hardware,
    *,
    seconds_budget: float,
    seed: int = 0,
    beta: float = 30.0,
    progress: bool = False,
    clock: Callable[[], float] = time.perf_counter,
    also_from: ExecutionPlan | None = None,
) -> SearchReport:
    """Search for ``seconds_budget`` seconds of ``clock`` (candidates and baselines included).

    ``clock=time.process_time`` budgets this process's CPU time instead of wall time, so that
    results do not depend on how many other jobs share the machine (the benchmark does that).
    """
    t0, cpu0 = clock(), time.process_time()
    wall0 = time.perf_counter()
    deadline = t0 + seconds_budget
    names = list(workload.calls)
    base = baselines(workload, hw)
    options = {c: candidates(c, workload, hw) for c in names}
    starts, start_name = _starting_points(workload, hw, base, options, also_from)
    current = starts[0] if starts else {c: options[c][0] for c in names}
    rng = random.Random(seed)
    state = _State(workload, hw, names, clock)
    current_cost = state.evaluate(current)
    best = (current_cost if current_cost.fits else None, dict(current))
    smallest_overflow = current_cost.overflow_bytes
    bar = _progress(progress, seconds_budget)
    while clock() < deadline:
        if starts:
            current = starts.pop(0)
            current_cost = state.evaluate(current)
        current, current_cost = _descend(state, current, options, deadline)
        if _faster(current_cost, best[0]):
            best = (current_cost, dict(current))
        if starts:
            continue
        # Metropolis walk away from the local optimum, then descend again from where it ends.
        current, current_cost, walk_best, walk_overflow = _walk(
            state, current, current_cost, options, rng, beta, deadline
        )
        smallest_overflow = min(smallest_overflow, walk_overflow)
        if walk_best is not None and _faster(walk_best[0], best[0]):
            best = walk_best
        if best[0] is not None and rng.random() < 0.5:
            current, current_cost = dict(best[1]), best[0]  # restart half the walks from the best
        bar(clock() - t0, best[0])
    bar(None, best[0])
    plan, cost = _fitting_plan(best, smallest_overflow, hw, names)
    return SearchReport(
        plan, cost, base, time.perf_counter() - wall0, state.num_evaluations, start_name, time.process_time() - cpu0
    )


def _starting_points(
    workload: Workload,
    hw: Hardware,
    base: dict[str, tuple[ExecutionPlan | None, PlanCost | None]],
    options: dict[str, list[CallAllocation]],
    also_from: ExecutionPlan | None,
) -> tuple[list[dict[str, CallAllocation]], str]:
    """Every fitting baseline (and ``also_from``), best first, and the best one's name ("fastest" if none
    fits). The search descends from each in turn: the best one alone already guarantees a result no worse
    than any of them. A call with no candidate of its own keeps ``also_from``'s allocation in ``options``;
    NoFitError when some call still has none."""
    given = {"given": (also_from, estimate_plan(also_from, workload, hw))} if also_from is not None else {}
    if also_from is not None and given["given"][1].fits:
        for c in options:
            options[c] = options[c] or [also_from.calls[c]]
    _check_every_call_fits_alone(options, base, hw)
    plans = {**base, **given}
    fitting = sorted((cost.seconds_per_iteration, name) for name, (_, cost) in plans.items() if cost and cost.fits)
    starts = [dict(plans[name][0].calls) for _, name in fitting]  # type: ignore[union-attr]
    return starts, fitting[0][1] if fitting else "fastest"


def _faster(cost: PlanCost, best: PlanCost | None) -> bool:
    """Whether ``cost`` is of a plan that fits and is faster than ``best`` (None: nothing fits yet)."""
    return cost.fits and (best is None or cost.seconds_per_iteration < best.seconds_per_iteration)


def _fitting_plan(
    best: tuple[PlanCost | None, dict[str, CallAllocation]], smallest_overflow: float, hw: Hardware, names: list[str]
) -> tuple[ExecutionPlan, PlanCost]:
    """The search's result, or NoFitError with the smallest overflow seen when no plan fitted."""
    cost, calls = best
    if cost is None:
        raise NoFitError(
            f"no execution plan fits in {hw.usable_memory_bytes / 2**30:.1f} GiB per GPU (of "
            f"{hw.gpu_memory_bytes / 2**30:.1f}, less the memory margin); the smallest "
            f"overflow found is {smallest_overflow / 2**30:.2f} GiB",
            smallest_overflow,
        )
    return ExecutionPlan(hw.num_nodes, hw.gpus_per_node, {c: calls[c] for c in names}, source="search"), cost


def _check_every_call_fits_alone(
    options: dict[str, list[CallAllocation]],
    base: dict[str, tuple[ExecutionPlan | None, PlanCost | None]],
    hw: Hardware,
) -> None:
    """NoFitError when some call has no candidate at all (nothing fits even with the cluster to itself)."""
    empty = [c for c, o in options.items() if not o]
    if empty:
        smallest = min((b[1].overflow_bytes for b in base.values() if b[1] is not None), default=math.inf)
        raise NoFitError(
            f"no allocation of {empty} fits on any mesh of {hw.num_nodes}x{hw.gpus_per_node} "
            f"{hw.name} GPUs even alone; smallest baseline overflow {smallest / 2**30:.1f} GiB",
            smallest,
        )


def _walk(
    state: _State,
    current: dict[str, CallAllocation],
    current_cost: PlanCost,
    options: dict[str, list[CallAllocation]],
    rng: random.Random,
    beta: float,
    deadline: float,
) -> tuple[dict[str, CallAllocation], PlanCost, tuple[PlanCost, dict[str, CallAllocation]] | None, float]:
    """Up to 200 Metropolis moves (ReaL's MCMC): re-pick a random call's candidate at random; accept a
    plan that is worse by the relative increase d with probability exp(-beta * d).

    Returns (where the walk ended, its cost, the fastest fitting plan it accepted or None, the
    smallest overflow it saw). Overflowing plans are priced by ``_penalized``, so the walk can cross them.
    """
    walk_cost = _penalized(current_cost, state.hw)
    best: tuple[PlanCost, dict[str, CallAllocation]] | None = None
    smallest_overflow = math.inf
    for _ in range(200):
        if state.clock() >= deadline:
            break
        call = rng.choice(state.names)
        proposal = dict(current)
        proposal[call] = rng.choice(options[call])
        cost = state.evaluate(proposal)
        smallest_overflow = min(smallest_overflow, cost.overflow_bytes)
        new = _penalized(cost, state.hw)
        if new <= walk_cost or rng.random() < math.exp(-beta * (new - walk_cost) / walk_cost):
            current, current_cost, walk_cost = proposal, cost, new
            if _faster(cost, None if best is None else best[0]):
                best = (cost, dict(current))
    return current, current_cost, best, smallest_overflow


def _descend(
    state: _State, current: dict[str, CallAllocation], options: dict[str, list[CallAllocation]], deadline: float
) -> tuple[dict[str, CallAllocation], PlanCost]:
    """Coordinate descent: re-pick each call's best candidate until no single change helps."""
    current = dict(current)
    cost = state.evaluate(current)
    improved = True
    while improved and state.clock() < deadline:
        improved = False
        for call in state.names:
            found = state.best_for(call, current, options[call], deadline)
            if found is not None and found[1].seconds_per_iteration < cost.seconds_per_iteration - 1e-12:
                current[call], cost, improved = found[0], found[1], True
    return current, cost


class _State:
    """Plan evaluation with a per-plan cache (the chain revisits plans often)."""

    def __init__(self, w: Workload, hw: Hardware, names: list[str], clock: Callable[[], float]) -> None:
        self.w, self.hw, self.names, self.clock = w, hw, names, clock
        self.ev = evaluator(w, hw)
        self.cache: dict[tuple[CallAllocation, ...], PlanCost] = {}
        self.num_evaluations = 0

    def evaluate(self, calls: dict[str, CallAllocation]) -> PlanCost:
        key = tuple(calls[c] for c in self.names)
        cost = self.cache.get(key)
        if cost is None:
            self.num_evaluations += 1
            cost = self.ev.estimate(tuple(zip(self.names, key)))
            if len(self.cache) > 200_000:
                self.cache.clear()
            self.cache[key] = cost
        return cost

    def best_for(
        self, call: str, current: dict[str, CallAllocation], options: list[CallAllocation], deadline: float
    ) -> tuple[CallAllocation, PlanCost] | None:
        """The fitting plan that changes only ``call`` with the shortest iteration.

        Two cheap tests skip most candidates before the full estimate: the call alone, and the
        schedule without reallocation, are lower bounds of the iteration.
        """
        here = self.evaluate(current)
        bound = here.seconds_per_iteration if here.fits else math.inf
        best = None
        capacity = self.hw.usable_memory_bytes
        for i, alloc in enumerate(options):
            if self.ev.seconds(call, alloc) >= bound:
                break  # options are sorted by time alone; none further can beat the bound
            if i % 64 == 0 and self.clock() >= deadline:
                break
            plan = dict(current, **{call: alloc})
            calls = tuple((c, plan[c]) for c in self.names)
            if self.ev.period(calls, with_moves=False) >= bound or np.nanmax(self.ev.peak(calls)) > capacity:
                continue
            cost = self.evaluate(plan)
            if cost.fits and cost.seconds_per_iteration < bound:
                best, bound = (alloc, cost), cost.seconds_per_iteration
        return best


def _progress(enabled: bool, total: float):
    if not enabled:
        return lambda elapsed, cost: None
    from tqdm import tqdm

    bar = tqdm(total=round(total), unit="s", desc="plan search", file=sys.stderr)
    state = {"shown": 0}

    def update(elapsed: float | None, cost: PlanCost | None) -> None:
        if cost is not None:
            bar.set_postfix_str(f"best {cost.seconds_per_iteration:.2f} s/it")
        if elapsed is None:
            bar.close()
            return
        step = min(round(elapsed), round(total)) - state["shown"]
        if step > 0:
            bar.update(step)
            state["shown"] += step

    return update


def search_plan(
    workload: Workload,
    hw: Hardware,
    *,
    seconds: float,
    seed: int = 0,
    also_from: ExecutionPlan | None = None,
    clock: Callable[[], float] = time.process_time,
) -> tuple[ExecutionPlan, PlanCost]:
    """The best fitting plan found in ``seconds`` of ``clock`` (never worse than a fitting baseline, nor
    than ``also_from`` when it fits). This process's CPU time by default: the same seed then gives the same
    plan however many other jobs share the machine."""
    report = search(workload, hw, seconds_budget=seconds, seed=seed, also_from=also_from, clock=clock)
    return report.plan, report.cost


def _fmt_baseline(cost: PlanCost | None) -> str:
    if cost is None:
        return "n/a"
    return f"{cost.seconds_per_iteration:.2f} s" if cost.fits else "oom"


def summary_line(report: SearchReport) -> str:
    b = report.baselines
    return (
        f"best {report.cost.seconds_per_iteration:.2f} s/iteration, fits; "
        f"ReaL-Heuristic {_fmt_baseline(b['real_heuristic'][1])}; symmetric {_fmt_baseline(b['symmetric'][1])}; "
        f"disjoint {_fmt_baseline(b['disjoint'][1])}; searched in {report.search_seconds:.1f} s"
    )


# The CLI's words are train.py's (cluster.*, rollout.*); the old ones are named in the error when used.
RENAMED_OPTIONS = {
    "--nodes": "--num-nodes",
    "--gpus-per-node": "--devices-per-node",
    "--gpu": "--hardware",
    "--batch": "--num-prompts, times --samples-per-prompt",
    "--prompt-len": "--max-prompt-tokens",
    "--gen-len": "--max-new-tokens",
}
MODEL_CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "model"


def model_shape(name: str) -> ModelSpec:
    """A model's shape from its name as train.py takes it (``configs/model/NAME.yaml``, its ``shape``), a
    named shape (``planning.shapes``: the ReaL paper's LLaMA-2 sizes, ...) or an HF directory; ValueError
    with the names there are."""
    config = MODEL_CONFIG_DIR / f"{name}.yaml"
    if config.is_file():
        import yaml

        shape = (yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("shape")
        if shape:
            return ModelSpec.from_hf_config(SimpleNamespace(**shape))
    try:
        return named_spec(name)
    except ValueError:
        names = sorted({p.stem for p in MODEL_CONFIG_DIR.glob("*.yaml")} | set(NAMED_SPECS))
        raise ValueError(
            f"unknown model {name!r}{did_you_mean(name, names)}: expected one of {', '.join(names)}, "
            "or an HF model directory with a config.json"
        ) from None


ALGORITHM_CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "algorithm"


def algorithm_graph(name: str) -> tuple[bool, bool]:
    """(has a critic, has a reference model) of ``configs/algorithm/NAME.yaml``: a critic unless its estimator
    is a critic-free one, a reference unless its ``kl_coef`` is 0 (keys it leaves out are PPO's: a critic and
    a KL term)."""
    import yaml

    keys = yaml.safe_load((ALGORITHM_CONFIG_DIR / f"{name}.yaml").read_text()) or {}
    return keys.get("estimator", "gae") == "gae", keys.get("kl_coef", 1) != 0


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python -m planning.search", description=__doc__.split("\n\n")[0], renamed=RENAMED_OPTIONS
    )
    models = "a configs/model/ name (as train.py's model=), a named shape (llama-2-7b .. -70b) or an HF model dir"
    parser.add_argument("--actor", required=True, help=models)
    parser.add_argument(
        "--algorithm",
        default="ppo",
        choices=sorted(p.stem for p in ALGORITHM_CONFIG_DIR.glob("*.yaml")),
        help="train.py's algorithm= (configs/algorithm/): its dataflow graph (a critic-free one has no critic "
        "calls; one with algorithm.kl_coef 0 no ref_inf)",
    )
    parser.add_argument("--critic", default=None, help="the critic's model (default: the actor's, critic.from_policy)")
    parser.add_argument("--reward", default=None, help="the reward model; omit for the success reward")
    parser.add_argument("--num-nodes", type=positive(int), required=True, help="cluster.num_nodes")
    parser.add_argument("--devices-per-node", type=positive(int), required=True, help="cluster.devices_per_node")
    parser.add_argument("--hardware", default="a100-80g", choices=list(HARDWARE), help="cluster.hardware")
    parser.add_argument("--num-prompts", type=positive(int), required=True, help="rollout.num_prompts")
    parser.add_argument(
        "--samples-per-prompt", type=positive(int), default=1, help="rollout.num_samples_per_prompt (default 1)"
    )
    parser.add_argument("--max-prompt-tokens", type=positive(int), required=True, help="rollout.max_prompt_tokens")
    parser.add_argument("--max-new-tokens", type=positive(int), required=True, help="rollout.max_new_tokens")
    parser.add_argument("--seconds", type=positive(float), default=60.0, help="search time budget (wall clock)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default=None, help="PROFILE.json from python -m planning.profile")
    parser.add_argument("--out", default=None, help="write the plan here (YAML)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m planning.search``: the plan report and the summary line; bad input or no fitting plan
    is one ``error:`` line and exit status 1."""
    args = _parser().parse_args(argv)
    try:
        actor = model_shape(args.actor)
        has_critic, has_reference = algorithm_graph(args.algorithm)
        w = Workload(
            actor,
            (model_shape(args.critic) if args.critic else actor) if has_critic else None,
            model_shape(args.reward) if args.reward else None,
            args.num_prompts * args.samples_per_prompt,
            args.max_prompt_tokens,
            args.max_new_tokens,
            reference=has_reference,
        )
        profile = None
        if args.profile:
            from planning.profile import Profile

            profile = Profile.load(args.profile)
        hw = hardware(args.hardware, args.num_nodes, args.devices_per_node, profile)
        report = search(w, hw, seconds_budget=args.seconds, seed=args.seed, progress=sys.stderr.isatty())
    except (NoFitError, ValueError, OSError) as e:
        fail(str(e))
    print(format_report(report, hw))
    if args.out:
        report.plan.save(args.out)
        print(f"wrote {args.out}")
    print(summary_line(report))
    return 0


def format_report(report: SearchReport, hw: Hardware) -> str:
    lines = [
        f"plan ({report.plan.num_devices} of {hw.num_gpus} GPUs, started from {report.start}, "
        f"{report.num_evaluations} plans evaluated, {report.cpu_seconds:.1f} s of CPU):"
    ]
    for call, alloc in report.plan.calls.items():
        lines.append(f"  {call:<13} {alloc.describe():<44} {report.cost.call_seconds[call]:8.2f} s")
    lines.append(f"  reallocation (after training, per iteration) {report.cost.realloc_seconds:.2f} s")
    peaks = report.cost.peak_bytes_per_device
    by_value: dict[str, list[int]] = {}
    for d, v in sorted(peaks.items()):
        by_value.setdefault(f"{v / 2**30:.1f}", []).append(d)
    lines.append(f"peak memory per GPU (GiB of {hw.usable_memory_bytes / 2**30:.1f} usable):")
    for value, devices in sorted(by_value.items(), key=lambda kv: -float(kv[0])):
        lines.append(f"  {value:>6} GiB on {_ranges(devices)}")
    lines.append("baselines:")
    for name in BASELINES:
        plan, cost = report.baselines[name]
        detail = "" if cost is None else f" (peak {cost.peak_bytes / 2**30:.1f} GiB)"
        lines.append(f"  {name:<15} {_fmt_baseline(cost)}{detail}")
    return "\n".join(lines)


def _ranges(devices: list[int]) -> str:
    out: list[str] = []
    start: int | None = devices[0]
    for a, b in zip(devices, devices[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return "gpus " + ",".join(out)


if __name__ == "__main__":
    sys.exit(main())
