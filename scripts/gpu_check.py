"""What realm's CUDA and NCCL paths must do, checked on ONE GPU in a few minutes (issue 27).

The GPU machine has torch (CUDA) and transformers but no vLLM, Ray, Hydra or OmegaConf, so this
imports only torch, transformers and project modules that import nothing else (the ``imports`` check
fails if any of the four was imported). Run it through ``scripts/gpu_check.sh``; ``--cpu`` runs the
same checks on CPU over gloo (the default tests do, ``tests/test_gpu_check.py``).

Checks, one ``PASS``/``FAIL`` line each (``NOTE`` lines say what could not run and why), then one
summary line; the exit status is 1 when any check failed:

- ``fsdp2_bf16_step``: one PPO policy step of a tiny Qwen2 under FSDP2 with bf16 parameters (world of
  1 over NCCL): the forward runs in bf16, the sharded parameters stay fp32 and all move, the first
  ratio is exactly 1 and the loss is exactly -sum(A)/N.
- ``offload_round_trips``: a model's weights (about 270 MB in bf16 on the GPU) to pinned host memory
  and back, 3 times: after each offload and ``empty_cache`` both ``memory_reserved`` and
  ``memory_allocated`` are back at their baselines, the weights come back bit for bit; prints the
  copy bandwidths.
- ``bf16_kl_zero``: reference logprobs from bf16 weights equal the FSDP2 bf16 policy's bit for bit at
  iteration 0 (KL exactly 0); a note gives how far an fp32 reference under autocast lands.
- ``p2p_nccl_one_gpu``: two ranks on the one GPU over NCCL, posting a crossing batch of sends and
  receives. NCCL (2.5 and later) refuses two ranks of one communicator on one GPU ("Duplicate GPU
  detected"); that refusal is a NOTE, not a failure, and the next check runs what can.
- ``p2p_pipeline_strict``: two processes on the one device run pipeline training (2 stages x 4
  micro-batches, 1F1B) and inference with every send and receive under the strict NCCL model over
  gloo (``tests/strict_p2p.py``): losses, gradients and logprobs equal one process's.
- ``imports``: none of ray, vllm, hydra, omegaconf was imported.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor, nn

from common import p2p
from models.config import TinyArchConfig
from models.parallelize import apply_fsdp
from models.tiny import hf_config_fields
from ppo.batch import position_ids, response_tokens
from ppo.losses import logprobs_from_logits, policy_loss
from runtime.device.pipeline import PipelineStage, keep_stage, last_stage_inputs, train_microbatches
from runtime.device.shards import response_logits
from tests import strict_p2p

ABSENT_ON_THE_GPU_IMAGE = ("ray", "vllm", "hydra", "omegaconf")
VOCAB_SIZE = 400
# The offload check's model on a GPU: big enough that its weights span many allocator blocks and
# the copy bandwidth means something (about 134M parameters, 270 MB in bf16).
OFFLOAD_MODEL = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16)


class Note(Exception):
    """A check that could not run as written here, for a reason outside realm (printed as NOTE)."""


def tiny_model(seed: int = 0, **overrides) -> nn.Module:
    """The project's tiny Qwen2 shape (``models.tiny``) with random weights, fp32, on the CPU."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {**hf_config_fields(TinyArchConfig(), VOCAB_SIZE), **overrides}
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).float().eval()


def random_batch(num_rows: int, device: torch.device, seed: int, prompt_len: int = 12, response_len: int = 8):
    """Rows of random tokens in the rollout layout (no padding): a prompt, then a response."""
    g = torch.Generator().manual_seed(seed)
    length = prompt_len + response_len
    return {
        "input_ids": torch.randint(5, VOCAB_SIZE, (num_rows, length), generator=g).to(device),
        "attention_mask": torch.ones(num_rows, length, dtype=torch.long, device=device),
        "response_mask": torch.ones(num_rows, response_len, device=device),
    }


def fsdp2_bf16(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` on ``device`` under FSDP2 over the world (of 1), bf16 parameters for compute."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    return apply_fsdp(model.to(device), mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def response_logprobs(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    return logprobs_from_logits(response_logits(model, batch), response_tokens(batch))


def check_fsdp2_bf16_step(device: torch.device) -> str:
    model = fsdp2_bf16(tiny_model(), device)
    before = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = random_batch(4, device, seed=1)
    mask = batch["response_mask"]
    logits = response_logits(model, batch)
    logprobs = logprobs_from_logits(logits, response_tokens(batch))
    advantages = torch.randn(mask.shape, generator=torch.Generator().manual_seed(2)).to(device)
    num_tokens = mask.sum()
    loss, stats = policy_loss(logprobs, logprobs.detach(), advantages, mask, 0.2, num_tokens)
    loss.backward()
    loss = loss.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).full_tensor()
    optimizer.step()
    assert logits.dtype == torch.bfloat16, f"logits in {logits.dtype}: the forward did not run in bf16"
    assert all(p.dtype == torch.float32 and hasattr(p, "full_tensor") for p in model.parameters())
    assert float(stats.ratio) == 1.0 and float(stats.clip_frac) == 0.0, stats
    want = -(advantages * mask).sum() / num_tokens  # ratio exactly 1: the loss is -mean(A)
    assert torch.allclose(loss, want, rtol=1e-6, atol=0), (float(loss), float(want))
    assert torch.isfinite(grad_norm) and grad_norm > 0, grad_norm
    unmoved = [n for n, p in model.named_parameters() if torch.equal(p.full_tensor(), before[n])]
    assert not unmoved, f"parameters the step did not move: {unmoved}"
    return f"loss {float(loss):.4f} = -mean(A), grad norm {float(grad_norm):.3f}, {len(before)} fp32 shards moved"


def _tensors(model: nn.Module) -> dict[str, Tensor]:
    """Parameters and buffers (the rotary frequencies are a buffer: they move with the weights)."""
    return {**dict(model.named_parameters()), **{f"buffer:{n}": b for n, b in model.named_buffers()}}


def _offload(model: nn.Module, host: dict[str, Tensor]) -> None:
    """Every tensor's data into its host buffer (allocated once, pinned on a GPU); the device
    copies are dropped."""
    for name, tensor in _tensors(model).items():
        host[name].copy_(tensor.data, non_blocking=True)
        tensor.data = host[name]


def _onload(model: nn.Module, device: torch.device) -> None:
    for tensor in _tensors(model).values():
        tensor.data = tensor.data.to(device, non_blocking=True)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _memory(device: torch.device) -> tuple[int, int]:
    """(reserved, allocated) bytes on ``device`` after freeing the allocator's cache ((0, 0) on CPU)."""
    if device.type != "cuda":
        return 0, 0
    gc.collect()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device)


def _round_trips(model: nn.Module, device: torch.device, num_round_trips: int, memory: dict[str, tuple]) -> dict:
    """Offload ``model`` to host buffers allocated once (pinned on a GPU) and load it back, timing
    both; after each move the device holds what ``memory`` says for it (offload: the baseline,
    onload: the resident model)."""
    host = {
        n: torch.empty(t.shape, dtype=t.dtype, pin_memory=device.type == "cuda") for n, t in _tensors(model).items()
    }
    seconds = {"offload": 0.0, "onload": 0.0}
    for trip in range(num_round_trips):
        for step in ("offload", "onload"):
            start = time.perf_counter()
            if step == "offload":
                _offload(model, host)
            else:
                _onload(model, device)
            _synchronize(device)
            seconds[step] += time.perf_counter() - start
            held = _memory(device)
            assert held == memory[step], (
                f"round trip {trip}, after {step}: (reserved, allocated) {held}, expected {memory[step]}"
            )
    assert device.type != "cuda" or all(t.is_pinned() for t in host.values()), "host copies are not pinned"
    return seconds


def check_offload_round_trips(device: torch.device, num_round_trips: int = 3) -> str:
    on_gpu = device.type == "cuda"
    baseline = _memory(device)
    model = tiny_model(**(OFFLOAD_MODEL if on_gpu else {})).to(torch.bfloat16)
    original = {n: t.detach().clone() for n, t in _tensors(model).items()}
    nbytes = sum(t.numel() * t.element_size() for t in original.values())
    model.to(device)
    seconds = _round_trips(model, device, num_round_trips, {"offload": baseline, "onload": _memory(device)})
    assert all(t.device.type == device.type for t in _tensors(model).values())
    assert all(torch.equal(t.cpu(), original[n]) for n, t in _tensors(model).items()), "weights changed"
    del model
    assert _memory(device) == baseline, "memory still held after the model is gone"
    if not on_gpu:
        return f"{nbytes / 1e6:.1f} MB x {num_round_trips}, bit-exact (CPU: no pinned memory or reserved bytes)"
    rates = ", ".join(f"{k} {nbytes * num_round_trips / s / 1e9:.1f} GB/s" for k, s in seconds.items())
    return f"{nbytes / 1e6:.0f} MB x {num_round_trips}: reserved back to {baseline[0]} B each time, bit-exact, {rates}"


def check_bf16_kl_zero(device: torch.device) -> str:
    policy = fsdp2_bf16(tiny_model(), device)
    # A frozen replica loaded in the compute dtype: its parameters in bf16, as from_pretrained(dtype=
    # bf16) gives them. Not Module.to(bf16), which also rounds the rotary frequencies (a float32 buffer
    # FSDP2 leaves alone), and then the logprobs differ.
    reference = tiny_model().to(device)
    for param in reference.parameters():
        param.data = param.data.to(torch.bfloat16)
    fp32_reference = tiny_model().to(device)
    batch = random_batch(8, device, seed=3)
    with torch.no_grad():
        policy_logprobs, reference_logprobs = response_logprobs(policy, batch), response_logprobs(reference, batch)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            autocast_logprobs = response_logprobs(fp32_reference, batch)
    kl = (policy_logprobs - reference_logprobs).abs().max()
    assert torch.equal(policy_logprobs, reference_logprobs), f"max |logprob difference| {float(kl):.3g}"
    drift = (policy_logprobs - autocast_logprobs).abs().max()
    return (
        f"{policy_logprobs.numel()} tokens, KL = 0 exactly (an fp32 reference under autocast is {float(drift):.3g} off)"
    )


def _nccl_crossing(rank: int, work: str) -> None:
    """Two ranks on the one GPU over NCCL: each sends 4 MiB to the other in one batch."""
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"file://{work}/nccl_store", rank=rank, world_size=2, device_id=device)
    mine, theirs = torch.full((1 << 20,), float(rank), device=device), torch.empty(1 << 20, device=device)
    p2p.barrier(None, device)
    p2p.exchange([dist.P2POp(dist.isend, mine, 1 - rank), dist.P2POp(dist.irecv, theirs, 1 - rank)])
    assert bool((theirs == 1 - rank).all())
    dist.destroy_process_group()


def check_p2p_nccl_one_gpu(device: torch.device) -> str:
    if device.type != "cuda":
        raise Note("no GPU (--cpu): nothing to try")
    with tempfile.TemporaryDirectory(prefix="gpu-check-nccl-") as work:
        try:
            strict_p2p.spawn_with_deadline(_nccl_crossing, (work,), nprocs=2, deadline_s=120)
        except Exception as error:  # the expected refusal comes back as a child's exception
            if "Duplicate GPU" in str(error):
                raise Note(
                    "NCCL refuses two ranks of one communicator on one GPU (ncclInvalidUsage: 'Duplicate GPU "
                    "detected'); the exchange runs under the strict NCCL model instead (p2p_pipeline_strict)"
                ) from None
            raise
    return "NCCL ran two ranks on one GPU: a crossing batch of 4 MiB sends and receives completed"


def _stage_worker(rank: int, work: str, device_type: str, num_microbatches: int) -> None:
    """Stage ``rank`` of 2, both stages on the same device, over gloo under the strict NCCL model."""
    device = torch.device(device_type, 0) if device_type == "cuda" else torch.device("cpu")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{work}/pg_store", rank=rank, world_size=2)
    strict_p2p.install(Path(work) / "p2p_store", 2)
    model = keep_stage(tiny_model(tie_word_embeddings=False).to(device), rank, 2)
    pipe = PipelineStage(rank, 2, prev=0 if rank else None, next=None if rank else 1, first=0, last=1)
    micros = [random_batch(2, device, seed=10 + i) for i in range(num_microbatches)]
    results = train_microbatches(model, pipe, micros, _stage_loss(model), 1.0, contextlib.nullcontext)
    with torch.no_grad():
        hidden = [last_stage_inputs(model, pipe, micro, position_ids(micro)) for micro in micros]
        logprobs = [response_logprobs_from(model, micro, h) for micro, h in zip(micros, hidden)] if rank else []
    grads = {n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None}
    losses = [float(loss.detach()) for loss, _ in results]
    torch.save({"grads": grads, "losses": losses, "logprobs": [x.cpu() for x in logprobs]}, Path(work) / f"{rank}.pt")
    dist.destroy_process_group()


def response_logprobs_from(model: nn.Module, micro: dict[str, Tensor], hidden: Tensor | None) -> Tensor:
    return logprobs_from_logits(response_logits(model, micro, hidden), response_tokens(micro))


def _stage_loss(model: nn.Module) -> Callable:
    return lambda micro, hidden: (-response_logprobs_from(model, micro, hidden).mean(), {})


def check_p2p_pipeline_strict(device: torch.device, num_microbatches: int = 4) -> str:
    with tempfile.TemporaryDirectory(prefix="gpu-check-pipeline-") as work:
        args = (work, device.type, num_microbatches)
        strict_p2p.spawn_with_deadline(_stage_worker, args, nprocs=2, deadline_s=300)
        stages = [torch.load(Path(work) / f"{rank}.pt") for rank in range(2)]
    model = tiny_model(tie_word_embeddings=False).to(device)
    micros = [random_batch(2, device, seed=10 + i) for i in range(num_microbatches)]
    losses = [-response_logprobs(model, micro).mean() for micro in micros]
    torch.stack(losses).sum().backward()
    want = {n: p.grad.cpu() for n, p in model.named_parameters()}
    got = {**stages[0]["grads"], **stages[1]["grads"]}
    assert got.keys() == want.keys(), sorted(set(want) ^ set(got))
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4, msg=name)
    torch.testing.assert_close(torch.tensor(stages[1]["losses"]), torch.stack(losses).detach().cpu())
    with torch.no_grad():
        for micro, got_logprobs in zip(micros, stages[1]["logprobs"]):
            torch.testing.assert_close(got_logprobs, response_logprobs(model, micro).cpu(), atol=1e-5, rtol=0)
    return f"2 stages x {num_microbatches} micro-batches on one {device.type} device: losses, {len(want)} gradients and logprobs equal one process's"


def check_imports(device: torch.device) -> str:
    found = [name for name in ABSENT_ON_THE_GPU_IMAGE if name in sys.modules]
    assert not found, f"imported {found}, which the GPU image does not have"
    project = {"common", "models", "ppo", "reallocation", "runtime", "tests", "__main__", "__mp_main__"}
    top = {name.split(".")[0] for name in sys.modules}
    third_party = sorted(n for n in top - set(sys.stdlib_module_names) - project if not n.startswith("_"))
    return f"none of {', '.join(ABSENT_ON_THE_GPU_IMAGE)} imported; third-party modules loaded: {' '.join(third_party)}"


CHECKS: list[tuple[str, Callable[[torch.device], str]]] = [
    ("fsdp2_bf16_step", check_fsdp2_bf16_step),
    ("offload_round_trips", check_offload_round_trips),
    ("bf16_kl_zero", check_bf16_kl_zero),
    ("p2p_nccl_one_gpu", check_p2p_nccl_one_gpu),
    ("p2p_pipeline_strict", check_p2p_pipeline_strict),
    ("imports", check_imports),
]


def run_checks(device: torch.device) -> tuple[int, int, int]:
    """Each check in turn, one line each; returns (passed, failed, notes)."""
    counts = {"PASS": 0, "FAIL": 0, "NOTE": 0}
    for name, check in CHECKS:
        start = time.perf_counter()
        try:
            status, detail = "PASS", check(device)
        except Note as note:
            status, detail = "NOTE", str(note)
        except Exception as error:  # noqa: BLE001 (a failed check is reported, the others still run)
            status, detail = "FAIL", f"{type(error).__name__}: {error}"
            traceback.print_exc(file=sys.stderr)
        counts[status] += 1
        print(f"{status} {name}: {detail} ({time.perf_counter() - start:.1f} s)", flush=True)
    return counts["PASS"], counts["FAIL"], counts["NOTE"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run the checks on CPU over gloo (no GPU needed)")
    parser.add_argument(
        "--step-split",
        action="store_true",
        help="instead of the checks: where a policy step's time goes (scripts/gpu_step_split.py)",
    )
    parser.add_argument(
        "--shape", default=None, help="--step-split's model shape (default: 1.5B on a GPU, tiny on CPU)"
    )
    parser.add_argument("--rows", default=None, help="--step-split's rows per step, comma-separated (default: 4,16)")
    parser.add_argument("--prompt", type=int, default=512, help="--step-split's prompt tokens per row")
    parser.add_argument("--response", type=int, default=512, help="--step-split's response tokens per row")
    args = parser.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("FAIL cuda: torch.cuda.is_available() is False (use --cpu for the CPU run)")
        return 1
    device = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
    import transformers

    where = "cpu" if args.cpu else torch.cuda.get_device_name(device)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        backend, extra = ("gloo", {}) if args.cpu else ("nccl", {"device_id": device})
        if not args.cpu:
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=f"file://{work}/pg_store", rank=0, world_size=1, **extra)
        p2p.barrier(None, device)  # on a GPU: common.p2p's NCCL barrier on this rank's device
        if args.step_split:
            import gpu_step_split

            shape = args.shape or ("tiny" if args.cpu else "qwen2.5-math-1.5b")
            rows = tuple(int(r) for r in (args.rows or "4,16").split(","))
            status = gpu_step_split.run(device, shape, rows, args.prompt, args.response)
            dist.destroy_process_group()
            return status
        passed, failed, notes = run_checks(device)
        dist.destroy_process_group()
    print(
        f"gpu_check: {passed} passed, {failed} failed, {notes} notes on {where} "
        f"(torch {torch.__version__}, transformers {transformers.__version__}, {backend})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
