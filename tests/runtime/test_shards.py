"""Policy/critic/ref workers on the tiny model: against unsharded references, 1 and 2 gloo ranks.

The 2-rank test runs the same calls as the in-process (world_size=1) workers on the full batch
and checks that every rank's slice and the resulting parameters agree within float tolerance.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from common.schedule import LRSchedule
from ppo.batch import select, update_rows, update_seed
from ppo.config import PPOConfig, ValueClip
from runtime.device.ranks import Ranks
from runtime.device.shards import CriticShard, PolicyShard, ReferenceShard, _full_state_dict
from tests import strict_p2p
from tests import tolerance as tol
from tests.conftest import free_port, leave_process_group
from trainer.rollout import pad_batch

PAD_ID = 3
# Ratios move by ~1e-3 per step at this lr, so clipping, grad-norm clipping and Adam all matter.
PPO = PPOConfig(num_epochs=2, num_minibatches=1, actor_lr=1e-3, critic_lr=1e-3, max_grad_norm=0.5)


def make_batch(num_rows: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random prompts (2-9 tokens) and responses (1-7 tokens) in the rollout layout."""
    g = torch.Generator().manual_seed(seed)
    lengths = lambda lo, hi: torch.randint(lo, hi, (num_rows,), generator=g).tolist()  # noqa: E731
    prompts = [torch.randint(5, 300, (n,), generator=g).tolist() for n in lengths(2, 10)]
    responses = [torch.randint(5, 300, (n,), generator=g).tolist() for n in lengths(1, 8)]
    return pad_batch(prompts, responses, PAD_ID)


def add_ppo_fields(batch, logprobs, values, seed: int = 1):
    """Old logprobs near the current ones (so some ratios clip), random advantages and returns."""
    g = torch.Generator().manual_seed(seed)
    mask = batch["response_mask"]
    noise = 0.3 * torch.randn(mask.shape, generator=g)
    return {
        **batch,
        "old_logprobs": (logprobs + noise) * mask,
        "advantages": torch.randn(mask.shape, generator=g) * mask,
        "values": values,
        "returns": torch.randn(mask.shape, generator=g) * mask,
    }


def forward_bound(model_dir, batch, want: torch.Tensor, lm_head: bool = True) -> float:
    """Rule 1 of tests/tolerance.py for logprobs (or, without the LM head, values) of ``batch``."""
    terms = tol.Reductions.of(model_dir).forward(batch["input_ids"].shape[1], lm_head)
    return tol.rounding(terms, tol.scale_of(want))


def gradient_rounding(model_dir, batch, num_ranks: int = 1, num_minibatches: int = PPO.num_minibatches) -> float:
    """Rule 3's rho for an update on ``batch``: the relative rounding of one weight's gradient."""
    num_tokens = batch["input_ids"].shape[1]
    minibatch_tokens = batch["input_ids"].numel() // num_minibatches
    return tol.rounding(tol.Reductions.of(model_dir).gradient(num_tokens, minibatch_tokens, num_ranks))


def assert_trained_like(got: dict, stats: tuple[dict, dict], states: tuple[dict, dict], rho: float) -> None:
    """Rule 3: a sharded run's update stats (policy, critic) and weights after its ``PPO`` steps against
    the unsharded worker's."""
    num_steps = PPO.num_epochs * PPO.num_minibatches
    for got_stats, want in zip((got["policy_stats"], got["critic_stats"]), stats):
        tol.assert_scalars_close(got_stats, want, tol.trained_scalars(want, rho, num_steps))
    tol.assert_trained_close(got["policy_state"], states[0], [PPO.actor_lr] * num_steps, rho)
    tol.assert_trained_close(got["critic_state"], states[1], [PPO.critic_lr] * num_steps, rho)


def unpadded_logprobs(model_dir, batch) -> list[torch.Tensor]:
    """Each row alone, no padding, plain HF forward: the reference for the padded layout."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    T = batch["response_mask"].shape[1]
    out = []
    for ids, attn, mask in zip(batch["input_ids"], batch["attention_mask"], batch["response_mask"]):
        seq = ids[attn.bool()][None]
        num_response = int(mask.sum())
        with torch.no_grad():
            logprobs = model(seq).logits.log_softmax(-1)[0, -num_response - 1 : -1]
        out.append(logprobs.gather(-1, seq[0, -num_response:, None])[:, 0])
    assert all(len(x) <= T for x in out)
    return out


@pytest.mark.equivalence
def test_logprobs_match_unpadded_forward_and_ref(tiny_model_dir):
    """The padded batch's logprobs are each row's alone (rule 1 of tests/tolerance.py: padding changes
    the sums' blocking); the reference's equal the policy's exactly (the same weights and code path on
    one machine: KL is 0 before training, under every kernel set)."""
    batch = make_batch()
    policy = PolicyShard(model_dir=str(tiny_model_dir))
    ref = ReferenceShard(model_dir=str(tiny_model_dir))
    logprobs = policy.compute_logprobs(batch)
    bound = forward_bound(tiny_model_dir, batch, logprobs)
    for b, expected in enumerate(unpadded_logprobs(tiny_model_dir, batch)):
        tol.assert_close(logprobs[b, : len(expected)], expected, bound, msg=f"row {b}")
        assert (logprobs[b, len(expected) :] == 0).all()
    assert torch.equal(ref.compute_logprobs(batch), logprobs)


def test_inference_cuts_rows_into_the_drivers_count_not_its_own(tiny_model_dir):
    """The driver chooses an inference call's micro-batch count from the whole batch; a replica must not
    raise it again from its own rows (an FSDP shard of the same layout takes its ranks' largest count, so
    the two would cut a rank's rows differently and KL before the first update would be 1e-9, not 0).
    Responses of 200, 10, 10, 10 tokens: alone, these rows would ask for 4 micro-batches
    (``test_batch.py``'s worked example); given 1 and 2, the reference runs 1 and 2 forwards."""
    from ppo.batch import throughput_microbatches

    batch = pad_batch([[7] * 5] * 4, [[5] * 200, [5] * 10, [5] * 10, [5] * 10], pad_id=0)
    assert throughput_microbatches(batch, 1) == 4
    ref = ReferenceShard(model_dir=str(tiny_model_dir))
    forwards = []
    model_forward = ref.model.forward
    ref.model.forward = lambda *a, **k: forwards.append(1) or model_forward(*a, **k)
    for count in (1, 2):
        forwards.clear()
        ref.compute_logprobs(batch, count)
        assert len(forwards) == count


def test_critic_starts_at_zero_and_learns(tiny_model_dir):
    batch = make_batch()
    critic = CriticShard(
        model_dir=str(tiny_model_dir),
        ppo=PPOConfig(num_epochs=4, critic_lr=1e-2, value_clip=ValueClip.raw, value_clip_eps=10.0),
    )
    values = critic.compute_values(batch)
    assert values.shape == batch["response_mask"].shape and (values == 0).all()
    targets = {**batch, "values": values, "returns": batch["response_mask"].clone()}
    first = critic.update(targets)
    second = critic.update(targets)
    assert second["loss"] < first["loss"]
    assert first["clip_range"] == 10.0
    assert critic.compute_values(batch).abs().sum() > 0


@pytest.mark.equivalence
def test_values_match_an_unpadded_forward_with_a_nonzero_head(tiny_model_dir):
    """V(s_t) is the head at the column before response token t; a zero head cannot show an off-by-one.
    Padded against unpadded: rule 1 of tests/tolerance.py, at the values' scale."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    batch = make_batch()
    critic = CriticShard(model_dir=str(tiny_model_dir))
    torch.manual_seed(3)
    with torch.no_grad():
        critic.model.score.weight.normal_()
        critic.model.score.bias.normal_() if critic.model.score.bias is not None else None
    values = critic.compute_values(batch)
    reference = AutoModelForTokenClassification.from_pretrained(
        tiny_model_dir, config=AutoConfig.from_pretrained(tiny_model_dir, num_labels=1, classifier_dropout=0.0)
    )
    reference.load_state_dict(critic.model.state_dict())
    bound = forward_bound(tiny_model_dir, batch, values, lm_head=False)
    for b, (ids, attn, mask) in enumerate(zip(batch["input_ids"], batch["attention_mask"], batch["response_mask"])):
        seq = ids[attn.bool()][None]
        num_response = int(mask.sum())
        with torch.no_grad():
            expected = reference(seq).logits[0, -num_response - 1 : -1, 0]  # the state before each response token
        assert expected.abs().min() > 1e-3  # a real check: no value is (near) zero
        tol.assert_close(values[b, :num_response], expected, bound, msg=f"row {b}")
        assert (values[b, num_response:] == 0).all()


def test_policy_update_stats(tiny_model_dir):
    batch = make_batch()
    policy = PolicyShard(model_dir=str(tiny_model_dir), ppo=PPOConfig(num_minibatches=2, actor_lr=1e-3))
    logprobs = policy.compute_logprobs(batch)
    stats = policy.update(add_ppo_fields(batch, logprobs, torch.zeros_like(logprobs)))
    assert set(stats) == {"loss", "entropy", "clip_frac", "approx_kl", "ratio", "grad_norm", "lr"}
    assert all(torch.isfinite(torch.tensor(v)) for v in stats.values())
    assert 0 < stats["clip_frac"] < 1 and stats["lr"] == 1e-3
    assert 0 < stats["entropy"] <= torch.log(torch.tensor(326.0)).item() + 1e-4  # <= log |V|
    assert not torch.equal(policy.compute_logprobs(batch), logprobs)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_nan_advantages_skip_the_step(tiny_model_dir):
    batch = make_batch()
    policy = PolicyShard(model_dir=str(tiny_model_dir))
    before = policy.state_dict_for_sync()
    logprobs = policy.compute_logprobs(batch)
    bad = add_ppo_fields(batch, logprobs, torch.zeros_like(logprobs))
    bad["advantages"] = bad["advantages"] * float("nan")
    stats = policy.update(bad)
    assert stats["loss"] != stats["loss"]  # NaN reported, for the loop to stop on
    after = policy.state_dict_for_sync()
    assert all(torch.equal(before[k], after[k]) for k in before)  # and never applied


def test_checkpoint_round_trip_is_exact(tiny_model_dir, tmp_path):
    """Resuming from a checkpoint continues bit for bit: the same stats and weights as the worker that
    never stopped (one machine runs the same sums in the same order, under every kernel set)."""
    batch = make_batch()
    ppo = PPOConfig(num_epochs=1, num_minibatches=2, actor_lr=1e-3, critic_lr=1e-3, lr_schedule=LRSchedule.linear)

    def fresh():
        return (
            PolicyShard(model_dir=str(tiny_model_dir), ppo=ppo, num_iterations=4),
            CriticShard(model_dir=str(tiny_model_dir), ppo=ppo, num_iterations=4),
        )

    policy, critic = fresh()
    data = add_ppo_fields(batch, policy.compute_logprobs(batch), critic.compute_values(batch))
    policy.update(data), critic.update(data)
    policy.save_checkpoint(tmp_path / "policy")
    critic.save_checkpoint(tmp_path / "critic")
    expected = policy.update(data), critic.update(data)  # continues with Adam moments and LR 0.5

    policy2, critic2 = fresh()
    policy2.load_checkpoint(tmp_path / "policy")
    critic2.load_checkpoint(tmp_path / "critic")
    assert (policy2.update(data), critic2.update(data)) == expected
    for a, b in ((policy, policy2), (critic, critic2)):
        sa, sb = a.model.state_dict(), b.model.state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)


def _two_ranks(rank: int, port: int, model_dir: str, work: str) -> None:
    torch.set_num_threads(1)
    data = torch.load(Path(work) / "data.pt")
    rows = torch.arange(rank * 4, rank * 4 + 4)  # the caller's split: equal row slices
    mine = select(data, rows)
    ranks = Ranks.join(rank, 2, "127.0.0.1", port, "gloo")
    common = dict(model_dir=model_dir, ppo=PPO, num_iterations=3)
    policy = PolicyShard(ranks, **common)
    critic = CriticShard(ranks, **common)
    ref = ReferenceShard(ranks, model_dir=model_dir)
    # The update's row order: the same global minibatches a single process makes (batch.update_rows).
    order, sizes = update_rows(8, PPO.num_epochs, PPO.num_minibatches, 2, update_seed(0, 0))
    update_data, update_sizes = select(data, order[rank]), sizes[rank]
    assert all(type(w.model).__name__.startswith("FSDP") for w in (policy, critic, ref))  # really sharded
    out = {
        "logprobs": policy.compute_logprobs(mine),
        "ref_logprobs": ref.compute_logprobs(mine),
        "values": critic.compute_values(mine),
        "policy_stats": policy.update(update_data, update_sizes),
        "critic_stats": critic.update(update_data, update_sizes),
    }
    policy_state = policy.state_dict_for_sync()
    critic_state = _full_state_dict(critic.model, critic.ranks)
    policy.save_checkpoint(Path(work) / "policy_ckpt")
    policy.save_pretrained(Path(work) / "policy_hf")
    out["sft_loss"] = policy.sft_step(mine)
    if rank == 0:
        out.update(policy_state=policy_state, critic_state=critic_state)
    torch.save(out, Path(work) / f"rank{rank}.pt")
    leave_process_group()


@pytest.mark.equivalence
def test_two_gloo_ranks_match_one_unsharded_process(tiny_model_dir, tmp_path):
    """2 FSDP ranks against one unsharded process on the whole batch: logprobs, values and reference
    logprobs before any step (rule 1 of ``tests/tolerance.py``), then the update's stats and the trained
    weights after 2 Adam steps (rule 3). Checkpoints and the HF export copy bytes: equal exactly."""
    model_dir = str(tiny_model_dir)
    batch = make_batch()
    policy = PolicyShard(model_dir=model_dir, ppo=PPO, num_iterations=3)
    critic = CriticShard(model_dir=model_dir, ppo=PPO, num_iterations=3)
    logprobs, values = policy.compute_logprobs(batch), critic.compute_values(batch)
    data = add_ppo_fields(batch, logprobs, values)
    torch.save(data, tmp_path / "data.pt")

    mp.spawn(_two_ranks, args=(free_port(), model_dir, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]

    forward = forward_bound(model_dir, batch, logprobs)
    tol.assert_close(torch.cat([r["logprobs"] for r in ranks]), logprobs, forward)
    tol.assert_close(torch.cat([r["ref_logprobs"] for r in ranks]), logprobs, forward)
    tol.assert_close(torch.cat([r["values"] for r in ranks]), values, forward_bound(model_dir, batch, values, False))

    stats = policy.update(data), critic.update(data)
    assert ranks[1]["policy_stats"] == ranks[0]["policy_stats"]  # every rank returns the global stats
    reference = policy.state_dict_for_sync()
    assert any(
        not torch.equal(reference[k], v) for k, v in PolicyShard(model_dir=model_dir).state_dict_for_sync().items()
    )
    rho = gradient_rounding(model_dir, batch, num_ranks=2)
    assert_trained_like(ranks[0], stats, (reference, _full_state_dict(critic.model, critic.ranks)), rho)

    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "policy_hf").state_dict()
    assert all(torch.equal(exported[k], v) for k, v in ranks[0]["policy_state"].items())
    sft_loss = policy.sft_step(data)
    assert ranks[0]["sft_loss"] == ranks[1]["sft_loss"]
    tol.assert_scalars_close(
        {"sft": ranks[0]["sft_loss"]}, {"sft": sft_loss}, tol.trained_scalars({"sft": sft_loss}, rho, 1)
    )

    # A checkpoint written by 2 ranks loads into 1 (DCP reshards) with the same weights.
    resumed = PolicyShard(model_dir=model_dir, ppo=PPO, num_iterations=3)
    resumed.load_checkpoint(tmp_path / "policy_ckpt")
    resumed_state = resumed.state_dict_for_sync()
    assert all(torch.equal(resumed_state[k], v) for k, v in ranks[0]["policy_state"].items())
    assert resumed.trainer.num_updates == 1


def test_update_rows_make_the_same_minibatches_for_any_number_of_ranks():
    # 8 rows, 2 epochs, 2 minibatches: each global minibatch is cut into one share per rank.
    one, one_sizes = update_rows(8, 2, 2, 1, seed=5)
    two, two_sizes = update_rows(8, 2, 2, 2, seed=5)
    assert one_sizes == [[4, 4, 4, 4]] and two_sizes == [[2, 2, 2, 2], [2, 2, 2, 2]]
    for part in range(4):
        single = one[0][4 * part : 4 * part + 4]
        split = torch.cat([two[0][2 * part : 2 * part + 2], two[1][2 * part : 2 * part + 2]])
        assert torch.equal(single, split)
    assert sorted(one[0][:8].tolist()) == list(range(8))  # an epoch visits every row once
    rows, sizes = update_rows(10, 1, 2, 2, seed=0)  # 5-row minibatches: shares of 3 and 2
    assert sizes == [[3, 3], [2, 2]] and sorted(torch.cat(rows).tolist()) == list(range(10))
    with pytest.raises(ValueError, match="cannot make ppo.num_minibatches=4 minibatches over 2"):
        update_rows(6, 1, 4, 2, seed=0)


@pytest.mark.equivalence
def test_microbatches_and_activation_checkpointing_take_the_same_step(tiny_model_dir):
    """The plan's per-call knobs change memory, not math: 3 micro-batches per minibatch (gradient
    accumulation) with recomputed activations give the plain worker's logprobs (rule 1 of
    tests/tolerance.py), and its stats and logprobs after the update's 4 Adam steps (rule 3)."""
    batch = make_batch()
    ppo = PPOConfig(num_minibatches=2, actor_lr=1e-3)
    plain = PolicyShard(model_dir=str(tiny_model_dir), ppo=ppo)
    knobs = PolicyShard(model_dir=str(tiny_model_dir), ppo=ppo, activation_checkpointing=True)
    logprobs = plain.compute_logprobs(batch)
    forward = forward_bound(tiny_model_dir, batch, logprobs)
    tol.assert_close(knobs.compute_logprobs(batch, num_microbatches=3), logprobs, forward)
    data = add_ppo_fields(batch, logprobs, torch.zeros_like(logprobs))
    want, got = plain.update(data), knobs.update(data, num_microbatches=3)
    rho = gradient_rounding(tiny_model_dir, batch, num_minibatches=ppo.num_minibatches)
    tol.assert_scalars_close(got, want, tol.trained_scalars(want, rho, ppo.num_epochs * ppo.num_minibatches))
    after = plain.compute_logprobs(batch)
    moved = float((after - logprobs).abs().max())
    tol.assert_close(knobs.compute_logprobs(batch), after, tol.trained(forward, rho, moved))


def _dp2_tp2(rank: int, port: int, model_dir: str, work: str) -> None:
    """One rank of a 2 x 2 grid: replicas {0, 1} and {2, 3} (TP), FSDP across them ({0, 2}, {1, 3})."""
    import torch.distributed as dist

    from runtime.meshes import column_of, grid_groups, row_of

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    grid = ((0, 1), (2, 3))
    replica_grids = [((0, 1),), ((2, 3),)]  # the reference: one TP-2 replica per row, no FSDP
    sets = sorted({g for m in [grid, *replica_grids] for g in grid_groups(m)})
    groups = {g: dist.new_group(list(g)) for g in sets}  # every rank, same order

    def ranks_on(mesh):
        whole = groups[tuple(sorted(d for row in mesh for d in row))]
        return Ranks(whole, dp_group=groups[column_of(mesh, rank)], tp_group=groups[row_of(mesh, rank)], grid=mesh)

    ranks = ranks_on(grid)
    data = torch.load(Path(work) / "data.pt")
    replica = rank // 2
    mine = select(data, torch.arange(replica * 4, replica * 4 + 4))  # both TP ranks: the replica's rows
    common = dict(model_dir=model_dir, ppo=PPO, num_iterations=3)
    policy, critic = PolicyShard(ranks, **common), CriticShard(ranks, **common)
    ref = ReferenceShard(ranks_on(replica_grids[rank // 2]), model_dir=model_dir)
    order, sizes = update_rows(8, PPO.num_epochs, PPO.num_minibatches, 2, update_seed(0, 0))
    update_data, update_sizes = select(data, order[replica]), sizes[replica]
    q_proj = policy.model.model.layers[0].self_attn.q_proj.weight
    out = {
        "q_proj": (q_proj.device_mesh.mesh_dim_names, q_proj.placements[1].is_shard(0), tuple(q_proj.to_local().shape)),
        "logprobs": policy.compute_logprobs(mine),
        "ref_logprobs": ref.compute_logprobs(mine),
        "ref_is_plain_tp": not type(ref.model).__name__.startswith("FSDP"),
        "values": critic.compute_values(mine),
        "policy_stats": policy.update(update_data, update_sizes),
        "critic_stats": critic.update(update_data, update_sizes),
    }
    policy_state = policy.state_dict_for_sync()
    critic_state = _full_state_dict(critic.model, critic.ranks)
    if rank == 0:
        out.update(policy_state=policy_state, critic_state=critic_state)
    torch.save(out, Path(work) / f"rank{rank}.pt")
    leave_process_group()


@pytest.mark.equivalence
def test_dp2_x_tp2_ranks_match_one_unsharded_process(tiny_kv2_model_dir, tmp_path):
    """Tensor parallelism inside each replica, FSDP across replicas: the same logprobs, values, update
    stats and updated weights as one process on the whole batch (rules 1 and 3 of tests/tolerance.py);
    the two TP ranks of a replica hold one all-reduced result, so their logprobs are equal exactly."""
    model_dir = str(tiny_kv2_model_dir)
    batch = make_batch()
    policy = PolicyShard(model_dir=model_dir, ppo=PPO, num_iterations=3)
    critic = CriticShard(model_dir=model_dir, ppo=PPO, num_iterations=3)
    logprobs, values = policy.compute_logprobs(batch), critic.compute_values(batch)
    data = add_ppo_fields(batch, logprobs, values)
    torch.save(data, tmp_path / "data.pt")

    mp.spawn(_dp2_tp2, args=(free_port(), model_dir, str(tmp_path)), nprocs=4, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(4)]
    # q_proj [128, 128]: split by head over TP (64 rows per replica rank), then FSDP halves each: 32 rows.
    assert all(r["q_proj"] == (("dp", "tp"), True, (32, 128)) for r in ranks)
    for tp_peer in (1, 3):
        assert torch.equal(ranks[tp_peer]["logprobs"], ranks[tp_peer - 1]["logprobs"]), tp_peer
    forward = forward_bound(model_dir, batch, logprobs)
    tol.assert_close(torch.cat([ranks[0]["logprobs"], ranks[2]["logprobs"]]), logprobs, forward)
    assert all(r["ref_is_plain_tp"] for r in ranks)
    tol.assert_close(torch.cat([ranks[1]["ref_logprobs"], ranks[3]["ref_logprobs"]]), logprobs, forward)
    values_bound = forward_bound(model_dir, batch, values, lm_head=False)
    tol.assert_close(torch.cat([ranks[0]["values"], ranks[2]["values"]]), values, values_bound)

    stats = policy.update(data), critic.update(data)
    assert all(r["policy_stats"] == ranks[0]["policy_stats"] for r in ranks)  # global stats everywhere
    states = policy.state_dict_for_sync(), _full_state_dict(critic.model, critic.ranks)
    assert_trained_like(ranks[0], stats, states, gradient_rounding(model_dir, batch, num_ranks=4))


def test_columns_that_are_padding_in_every_row_change_nothing(tiny_model_dir):
    """Workers cut all-padding columns (ppo.batch.trim_padding) before each forward: the same
    batch with 3 more prompt and 2 more response columns of padding gives the same logprobs, values
    and update, and the outputs keep the caller's width. Bit for bit: once trimmed, the two run the
    same sums in the same order (on every kernel set)."""
    batch = make_batch()
    pad = lambda x, left, right: torch.nn.functional.pad(x, (left, right), value=0)  # noqa: E731
    wide = {key: pad(value, 3, 0) if key != "response_mask" else value for key, value in batch.items()}
    wide = {key: pad(value, 0, 2) for key, value in wide.items()}
    T = batch["response_mask"].shape[1]
    policy = PolicyShard(model_dir=str(tiny_model_dir), ppo=PPO)
    logprobs, wide_logprobs = policy.compute_logprobs(batch), policy.compute_logprobs(wide)
    assert wide_logprobs.shape == (len(logprobs), T + 2)
    assert torch.equal(wide_logprobs[:, :T], logprobs)
    assert (wide_logprobs[:, T:] == 0).all()

    critic = CriticShard(model_dir=str(tiny_model_dir))
    with torch.no_grad():
        critic.model.score.weight.normal_()
    assert torch.equal(critic.compute_values(wide)[:, :T], critic.compute_values(batch))

    fields = add_ppo_fields(batch, logprobs, torch.zeros_like(logprobs))
    wide_fields = {**wide, **{k: pad(fields[k], 0, 2) for k in ("old_logprobs", "advantages", "values", "returns")}}
    other = PolicyShard(model_dir=str(tiny_model_dir), ppo=PPO)
    stats, wide_stats = policy.update(fields), other.update(wide_fields)
    assert stats == wide_stats
    for (name, p), q in zip(policy.model.named_parameters(), other.model.parameters()):
        assert torch.equal(p, q), name


def _pp2_dp2(rank: int, port: int, model_dir: str, work: str) -> None:
    """One device of a model in 2 pipeline stages of 2 FSDP ranks: stage 0 on {0, 1}, stage 1 on
    {2, 3}; device 0 -> 2 and 1 -> 3 are pipeline columns, rows {0, 2} and {1, 3} the data shares."""
    from runtime.driver import DeviceProcess
    from runtime.meshes import pipeline_groups, staged_grid

    torch.set_num_threads(1)
    strict_p2p.install(Path(work) / "p2p_store", 4)  # every send and receive under NCCL's rules
    mesh = staged_grid(range(4), pp=2, tp=1)
    common = dict(model_dir=model_dir, ppo=PPO, num_iterations=3)
    builders = {"actor": (PolicyShard, common, mesh), "critic": (CriticShard, common, mesh)}
    worker = DeviceProcess(rank, range(4), "127.0.0.1", port, "gloo", pipeline_groups(mesh), "float32", builders)
    data = torch.load(Path(work) / "data.pt")
    share = rank % 2
    order, sizes = update_rows(8, PPO.num_epochs, PPO.num_minibatches, 2, update_seed(0, 0))
    policy, critic = worker.shards["actor"], worker.shards["critic"]
    out = {
        "logprobs": policy.compute_logprobs(select(data, torch.arange(share * 4, share * 4 + 4)), 2),
        "policy_stats": policy.update(select(data, order[share]), sizes[share], 2),
        "critic_stats": critic.update(select(data, order[share]), sizes[share], 2),
        "params": sorted(n for n, _ in policy.model.named_parameters()),
    }
    policy_state, critic_state = policy.state_dict_for_sync(), _full_state_dict(critic.model, critic.ranks)
    policy.save_checkpoint(Path(work) / "policy_ckpt")
    policy.load_checkpoint(Path(work) / "one_ckpt")  # written by one process: each stage takes its part
    loaded_state = policy.state_dict_for_sync()
    if rank == 0:
        out.update(policy_state=policy_state, critic_state=critic_state, loaded_state=loaded_state)
    torch.save(out, Path(work) / f"rank{rank}.pt")
    leave_process_group()


@pytest.mark.equivalence
def test_pipeline_stages_x_fsdp_train_like_one_unsharded_process(tiny_model_dir, tmp_path):
    """Actor and critic in 2 pipeline stages x 2 FSDP ranks, 2 micro-batches per minibatch: the same
    logprobs, update stats and updated weights as one process on the whole batch (rules 1 and 3 of
    tests/tolerance.py). The tiny model's LM head is its embedding, held by both stages; its gradient
    is the sum of both stages' (a stage alone would move it differently). The checkpoint the stages
    write loads into one process, and one process's checkpoint into the stages, bit for bit."""
    model_dir = str(tiny_model_dir)
    batch = make_batch()
    policy = PolicyShard(model_dir=model_dir, ppo=PPO, num_iterations=3)
    critic = CriticShard(model_dir=model_dir, ppo=PPO, num_iterations=3)
    logprobs, values = policy.compute_logprobs(batch), critic.compute_values(batch)
    data = add_ppo_fields(batch, logprobs, values)
    torch.save(data, tmp_path / "data.pt")
    one_process = PolicyShard(model_dir=model_dir, ppo=PPO, num_iterations=3)
    one_process.update(data)  # optimizer state, and weights far from what the stages train to:
    with torch.no_grad():
        for param in one_process.model.parameters():
            param.add_(0.01)
    one_process.save_checkpoint(tmp_path / "one_ckpt")

    mp.spawn(_pp2_dp2, args=(free_port(), model_dir, str(tmp_path)), nprocs=4, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(4)]
    # Stage 0 holds the embedding and block 0; stage 1 block 1, the norm and (tied) the embedding.
    assert ranks[0]["params"] == ranks[1]["params"] and "model.layers.1.mlp.up_proj.weight" not in ranks[0]["params"]
    assert {"model.embed_tokens.weight", "model.norm.weight", "model.layers.1.mlp.up_proj.weight"} <= set(
        ranks[2]["params"]
    )
    assert not any(n.startswith("model.layers.0.") for n in ranks[2]["params"])
    # The last stage (devices 2, 3) reports the logprobs of shares 0 and 1.
    forward = forward_bound(model_dir, batch, logprobs)
    tol.assert_close(torch.cat([ranks[2]["logprobs"], ranks[3]["logprobs"]]), logprobs, forward)

    stats = policy.update(data), critic.update(data)
    assert all(r["policy_stats"] == ranks[0]["policy_stats"] for r in ranks)  # every stage reports the same
    states = policy.state_dict_for_sync(), _full_state_dict(critic.model, critic.ranks)
    assert_trained_like(ranks[0], stats, states, gradient_rounding(model_dir, batch, num_ranks=4))
    one = PolicyShard(model_dir=model_dir, ppo=PPO, num_iterations=3)
    one.load_checkpoint(tmp_path / "policy_ckpt")
    for name, tensor in one.state_dict_for_sync().items():
        torch.testing.assert_close(ranks[0]["policy_state"][name], tensor, atol=0, rtol=0, msg=name)
    # And the other way: one process's checkpoint loads into the stages bit for bit.
    for name, tensor in one_process.state_dict_for_sync().items():
        torch.testing.assert_close(ranks[0]["loaded_state"][name], tensor, atol=0, rtol=0, msg=name)


def _three_stages(rank: int, port: int, model_dir: str, work: str) -> None:
    from runtime.driver import DeviceProcess
    from runtime.meshes import pipeline_groups, staged_grid

    torch.set_num_threads(1)
    strict_p2p.install(Path(work) / "p2p_store", 3)  # every send and receive under NCCL's rules
    mesh = staged_grid(range(3), pp=3, tp=1)
    builders = {"actor": (PolicyShard, dict(model_dir=model_dir, ppo=PPO, num_iterations=3), mesh)}
    worker = DeviceProcess(rank, range(3), "127.0.0.1", port, "gloo", pipeline_groups(mesh), "float32", builders)
    policy = worker.shards["actor"]
    stats = policy.update(torch.load(Path(work) / "data.pt"), [8, 8], 4)
    state = policy.state_dict_for_sync()
    if rank == 0:
        torch.save((stats, state), Path(work) / "three_stages.pt")
    leave_process_group()


@pytest.mark.equivalence
def test_three_stages_run_one_forward_one_backward_like_one_process(tiny_model_dir, tmp_path):
    """1F1B over 3 stages (blocks 0 | 1 | norm and head) with 4 micro-batches per minibatch: stage 0
    runs 2 forwards ahead, stage 1 one, stage 2 none, and the steps equal one process's (rule 3 of
    tests/tolerance.py)."""
    model_dir = str(tiny_model_dir)
    batch = make_batch()
    policy = PolicyShard(model_dir=model_dir, ppo=PPO, num_iterations=3)
    data = add_ppo_fields(batch, policy.compute_logprobs(batch), torch.zeros(batch["response_mask"].shape))
    order, sizes = update_rows(8, PPO.num_epochs, PPO.num_minibatches, 1, update_seed(0, 0))
    torch.save(select(data, order[0]), tmp_path / "data.pt")
    mp.spawn(_three_stages, args=(free_port(), model_dir, str(tmp_path)), nprocs=3, join=True)
    stats, state = torch.load(tmp_path / "three_stages.pt")
    want = policy.update(select(data, order[0]), sizes[0], num_microbatches=4)
    assert sizes[0] == [8, 8]
    rho = gradient_rounding(model_dir, batch, num_ranks=3)
    tol.assert_scalars_close(stats, want, tol.trained_scalars(want, rho, len(sizes[0])))
    tol.assert_trained_close(state, policy.state_dict_for_sync(), [PPO.actor_lr] * len(sizes[0]), rho)


def _two_stages_strict(rank: int, port: int, model_dir: str, work: str, num_microbatches: int) -> None:
    """Stage ``rank`` of the policy in 2 stages, every send and receive under NCCL's rules
    (``tests.strict_p2p``): pipeline inference (logprobs, and a frozen model's body through
    ``stage_hidden``), then 1F1B training."""
    from runtime.device.pipeline import stage_hidden
    from runtime.device.process import DeviceProcess
    from runtime.meshes import pipeline_groups, staged_grid

    torch.set_num_threads(1)
    strict_p2p.install(Path(work) / "p2p_store", 2)
    mesh = staged_grid(range(2), pp=2, tp=1)
    builders = {"actor": (PolicyShard, dict(model_dir=model_dir, ppo=PPO, num_iterations=3), mesh)}
    worker = DeviceProcess(rank, range(2), "127.0.0.1", port, "gloo", pipeline_groups(mesh), "float32", builders)
    policy = worker.shards["actor"]
    data, update_data = torch.load(Path(work) / "data.pt"), torch.load(Path(work) / "update_data.pt")
    logprobs = policy.compute_logprobs(data, num_microbatches)
    with torch.no_grad():
        hidden = stage_hidden(policy.model, policy.ranks.pipeline, data["input_ids"], data["attention_mask"])
    stats = policy.update(update_data, [8, 8], num_microbatches)
    state = policy.state_dict_for_sync()
    if rank == 0:
        torch.save({"stats": stats, "state": state}, Path(work) / "stage0.pt")
    else:
        torch.save({"logprobs": logprobs, "hidden": hidden}, Path(work) / "stage1.pt")
    leave_process_group()


@pytest.mark.equivalence
def test_two_stages_keep_nccls_point_to_point_rules_in_pipeline_training_and_inference(tiny_model_dir, tmp_path):
    """2 stages x 4 micro-batches under NCCL's point-to-point rules: in 1F1B's steady state stage 0
    sends activations to stage 1 while stage 1 sends a gradient to stage 0, which deadlocks unless
    each side's send and receive go out as one batch (posted one by one, as at 04eb4e1, this test
    hangs until the strict model's stall timeout). Inference (logprobs, a frozen body's hidden
    states) and the two optimizer steps equal one process's (rules 1 and 3 of tests/tolerance.py)."""
    from transformers import AutoModelForCausalLM

    model_dir = str(tiny_model_dir)
    batch = make_batch()
    policy = PolicyShard(model_dir=model_dir, ppo=PPO, num_iterations=3)
    logprobs = policy.compute_logprobs(batch)
    data = add_ppo_fields(batch, logprobs, torch.zeros(batch["response_mask"].shape))
    order, sizes = update_rows(8, PPO.num_epochs, PPO.num_minibatches, 1, update_seed(0, 0))
    torch.save(data, tmp_path / "data.pt")
    torch.save(select(data, order[0]), tmp_path / "update_data.pt")
    strict_p2p.spawn_with_deadline(
        _two_stages_strict, (free_port(), model_dir, str(tmp_path), 4), nprocs=2, deadline_s=600
    )
    stage0, stage1 = torch.load(tmp_path / "stage0.pt"), torch.load(tmp_path / "stage1.pt")
    tol.assert_close(stage1["logprobs"], logprobs, forward_bound(model_dir, batch, logprobs))
    body = AutoModelForCausalLM.from_pretrained(model_dir).model
    with torch.no_grad():
        want_hidden = body(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    # The body's output: the head's terms and the log-softmax are not on its path.
    tol.assert_close(stage1["hidden"], want_hidden, forward_bound(model_dir, batch, want_hidden, lm_head=False))
    want = policy.update(select(data, order[0]), sizes[0], num_microbatches=4)
    assert sizes[0] == [8, 8]
    rho = gradient_rounding(model_dir, batch, num_ranks=2)
    tol.assert_scalars_close(stage0["stats"], want, tol.trained_scalars(want, rho, len(sizes[0])))
    tol.assert_trained_close(stage0["state"], policy.state_dict_for_sync(), [PPO.actor_lr] * len(sizes[0]), rho)


def _bf16_ranks(rank: int, port: int, model_dir: str, work: str) -> None:
    from ppo.batch import throughput_microbatches

    torch.set_num_threads(1)
    data = torch.load(Path(work) / "data.pt")
    mine = select(data, torch.arange(rank * 4, rank * 4 + 4))
    ranks = Ranks.join(rank, 2, "127.0.0.1", port, "gloo", dtype="bfloat16")
    policy = PolicyShard(ranks, model_dir=model_dir, dtype="bfloat16", ppo=PPO, num_iterations=1)
    ref = ReferenceShard(model_dir=model_dir, dtype="bfloat16")  # this rank's own replica, as a plan's dp 2
    # As the driver does: one micro-batch count for both calls, from every replica's rows.
    count = max(throughput_microbatches(select(data, torch.arange(r * 4, r * 4 + 4)), 1) for r in (0, 1))
    out = {"logprobs": policy.compute_logprobs(mine, count), "ref_logprobs": ref.compute_logprobs(mine, count)}
    policy.update(*_one_share(data, rank))
    out["ref_bytes"] = {p.element_size() for p in ref.model.parameters()}
    out["policy_bytes"] = sum(p.to_local().numel() * p.element_size() for p in policy.model.parameters())
    local = [
        t.to_local() if hasattr(t, "to_local") else t
        for st in policy.trainer.optimizer.state.values()
        for t in st.values()
    ]
    out["adam_bytes"] = sum(t.numel() * t.element_size() for t in local if t.dim())
    out["local_params"] = sum(p.to_local().numel() for p in policy.model.parameters())
    torch.save(out, Path(work) / f"bf16_rank{rank}.pt")
    leave_process_group()


def _one_share(data, rank: int):
    order, sizes = update_rows(8, PPO.num_epochs, PPO.num_minibatches, 2, update_seed(0, 0))
    return select(data, order[rank]), sizes[rank]


def test_bf16_reference_logprobs_equal_the_fsdp_policys_at_iteration_zero(tiny_model_dir, tmp_path):
    """bf16 over gloo: the policy in 2 FSDP2 ranks (float32 master weights, cast to bf16 per layer) and
    a reference replica per rank holding bf16 weights compute the same logprobs, bit for bit on every
    kernel set (the same bf16 weights through the same sums): KL is 0 before the first update. Element
    sizes are the cost model's: 2 B a frozen weight, 4 B a master weight and 8 B of Adam state
    (planning.lifecycle)."""
    model_dir = str(tiny_model_dir)
    batch = make_batch()
    policy = PolicyShard(model_dir=model_dir, ppo=PPO, num_iterations=1)
    critic = CriticShard(model_dir=model_dir, ppo=PPO, num_iterations=1)
    torch.save(
        add_ppo_fields(batch, policy.compute_logprobs(batch), critic.compute_values(batch)), tmp_path / "data.pt"
    )
    mp.spawn(_bf16_ranks, args=(free_port(), model_dir, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        out = torch.load(tmp_path / f"bf16_rank{rank}.pt", weights_only=False)
        assert torch.equal(out["logprobs"], out["ref_logprobs"]), rank
        assert out["logprobs"].abs().sum() > 0
        assert out["ref_bytes"] == {2}
        assert out["policy_bytes"] == 4 * out["local_params"] and out["adam_bytes"] == 8 * out["local_params"]
