"""The project's one vLLM wrapper (and the only module that imports ``vllm``).

Used by evaluation (``python -m eval``) and by the PPO trainer (rollouts + weight sync)::

    engine = VLLMEngine("path/to/hf_dir", dtype="float32", seed=0, max_model_len=2048)
    outs = engine.generate(["<chat-formatted prompt>"], n=4, temperature=1.0, max_new_tokens=256)
    outs[0][0].text, outs[0][0].token_ids, outs[0][0].logprobs, outs[0][0].finish_reason
    engine.load_weights(model.state_dict().items())      # HF names, full tensors
    engine.load_shards([(name, shape, box, shard), ...])  # a TP rank's own boxes (the plan runtime)
    engine.prompt_logprobs([[1, 2, 3, 4]])                # -> [[lp(2|1), lp(3|1,2), lp(4|1,2,3)]]

Prompts are fully formatted by the caller (chat template applied, special tokens included) and
are tokenized here *without* adding special tokens, or passed as token ids, so nothing is templated
twice. Logprobs are the model's raw log-probabilities of each sampled token (vLLM's
``raw_logprobs``: before temperature / top-p), i.e. the same quantity the trainer computes with
``log_softmax(logits)``.

``vllm`` is imported lazily in ``VLLMEngine.__init__``: importing this module costs nothing and
works on machines without vLLM (e.g. to use ``Completion``). The environment defaults
(``common/env.py``) are set at import time because vLLM reads most of them when it is first imported.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch

from common.env import apply_defaults, apply_loopback

apply_defaults()  # vLLM reads most of its settings when it is first imported

FINISH_REASONS = ("stop", "length")


@dataclass(frozen=True)
class Completion:
    """One generated continuation of one prompt."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    """log p(token_t | prompt, tokens_<t) under the model (raw, before temperature); None if not asked."""
    finish_reason: str
    """"stop" (EOS or a stop string) or "length" (hit max_new_tokens / the context)."""

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class EngineMemory(StrEnum):
    """What an engine holds on its device: ``awake`` weights and KV cache, ``weights`` only (woken to
    be reloaded), ``asleep`` nothing (``VLLMEngine.sleep``)."""

    awake = "awake"
    weights = "weights"
    asleep = "asleep"


@dataclass
class EngineInfo:
    """What the engine was built with (recorded in evaluation reports)."""

    model_dir: str
    tokenizer_dir: str
    dtype: str
    max_model_len: int
    tensor_parallel_size: int
    device: str
    vllm_version: str = ""
    kv_cache_gib: float | None = None
    """CPU only: the KV cache size (GiB)."""
    extra: dict[str, Any] = field(default_factory=dict)


def _reload_weights_on_worker(worker, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Runs inside each vLLM worker (via collective_rpc): push HF-named weights into the model.

    ``reload_weights`` maps checkpoint names onto vLLM's fused parameters (qkv_proj, gate_up_proj)
    and re-runs the CPU backend's weight repacking; ``model.load_weights`` alone does not
    (CPU layers hold repacked weights and fail with ``parameter (torch.Size([0]))``).
    """
    count = 0

    def counted():
        nonlocal count
        for name, tensor in weights:
            count += 1
            yield name, tensor

    worker.model_runner.reload_weights(weights_iterator=counted())
    _reprocess_vocab_layers(worker.model_runner.get_model())
    return count


def _memory_report_on_worker(worker) -> dict[str, Any]:
    """Runs inside a vLLM worker (via collective_rpc): what it holds after start, in bytes. The KV cache is
    its allocated tensors (layers that share one storage counted once), the weights what vLLM measured
    while loading them (GPU) or the model's parameters and buffers (CPU, where vLLM measures nothing)."""
    runner, config = worker.model_runner, worker.vllm_config
    storages: dict[int, int] = {}
    for t in runner.kv_caches:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    weights = int(getattr(runner, "model_memory_usage", 0) or 0)
    if not weights:
        model = runner.get_model()
        weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    out: dict[str, Any] = {
        "kv_cache_bytes": sum(storages.values()),
        "num_blocks": config.cache_config.num_gpu_blocks or 0,
        "block_size": config.cache_config.block_size,
        "weights_bytes": weights,
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "enforce_eager": bool(config.model_config.enforce_eager),
    }
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        out |= {
            "cuda_allocated_bytes": torch.cuda.memory_allocated(),
            "cuda_reserved_bytes": torch.cuda.memory_reserved(),
            "cuda_free_bytes": free,
            "cuda_total_bytes": total,
        }
    return out


class _HarmlessVLLMLines(logging.Filter):
    """Drops vLLM log lines that are known to be harmless in realm's use, each for the reason below;
    every other line of the same loggers passes."""

    def __init__(self) -> None:
        super().__init__()
        self.tied_head = False
        """Whether this process's engine ties its LM head to the embedding (set per engine)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        # The layer-wise reload has nothing to load into the rotary embedding: its cos/sin cache is
        # computed from the config, and a reload leaves it as it was (test_reload_leaves_...).
        if message == "RotaryEmbedding: Failed to load weights":
            return False
        # A tied head has no weight of its own in the checkpoint: it shares the embedding's, reprocessed
        # after each reload (_reprocess_vocab_layers); test_reload_leaves_... checks it equals the new one.
        if message == "ParallelLMHead: Failed to load weights" and self.tied_head:
            return False
        # vLLM's CPU worker makes torch.set_num_threads a warning no-op once it binds threads; realm has
        # set the engine's threads before that (_one_torch_thread_on_cpu), so vLLM's later calls change nothing.
        # (test_engine_runs_with_the_threads_realm_set)
        return not message.startswith("CPU backend doesn't allow to use `torch.set_num_threads`")


_HARMLESS = _HarmlessVLLMLines()
_HARMLESS_LOGGERS = ("vllm.model_executor.model_loader.reload.layerwise", "vllm.v1.worker.cpu_worker")

CPU_START_NOTICES: tuple[str, ...] = (
    # realm's own CPU settings (llm_arguments): eager mode, hence no inductor, and one prefill per step.
    "Enforce eager set, disabling torch.compile",
    "Inductor compilation was disabled by user settings",
    "max_num_batched_tokens (",
    # vLLM-CPU without Triton falls back to its V1 model runner and C++ kernels, the path the engine
    # tests run (tests/models/test_vllm_engine.py); nothing realm calls needs Triton.
    "Triton is not installed. triton-cpu is expected",
    "Model Runner V2 requires Triton",
    "Triton not available, find_triton_kernels",
    # A cache type for Mamba layers; the models realm serves have none.
    "Reset SSM cache type to float32",
)
"""Start-up lines of a CPU engine that say only how realm configured it; each is dropped, for the reason
beside it. Performance hints (tcmalloc, libiomp) and anything else still show."""


class _CPUStartNotices(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(CPU_START_NOTICES)


_CPU_NOTICES = _CPUStartNotices()
# The loggers that emit them: a filter on vLLM's handlers would not last, as the engine reconfigures them.
_CPU_NOTICE_LOGGERS = ("vllm.config.vllm", "vllm.config.scheduler", "vllm.platforms.cpu", "torch._library.triton")


def _quiet_harmless_vllm_lines(model_dir: Path, on_gpu: bool) -> None:
    """Attach ``_HARMLESS`` and, on CPU, ``_CPU_NOTICES`` to the loggers that emit those lines (once per
    process)."""
    config = json.loads((model_dir / "config.json").read_text())
    _HARMLESS.tied_head = bool(config.get("tie_word_embeddings", False))
    for name in _HARMLESS_LOGGERS:
        if _HARMLESS not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_HARMLESS)
    if on_gpu:
        return
    for name in _CPU_NOTICE_LOGGERS:
        if _CPU_NOTICES not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_CPU_NOTICES)
    # vLLM's own code calls a deprecated torch alias; the warning is about vLLM's source, not realm's use.
    warnings.filterwarnings("ignore", message="`torch.distributed.reduce_op` is deprecated", category=FutureWarning)


def _reprocess_vocab_layers(model: torch.nn.Module) -> None:
    """Re-run the weight processing of the embedding and LM head after a reload.

    A tied LM head shares the embedding's tensor, so the reload fills it but skips its processing
    (vLLM logs "ParallelLMHead: Failed to load weights"); on CPU that processing builds the packed
    GEMM handle the logits are computed with, which would otherwise keep the old weights. Measured:
    a TP-2 engine's logprobs were 1.48 away from the reloaded model's without this, 1e-6 with it.
    Elsewhere (GPU) the processing of an unquantized embedding does nothing.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedEmbeddingMethod):
            method.process_weights_after_loading(module)


CPU_MAX_NUM_BATCHED_TOKENS = 1 << 18


CUDA_IPC_DEVICE_ARG = 6
"""Where ``torch.multiprocessing.reductions.rebuild_cuda_tensor``'s arguments hold the device index."""


def _received(shard: Any, device_index: int | None = None) -> torch.Tensor:
    """A shard as the device process handed it over: a tensor, or a CUDA IPC handle (rebuild function,
    arguments) to memory of that process on this same GPU (``DeviceProcess._handoff``), rebuilt on
    ``device_index`` (default: this process's current CUDA device)."""
    if isinstance(shard, torch.Tensor):
        return shard
    rebuild, args = shard
    if rebuild.__name__ == "rebuild_cuda_tensor":
        index = torch.cuda.current_device() if device_index is None else device_index
        args = on_device(args, index)
    return rebuild(*args)


def on_device(args: tuple, device_index: int) -> tuple:
    """A CUDA IPC handle's arguments with the device index of the process that rebuilds it. The handle
    carries the sender's index, which names the same GPU here only when both processes number their visible
    GPUs alike; the engine and its device process share one GPU (one Ray bundle), and each maps it under its
    own index (verl's colocated weight sync sets the same argument to its own device)."""
    return (*args[:CUDA_IPC_DEVICE_ARG], device_index, *args[CUDA_IPC_DEVICE_ARG + 1 :])


def prompt_seed(seed: int, prompt_token_ids: Sequence[int]) -> int:
    """A request seed from the call's seed and the prompt's tokens (stable across processes)."""
    data = ",".join(str(int(t)) for t in prompt_token_ids).encode()
    return (seed * 1_000_003 + zlib.crc32(data)) % (1 << 31)


def call_seeds(seed: int, num_requests: int, n: int) -> list[int]:
    """The seed of each request of a call seeded with ``seed`` (stable across processes): request i gets
    ``start + i * n``, ``start`` a 61-bit number hashed from ``seed``. vLLM seeds a request's n samples with
    seed, seed + 1, ..., seed + n - 1 (``ParentRequest``), so a call's samples draw from distinct seeds, and
    two calls' (another replica's seed, another iteration's) overlap with probability ~ requests x n / 2**61.

    Every request carries a seed because an unseeded one is not seeded by realm at all on a GPU: vLLM 0.32
    runs Model Runner V2 there whenever Triton is present, and it gives an unseeded request a seed drawn from
    numpy's global generator (``vllm/v1/worker/gpu/sample/states.py``), which vLLM seeds with the engine's
    seed at start: every replica built with one seed would draw the same noise. V2 samples seeded requests in
    its batched kernel; the V1 runner (CPU, or a GPU model V2 does not support) draws each seeded request's
    noise from its own generator. Example: ``call_seeds(s, 2, 4)`` -> ``[a, a + 4]``."""
    start = int.from_bytes(hashlib.sha256(f"realm-call-{seed}".encode()).digest()[:8], "big") >> 3
    return [start + i * n for i in range(num_requests)]


VLLM_SERIES = "0.32."
"""The vLLM release realm is built against (``pyproject.toml`` pins 0.32.0): its GPU and CPU model runners
have ``reload_weights(weights_iterator=...)``, which the 0.11-0.12 runners lack, and its sleep mode, seeds
and ``external_launcher`` behave as this module's comments say."""


def check_vllm_version(version: str) -> None:
    """Refuse, at start and in one line, a vLLM release other than ``VLLM_SERIES``: its weight reload or
    sampler may differ from what this module relies on, and would fail (or mislead) only mid-run."""
    if not version.startswith(VLLM_SERIES):
        raise RuntimeError(
            f"vLLM {version or '(unknown version)'} is installed; realm needs {VLLM_SERIES}x "
            '(pip install -e ".[gpu]" on a GPU, ".[cpu]" on CPU)'
        )


def has_tokenizer(model_dir: str | Path) -> bool:
    """True if ``model_dir`` holds tokenizer files transformers can load."""
    d = Path(model_dir)
    return any((d / f).exists() for f in ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json"))


def _check_dirs(model_dir: Path, tokenizer_dir: Path) -> None:
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"{model_dir}: not an HF model directory (no config.json)")
    if not has_tokenizer(tokenizer_dir):
        raise FileNotFoundError(
            f"{tokenizer_dir}: no tokenizer files (tokenizer.json / tokenizer_config.json / tokenizer.model); "
            "pass tokenizer_dir= (CLI: tokenizer=DIR) pointing at the base model's directory"
        )


def llm_arguments(
    model_dir: Path,
    tokenizer_dir: Path,
    *,
    on_gpu: bool,
    dtype: str,
    seed: int,
    max_model_len: int,
    tensor_parallel_size: int,
    gpu_memory_utilization: float,
    enforce_eager: bool | None,
    llm_kwargs: Mapping[str, Any],
) -> dict[str, Any]:
    """vLLM ``LLM(...)``'s keyword arguments for a GPU or a CPU engine (``llm_kwargs`` win).

    Worked example: on CPU with max_model_len 2048, ``enforce_eager`` is True (no graph capture)
    and ``max_num_batched_tokens`` is 2**18 (also when the caller asks for fewer: see below); on GPU
    ``gpu_memory_utilization`` is passed instead, and the caller's ``max_num_seqs`` and
    ``max_num_batched_tokens`` (the plan's, ``planning.lifecycle.engine_batch_limits``) as they are.
    """
    kwargs: dict[str, Any] = dict(
        model=str(model_dir),
        tokenizer=str(tokenizer_dir),
        dtype=dtype,
        seed=seed,
        max_model_len=max_model_len,
        tensor_parallel_size=tensor_parallel_size,
        enforce_eager=(not on_gpu) if enforce_eager is None else enforce_eager,
    )
    if on_gpu:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    else:
        kwargs["use_tqdm_on_load"] = False  # a bar per engine and reload, for checkpoints CPU runs load in ms
    kwargs.update(llm_kwargs)
    if not on_gpu:
        # A token budget this large keeps every prefill of realm's CPU runs in one step, whatever the plan's
        # chunk: a prefill split over steps has vLLM rewind the request's sampler generator
        # (gpu_model_runner: ``gen.set_offset``), which a seeded request's CPU generator refuses ("CPU
        # Generator does not use offset"), and every request is seeded (``call_seeds``).
        kwargs["max_num_batched_tokens"] = max(
            CPU_MAX_NUM_BATCHED_TOKENS, max_model_len, int(kwargs.get("max_num_batched_tokens", 0))
        )
    return kwargs


@contextmanager
def _cpu_kv_cache(kv_cache_gib: float | None, kwargs: dict[str, Any]) -> Iterator[None]:
    """While vLLM-CPU starts, a KV cache of ``kv_cache_gib`` GiB (None: $VLLM_CPU_KVCACHE_SPACE as set).

    On CPU the KV cache is VLLM_CPU_KVCACHE_SPACE GiB (it overrides kv_cache_memory_bytes); it bounds
    how many sequences run at once, so long batched generations may need more than 1. The variable
    takes whole GiB only; for a fraction it is unset and ``kv_cache_memory_bytes`` goes into ``kwargs``.
    The variable's earlier value is back afterwards.
    """
    previous_kv = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    if kv_cache_gib is not None:
        if float(kv_cache_gib).is_integer():
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))
        else:
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * (1 << 30))
    try:
        yield
    finally:
        if previous_kv is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = previous_kv


def _one_torch_thread_on_cpu(on_gpu: bool) -> tuple[int, Any]:
    """Returns (torch's thread count, ``torch.set_num_threads``) from before, for ``close()`` to restore.

    vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process and only
    then tries to drop torch to 1 intra-op thread for serving, so in-process the drop never
    happens. Do it first: on a shared 2-core machine 1 thread generated several times faster than 2,
    whose OpenMP barriers stall whenever another process holds a core (`bench/generate.py` measures
    it and prints the thread counts it ran with). An explicit OMP_NUM_THREADS is respected (as vLLM
    does).
    """
    before = torch.get_num_threads(), torch.set_num_threads
    if not on_gpu and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    return before


def _join_engine_group(
    rank: int, tp: int, pp: int, master: tuple[str, int] | None, model_dir: Path, on_gpu: bool
) -> dict[str, Any]:
    """Set the environment vLLM's ``external_launcher`` builds its TP and PP groups from (torchrun's
    variables; vLLM's world rank is ``pp_rank * tp + tp_rank``); returns the ``LLM`` arguments that
    select it. With pp > 1 the decoder blocks go to stages as ``reallocation.layout`` splits them
    (``VLLM_PP_LAYER_PARTITION``), so each stage receives exactly the blocks the layout gives it."""
    size = tp * pp
    if not 0 <= rank < size or master is None:
        raise ValueError(f"engine rank={rank} needs 0 <= rank < tp x pp = {size} and master=(addr, port)")
    addr, port = master
    # Each rank's process sees only its own device (Ray sets CUDA_VISIBLE_DEVICES per actor): local rank 0.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK="0", MASTER_ADDR=addr, MASTER_PORT=str(port))
    if not on_gpu:  # the ranks share the machine's cores; vLLM would pin each to the same ones
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        _unique_cpu_shm_names(port)
    if pp > 1:
        from reallocation.layout import pipeline_stage_of_layer

        num_layers = int(json.loads((model_dir / "config.json").read_text())["num_hidden_layers"])
        stages = [pipeline_stage_of_layer(i + 1, num_layers, pp) for i in range(num_layers)]
        os.environ["VLLM_PP_LAYER_PARTITION"] = ",".join(str(stages.count(s)) for s in range(pp))
    return {"distributed_executor_backend": "external_launcher", "pipeline_parallel_size": pp}


def _unique_cpu_shm_names(port: int) -> None:
    """Name this engine's CPU shared-memory segments after its rendezvous port. vLLM-CPU names them
    from the distributed init method, which ``external_launcher`` leaves as ``env://``: every such
    engine on the machine then asks for "-tp:0-[0-1]-cpushm_0", and a second engine (another run, or
    one whose predecessor was killed before it could unlink its segments) fails with errno 17."""
    from vllm.distributed.device_communicators import cpu_communicator

    shm: Any = cpu_communicator._CPUSHMDistributed
    if getattr(shm, "realm_port", None) == port:
        return
    name_of = shm.__dict__["make_group_name"].__func__ if "realm_port" not in shm.__dict__ else shm.realm_name_of
    shm.realm_name_of, shm.realm_port = name_of, port
    # A segment name may hold no "/" past its first character.
    shm.make_group_name = staticmethod(lambda c: "/realm" + str(port) + name_of(c).replace("/", ""))


def _start_llm(
    kwargs: dict[str, Any],
    engine: tuple[int | None, tuple[str, int] | None, int, int],
    model_dir: Path,
    on_gpu: bool,
    kv_cache_gib: float | None,
) -> Any:
    """vLLM's ``LLM``: on its own, or as rank ``rank`` of the engine ``(rank, master, tp, pp)`` whose
    ranks the caller started."""
    from vllm import LLM

    rank, master, tp, pp = engine
    if rank is not None:
        kwargs = {**kwargs, **_join_engine_group(rank, tp, pp, master, model_dir, on_gpu)}
    elif pp > 1:
        raise ValueError("pipeline_parallel_size > 1 needs the engine's ranks started by the caller (rank, master)")
    else:  # vLLM starts its own ranks, all on this node (a joined engine's environment comes from placement)
        apply_loopback()
    with _cpu_kv_cache(kv_cache_gib, kwargs):
        llm = LLM(**kwargs)
    if pp > 1 and not on_gpu:
        _cpu_pipeline_buffers(llm)
    return llm


def _cpu_pipeline_buffers(llm: Any) -> None:
    """Allocate the receive buffer of a later pipeline stage, which vLLM's GPU warm-up (a dummy run)
    allocates and vLLM-CPU's warm-up does not (its first step then fails on an assertion; vLLM 0.32)."""
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    if runner.intermediate_tensors is None:
        runner.intermediate_tensors = runner.model.make_empty_intermediate_tensors(
            batch_size=runner.max_num_tokens, dtype=runner.model_config.dtype, device=runner.device
        )


class VLLMEngine:
    """A vLLM ``LLM`` with the calls realm needs: generate, prompt_logprobs, load_weights.

    On CPU (``vllm-cpu``) ``enforce_eager`` defaults to True (no graph capture), the KV cache is
    ``kv_cache_gib`` GiB (default: $VLLM_CPU_KVCACHE_SPACE, 1) and ``gpu_memory_utilization`` is
    ignored; on GPU that fraction bounds the KV cache and ``kv_cache_gib`` is ignored.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        tokenizer_dir: str | Path | None = None,
        dtype: str = "float32",
        seed: int = 0,
        max_model_len: int = 2048,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.85,
        enforce_eager: bool | None = None,
        kv_cache_gib: float | None = None,
        pipeline_parallel_size: int = 1,
        rank: int | None = None,
        master: tuple[str, int] | None = None,
        **llm_kwargs: Any,
    ) -> None:
        """``rank``, ``master`` (address, port): this process is rank ``rank`` (stage x tp + tp rank) of
        an engine the caller started (vLLM's ``external_launcher``: every rank runs the same requests
        and holds its own shards, which the plan runtime sends it); without them vLLM starts its own."""
        model_dir, tokenizer_dir = Path(model_dir), Path(tokenizer_dir or model_dir)
        _check_dirs(model_dir, tokenizer_dir)
        import vllm

        check_vllm_version(getattr(vllm, "__version__", ""))
        on_gpu = torch.cuda.is_available()
        # vLLM-CPU refuses sleep mode: on CPU the flag only drives the engine's memory state.
        sleep_mode = bool(llm_kwargs.pop("enable_sleep_mode", False))
        llm_kwargs.update({"enable_sleep_mode": True} if sleep_mode and on_gpu else {})
        _quiet_harmless_vllm_lines(model_dir, on_gpu)
        self._torch_threads_before, self._set_num_threads = _one_torch_thread_on_cpu(on_gpu)
        kwargs = llm_arguments(
            model_dir,
            tokenizer_dir,
            on_gpu=on_gpu,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            llm_kwargs=llm_kwargs,
        )
        engine = (rank, master, tensor_parallel_size, pipeline_parallel_size)
        self.llm = _start_llm(kwargs, engine, model_dir, on_gpu, None if on_gpu else kv_cache_gib)
        self.tokenizer, self.seed = self.llm.get_tokenizer(), seed
        # An external_launcher engine always runs in this process; otherwise vLLM's own setting says.
        self._in_process = rank is not None or os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0"
        self._memory_state(sleep_mode, on_gpu)
        self.info = EngineInfo(
            model_dir=str(model_dir),
            tokenizer_dir=str(tokenizer_dir),
            dtype=dtype,
            max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel_size,
            device="cuda" if on_gpu else "cpu",
            vllm_version=getattr(vllm, "__version__", ""),
            kv_cache_gib=None if on_gpu else float(kv_cache_gib or os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 0),
            extra={k: v for k, v in llm_kwargs.items() if isinstance(v, (str, int, float, bool))},
        )

    def _memory_state(self, sleep_mode: bool, on_gpu: bool) -> None:
        """Awake, with current weights (``sleep``, ``wake_weights`` and ``wake_kv_cache`` move it)."""
        self.sleep_mode, self.on_gpu = sleep_mode, on_gpu
        self.memory = EngineMemory.awake
        self.stale = False  # weights allocated by wake_weights and not reloaded yet
        self.transitions: list[EngineMemory] = []

    # -- generation ---------------------------------------------------------------------------

    def _token_prompts(self, prompts: Sequence[str] | Sequence[Sequence[int]]) -> list[Any]:
        from vllm.inputs import TokensPrompt

        out = []
        for p in prompts:
            # Strings are already formatted (chat template + special tokens): no BOS added here.
            ids = self.tokenizer.encode(p, add_special_tokens=False) if isinstance(p, str) else [int(t) for t in p]
            if not ids:
                raise ValueError("empty prompt")
            out.append(TokensPrompt(prompt_token_ids=ids))
        return out

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        seed: int | None = None,
        logprobs: bool = True,
        stop: Sequence[str] | None = None,
        report: bool = True,
        seed_per_prompt: bool = False,
    ) -> list[list[Completion]]:
        """For each prompt, ``n`` completions (none with ``report=False``: a tensor-parallel rank other
        than its engine's first runs the same requests, and its identical copy need not travel).

        ``prompts``: formatted strings or token-id lists. ``temperature=0`` is greedy (then top_p
        is ignored). ``seed`` (default: the engine's seed) seeds every request: request i of the call from
        ``seed`` and i (``call_seeds``), so the same call with the same prompts draws the same samples on any
        runner, and another seed (the driver gives each replica its own, ``runtime.driver.replica_seed``)
        others. ``seed_per_prompt``: each request is seeded from ``seed`` and the prompt's own tokens
        instead, so its samples do not depend on where in which call it is (``prompt_seed``).
        """
        from vllm import SamplingParams

        if n < 1:
            raise ValueError(f"n={n}: need at least one completion per prompt")
        if not prompts:
            return []
        self.wake_kv_cache()
        greedy = temperature <= 0
        token_prompts = self._token_prompts(prompts)
        base_seed = self.seed if seed is None else seed

        def params(request_seed: int) -> Any:
            return SamplingParams(
                n=n,
                temperature=0.0 if greedy else temperature,
                top_p=1.0 if greedy else top_p,
                max_tokens=max_new_tokens,
                seed=request_seed,
                logprobs=0 if logprobs else None,
                stop=list(stop) if stop else None,
            )

        if seed_per_prompt:
            seeds = [prompt_seed(base_seed, p["prompt_token_ids"]) for p in token_prompts]
        else:
            seeds = call_seeds(base_seed, len(token_prompts), n)
        outputs = self.llm.generate(token_prompts, [params(s) for s in seeds], use_tqdm=False)
        if not report:
            return []
        return [[self._completion(c, logprobs) for c in out.outputs] for out in outputs]

    @staticmethod
    def _completion(c: Any, want_logprobs: bool) -> Completion:
        token_ids = tuple(int(t) for t in c.token_ids)
        lps = None
        if want_logprobs:
            # logprobs=0 returns, per position, a dict holding (at least) the sampled token.
            lps = tuple(float(step[t].logprob) for t, step in zip(token_ids, c.logprobs or []))
        # vLLM reports "abort" / None in corner cases; anything that is not a cut-off counts as a stop.
        reason = "length" if c.finish_reason == "length" else "stop"
        return Completion(text=c.text, token_ids=token_ids, logprobs=lps, finish_reason=reason)

    def generate_fn(self, *, logprobs: bool = False):
        """An ``eval.evaluate.GenerateFn``: ``fn(prompts, n=, temperature=, top_p=, max_new_tokens=, seed=, stop=)``.

        Evaluation does not need logprobs, so the adapter skips them by default.
        """

        def fn(prompts, *, n=1, temperature=0.0, top_p=1.0, max_new_tokens=256, seed=None, stop=None):
            return self.generate(
                prompts,
                n=n,
                temperature=temperature,
                top_p=top_p,
                max_new_tokens=max_new_tokens,
                seed=seed,
                logprobs=logprobs,
                stop=stop,
            )

        return fn

    # -- scoring ------------------------------------------------------------------------------

    def prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """log p(x_t | x_<t) for t = 1..L-1 of each token sequence (length L-1 each).

        Scores fixed sequences with the engine's current weights, e.g. to check after a weight sync
        that vLLM and the training model agree.
        """
        from vllm import SamplingParams

        self.wake_kv_cache()
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        for seq in sequences:
            if len(seq) < 2:
                raise ValueError("prompt_logprobs needs sequences of at least 2 tokens")
        outputs = self.llm.generate(self._token_prompts(sequences), params, use_tqdm=False)
        result = []
        for seq, out in zip(sequences, outputs):
            if out.prompt_logprobs is None:
                raise RuntimeError("vLLM returned no prompt logprobs although prompt_logprobs=0 was requested")
            # Position 0 has no logprob (None); the rest hold at least the actual token.
            logprobs = []
            for position, (t, step) in enumerate(zip(seq[1:], out.prompt_logprobs[1:]), start=1):
                if step is None:
                    raise RuntimeError(f"vLLM returned no prompt logprob at position {position}")
                logprobs.append(float(step[int(t)].logprob))
            result.append(logprobs)
        return result

    def memory_report(self) -> dict[str, Any]:
        """What this engine rank holds, as vLLM reports it (``_memory_report_on_worker``): KV cache bytes,
        its blocks and block size, weight bytes, the batch limits it runs with, whether it is eager, and on a
        GPU torch's allocated and reserved bytes and the device's free and total memory. The driver prints it
        beside the plan's budget (``runtime.driver.engine_memory_line``)."""
        return dict(self.llm.collective_rpc(_memory_report_on_worker)[0])

    # -- weight sync --------------------------------------------------------------------------

    def load_weights(self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> int:
        """Push HF-named full tensors into the running engine; returns how many were pushed.

        Give every weight of a vLLM fused layer together (q/k/v, gate/up): a layer that receives
        only some of its parts is rebuilt with the missing parts uninitialised. Layers that receive
        nothing keep their weights, so the usual call is the whole state dict. The prefix cache is
        cleared afterwards (cached KV entries were computed with the old weights).
        """
        self.wake_weights()
        pairs: Iterable[tuple[str, torch.Tensor]] = weights.items() if isinstance(weights, Mapping) else weights
        if not self._in_process:
            # The engine runs in another process: arguments are serialized, so no lazy iterators.
            pairs = [(n, t.detach().cpu()) for n, t in pairs]
        counts = self.llm.collective_rpc(_reload_weights_on_worker, args=(pairs,))
        self.llm.reset_prefix_cache()
        self.stale = False
        return int(counts[0]) if counts else 0

    def load_shards(self, shards: Iterable[tuple[str, tuple[int, ...], Any, torch.Tensor]]) -> int:
        """Push this TP rank's own boxes of HF-named parameters: ``(name, full shape, box, shard)``.

        vLLM's loaders cut a rank's part out of checkpoint-shaped tensors, so each shard goes in as
        ``names.checkpoint_shaped`` (zeros outside its box), one parameter at a time; a TP=1 engine's
        boxes are full and go in as they are. Same rules as ``load_weights`` otherwise.
        """
        from reallocation.names import checkpoint_shaped

        pairs = ((name, checkpoint_shaped(_received(shard), box, tuple(shape))) for name, shape, box, shard in shards)
        return self.load_weights(pairs)

    reload_weights = load_weights
    """Alias: ``reallocation.sync`` documents ``engine.reload_weights(weights)``."""

    # -- sharing the GPU with training (vLLM sleep mode) -----------------------------------------

    def sleep(self) -> None:
        """Give the device back between generations: drop the weights and the KV cache (vLLM's
        ``sleep(level=2)``; level 1 would copy the weights to host memory and back, only for them to be
        overwritten by the next reallocation). ``wake_weights``, a reload, then ``wake_kv_cache`` come
        back. With ``enable_sleep_mode=True`` only; on CPU (vLLM-CPU has no sleep mode, and its memory is
        the host's) the state changes and nothing is freed."""
        if self.sleep_mode and self.memory != EngineMemory.asleep:
            if self.on_gpu:
                self.llm.sleep(level=2)
            self._now(EngineMemory.asleep)

    def wake_weights(self) -> None:
        """Allocate the weights (their values are stale after a level-2 sleep: a reload must follow)."""
        if self.memory == EngineMemory.asleep:
            if self.on_gpu:
                self.llm.wake_up(tags=["weights"])
            self._now(EngineMemory.weights)
            self.stale = True

    def wake_kv_cache(self) -> None:
        """Allocate the KV cache, just before generating; the weights must be current."""
        if self.memory == EngineMemory.awake:
            return
        if self.memory == EngineMemory.asleep or self.stale:
            raise RuntimeError(
                "the engine slept (level 2: its weights were dropped) and was not reloaded: call "
                "wake_weights() and load the weights before generating"
            )
        if self.on_gpu:
            self.llm.wake_up(tags=["kv_cache"])
        self._now(EngineMemory.awake)

    def residency(self) -> dict[str, str]:
        """What the engine holds on its device now: {"weights": "device", "kv_cache": "device"} awake."""
        held = {EngineMemory.awake: ("weights", "kv_cache"), EngineMemory.weights: ("weights",)}
        return {kind: "device" for kind in held.get(self.memory, ())}

    def _now(self, memory: EngineMemory) -> None:
        self.memory = memory
        self.transitions.append(memory)

    def close(self) -> None:
        """Free the engine (and its KV cache) before building another one in the same process."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        engine = getattr(llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del self.llm  # the engine's last reference; a second close() finds no `llm` and returns
        import gc

        gc.collect()
        torch.set_num_threads = self._set_num_threads
        torch.set_num_threads(self._torch_threads_before)
