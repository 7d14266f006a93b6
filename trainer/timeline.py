"""One PPO iteration as a timeline: per-call start/end metrics and a picture (one row per device,
one bar per call), from the runtime's ``Event`` records."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from runtime.driver import Event

# A colour per call, so that the same call looks the same in every picture.
_COLOURS = {
    "actor_gen": "tab:blue",
    "rew_inf": "tab:olive",
    "reward": "tab:olive",
    "ref_inf": "tab:purple",
    "critic_inf": "tab:orange",
    "actor_inf": "tab:cyan",
    "actor_train": "tab:green",
    "critic_train": "tab:red",
    "realloc_actor": "black",
    "realloc_actor_load": "dimgray",
    "realloc_actor_handoff": "silver",
    "realloc_critic": "tab:brown",
}


def call_spans(events: Sequence[Event], t0: float) -> dict[str, float]:
    """``call/<name>/start_s`` and ``call/<name>/end_s``: each call's first start and last end over
    its devices, in seconds since ``t0`` (the iteration's start).

    Example: actor_train on devices 0 and 1 from 2.0 to 5.0 and 2.1 to 5.2 -> start 2.0, end 5.2.
    """
    spans: dict[str, tuple[float, float]] = {}
    for e in events:
        lo, hi = spans.get(e.call, (e.start, e.end))
        spans[e.call] = (min(lo, e.start), max(hi, e.end))
    out: dict[str, float] = {}
    for call, (lo, hi) in sorted(spans.items()):
        out[f"call/{call}/start_s"] = lo - t0
        out[f"call/{call}/end_s"] = hi - t0
    return out


def busy_seconds(events: Sequence[Event]) -> dict[int, float]:
    """Per device, the seconds at least one call ran on it (overlapping calls counted once).

    Worked example: device 0 runs 0-3 and 2-5, device 1 runs 1-2 -> {0: 5.0, 1: 1.0}.
    """
    out: dict[int, float] = {}
    for device in {e.device for e in events}:
        total, end = 0.0, float("-inf")
        for e in sorted((e for e in events if e.device == device), key=lambda e: e.start):
            total += max(0.0, e.end - max(e.start, end))
            end = max(end, e.end)
        out[device] = total
    return out


def plot_timeline(events: Sequence[Event], t0: float, path: Path, title: str = "") -> Path:
    """Write a PNG: one row per device (``-1``: the reward actor, which holds no device), one bar
    per call on it, x = seconds since ``t0``; the title gives the iteration's length and how busy each
    device was. Written to a temp file, then renamed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = sorted({e.device for e in events})
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(devices) + 2.0))
    seen: set[str] = set()
    for e in events:
        label = None if e.call in seen else e.call
        seen.add(e.call)
        ax.barh(
            devices.index(e.device),
            e.end - e.start,
            left=e.start - t0,
            height=0.6,
            color=_COLOURS.get(e.call, "gray"),
            edgecolor="white",
            label=label,
        )
    ax.set_yticks(range(len(devices)))
    ax.set_yticklabels(["no device" if d < 0 else f"device {d}" for d in devices])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the iteration started")
    span = max(e.end for e in events) - t0
    busy = busy_seconds([e for e in events if e.device >= 0])
    used = ", ".join(f"device {d} {100 * b / span:.0f}%" for d, b in sorted(busy.items())) if span > 0 else ""
    ax.set_title(f"{title or 'one PPO iteration'}: {span:.1f} s; busy {used}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.legend(loc="lower center", ncol=min(6, len(seen)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.09 + 0.04 * (len(seen) > 6), 1, 1))
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    tmp.replace(path)
    return path
