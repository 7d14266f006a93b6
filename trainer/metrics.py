"""Run outputs: metrics JSONL, TensorBoard events, sample generations, a PNG of the key curves, progress."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.files import append_text, atomic_save_figure, atomic_write_text
from common.progress import progress_line


@dataclass(frozen=True)
class Curve:
    """One panel of the run and sweep pictures: a metrics.jsonl key, what it is, and its axis's unit."""

    key: str
    title: str
    ylabel: str
    zero_means_none: bool = False
    """Logged as 0 by a run that has no such quantity (the learned reward of a success-only run)."""


CURVES = (
    Curve("heldout/success", "held-out success (greedy)", "fraction of problems solved"),
    Curve("heldout/sampled_success", "held-out success (sampled)", "fraction of samples correct"),
    Curve("reward/success", "training success", "fraction of rollouts correct"),
    Curve("reward/learned", "learned reward per response", "α · ORM/PRM reward (sum)", zero_means_none=True),
    Curve("reward/step_score", "PRM step score", "mean score c_k (0 to 1)", zero_means_none=True),
    Curve("response/num_steps", "steps per response", "steps (batch mean)"),
    Curve("response/length", "response length", "tokens (batch mean)"),
    Curve("kl/mean", "KL to the reference policy", "nats per response (sum over tokens)"),
    Curve("actor/entropy", "policy entropy", "nats per token"),
    Curve("critic/loss", "value loss", "squared error (reward units²)"),
)
"""Every panel either picture may draw, in order; ``drawn`` leaves out what a run lacks."""


def drawn(curves: Sequence[Curve], rows: Sequence[dict[str, Any]]) -> list[Curve]:
    """The curves ``rows`` (metrics.jsonl rows, of one run or several) have something to show for: the key
    is logged, and for a ``zero_means_none`` curve, not only as 0.

    Worked example: rows [{"reward/learned": 0.0, "kl/mean": 0.0}, {"reward/learned": 0.0, "kl/mean": 0.3}]
    -> kl/mean only (the learned reward is 0 throughout: a success-only run has none).
    """
    return [c for c in curves if any(c.key in r and not (c.zero_means_none and r[c.key] == 0) for r in rows)]


def panel_grid(num_panels: int, num_cols: int = 4, size: tuple[float, float] = (4.2, 3.0)):
    """A figure with ``num_panels`` axes in rows of ``num_cols``; the grid's unused cells are removed
    (no empty panels). Returns (figure, list of axes)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    num_cols = min(num_cols, max(1, num_panels))
    num_rows = max(1, math.ceil(num_panels / num_cols))
    fig, axes = plt.subplots(num_rows, num_cols, figsize=(size[0] * num_cols, size[1] * num_rows), squeeze=False)
    for ax in list(axes.flat)[num_panels:]:
        fig.delaxes(ax)
    return fig, list(axes.flat)[:num_panels]


class MetricsWriter:
    """Appends one JSON object per iteration (flushed), mirrors scalars to TensorBoard."""

    def __init__(self, run_dir: Path, resume_from_iteration: int | None = None):
        """``resume_from_iteration``: the checkpoint's iteration; rows past it in metrics.jsonl and
        samples.jsonl are dropped (they will be recomputed). None: a fresh start, which drops every row
        an earlier attempt left in the same run directory (e.g. one stopped before its first checkpoint)."""
        self.run_dir = run_dir
        self.path = run_dir / "metrics.jsonl"
        self.samples_path = run_dir / "samples.jsonl"
        self.heldout_path = run_dir / "heldout.jsonl"
        self.residency_path = run_dir / "residency.jsonl"
        keep_through = -1 if resume_from_iteration is None else resume_from_iteration
        for path in (self.path, self.samples_path, self.heldout_path, self.residency_path):
            if path.exists():
                kept = [line for line in path.read_text().splitlines() if _iteration(line) <= keep_through]
                atomic_write_text(path, "".join(k + "\n" for k in kept))
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb: SummaryWriter | None = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        except Exception:  # noqa: BLE001 - TensorBoard is optional output, never a reason to stop training
            self.tb = None
        self.wandb = start_wandb(run_dir)

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        row = {"iteration": iteration, **{k: _scalar(v) for k, v in metrics.items()}}
        append_text(self.path, json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and math.isfinite(v) and k != "iteration":
                    self.tb.add_scalar(k, v, iteration)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if k != "iteration"}, step=iteration)

    def log_samples(self, iteration: int, samples: list[dict[str, Any]]) -> None:
        append_text(self.samples_path, "".join(json.dumps({"iteration": iteration, **s}) + "\n" for s in samples))

    def log_heldout(self, iteration: int, problem_ids: list[str], greedy: list[bool], sampled: list[int]) -> None:
        """Per-problem held-out correctness of one evaluation, in ``problem_ids`` order: ``greedy`` a
        string of 0/1, ``sampled`` the number of correct samples per problem (one digit each when the
        evaluation drew at most 9), so that two runs on the same problems can be compared problem by
        problem (a paired test such as McNemar's)."""
        row = {
            "iteration": iteration,
            "problem_ids_sha256": hashlib.sha256("\n".join(problem_ids).encode()).hexdigest()[:16],
            "greedy": "".join("1" if c else "0" for c in greedy),
            "sampled": "".join(str(n) for n in sampled) if all(n <= 9 for n in sampled) else sampled,
        }
        append_text(self.heldout_path, json.dumps(row) + "\n")

    def log_restart(self, iteration: int, restart: int, reason: str) -> None:
        """A restart after a lost worker, resuming at ``iteration``: a row of its own in metrics.jsonl."""
        append_text(self.path, json.dumps({"iteration": iteration, "restart": restart, "reason": reason}) + "\n")

    def log_residency(self, iteration: int, rows: list[dict[str, Any]]) -> None:
        """What every device held at the start of each phase of this iteration (``PlanRuntime.snapshot``),
        beside the plan's ``memory_lifecycle.json``: the two should say the same."""
        append_text(self.residency_path, "".join(json.dumps({"iteration": iteration, **row}) + "\n" for row in rows))

    def write_rollouts(self, iteration: int, rollouts: list[dict[str, Any]]) -> None:
        """One iteration's whole batch of rollouts, to rollouts/iter_NNNNNN.jsonl (atomically); each
        names its problem by id, not by its text (the run's data config regenerates the question)."""
        text = "".join(
            json.dumps({"iteration": iteration, **{k: v for k, v in r.items() if k not in ("question", "gold")}}) + "\n"
            for r in rollouts
        )
        atomic_write_text(self.run_dir / "rollouts" / f"iter_{iteration:06d}.jsonl", text)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def start_wandb(run_dir: Path, environ: Any = None):
    """A Weights & Biases run mirroring the metrics, or None (the default: REALM_WANDB is not 1).

    Off unless REALM_WANDB=1 (pip install -e ".[wandb]"). wandb's own variables apply: WANDB_MODE=offline
    writes under <run_dir>/wandb with no network (`wandb sync` uploads it later), WANDB_PROJECT (default
    "realm"), WANDB_ENTITY, WANDB_API_KEY. The wandb run id is derived from the run directory, so a
    relaunched run (run.name) continues the same wandb run. Driver process only: workers never log.
    """
    import hashlib
    import os

    environ = os.environ if environ is None else environ
    if environ.get("REALM_WANDB", "0") != "1":
        return None
    try:
        import wandb
    except ImportError:
        raise RuntimeError('REALM_WANDB=1 but wandb is not installed: pip install -e ".[wandb]"') from None
    config: dict[Any, Any] = {}
    hydra_config = run_dir / ".hydra" / "config.yaml"
    if hydra_config.exists():
        from omegaconf import OmegaConf

        loaded = OmegaConf.to_container(OmegaConf.load(hydra_config))
        if not isinstance(loaded, dict):
            raise ValueError(f"{hydra_config}: expected a mapping at the top level, got {type(loaded).__name__}")
        config = loaded
    run_id = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
    return wandb.init(
        project=environ.get("WANDB_PROJECT", "realm"),
        name=run_dir.name,
        id=run_id,
        resume="allow",
        dir=str(run_dir),
        config=config,
    )


def _iteration(line: str) -> float:
    """A row's iteration; infinity for a blank line or one that does not parse (the cut-off end of a line
    whose writer was killed mid-write), so that a resume drops it with the rows it recomputes."""
    try:
        return json.loads(line).get("iteration", -1)
    except ValueError:
        return math.inf


def _scalar(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()
    return v


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``run_dir/metrics.jsonl`` ([] when there is none); ValueError naming file and line."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for num_line, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise ValueError(f"{path}:{num_line}: malformed JSON ({e})") from None
    return rows


def plot_curves(run_dir: Path, out: Path | None = None) -> Path | None:
    """The run's curves over iterations (``CURVES`` it has values for), written next to metrics.jsonl;
    the title says where held-out success went."""
    rows = read_metrics(run_dir)
    curves = drawn(CURVES, rows)
    if not curves:
        return None
    fig, axes = panel_grid(len(curves))
    for ax, curve in zip(axes, curves):
        points = [(r["iteration"], r[curve.key]) for r in rows if curve.key in r]
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", markersize=3)
        ax.set_title(curve.title, fontsize=10)
        ax.set_xlabel("iteration")
        ax.set_ylabel(curve.ylabel, fontsize=8)
        ax.grid(alpha=0.3)
    heldout = [r["heldout/success"] for r in rows if "heldout/success" in r]
    went = f": held-out greedy success {heldout[0]:.3f} -> {heldout[-1]:.3f}" if len(heldout) > 1 else ""
    fig.suptitle(f"{run_dir.name}, {rows[-1]['iteration']} iterations{went}", fontsize=11)
    fig.tight_layout()
    return atomic_save_figure(fig, out or run_dir / "curves.png", dpi=90)


class Progress:
    """PPO iterations in the shared progress format (``common.progress``): the loop logs one line per
    iteration, ``[iter] 3/10 (30%) [00:42<01:38, 14.00s/iter, <extra>]``."""

    def __init__(self, total: int, start: int = 0, label: str = "iter"):
        self.total, self.start, self.label = total, start, label
        self.t0 = time.monotonic()

    def line(self, done: int, extra: str = "") -> str:
        return progress_line(
            done,
            self.total,
            time.monotonic() - self.t0,
            f"[{self.label}]",
            self.label,
            initial=self.start,
            postfix=extra,
        )
