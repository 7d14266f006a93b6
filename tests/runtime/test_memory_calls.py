"""The order of the GPU memory calls, checked on CPU with recording stand-ins: vLLM's ``LLM`` (sleep and
wake-up), ``torch.cuda`` (empty_cache), and a device pool whose engines and device processes record
what the driver asks of them over one PPO iteration."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from models.vllm_engine import EngineMemory, VLLMEngine
from planning.execution_plan import CallAllocation, ExecutionPlan
from planning.lifecycle import Inputs, Phase, memory_lifecycle
from planning.shapes import named_spec
from runtime.device.memory import DeviceMemory


class RecordingLLM:
    """vLLM's ``LLM`` as far as the engine calls it."""

    def __init__(self, calls: list[str]):
        self.calls = calls

    def sleep(self, level: int = 1) -> None:
        self.calls.append(f"llm.sleep(level={level})")

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(f"llm.wake_up({tags})")

    def collective_rpc(self, fn, args=()):
        self.calls.append(f"llm.{fn.__name__}")
        return [0]

    def reset_prefix_cache(self) -> None:
        pass

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append("llm.generate")
        return [SimpleNamespace(outputs=[]) for _ in prompts]


def _engine(calls: list[str], on_gpu: bool = True) -> VLLMEngine:
    """The real ``VLLMEngine`` logic around a recording ``LLM`` (no vLLM needed)."""
    engine = object.__new__(VLLMEngine)
    engine.llm = RecordingLLM(calls)
    engine.seed, engine.sleep_mode, engine.on_gpu, engine._in_process = 0, True, on_gpu, True
    engine.memory, engine.stale, engine.transitions = EngineMemory.awake, False, []
    engine._token_prompts = lambda prompts: [{"prompt_token_ids": p} for p in prompts]
    return engine


def test_an_engine_sleeps_at_level_two_and_wakes_in_two_steps():
    """Generate, sleep (level 2: no copy of weights about to be overwritten), wake the weights, load new
    ones, wake the KV cache just before generating again (every request carries its seed: no worker call)."""
    calls: list[str] = []
    engine = _engine(calls)
    engine.generate([[1, 2]], seed=7)
    engine.sleep()
    engine.sleep()  # already asleep: nothing more
    assert engine.residency() == {}
    engine.wake_weights()
    assert engine.residency() == {"weights": "device"}
    with pytest.raises(RuntimeError, match="not reloaded"):
        engine.generate([[1, 2]])  # its weights are stale until loaded
    engine.load_weights([("w", torch.zeros(1))])
    engine.generate([[1, 2]], seed=8)
    assert calls == [
        "llm.generate",
        "llm.sleep(level=2)",
        "llm.wake_up(['weights'])",
        "llm._reload_weights_on_worker",
        "llm.wake_up(['kv_cache'])",
        "llm.generate",
    ]
    assert engine.transitions == [EngineMemory.asleep, EngineMemory.weights, EngineMemory.awake]


def test_on_cpu_the_engine_changes_state_and_calls_no_sleep_mode():
    calls: list[str] = []
    engine = _engine(calls, on_gpu=False)
    engine.sleep()
    engine.wake_weights()
    engine.load_weights([("w", torch.zeros(1))])
    engine.generate([[1]])
    assert "llm.sleep(level=2)" not in calls and not any(c.startswith("llm.wake_up") for c in calls)
    assert engine.transitions == [EngineMemory.asleep, EngineMemory.weights, EngineMemory.awake]


class FakeCuda:
    def __init__(self, calls: list[str]):
        self.calls = calls

    def empty_cache(self) -> None:
        self.calls.append("cuda.empty_cache")

    def synchronize(self) -> None:
        self.calls.append("cuda.synchronize")

    def ipc_collect(self) -> None:
        self.calls.append("cuda.ipc_collect")


def test_offloaded_weights_go_to_pinned_host_memory_and_the_cache_is_released():
    calls: list[str] = []
    memory = DeviceMemory(torch.device("cpu"), cuda=FakeCuda(calls))
    model = torch.nn.Linear(2, 2)
    memory.to_host("ref", model)
    assert memory.on_host == {"ref"}
    memory.to_device("ref", model)
    memory.release("after ref.compute_logprobs")
    assert memory.log == [
        ("to_host", "ref"),
        ("release", "ref offloaded"),
        ("to_device", "ref"),
        ("release", "after ref.compute_logprobs"),
    ]
    assert calls == ["cuda.synchronize", "cuda.empty_cache", "cuda.empty_cache"]
    assert memory.on_host == set()


def test_memory_shared_over_cuda_ipc_is_collected_before_the_cache_is_released():
    """After the engine has loaded the handoff: ipc_collect frees the blocks it no longer maps, then
    empty_cache hands them back (verl's bucketed sender ends the same way)."""
    calls: list[str] = []
    memory = DeviceMemory(torch.device("cpu"), cuda=FakeCuda(calls))
    memory.release_ipc("after the engine loaded the handoff")
    assert calls == ["cuda.ipc_collect", "cuda.empty_cache"]
    assert [what for what, _ in memory.log] == ["ipc_collect", "release"]


def test_a_reference_replica_visits_the_device_for_its_call_only(tiny_model_dir):
    from runtime.device.shards import ReferenceShard
    from trainer.rollout import pad_batch

    shard = ReferenceShard(model_dir=str(tiny_model_dir), offload=True)
    calls: list[str] = []
    shard.memory.cuda = FakeCuda(calls)
    assert shard.residency() == {("ref", "weights"): "host"}
    shard.compute_logprobs(pad_batch([[5, 6]], [[7, 8, 9]], pad_id=0))
    assert [what for what, _ in shard.memory.log] == ["to_host", "release", "to_device", "to_host", "release"]
    assert shard.residency() == {("ref", "weights"): "host"} and calls[-1] == "cuda.empty_cache"


# -- the driver's engine calls over one iteration, with a pool that runs everything in-process -----


class Future:
    _ids = itertools.count()

    def __init__(self, value):
        self.value, self.id = value, next(self._ids)


class RecordingPool:
    """A DevicePool stand-in: ``submit`` runs the method at once on a recording stand-in of the device
    process or its engine and returns a ready future, as Ray would once the call ends."""

    def __init__(self, devices: list[int], calls: list[str]):
        self.devices, self.calls = devices, calls

    def submit(self, device, method, *args, companion=None, timed=True, num_returns=1, **kwargs):
        self.calls.append(f"{companion or 'device'}{device}.{method}{'' if method != 'call' else '.' + args[1]}")
        value = self._result(method, args)
        if num_returns == 2:
            return Future(value[0]), Future(value[1])
        return Future((value, 0.0, 0.0) if timed else value)

    def _result(self, method, args):
        if method == "residency":
            return {}
        if method == "generate":
            return [[SimpleNamespace(text="", token_ids=())] for _ in args[0]]
        if method == "reallocate":  # every device of the move held a bucket; generation devices the handoff
            held = {"transfer/buffers": "device", "handoff/buffers": "device"}
            return None, ({"bytes_received": 0, "bytes_sent": 0, "lower_bound": 0, "held": held}, 0.0, 0.0)
        if method == "call" and args[1] == "update":
            return {"loss": 0.0}
        if method == "call" and args[1] in ("compute_logprobs", "compute_values"):
            return torch.zeros(len(args[2]["input_ids"]), 1)
        if method == "call" and args[1] == "score":
            return None
        return None

    def wait(self, futures):
        return [f.value for f in futures]

    def wait_any(self, futures):
        return list(futures)


def test_the_driver_wakes_and_sleeps_the_engines_at_the_lifecycles_phase_boundaries():
    """On GPUs shared by every call: generate with the engines awake; they sleep before inference; the
    weight sync wakes their weights before loading them; the next generation wakes the KV cache."""
    from ppo.config import PPOConfig
    from runtime.driver import PlanRuntime

    both = (0, 1)
    plan = ExecutionPlan(
        1,
        2,
        {c: CallAllocation(both, dp=2) for c in ("actor_gen", "ref_inf", "critic_inf", "actor_train", "critic_train")},
    )
    spec = named_spec("qwen2.5-math-1.5b")
    life = memory_lifecycle(
        plan.calls, Inputs({"actor": spec, "critic": spec, "ref": spec}, 4, 8, 8, 2, gpu=True), 80e9
    )
    calls: list[str] = []
    runtime = PlanRuntime(
        plan, RecordingPool([0, 1], calls), reward_actor=None, ppo=PPOConfig(num_minibatches=1), seed=0, engine_boxes={}
    )
    runtime.reward_actor = SimpleNamespace(submit_timed=lambda method, samples: [Future((None, 0.0, 0.0))])
    runtime.engines_sleep = life.engines_sleep
    batch = {
        "input_ids": torch.zeros(4, 3, dtype=torch.long),
        "attention_mask": torch.ones(4, 3, dtype=torch.long),
        "response_mask": torch.ones(4, 1),
    }
    runtime.generate([[1], [2], [3], [4]], seed=0)
    runtime.infer(batch, [None] * 4)
    training = runtime.start_training({**batch, "advantages": torch.zeros(4, 1)}, 0)
    sync = runtime.weight_sync.start(after=training)
    runtime.finish_training(training)
    runtime.weight_sync.finish(sync)
    runtime.generate([[1], [2], [3], [4]], seed=1)
    engine0 = [c.split(".", 1)[1] for c in calls if c.startswith("engine0.") and not c.endswith("residency")]
    assert engine0 == [
        "wake_kv_cache",
        "generate",
        "sleep",
        "sleep",
        "wake_weights",
        "load_shards",
        "wake_kv_cache",
        "generate",
    ]
    device0 = [c for c in calls if c.startswith("device0.") and not c.endswith("residency")]
    assert device0.index("device0.call.update") < device0.index("device0.reallocate")
    # The handed-over shards are freed once the engine has loaded them, before anything else runs there.
    assert calls.index("engine0.load_shards") < calls.index("device0.handoff_done")
    assert device0[device0.index("device0.reallocate") + 1] == "device0.handoff_done"
    rows = [row for row in runtime.residency_log if row["device"] == 0]
    assert [(row["phase"], row.get("call")) for row in rows] == [
        (Phase.generate, None),
        (Phase.infer, None),
        (Phase.train, None),
        (Phase.reallocate, "realloc_actor"),  # recorded by the move itself, at its fullest
        (Phase.reallocate, None),
        (Phase.generate, None),
    ]
    during = life.to_json()["devices"]["0"]["reallocate"]["during"]
    assert rows[3]["held"] == during["realloc_actor"] == {"transfer/buffers": "device", "handoff/buffers": "device"}


def test_a_shard_handed_over_as_an_ipc_handle_arrives_as_the_same_tensor():
    """On a GPU the device process hands the engine beside it a CUDA IPC handle (reduce_tensor), not a
    copy; the same reduction of a CPU tensor (shared memory) shows the engine rebuilds what was sent."""
    from torch.multiprocessing.reductions import reduce_tensor

    from models.vllm_engine import _received

    shard = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(_received(reduce_tensor(shard)), shard)
    assert _received(shard) is shard  # on CPU the tensor itself travels (Ray's object store)


def test_a_cuda_ipc_handle_is_rebuilt_on_the_engines_own_device_index():
    """The sender's GPU index in a handle (argument 6 of rebuild_cuda_tensor, ``storage_device``) is replaced
    by the receiver's, as verl does: a process that sees its GPU as cuda:3 hands it to one that sees it as 0."""
    import inspect

    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    from models.vllm_engine import CUDA_IPC_DEVICE_ARG, _received, on_device

    names = list(inspect.signature(rebuild_cuda_tensor).parameters)
    assert names[CUDA_IPC_DEVICE_ARG] == "storage_device"
    sent = tuple(range(15))
    assert on_device(sent, 0) == (0, 1, 2, 3, 4, 5, 0, 7, 8, 9, 10, 11, 12, 13, 14)
    seen: list[tuple] = []

    def rebuild_cuda_tensor(*args):  # the name _received recognises; records what it would rebuild
        seen.append(args)
        return torch.zeros(1)

    _received((rebuild_cuda_tensor, (None,) * 6 + (3,) + (None,) * 8), device_index=0)
    assert seen[0][CUDA_IPC_DEVICE_ARG] == 0


def test_engines_start_with_the_plans_memory_and_batch_limits_and_report_beside_them():
    """Each engine gets the lifecycle's KV cache and batch limits (4 sequences a wave, 4 x 16 = 64 tokens a
    step here), on a GPU with a utilization covering its whole budget; its start-up line puts what vLLM reports
    beside that budget. The GPU report below is written by hand in the shape ``VLLMEngine.memory_report`` gives."""
    from planning.lifecycle import Kind
    from runtime.driver import engine_memory_kwargs, engine_memory_line

    both = (0, 1)
    calls = {
        c: CallAllocation(both, dp=2) for c in ("actor_gen", "ref_inf", "critic_inf", "actor_train", "critic_train")
    }
    spec = named_spec("qwen2.5-math-1.5b")
    life = memory_lifecycle(calls, Inputs({"actor": spec, "critic": spec, "ref": spec}, 8, 8, 8, 2, gpu=True), 80e9)
    assert life.engine_batch == (4, 64)
    budget = life.engine_budget(0)
    gpu = engine_memory_kwargs(life, 0, on_gpu=True)
    assert (gpu["max_num_seqs"], gpu["max_num_batched_tokens"]) == (4, 64)
    assert gpu["kv_cache_memory_bytes"] == int(budget[Kind.kv_cache])
    assert gpu["gpu_memory_utilization"] * 80e9 >= sum(budget.values())
    cpu = engine_memory_kwargs(life, 0, on_gpu=False)
    assert cpu == {"kv_cache_gib": int(budget[Kind.kv_cache]) / 2**30, "max_num_seqs": 4, "max_num_batched_tokens": 64}
    gib = 2**30
    report = {
        "kv_cache_bytes": gib // 2,
        "num_blocks": 1024,
        "block_size": 16,
        "weights_bytes": 3 * gib,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 64,
        "enforce_eager": True,
        "cuda_allocated_bytes": 4 * gib,
        "cuda_reserved_bytes": 5 * gib,
        "cuda_free_bytes": 70 * gib,
        "cuda_total_bytes": 80 * gib,
    }
    line = engine_memory_line(0, report, {Kind.kv_cache: gib / 4, Kind.weights: 3 * gib, Kind.activations: gib})
    assert line == (
        "[engine] device 0: vLLM KV cache 0.500 GiB (1024 blocks of 16), weights 3.000 GiB, batch 4 seqs / 64 tokens, "
        "eager; planned KV 0.250 GiB, weights 3.000 GiB, workspace 1.000 GiB; cuda allocated 4.0 GiB, reserved "
        "5.0 GiB, free 70.0 of 80.0 GiB"
    )
