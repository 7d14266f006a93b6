"""Device processes over gloo, several per test (torch.multiprocessing): reallocation between layouts
moves the lower bound, pipeline stages and sharded reward models compute what one process computes, and
a plan's micro-batches and offload reach the shards. Every send and receive keeps NCCL's point-to-point
rules (``tests.strict_p2p``)."""

from __future__ import annotations

import pytest
import torch

from planning.execution_plan import CallAllocation
from reallocation.layout import ModelSpec, full_box
from runtime.meshes import Pipeline
from tests import strict_p2p
from tests import tolerance as tol
from tests.conftest import leave_process_group
from tests.runtime.test_topology import DISJOINT, _plan


def _actor_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    from transformers import AutoConfig

    return ModelSpec.from_hf_config(AutoConfig.from_pretrained(model_dir)).shapes()


def _reallocate(device: int, port: int, model_dir: str, out_dir: str) -> None:
    """One device worker of a 3-device world: the actor's FSDP shards on devices 0 and 1, its
    generation replicas on devices 1 and 2 (device 1 holds half and receives the other half)."""
    from runtime.device.process import DeviceProcess
    from runtime.device.shards import PolicyShard

    torch.set_num_threads(1)
    strict_p2p.install(f"{out_dir}/p2p_store", 3)  # sends and receives under NCCL's rules
    builders = {"actor": (PolicyShard, {"model_dir": model_dir}, ((0,), (1,)))} if device < 2 else {}
    worker = DeviceProcess(device, (0, 1, 2), "127.0.0.1", port, "gloo", [(0, 1), (0, 1, 2)], "float32", builders)
    engine = {name: {1: full_box(shape), 2: full_box(shape)} for name, shape in _actor_shapes(model_dir).items()}
    weights, (counts, start, end) = worker.reallocate("actor", "engine", (0, 1), (1, 2), engine)
    held = {"kept": len(worker._ipc_keepalive), "residency": worker.residency()}
    worker.handoff_done(None)  # what the driver calls once the engine has loaded ``weights``
    held.update(kept_after=len(worker._ipc_keepalive), residency_after=worker.residency(), memory=worker.memory.log)
    out = {"weights": weights, "counts": counts, "held": held}
    torch.save(out, f"{out_dir}/device{device}.pt")
    leave_process_group()


def test_reallocation_sends_each_replica_only_what_it_lacks(tiny_model_dir, tmp_path):
    import torch.multiprocessing as mp
    from transformers import AutoModelForCausalLM

    from tests.conftest import free_port

    mp.spawn(_reallocate, args=(free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=3, join=True)
    out = [torch.load(tmp_path / f"device{d}.pt") for d in range(3)]
    reference = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    total = sum(p.numel() * 4 for p in reference.values())
    assert out[0]["weights"] is None  # a source only
    # At its fullest every device held a bucket in flight; the engines' devices, every shard handed over.
    bucket, handoff = {"transfer/buffers": "device"}, {"handoff/buffers": "device"}
    assert [o["counts"]["held"] for o in out] == [bucket, {**bucket, **handoff}, {**bucket, **handoff}]
    # The handoff stays held until the engine has loaded it (handoff_done), then goes: ipc_collect and
    # empty_cache on a GPU; the buckets' cached blocks went back as the move ended (empty_cache on a GPU).
    for d, o in enumerate(out):
        kept = len(o["weights"]) if d else 0
        assert o["held"]["kept"] == kept and o["held"]["kept_after"] == 0
        assert o["held"]["residency"].get("handoff/buffers") == ("device" if d else None)
        assert "handoff/buffers" not in o["held"]["residency_after"]
        assert "transfer/buffers" not in o["held"]["residency"]
        after_move = [("release", "after reallocate actor -> engine")]
        freed = [
            ("ipc_collect", "after the engine loaded the handoff"),
            ("release", "after the engine loaded the handoff"),
        ]
        assert o["held"]["memory"][-3 if d else -1 :] == after_move + (freed if d else [])
    for device in (1, 2):
        got = {name: shard for name, _, _, shard in out[device]["weights"]}
        assert got.keys() == reference.keys()
        assert all(torch.equal(got[n], p.detach()) for n, p in reference.items())
    received = [o["counts"]["bytes_received"] for o in out]
    # Device 2 lacks everything; device 1 lacks what device 0 holds (FSDP: about half of each tensor).
    assert received[0] == 0 and received[2] == total and 0 < received[1] < total
    assert sum(received) == out[0]["counts"]["lower_bound"]


def _reallocate_tp(device: int, port: int, model_dir: str, out_dir: str) -> None:
    """One device worker of a 4-device world: actor and critic trained as 2 FSDP x 2 TP; the
    actor goes to tp=1 engines on devices 1 and 2 and then to one TP-2 engine on devices 2 and 3,
    the critic to one TP-2 inference replica on 2, 3."""
    from transformers import AutoConfig

    from reallocation.names import vllm_layout
    from runtime.device.process import DeviceProcess
    from runtime.device.shards import CriticShard, PolicyShard, _full_state_dict
    from runtime.meshes import grid_groups

    torch.set_num_threads(1)
    strict_p2p.install(f"{out_dir}/p2p_store", 4)  # sends and receives under NCCL's rules
    train, replica = ((0, 1), (2, 3)), ((2, 3),)
    builders = {
        "actor": (PolicyShard, {"model_dir": model_dir}, train),
        "critic": (CriticShard, {"model_dir": model_dir}, train),
    }
    if device >= 2:
        builders["critic_inf"] = (CriticShard, {"model_dir": model_dir}, replica)
    groups = sorted(set(grid_groups(train)) | set(grid_groups(replica)))
    worker = DeviceProcess(device, (0, 1, 2, 3), "127.0.0.1", port, "gloo", groups, "float32", builders)
    with torch.no_grad():  # the training weights move away from what the replica loaded
        for param in worker.shards["critic"].model.parameters():
            param.to_local().add_(1.0)
    spec = ModelSpec.from_hf_config(AutoConfig.from_pretrained(model_dir))
    replicas = vllm_layout(1, 2, ranks=(1, 2)).holdings(spec)
    weights, (actor_counts, _, _) = worker.reallocate("actor", "engine", (0, 1, 2, 3), (1, 2), replicas)
    tp_engine = vllm_layout(2, 1, ranks=(2, 3)).holdings(spec)
    tp_shards, (tp_counts, _, _) = worker.reallocate("actor", "engine", (0, 1, 2, 3), (2, 3), tp_engine)
    _, (critic_counts, _, _) = worker.reallocate("critic", "critic_inf", (0, 1, 2, 3), (2, 3))
    out = {"weights": weights, "tp_shards": tp_shards, "actor": actor_counts, "tp": tp_counts, "critic": critic_counts}
    if device >= 2:
        out["critic_inf"] = _full_state_dict(worker.shards["critic_inf"].model, worker.shards["critic_inf"].ranks)
    torch.save(out, f"{out_dir}/device{device}.pt")
    leave_process_group()


def test_reallocation_from_tensor_parallel_training_moves_the_lower_bound(tiny_kv2_model_dir, tmp_path):
    import torch.multiprocessing as mp
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    from tests.conftest import free_port

    model_dir = str(tiny_kv2_model_dir)
    mp.spawn(_reallocate_tp, args=(free_port(), model_dir, str(tmp_path)), nprocs=4, join=True)
    out = [torch.load(tmp_path / f"device{d}.pt") for d in range(4)]
    actor = dict(AutoModelForCausalLM.from_pretrained(model_dir).named_parameters())
    for device in (1, 2):  # each engine gets the whole actor, bit for bit
        got = {name: shard for name, _, _, shard in out[device]["weights"]}
        assert got.keys() == actor.keys() and all(torch.equal(got[n], p.detach()) for n, p in actor.items())
    config = AutoConfig.from_pretrained(model_dir, num_labels=1)
    critic = dict(AutoModelForTokenClassification.from_pretrained(model_dir, config=config).named_parameters())
    got = out[2]["critic_inf"]  # the replica's TP shards, gathered: the training weights + 1
    assert got.keys() == critic.keys()
    for name, param in critic.items():  # the value head starts at zero, the backbone as loaded
        want = torch.ones_like(param) if name.startswith("score.") else param.detach() + 1.0
        assert torch.equal(got[name], want), name
    # The TP-2 engine's ranks get their own vLLM boxes of the actor (the one kv head on both), nothing else.
    for device in (2, 3):
        for name, shape, box, shard in out[device]["tp_shards"]:
            assert tuple(shape) == tuple(actor[name].shape)
            assert torch.equal(shard, actor[name].detach()[tuple(slice(a, b) for a, b in box)]), (device, name)
    q_box = {
        d: dict((n, b) for n, _, b, _ in out[d]["tp_shards"])["model.layers.0.self_attn.q_proj.weight"] for d in (2, 3)
    }
    assert q_box[2][0] == (0, 64) and q_box[3][0] == (64, 128)  # 2 heads of 64: one each
    for model in ("actor", "tp", "critic"):
        received = sum(o[model]["bytes_received"] for o in out)
        assert received == out[0][model]["lower_bound"] > 0, model
    # Engines on devices 1 and 2 hold part of the actor already; 0 and 3 are sources only.
    total = sum(p.numel() * 4 for p in actor.values())
    assert [o["actor"]["bytes_received"] == 0 for o in out] == [True, False, False, True]
    assert all(0 < out[d]["actor"]["bytes_received"] < total for d in (1, 2))


def _pipelines(device: int, port: int, model_dir: str, out_dir: str) -> None:
    """One device worker of a 4-device world: the critic trained as FSDP over devices 0, 1; a
    reference replica in 2 stages of TP 2 (stage 0 on 0, 1; stage 1 on 2, 3); a critic inference
    replica in 2 stages (2 -> 3) that gets the trained critic by reallocation."""
    from runtime.device.process import DeviceProcess
    from runtime.device.shards import CriticShard, ReferenceShard
    from runtime.meshes import grid_groups, pipeline_groups
    from tests.runtime.test_shards import make_batch

    torch.set_num_threads(1)
    strict_p2p.install(f"{out_dir}/p2p_store", 4)  # sends and receives under NCCL's rules
    train, ref, critic_inf = ((0,), (1,)), Pipeline.of_rows((0, 1), (2, 3)), Pipeline.of_rows((2,), (3,))
    builders = {"ref": (ReferenceShard, {"model_dir": model_dir}, ref)}
    if device < 2:
        builders["critic"] = (CriticShard, {"model_dir": model_dir}, train)
    else:
        builders["critic_inf"] = (CriticShard, {"model_dir": model_dir}, critic_inf)
    groups = sorted({*grid_groups(train), *pipeline_groups(ref), *pipeline_groups(critic_inf)})
    worker = DeviceProcess(device, (0, 1, 2, 3), "127.0.0.1", port, "gloo", groups, "float32", builders)
    if device < 2:
        with torch.no_grad():  # the training weights move away from what the replica loaded
            for param in worker.shards["critic"].model.parameters():
                param.to_local().add_(1.0)
    _, (counts, _, _) = worker.reallocate("critic", "critic_inf", (0, 1), (2, 3))
    batch = make_batch(num_rows=6)
    out = {
        "counts": counts,
        "ref_logprobs": worker.call("ref", "compute_logprobs", batch, 2),
        "params": sorted(n for n, _ in worker.shards["ref"].model.named_parameters()),
    }
    if device >= 2:
        out["values"] = worker.call("critic_inf", "compute_values", batch, 2)
    torch.save(out, f"{out_dir}/device{device}.pt")
    leave_process_group()


@pytest.mark.equivalence
def test_pipeline_stages_compute_what_one_process_computes(tiny_kv2_model_dir, tmp_path):
    """Reference logprobs from 2 stages x TP 2 and critic values from 2 stages (after the trained
    critic moved into them) equal one unsharded process's, in 2 micro-batches (rule 1 of
    tests/tolerance.py); each stage holds only its part of the model under its HF names and receives
    only that part."""
    import torch.multiprocessing as mp
    from transformers import AutoConfig, AutoModelForTokenClassification

    from runtime.device.shards import CriticShard, ReferenceShard
    from tests.conftest import free_port
    from tests.runtime.test_shards import make_batch

    model_dir = str(tiny_kv2_model_dir)
    mp.spawn(_pipelines, args=(free_port(), model_dir, str(tmp_path)), nprocs=4, join=True)
    out = [torch.load(tmp_path / f"device{d}.pt") for d in range(4)]
    batch = make_batch(num_rows=6)
    ref_logprobs = ReferenceShard(model_dir=model_dir).compute_logprobs(batch)
    shape, num_tokens = tol.Reductions.of(model_dir), batch["input_ids"].shape[1]
    logprob_bound = tol.rounding(shape.forward(num_tokens), tol.scale_of(ref_logprobs))
    tol.assert_close(out[2]["ref_logprobs"], ref_logprobs, logprob_bound)  # the last stage reports
    critic = CriticShard(model_dir=model_dir)
    with torch.no_grad():
        for param in critic.model.parameters():
            param.add_(1.0)
    values = critic.compute_values(batch)  # every weight 1 larger: values in the hundreds, the bound with them
    tol.assert_close(
        out[3]["values"], values, tol.rounding(shape.forward(num_tokens, lm_head=False), tol.scale_of(values))
    )
    stage0 = {"model.embed_tokens.weight"} | {n for n in out[0]["params"] if n.startswith("model.layers.0.")}
    assert set(out[0]["params"]) == stage0 and out[0]["params"] == out[1]["params"]
    assert not any(n.startswith("model.layers.0.") for n in out[2]["params"])
    # The LM head shares the embedding: the last stage holds it too (one tensor, named once).
    assert {"model.embed_tokens.weight", "model.norm.weight", "model.layers.1.mlp.up_proj.weight"} <= set(
        out[2]["params"]
    )
    config = AutoConfig.from_pretrained(model_dir, num_labels=1)
    sizes = {
        n: p.numel() * 4
        for n, p in AutoModelForTokenClassification.from_pretrained(model_dir, config=config).named_parameters()
    }
    first = sum(b for n, b in sizes.items() if n == "model.embed_tokens.weight" or n.startswith("model.layers.0."))
    received = [o["counts"]["bytes_received"] for o in out]
    assert received == [0, 0, first, sum(sizes.values()) - first]
    assert sum(received) == out[0]["counts"]["lower_bound"]


def _reward_replica(device: int, port: int, rm_dirs: dict[str, str], out_dir: str) -> None:
    """One device of a reward replica in 2 stages x TP 2 (stage 0 on devices 0, 1; stage 1 on 2, 3),
    hosting three reward functions: a value-head PRM with Clip-Delta, a step-tag PRM (a causal LM
    whose head is the embedding, TP-sharded) and an ORM."""
    from runtime.device.process import DeviceProcess
    from runtime.device.reward import RewardShard
    from runtime.meshes import pipeline_groups

    torch.set_num_threads(1)
    strict_p2p.install(f"{out_dir}/p2p_store", 4)  # sends and receives under NCCL's rules
    replica = Pipeline.of_rows((0, 1), (2, 3))
    builders = {
        name: (RewardShard, {"reward_cfg": cfg, "tokenizer_dir": rm_dirs["policy"]}, replica)
        for name, cfg in _reward_configs(rm_dirs).items()
    }
    worker = DeviceProcess(
        device, (0, 1, 2, 3), "127.0.0.1", port, "gloo", pipeline_groups(replica), "float32", builders
    )
    samples = _reward_samples(rm_dirs["policy"])
    out = {name: worker.call(name, "score", samples) for name in builders}
    out["params"] = sorted(n for n, _ in worker.shards["prm"].fn.reward_model.model.named_parameters())
    torch.save(out, f"{out_dir}/device{device}.pt")
    leave_process_group()


def _reward_configs(rm_dirs: dict[str, str]) -> dict[str, object]:
    from rewards.config import Readout, Refinement, RewardConfig, RewardKind, RewardModelConfig

    prm, orm = RewardKind.prm, RewardKind.orm
    return {
        "prm": RewardConfig(kind=prm, refinement=Refinement.clip_delta, model=RewardModelConfig(path=rm_dirs["prm"])),
        "prm_tag": RewardConfig(kind=prm, model=RewardModelConfig(path=rm_dirs["policy"], readout=Readout.step_tag)),
        "orm": RewardConfig(kind=orm, alpha=0.5, model=RewardModelConfig(path=rm_dirs["orm"], batch_size=2)),
    }


def _reward_samples(tokenizer_dir: str) -> list:
    from transformers import AutoTokenizer

    from rewards.types import RewardSample

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    question = "Start with 7. Add 5, then multiply by 3. What is the result?"
    responses = [
        "7 + 5 = 12\n\n12 * 3 = 36\n\nThe answer is \\boxed{36}.",
        "The answer is \\boxed{35}.",
        "7 + 5 = 12\n\n12 * 3 = 35\n\n\n\nmore\n\nThe answer is \\boxed{35}.",
        "",
    ]
    return [RewardSample(question, "36", "math", question, r, tok(r).input_ids) for r in responses]


@pytest.mark.equivalence
def test_sharded_reward_models_score_like_one_process(tiny_kv2_model_dir, tmp_path):
    """A reward replica in 2 stages x TP 2 gives one process's rewards for three kinds of reward
    model (rule 1 of tests/tolerance.py: scores in [0, 1], read through a value head or an LM head's
    softmax); the last stage's first device reports, the others return None; stage 0 holds only the
    embedding and block 0."""
    import torch.multiprocessing as mp
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer

    from runtime.device.reward import RewardShard
    from tests.conftest import free_port

    rm_dirs = {"policy": str(tiny_kv2_model_dir)}
    for name, cls in [("prm", AutoModelForTokenClassification), ("orm", AutoModelForSequenceClassification)]:
        torch.manual_seed(0)
        cls.from_pretrained(tiny_kv2_model_dir, num_labels=1).save_pretrained(tmp_path / name)
        AutoTokenizer.from_pretrained(tiny_kv2_model_dir).save_pretrained(tmp_path / name)
        rm_dirs[name] = str(tmp_path / name)
    mp.spawn(_reward_replica, args=(free_port(), rm_dirs, str(tmp_path)), nprocs=4, join=True)
    out = [torch.load(tmp_path / f"device{d}.pt", weights_only=False) for d in range(4)]
    samples = _reward_samples(rm_dirs["policy"])
    bound = _score_bound(rm_dirs["policy"], samples)
    for name, cfg in _reward_configs(rm_dirs).items():
        assert [o[name] is None for o in out] == [True, True, False, True], name
        got, want = out[2][name], RewardShard(reward_cfg=cfg, tokenizer_dir=rm_dirs["policy"]).score(samples)
        tol.assert_close(got.token_rewards, want.token_rewards, bound, msg=name)
        assert torch.equal(got.success, want.success) and torch.equal(got.num_steps, want.num_steps), name
        for a, b in zip(got.step_scores, want.step_scores):
            tol.assert_close(torch.tensor(a), torch.tensor(b), bound, msg=name)
    assert [len(s) for s in out[2]["prm"].step_scores] == [3, 1, 4, 0]  # the empty paragraph is no step
    names = [n for n, _ in AutoModelForTokenClassification.from_pretrained(rm_dirs["prm"]).named_parameters()]
    stage0 = sorted(n for n in names if n == "model.embed_tokens.weight" or n.startswith("model.layers.0."))
    assert out[0]["params"] == out[1]["params"] == stage0
    assert out[2]["params"] == out[3]["params"] == sorted(set(names) - set(stage0))  # block 1, norm, score


def _score_bound(model_dir: str, samples: list) -> float:
    """Rule 1 for a reward model's scores and token rewards over ``samples``: a forward pass through
    the LM head (the longest path: a step-tag PRM's softmax), twice (Clip-Delta's differences of
    scores), at scale 1 (scores in [0, 1]), on the longest input: the question, the response and a tag
    per step are at most twice their characters, and a token holds at least one character."""
    longest = 2 * max(len(s.question) + len(s.response_text) for s in samples)
    return tol.rounding(2 * tol.Reductions.of(model_dir).forward(longest))


@pytest.mark.parametrize(
    "algorithm, calls, roles",
    [
        ("ppo", DISJOINT.calls, ["actor", "critic", "critic_inf", "ref", "reward"]),
        ("grpo", {c: DISJOINT.calls[c] for c in ("actor_gen", "actor_train", "ref_inf")}, ["actor", "ref", "reward"]),
        ("grpo_without_kl", {c: DISJOINT.calls[c] for c in ("actor_gen", "actor_train")}, ["actor", "reward"]),
    ],
    ids=["ppo", "grpo", "grpo_without_kl"],
)
def test_recipes_cover_the_plans_roles_and_reward_workers_get_its_micro_batches_and_offload(algorithm, calls, roles):
    """The driver builds a worker recipe for exactly the roles whose calls the plan has (a critic-free plan
    none for the critic, one without ref_inf none for the reference), each from the inputs the driver
    passes, and the reward workers take rew_inf's micro-batches and offload."""
    from ppo.config import AlgorithmConfig, Estimator
    from runtime.device.reward import RewardShard
    from runtime.device.shards import PolicyShard
    from runtime.driver import _recipes

    config = {
        "ppo": AlgorithmConfig(),
        "grpo": AlgorithmConfig(name="grpo", estimator=Estimator.grpo),
        "grpo_without_kl": AlgorithmConfig(name="grpo", estimator=Estimator.grpo, kl_coef=0.0),
    }[algorithm]
    plan = _plan(**{**calls, "rew_inf": CallAllocation((4,), num_microbatches=4, offload=True)})
    dirs = dict(policy_dir="p", critic_dir="c", temperature=1.0, algorithm=config, loss_norm_tokens=1)
    reward = {"reward_cfg": None, "tokenizer_dir": "p", "device": "cpu"}
    recipes = _recipes(plan, {}, {}, dirs, reward)
    assert sorted(recipes) == roles
    assert recipes["actor"][0] is PolicyShard and recipes["actor"][1]["algorithm"] is config
    worker_cls, kwargs = recipes["reward"]
    assert worker_cls is RewardShard and (kwargs["num_microbatches"], kwargs["offload"]) == (4, True)


@pytest.mark.gpu
@pytest.mark.equivalence
def test_offloaded_reward_model_waits_on_the_host_and_scores_on_the_gpu(tiny_kv2_model_dir, tmp_path):
    """rew_inf's offload on a GPU: between calls the PRM's weights are in host memory, during a call
    on the GPU, and the rewards are those of a PRM that never moves."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    from runtime.device.reward import RewardShard

    torch.manual_seed(0)
    AutoModelForTokenClassification.from_pretrained(tiny_kv2_model_dir, num_labels=1).save_pretrained(tmp_path / "prm")
    AutoTokenizer.from_pretrained(tiny_kv2_model_dir).save_pretrained(tmp_path / "prm")
    rm_dirs = {"policy": str(tiny_kv2_model_dir), "prm": str(tmp_path / "prm")}
    cfg = _reward_configs({**rm_dirs, "orm": rm_dirs["prm"]})["prm"]  # only the PRM is loaded
    samples = _reward_samples(rm_dirs["policy"])
    kwargs = {"reward_cfg": cfg, "tokenizer_dir": rm_dirs["policy"], "device": "cuda"}
    offloaded, resident = RewardShard(**kwargs, offload=True), RewardShard(**kwargs)
    model = offloaded.fn.reward_model.model
    assert next(model.parameters()).device.type == "cpu"
    seen = []
    reader = offloaded.fn.reward_model.reader
    reader.body = lambda ids, mask: (seen.append(next(model.parameters()).device.type), reader.hidden(ids, mask))[1]
    got, want = offloaded.score(samples), resident.score(samples)
    assert seen and set(seen) == {"cuda"} and next(model.parameters()).device.type == "cpu"
    tol.assert_close(got.token_rewards, want.token_rewards, _score_bound(rm_dirs["policy"], samples))


def test_training_micro_batches_are_the_size_the_plan_priced():
    """The plan counts micro-batches over the whole batch; the update cuts it into minibatches first.
    512 over 4 minibatches of 1024 rows per rank: 128 each (8 rows, as priced); 6 over 4: 2 each
    (never larger than priced); at most one per row of the smallest share."""
    from ppo.batch import microbatches_per_minibatch

    assert microbatches_per_minibatch(512, 4, [[1024, 1024], [1024, 1024]]) == 128
    assert microbatches_per_minibatch(6, 4, [[64]]) == 2
    assert microbatches_per_minibatch(1, 4, [[64]]) == 1
    assert microbatches_per_minibatch(64, 1, [[48], [40]]) == 40
