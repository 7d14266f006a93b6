"""Shards built from a bfloat16 checkpoint (models/stored_weights.py): loaded in bf16, converted to float32 where
they are kept, they hold exactly the weights transformers' own conversion gives (``==``: bf16 -> fp32 is exact),
unsharded, over 2 FSDP ranks and over 2 TP ranks."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.multiprocessing as mp

from models.stored_weights import _mapped_files, _read, fsdp_rows, stored_dtype
from tests.conftest import free_port, leave_process_group


def _bf16_copy(model_dir: Path, out: Path) -> Path:
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(model_dir).to(torch.bfloat16).save_pretrained(out)
    return out


def _reference(model_dir: Path) -> dict[str, torch.Tensor]:
    """transformers' conversion of the whole model in one process."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()


def test_fsdp_rows_are_torch_chunks_rows():
    assert [fsdp_rows(5, r, 2) for r in (0, 1)] == [(0, 3), (3, 5)]
    assert [fsdp_rows(1, r, 2) for r in (0, 1)] == [(0, 1), (1, 1)]
    for n, world in [(7, 3), (2, 4), (8, 4)]:
        chunks = torch.chunk(torch.arange(n), world)
        for r in range(world):
            start, stop = fsdp_rows(n, r, world)
            want = chunks[r].tolist() if r < len(chunks) else []
            assert list(range(start, stop)) == want, (n, world, r)


def test_unsharded_shards_convert_each_weight_from_the_file(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from runtime.device.shards import PolicyShard, ReferenceShard

    bf16 = _bf16_copy(tiny_model_dir, tmp_path / "bf16")
    assert stored_dtype(tiny_model_dir) == torch.float32 and stored_dtype(bf16) == torch.bfloat16
    mapped = AutoModelForCausalLM.from_pretrained(bf16, dtype=torch.bfloat16)  # what the shards load
    weight = mapped.model.layers[0].mlp.up_proj.weight
    read = _read(weight.data, _mapped_files())
    assert read is not None and torch.equal(read, weight.data)  # a mapping: converted from plain reads
    want = _reference(bf16)
    for shard in (PolicyShard(model_dir=str(bf16)), ReferenceShard(model_dir=str(bf16))):
        got = shard.model.state_dict()
        assert {t.dtype for t in got.values() if t.is_floating_point()} == {torch.float32}
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
        assert shard.model.lm_head.weight is shard.model.model.embed_tokens.weight  # still tied
    ref16 = ReferenceShard(model_dir=str(tiny_model_dir), dtype="bfloat16", offload=True)  # fp32 file -> bf16
    want16 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).state_dict()
    assert all(torch.equal(ref16.model.state_dict()[k], want16[k]) for k in want16)


def _two_ranks(rank: int, port: int, fsdp_dir: str, tp_dir: str, work: str) -> None:
    import torch.distributed as dist

    from runtime.device.ranks import Ranks
    from runtime.device.shards import CriticShard, PolicyShard, ReferenceShard, _full_state_dict

    torch.set_num_threads(1)
    ranks = Ranks.join(rank, 2, "127.0.0.1", port, "gloo")
    alone = [dist.new_group([r]) for r in (0, 1)]  # every rank, same order
    tp = Ranks(dist.group.WORLD, dp_group=alone[rank], tp_group=dist.group.WORLD, grid=((0, 1),))
    policy = PolicyShard(ranks, model_dir=fsdp_dir)
    critic = CriticShard(ranks, model_dir=fsdp_dir)
    ref = ReferenceShard(tp, model_dir=tp_dir)
    assert type(policy.model).__name__.startswith("FSDP") and hasattr(
        ref.model.model.layers[0].mlp.up_proj.weight, "to_local"
    )
    out = {
        "policy": _full_state_dict(policy.model, policy.ranks),
        "critic": _full_state_dict(critic.model, critic.ranks),
        "ref": _full_state_dict(ref.model, ref.ranks),
    }
    if rank == 0:
        torch.save(out, Path(work) / "full.pt")
    leave_process_group()


def test_fsdp_and_tp_ranks_convert_only_their_shards_to_the_same_weights(tiny_model_dir, tiny_kv2_model_dir, tmp_path):
    """Two gloo processes: the policy and critic over 2 FSDP ranks and a reference over 2 TP ranks, from bf16
    checkpoints; gathered, their weights equal transformers' conversion of the whole model."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    fsdp_dir, tp_dir = _bf16_copy(tiny_model_dir, tmp_path / "bf16"), _bf16_copy(tiny_kv2_model_dir, tmp_path / "kv2")
    mp.spawn(_two_ranks, args=(free_port(), str(fsdp_dir), str(tp_dir), str(tmp_path)), nprocs=2, join=True)
    got = torch.load(tmp_path / "full.pt")
    for name, want in [("policy", _reference(fsdp_dir)), ("ref", _reference(tp_dir))]:
        assert all(torch.equal(got[name][k], want[k]) for k in want), name
    config = AutoConfig.from_pretrained(fsdp_dir, num_labels=1)
    critic = AutoModelForTokenClassification.from_pretrained(fsdp_dir, dtype=torch.float32, config=config).state_dict()
    assert all(torch.equal(got["critic"][k], critic[k]) for k in critic if not k.startswith("score."))
    assert all(not got["critic"][k].any() for k in critic if k.startswith("score."))  # the zero value head
