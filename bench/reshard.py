"""Benchmark: minimal-traffic resharding vs gather-everything-then-broadcast, on gloo ranks.

    .venv/bin/python bench/reshard.py --json bench/out/reshard.json

4 gloo ranks on this machine (loopback only), SmolLM2-135M-sized parameters (LlamaConfig: hidden
576, intermediate 1536, 30 layers, 9 heads, 3 kv heads, vocab 49152, tied embeddings; random
tensors built from the shapes, no download). For each layout pair (and back) it measures, in the
same run: bytes moved and the lower bound, wall time of ``reshard`` and of the baseline
(``reshard_gather_broadcast``: gather every parameter on rank 0, broadcast it to every destination
rank, slice), exactness of both against the unsharded reference, and memory per rank (the
executor's largest send+receive buffer, and the peak RSS growth during the reshard next to the
bound "one bucket + the destination shard").

Writes the JSON (a list of objects; keys pair, bytes_moved, lower_bound_bytes, time_s,
baseline_time_s, exact, ...) atomically, and a PNG bar chart next to it.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# Run from anywhere: the repository root is the parent of bench/.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from common.files import atomic_save_figure, atomic_write_json  # noqa: E402
from reallocation.layout import Layout, ModelSpec, full_box, local_slices  # noqa: E402
from reallocation.names import vllm_layout  # noqa: E402
from reallocation.plan import gather_broadcast_bytes, lower_bound_bytes, make_plan  # noqa: E402
from reallocation.reshard import reshard, reshard_gather_broadcast  # noqa: E402

SMOLLM2_135M = SimpleNamespace(
    model_type="llama",
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    tie_word_embeddings=True,
    head_dim=64,
)

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def layout_pairs() -> list[tuple[str, Layout, Layout]]:
    pairs = [
        ("fsdp4->tp2dp2", Layout(fsdp=4), Layout(dp=2, tp=2)),
        ("tp2dp2->dp4", Layout(dp=2, tp=2), Layout(dp=4)),  # TP(2) -> TP(1) replicas
        ("tp4->tp2", Layout(tp=4), Layout(tp=2)),  # TP(2) on ranks 0, 1
        ("pp2tp2->tp4", Layout(pp=2, tp=2), Layout(tp=4)),
    ]
    out = []
    for name, a, b in pairs:
        src, dst = name.split("->")
        out += [(name, a, b), (f"{dst}->{src}", b, a)]
    # Extras: the trainer's weight sync on CPU (everything to rank 0, TP=1) and a vLLM target
    # (TP=3 on ranks 0-2: SmolLM2's 9 heads / 3 kv heads allow vLLM TP 1, 3 or 9 only).
    out.append(("fsdp4->rank0", Layout(fsdp=4), Layout()))
    out.append(("fsdp4->vllm_tp3", Layout(fsdp=4), vllm_layout(tp=3, ranks=(0, 1, 2))))
    return out


def _rss() -> tuple[int, int]:
    """(current RSS, peak RSS since the last reset) in bytes, from /proc/self/status."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def _reference(spec: ModelSpec, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {p.name: torch.randn(p.shape, generator=gen).to(dtype) for p in spec.params()}


def _shards(holdings, ref, rank):
    return {
        n: ref[n][local_slices(per[rank], full_box(ref[n].shape))].clone() for n, per in holdings.items() if rank in per
    }


def _exact(holdings, ref, got, rank) -> bool:
    for n, per in holdings.items():
        if rank in per:
            want = ref[n][local_slices(per[rank], full_box(ref[n].shape))]
            if n not in got or not torch.equal(got[n], want):
                return False
    return True


def _max(value: float) -> float:
    import torch.distributed as dist

    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _timed(fn):
    """Run ``fn`` between barriers. Returns (result, max-over-ranks seconds, this rank's peak RSS
    growth during the run, or -1 if it cannot be measured)."""
    import torch.distributed as dist

    dist.barrier()
    rss_before, _peak = _rss()
    can_reset = _reset_peak_rss()
    start = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - start
    _now, peak = _rss()
    return result, _max(elapsed), (peak - rss_before if can_reset else -1)


def _worker(rank: int, world_size: int, store: str, args) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)  # 4 ranks share the machine's cores
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    dtype = DTYPES[args.dtype]
    spec = ModelSpec.from_hf_config(SimpleNamespace(**{**vars(SMOLLM2_135M), "num_hidden_layers": args.num_layers}))
    shapes = spec.shapes()
    itemsize = dtype.itemsize
    t0 = time.perf_counter()
    ref = _reference(spec, dtype)
    if rank == 0:
        print(
            f"[bench] {spec.num_params() / 1e6:.1f}M params ({args.dtype}), reference built in {time.perf_counter() - t0:.1f}s",
            flush=True,
        )
    pairs = [p for p in layout_pairs() if not args.pairs or p[0] in args.pairs]
    # Broadcast groups for the baseline: the destination ranks plus the root (new_group is
    # collective, so every rank creates every group up front).
    groups = {}
    for _, _, dst_layout in pairs:
        members = tuple(sorted(set(dst_layout.global_ranks) | {0}))
        if members not in groups:
            groups[members] = None if len(members) == world_size else dist.new_group(list(members))
    dist.barrier()
    rows = []
    for i, (name, src_layout, dst_layout) in enumerate(pairs):
        src, dst = src_layout.holdings(spec), dst_layout.holdings(spec)
        plan = make_plan(src, dst, shapes)
        members = tuple(sorted(set(dst_layout.global_ranks) | {0}))
        shards = _shards(src, ref, rank)

        ours = functools.partial(reshard, plan, shards, dtype=dtype, bucket_bytes=args.bucket_bytes)
        baseline = functools.partial(
            reshard_gather_broadcast,
            plan,
            shards,
            dtype=dtype,
            bucket_bytes=args.bucket_bytes,
            broadcast_group=groups[members],
        )

        # Alternate the two (one untimed warm-up each) and keep the best time of each: the
        # machine may be shared, and alternating exposes both to the same background load.
        times, base_times = [], []
        got: Any = None
        base: Any = None
        for rep in range(args.repeats + 1):
            got = base = None  # the previous repeat's tensors go before the next one runs
            (got, stats), seconds, rss_extra = _timed(ours)
            base, base_seconds, base_rss_extra = _timed(baseline)
            if rep > 0:
                times.append(seconds)
                base_times.append(base_seconds)
        seconds, base_seconds = min(times), min(base_times)
        exact = _exact(dst, ref, got, rank)
        base_exact = _exact(dst, ref, base, rank) if rank in members else True
        dst_bytes = sum(t.numel() * t.element_size() for t in got.values())
        del got, base, shards, ours, baseline

        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(
            gathered,
            dict(
                exact=exact,
                base_exact=base_exact,
                peak_buffer=stats.peak_buffer_bytes,
                rss_extra=rss_extra,
                base_rss_extra=base_rss_extra,
                dst_bytes=dst_bytes,
                received=stats.bytes_received,
                staged=stats.bytes_staged,
                rounds=stats.num_rounds,
                breakdown=stats.extra,
            ),
        )
        if rank == 0:
            bound = [args.bucket_bytes + g["dst_bytes"] for g in gathered]
            row = dict(
                pair=name,
                bytes_moved=plan.bytes_moved(itemsize),
                bytes_received_measured=sum(g["received"] for g in gathered),
                lower_bound_bytes=lower_bound_bytes(src, dst, shapes, itemsize),
                baseline_bytes=gather_broadcast_bytes(src, dst, shapes, itemsize),
                time_s=round(seconds, 4),
                baseline_time_s=round(base_seconds, 4),
                time_all_s=[round(t, 4) for t in times],
                baseline_time_all_s=[round(t, 4) for t in base_times],
                speedup=round(base_seconds / seconds, 2) if seconds > 0 else None,
                exact=all(g["exact"] for g in gathered),
                baseline_exact=all(g["base_exact"] for g in gathered),
                bucket_bytes=args.bucket_bytes,
                peak_extra_bytes=max(g["peak_buffer"] for g in gathered),
                peak_rss_extra_bytes=max(g["rss_extra"] for g in gathered),
                baseline_peak_rss_extra_bytes=max(g["base_rss_extra"] for g in gathered),
                dst_shard_bytes_max=max(g["dst_bytes"] for g in gathered),
                memory_bound_bytes_max=max(bound),
                within_memory_bound=all(g["peak_buffer"] <= args.bucket_bytes for g in gathered)
                and all(g["rss_extra"] <= b + args.rss_slack_bytes for g, b in zip(gathered, bound)),
                num_transfers=len(plan.transfers),
                num_rounds=gathered[0]["rounds"],
                bytes_staged=sum(g["staged"] for g in gathered),
                rank0_breakdown_s={k: round(v, 4) for k, v in gathered[0]["breakdown"].items()},
                world_size=world_size,
                dtype=args.dtype,
            )
            rows.append(row)
            print(
                f"[bench] {i + 1}/{len(pairs)} {name}: {row['bytes_moved'] / 2**20:.1f} MiB (lower bound "
                f"{row['lower_bound_bytes'] / 2**20:.1f}) in {seconds:.3f}s, baseline {row['baseline_bytes'] / 2**20:.1f} MiB "
                f"in {base_seconds:.3f}s, exact={row['exact']}",
                flush=True,
            )
    dist.barrier()
    if rank == 0:
        _write(rows, args.json)
    dist.destroy_process_group()


def _write(rows: list[dict], path: str) -> None:
    out = Path(path)
    atomic_write_json(out, rows)
    mib = 2**20
    print(
        f"\n{'pair':<18}{'moved MiB':>10}{'lower MiB':>10}{'base MiB':>10}{'time s':>9}{'base s':>9}{'speedup':>9}"
        f"{'exact':>7}{'buf MiB':>9}{'rss+ MiB':>10}{'bound MiB':>10}"
    )
    for r in rows:
        print(
            f"{r['pair']:<18}{r['bytes_moved'] / mib:>10.1f}{r['lower_bound_bytes'] / mib:>10.1f}"
            f"{r['baseline_bytes'] / mib:>10.1f}{r['time_s']:>9.3f}{r['baseline_time_s']:>9.3f}"
            f"{(r['speedup'] or float('inf')):>8.1f}x{str(r['exact']):>7}{r['peak_extra_bytes'] / mib:>9.1f}"
            f"{r['peak_rss_extra_bytes'] / mib:>10.1f}{r['memory_bound_bytes_max'] / mib:>10.1f}"
        )
    print(f"[bench] wrote {out}")
    try:
        _plot(rows, out.with_suffix(".png"))
    except Exception as e:  # the JSON is the result; a missing plotting backend is not fatal
        print(f"[bench] no plot: {e}")


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["pair"] for r in rows]
    x = range(len(rows))
    fig, (ax_t, ax_b) = plt.subplots(2, 1, figsize=(max(8, len(rows) * 1.1), 7), sharex=True)
    w = 0.4
    ax_t.bar([i - w / 2 for i in x], [r["time_s"] for r in rows], w, label="plan (P2P, minimal bytes)")
    ax_t.bar([i + w / 2 for i in x], [r["baseline_time_s"] for r in rows], w, label="gather + broadcast")
    ax_t.set_ylabel("wall time (s)")
    ax_t.legend()
    ax_t.set_title(f"Resharding SmolLM2-135M-sized weights, {rows[0]['world_size']} gloo ranks, {rows[0]['dtype']}")
    ax_b.bar([i - w / 2 for i in x], [r["bytes_moved"] / 2**20 for r in rows], w, label="moved (= lower bound)")
    ax_b.bar([i + w / 2 for i in x], [r["baseline_bytes"] / 2**20 for r in rows], w, label="baseline")
    ax_b.set_ylabel("MiB moved")
    ax_b.set_xticks(list(x))
    ax_b.set_xticklabels(names, rotation=30, ha="right")
    ax_b.legend()
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=100)
    print(f"[bench] wrote {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True, help="output JSON path (PNG written next to it)")
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--bucket-mb", type=float, default=32.0)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--repeats", type=int, default=3, help="best of N wall times (after one warm-up)")
    parser.add_argument("--pairs", nargs="*", help="subset of pair names")
    parser.add_argument(
        "--num-layers",
        type=int,
        default=SMOLLM2_135M.num_hidden_layers,
        help="fewer layers for a quick check (the smoke test)",
    )
    parser.add_argument("--rss-slack-mb", type=float, default=8.0, help="allocator slack allowed over the bound")
    args = parser.parse_args(argv)
    args.bucket_bytes = int(args.bucket_mb * 2**20)
    args.rss_slack_bytes = int(args.rss_slack_mb * 2**20)
    if args.world_size != 4:
        print("[bench] note: the layout pairs assume 4 ranks", flush=True)

    import torch.multiprocessing as mp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo listens on loopback only
    # Return freed buffers to the OS at once so peak-RSS growth measures what a reshard holds.
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(1 << 16))
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 16))
    with tempfile.TemporaryDirectory(prefix="reshard-bench-") as d:
        # A file store needs no listening socket (the TCP store binds every interface).
        mp.spawn(_worker, args=(args.world_size, os.path.join(d, "store"), args), nprocs=args.world_size, join=True)


if __name__ == "__main__":
    main()
