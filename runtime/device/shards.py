"""The model shards a device process hosts, one plain class per role: policy (actor), critic, reference.

No Ray here: a device process (``runtime.device.process``) builds these classes for its roles, and
tests build them in-process. Each object is one rank of its model's process group
(``Ranks``: the devices of one call of the execution plan, gloo on CPU, NCCL on GPU) and shards its
model with FSDP2 over that group (``models.parallelize.apply_fsdp``). With one rank the model
stays a plain module and needs no process group, so several roles can share one test process.

Data parallelism (see ``ppo/batch.py``): the caller splits every global batch into row slices,
one per rank (for updates, in ``batch.update_rows`` order), and calls the same method on all
ranks; outputs come back per slice. Losses
are token means over the *global* minibatch (the token count is all-reduced), and FSDP averages
gradients over ranks, so each rank backpropagates ``num_dp * its share``: N ranks take
exactly the step one rank would take on the whole minibatch. Stats are all-reduced the same way,
so every rank returns the global numbers. With tensor parallelism (``Ranks(tp_group=...)``) only
the dp ranks split the rows; the tp ranks of one replica compute on the same rows. With pipeline
stages (``Ranks(pipeline=...)``, ``runtime/device/pipeline.py``) each rank holds one stage's blocks, the
stages of a data share see the same rows, and the last stage computes the loss and the stats.

Precision: parameters and optimizer state are float32; ``dtype`` is the compute dtype (FSDP2
mixed precision with N ranks, autocast with one). Dropout is off everywhere (``model.eval()``):
the logprobs an update recomputes must equal the ones the rollout was scored with.
"""

from __future__ import annotations

import contextlib
import random
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from common.optim import adamw
from common.schedule import build_lr_scheduler
from ppo import batch as B
from ppo.advantages import masked_sum
from ppo.config import AlgorithmConfig, KLPlacement, PPOConfig, SFTConfig, reuses_update_logprobs
from ppo.kl import kl_estimate
from ppo.losses import (
    Denominators,
    aggregate,
    entropy_from_logits,
    head_logprobs,
    logprobs_from_logits,
    policy_loss,
    value_clip_range,
    value_loss,
)
from runtime.device.memory import DeviceMemory
from runtime.device.pipeline import (
    PipelineStage,
    counted_in_norm,
    from_last_stage,
    keep_stage,
    last_stage_inputs,
    shares_embedding,
    stage_hidden,
    sum_over_stages,
    sync_tied_grads,
    train_microbatches,
)
from runtime.device.ranks import Ranks
from runtime.device.work_log import ForwardRecord
from runtime.dispatch import Gather, Split, dispatch


def _load_model(model_cls, model_dir: str, ranks: Ranks, dtype: torch.dtype = torch.float32, **kwargs):
    """Load an HF model in host memory, dropout off, its weights in the dtype the checkpoint stores
    (``models.stored_weights.stored_dtype``: transformers then maps the file and copies nothing); ``_shard``
    converts to ``dtype`` only what this rank keeps and puts only that on the device, so a whole model never
    lands on a GPU that an engine and other shards share, nor (converted) in every process's host memory.

    Returns the model and the names of weights missing from ``model_dir`` (newly initialized).
    """
    from transformers.utils import logging as hf_logging

    from models.stored_weights import stored_dtype

    # A missing value head is expected (it is zero-initialized below): no load report for it.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = model_cls.from_pretrained(
            model_dir, dtype=stored_dtype(model_dir) or dtype, output_loading_info=True, **kwargs
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    model.eval()
    return model, list(info["missing_keys"])


def _shard(model: nn.Module, ranks: Ranks, dtype: torch.dtype | None = None) -> nn.Module:
    """TP within each replica (``ranks.tp_size > 1``), then FSDP2 across replicas (``num_dp > 1``),
    each moving only this rank's shards to the device (``distribute_tensor``, ``fully_shard``); then
    the rest (an unsharded replica, buffers) follows. With ``dtype``, the weights are converted to it as
    they are kept (``models.stored_weights``): a TP rank converts its own shards, an FSDP rank the rows it
    keeps, an unsharded replica each weight on its way to the device.

    A single replica stays without FSDP: its parameters are then the TP shards themselves, which
    reallocation writes into, and ``Ranks.autocast`` gives it the compute dtype. A pipeline stage
    (``ranks.pipeline``) first drops what the other stages hold.
    """
    from models.stored_weights import cast_fsdp_rows, cast_weights

    if ranks.pipeline is not None:
        keep_stage(model, ranks.pipeline.stage, ranks.pipeline.num_stages)
    if ranks.sharded:
        from models.parallelize import apply_fsdp, apply_tp

        # The mesh is the model's own group (the plan runtime's devices of this call), not the world.
        mesh = ranks.mesh()
        if ranks.tp_group is not None:
            apply_tp(model, mesh["tp"])
            mesh = mesh["dp"]
            if dtype is not None:
                cast_weights(model, dtype)  # the TP shards (and what TP replicates) before FSDP cuts them
        if ranks.num_dp > 1:
            if dtype is not None:
                cast_fsdp_rows(model, dtype, mesh.get_local_rank(), mesh.size())
            param_dtype = None if ranks.compute_dtype == torch.float32 else ranks.compute_dtype
            model = apply_fsdp(model, mesh, param_dtype=param_dtype, reduce_dtype=torch.float32)
    if dtype is not None:
        cast_weights(model, dtype, ranks.device)
    return model.to(ranks.device)


def shard_replica(model: nn.Module, ranks: Ranks) -> Any:
    """Shard a frozen model (a reward model) over one inference replica's ranks as the reference
    replicas are (``_shard``: this rank's pipeline stage, TP within it). Returns its body as a stage
    (``stage_hidden``), or None when the replica is not cut into stages (its own body runs)."""
    _shard(model, ranks)
    pipe = ranks.pipeline
    if pipe is None:
        return None
    return lambda input_ids, attention_mask: stage_hidden(model, pipe, input_ids, attention_mask)


def _to_device(batch: Mapping[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {key: value.to(device) for key, value in batch.items()}


def response_logits(model: nn.Module, batch: Mapping[str, Tensor], hidden: Tensor | None = None) -> Tensor:
    """Logits that predict each response token: columns P-1 .. L-2 of a causal LM, [B, T, V].

    ``logits_to_keep=T + 1`` computes the LM head only on the last T + 1 columns; the last one
    predicts past the end and is dropped. Prompt logits are never materialized. ``hidden`` [B, L, H]:
    a pipeline's last stage starts from the hidden states it received instead of the token ids.
    """
    T = batch["response_mask"].shape[1]
    out = model(
        input_ids=batch["input_ids"] if hidden is None else None,
        inputs_embeds=hidden,
        attention_mask=batch["attention_mask"],
        position_ids=B.position_ids(batch),
        logits_to_keep=T + 1,
        use_cache=False,
    )
    return out.logits[:, :-1]


def response_values(model: nn.Module, batch: Mapping[str, Tensor], hidden: Tensor | None = None) -> Tensor:
    """V(s_t) for each response token t: the value head at column P + t - 1, [B, T] float32
    (``hidden``: as in ``response_logits``)."""
    T = batch["response_mask"].shape[1]
    work = ForwardRecord(model, "values")
    out = model(
        input_ids=batch["input_ids"] if hidden is None else None,
        inputs_embeds=hidden,
        attention_mask=batch["attention_mask"],
        position_ids=B.position_ids(batch),
        use_cache=False,
    )
    work.record(batch, num_head_positions=0)
    return out.logits[:, -T - 1 : -1, 0].float()


LM_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Causal LMs whose logits are exactly ``lm_head(final hidden state)``: no logit scaling or soft-capping
after the head (Gemma2's, Cohere's and Granite's have one)."""


def _plain_head(model: nn.Module) -> nn.Linear | None:
    """The LM head when ``response_logprobs`` may compute it itself: a plain ``nn.Linear`` without bias and
    without hooks (tensor parallelism hooks the head to gather its vocabulary shards) of a model in
    ``LM_HEAD_MODEL_TYPES``. None otherwise: the model's own forward computes the logits."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if type(head) is not nn.Linear or head.bias is not None or model_type not in LM_HEAD_MODEL_TYPES:
        return None
    return None if head._forward_hooks or head._forward_pre_hooks else head


@contextlib.contextmanager
def _head_passes_hidden_through(head: nn.Linear):
    """The model's forward returns the final hidden states where it would return logits."""
    head.forward = _hidden_unchanged  # type: ignore[method-assign,assignment]  # an instance attribute shadows nn.Linear's
    try:
        yield
    finally:
        del head.forward


def _hidden_unchanged(hidden: Tensor) -> Tensor:
    return hidden


def response_logprobs(
    model: nn.Module,
    batch: Mapping[str, Tensor],
    temperature: float,
    hidden: Tensor | None = None,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """log pi(a_t | s_t) of each response token, [B, T] float32, 0 on padding, and with ``with_entropy`` the
    entropy of pi(. | s_t) at each of them (0 on padding; None without).

    The LM head runs on the real response tokens only, a block of rows at a time (``ppo.losses.head_logprobs``):
    neither the padding's logits nor [B, T, V] float32 logits are ever computed. Models whose head is not a
    plain linear map (``_plain_head``) go through their own forward and ``logprobs_from_logits``.
    ``hidden``: as in ``response_logits``.
    """
    mask_BT, tokens_BT = batch["response_mask"], B.response_tokens(batch)
    head = _plain_head(model)
    work = ForwardRecord(model, "logprobs")
    if head is None:
        logits_BTV = response_logits(model, batch, hidden)
        entropy_BT = entropy_from_logits(logits_BTV, temperature) * mask_BT if with_entropy else None
        logprobs_BT = logprobs_from_logits(logits_BTV, tokens_BT, temperature) * mask_BT
        work.record(batch, num_head_positions=logits_BTV.shape[0] * (logits_BTV.shape[1] + 1))
        return logprobs_BT, entropy_BT
    with _head_passes_hidden_through(head):
        hidden_BTH = response_logits(model, batch, hidden)
    real_BT = mask_BT.bool()
    logprobs_N, entropy_N = head_logprobs(
        hidden_BTH[real_BT], head.weight, tokens_BT[real_BT], temperature, with_entropy
    )
    work.record(batch, num_head_positions=logprobs_N.shape[0])
    logprobs_BT = torch.zeros(mask_BT.shape, dtype=logprobs_N.dtype, device=logprobs_N.device)
    logprobs_BT = logprobs_BT.masked_scatter(real_BT, logprobs_N)
    if entropy_N is None:
        return logprobs_BT, None
    return logprobs_BT, torch.zeros_like(logprobs_BT).masked_scatter(real_BT, entropy_N)


def _response_logprobs(model: nn.Module, ranks: Ranks, batch: Mapping[str, Tensor], temperature: float) -> Tensor:
    T = batch["response_mask"].shape[1]
    batch = _to_device(B.trim_padding(batch), ranks.device)
    with torch.no_grad(), ranks.autocast(model):
        hidden = _pipeline_inputs(model, ranks, batch)
        if ranks.pipeline is not None and not ranks.pipeline.is_last:
            return torch.zeros(batch["input_ids"].shape[0], T)  # the last stage reports
        logprobs_BT, _ = response_logprobs(model, batch, temperature, hidden)
    return B.pad_response_columns(logprobs_BT.cpu(), T)


def _pipeline_inputs(model: nn.Module, ranks: Ranks, batch: Mapping[str, Tensor]) -> Tensor | None:
    """With pipeline stages: run this rank's stage (``runtime.device.pipeline.last_stage_inputs``); the
    last stage gets the hidden states to finish from. None without a pipeline."""
    if ranks.pipeline is None:
        return None
    return last_stage_inputs(model, ranks.pipeline, batch, B.position_ids(batch))


def _in_chunks(fn, batch: Mapping[str, Tensor], num_microbatches: int, ranks: Ranks) -> Tensor:
    """``fn`` over ``num_microbatches`` micro-batches of rows of similar length (``batch.microbatch_rows``),
    its [rows, T] outputs put back in row order.

    The driver chose the count for throughput from the whole call (``PlanRuntime._inference_microbatches``);
    it is not raised again here, per replica: an FSDP shard would then take the largest count of its
    ranks and a replica of the same layout its own, the two would cut a rank's rows differently, and the
    old logprobs would differ from the reference's in the last bits before the first update (KL 1e-9,
    not 0)."""
    parts = B.microbatch_rows(batch, microbatch_count(batch, num_microbatches, ranks, throughput=False))
    if len(parts) == 1:
        return fn(batch)
    outputs = torch.cat([fn(B.select(batch, rows)) for rows in parts])
    out = torch.empty_like(outputs)
    out[torch.cat(parts)] = outputs
    return out


def microbatch_count(
    batch: Mapping[str, Tensor], num_microbatches: int, ranks: Ranks, *, throughput: bool = True
) -> int:
    """The plan's micro-batch count (a memory bound), with ``throughput`` raised where more and shorter
    micro-batches compute on less padding (``batch.throughput_microbatches``: SmolLM2-135M's logprobs over
    32 rows, one long response among short ones, took 26 CPU-seconds in one micro-batch and 11 in 16).
    Collective when the model is sharded: every rank of the model runs the same number of passes (FSDP's
    gathers and the pipeline's sends pair up), the largest any rank asks for, and no rank more than it
    has rows."""
    wanted = B.throughput_microbatches(batch, num_microbatches) if throughput else max(1, num_microbatches)
    num_rows = B.num_rows(batch)
    if ranks.model_sharded:
        import torch.distributed as dist

        both = torch.tensor([wanted, -num_rows], device=ranks.device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=ranks.model_group)
        wanted, num_rows = int(both[0]), -int(both[1])
    return max(1, min(wanted, num_rows))


def _checkpoint_activations(model: nn.Module) -> None:
    """Recompute each decoder block's activations in the backward pass instead of keeping them
    (torch's checkpoint wrapper: HF's own switch only acts in train mode, and dropout keeps these
    models in eval mode)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

    base = getattr(model, getattr(model, "base_model_prefix", "model"))
    blocks = set(base.layers)
    apply_activation_checkpointing(model, check_fn=lambda m: m in blocks)


def _by_mesh(grads: Sequence[Tensor]) -> dict[Any, list[Tensor]]:
    by_mesh: dict[Any, list[Tensor]] = {}
    for grad in grads:
        by_mesh.setdefault(getattr(grad, "device_mesh", None), []).append(grad)
    return by_mesh


def _global_grad_norm_clip(model: nn.Module, max_norm: float, pipe: PipelineStage | None = None) -> Tensor:
    """Clip the (possibly sharded) gradients to ``max_norm``; returns the pre-clip global norm.

    With TP under FSDP the gradients live on two meshes (TP-sharded weights on ("dp", "tp"),
    replicated norms and heads on "dp" alone), which one ``clip_grad_norm_`` cannot combine: the
    squared norm of each mesh's gradients is reduced over that mesh, and the sum is the global one.
    A pipeline stage (``pipe``) adds the other stages' squares (``runtime.device.pipeline``).
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    by_mesh = _by_mesh(grads)
    if pipe is None and len(by_mesh) <= 1:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    squares = [torch.zeros((), device=grads[0].device if grads else None)]
    counted = grads if pipe is None else [p.grad for p in counted_in_norm(model, pipe) if p.grad is not None]
    for mesh_grads in _by_mesh(counted).values():
        norm = torch.nn.utils.get_total_norm(mesh_grads, 2.0)
        squares.append((norm.full_tensor() if hasattr(norm, "full_tensor") else norm) ** 2)
    total_sq = torch.stack(squares).sum()
    total = (total_sq if pipe is None else sum_over_stages(total_sq, pipe)).sqrt()
    # clip_grad_norm_'s coefficient, applied per mesh (a plain tensor cannot scale DTensors in one foreach).
    coef = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))
    for mesh_grads in by_mesh.values():
        torch._foreach_mul_(mesh_grads, coef)
    return total


@contextlib.contextmanager
def _single_process_dcp_quiet():
    """DCP warns that it 'assumes the intent' to save/load in one process; with one rank it is."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _held(owner: str, model: nn.Module, trainer: _Trainer | None) -> dict[tuple[str, str], str]:
    """What a trained (or critic-inference) shard holds now: its weights, Adam's state once it has
    stepped, gradients between a backward pass and the optimizer step."""
    out = {(owner, "weights"): "device"}
    if trainer is not None and trainer.optimizer.state:
        out[owner, "optimizer"] = "device"
    if any(p.grad is not None for p in model.parameters()):
        out[owner, "gradients"] = "device"
    return out


class _Trainer:
    """Optimizer + LR schedule + the minibatch loop shared by the policy and critic updates.

    Composition, not inheritance: each worker owns one and passes in its loss function.
    """

    def __init__(
        self,
        model: nn.Module,
        ranks: Ranks,
        ppo: PPOConfig,
        lr: float,
        num_iterations: int,
        seed: int,
        norm_tokens: int = 1,
    ):
        """``norm_tokens``: the constant of the seq_mean_token_sum_norm aggregation (``ppo.losses.aggregate``)."""
        self.model, self.ranks, self.ppo, self.seed, self.norm_tokens = model, ranks, ppo, seed, norm_tokens
        self.optimizer = adamw(model.parameters(), lr=lr, weight_decay=ppo.weight_decay)
        self.scheduler = build_lr_scheduler(
            self.optimizer, ppo.lr_schedule, ppo.num_warmup_iterations, max(num_iterations, 1)
        )
        self.num_updates = 0
        """PPO iterations done; seeds the minibatch order, so a resumed run shuffles the same way."""

    def run(
        self, batch: Mapping[str, Tensor], loss_fn, part_sizes: list[int] | None = None, num_microbatches: int = 1
    ) -> dict[str, float]:
        """``num_epochs`` x ``num_minibatches`` optimizer steps, then one LR step.

        ``batch`` holds this rank's rows in (epoch, minibatch) order and ``part_sizes`` the size of
        each part (``batch.update_rows``); None: ``batch`` is the whole batch of a single rank and
        the rows are ordered here, the same way. Each part runs as ``num_microbatches`` forward /
        backward passes (gradient accumulation, at most one per row; every rank must get the same
        number; rows of similar length go together, ``batch.microbatch_rows``).
        ``loss_fn(minibatch, den) -> (loss, {name: scalar})`` returns this rank's share of the global
        minibatch's loss, its denominators ``den`` those of the whole minibatch (``ppo.losses.Denominators``),
        and its stats' (token means); the shares sum to the global values.
        """
        if part_sizes is None:
            if self.ranks.num_dp > 1:
                raise ValueError("a data-parallel update needs the caller's row order (batch.update_rows)")
            rows, sizes = B.update_rows(
                B.num_rows(batch),
                self.ppo.num_epochs,
                self.ppo.num_minibatches,
                1,
                B.update_seed(self.seed, self.num_updates),
            )
            batch, part_sizes = B.select(batch, rows[0]), sizes[0]
        batch = _to_device(batch, self.ranks.device)
        lr = self.optimizer.param_groups[0]["lr"]
        sums: dict[str, Tensor] = {}
        grad_norms = []
        offset = 0
        for size in part_sizes:
            minibatch = {k: v[offset : offset + size] for k, v in batch.items()}
            offset += size
            grad_norms.append(self._step(minibatch, loss_fn, num_microbatches, sums))
        self.scheduler.step()
        self.num_updates += 1
        out: dict[str, float] = {}
        if sums:  # the last pipeline stage (or no pipeline) holds the losses and stats
            names = sorted(sums)
            totals = self.ranks.all_reduce_sum(torch.stack([sums[n] for n in names])).cpu() / len(part_sizes)
            out = {name: float(v) for name, v in zip(names, totals)}
        if self.ranks.pipeline is not None:
            out = from_last_stage(out, self.ranks.pipeline)
        out["grad_norm"] = float(torch.stack(grad_norms).mean())
        out["lr"] = lr
        return out

    def _step(self, minibatch: Mapping[str, Tensor], loss_fn, num_microbatches: int, sums: dict[str, Tensor]) -> Tensor:
        """One optimizer step on one minibatch in ``num_microbatches`` passes; adds the stats to
        ``sums`` and returns the pre-clip gradient norm."""
        den = self.denominators(minibatch["response_mask"])
        num_micro = microbatch_count(minibatch, num_microbatches, self.ranks)
        micros = [B.trim_padding(B.select(minibatch, rows)) for rows in B.microbatch_rows(minibatch, num_micro)]
        for loss, stats in self._forward_backward(micros, den, loss_fn):
            for name, value in {"loss": loss.detach(), **stats}.items():
                sums[name] = sums.get(name, 0.0) + value.detach().float()
        pipe = self.ranks.pipeline
        if pipe is not None:
            sync_tied_grads(self.model, pipe)
        grad_norm = _global_grad_norm_clip(self.model, self.ppo.max_grad_norm, pipe)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        # else: skip the step so a NaN/inf never reaches the weights; the stats report it.
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm.detach().float().cpu()

    def denominators(self, mask_BT: Tensor) -> Denominators:
        """The whole minibatch's token and response counts (one all-reduce over the dp ranks' shares)."""
        counts = torch.stack([mask_BT.sum(), (mask_BT.sum(1) > 0).sum()]).float()
        num_tokens, num_responses = self.ranks.all_reduce_sum(counts)
        return Denominators(num_tokens, num_responses, float(self.norm_tokens))

    def _forward_backward(
        self, micros: list[dict[str, Tensor]], den: Denominators, loss_fn
    ) -> list[tuple[Tensor, dict[str, Tensor]]]:
        """Loss and backward of each micro-batch (through the stages with a pipeline: nothing to
        return on stages before the last). FSDP averages gradients over dp ranks and our loss is
        this rank's share of a sum, so the backward scales it by ``num_dp``."""
        pipe = self.ranks.pipeline
        if pipe is not None:
            return train_microbatches(
                self.model,
                pipe,
                micros,
                lambda micro, hidden: loss_fn(micro, den, hidden),
                self.ranks.num_dp,
                lambda: self.ranks.autocast(self.model),
            )
        results = []
        for micro in micros:
            with self.ranks.autocast(self.model):
                loss, stats = loss_fn(micro, den)
            (loss * self.ranks.num_dp).backward()
            results.append((loss, stats))
        return results

    def state_dict_extra(self) -> dict[str, Any]:
        rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {"scheduler": self.scheduler.state_dict(), "num_updates": self.num_updates, "rng": rng}

    def load_state_dict_extra(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.num_updates = state["num_updates"]
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        if "cuda" in state["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])

    def save(self, directory: str | Path) -> None:
        """Model + optimizer via torch.distributed.checkpoint (sharded, each rank writes its own
        shards; reloadable at another world size), plus per-rank scheduler/counter/RNG state."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        with _single_process_dcp_quiet():
            dcp.save(
                {"model": model_state, "optim": optim_state},
                checkpoint_id=str(directory / "dcp"),
                no_dist=not self.ranks.model_sharded,
                process_group=self.ranks.model_group,
            )
        torch.save(self.state_dict_extra(), directory / f"extra_rank{self.ranks.model_rank}.pt")
        self.ranks.barrier()  # the caller renames the directory once every rank has written

    def load(self, directory: str | Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        directory = Path(directory)
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_state, "optim": optim_state}
        with _single_process_dcp_quiet():
            dcp.load(
                state,
                checkpoint_id=str(directory / "dcp"),
                no_dist=not self.ranks.model_sharded,
                process_group=self.ranks.model_group,
            )
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        extra = directory / f"extra_rank{self.ranks.model_rank}.pt"
        if not extra.exists():  # saved with another world size: rank 0's schedule is everyone's
            extra = directory / "extra_rank0.pt"
        self.load_state_dict_extra(torch.load(extra, weights_only=False))


class PolicyShard:
    """The actor: response logprobs, PPO-clip updates, SFT steps, weights for sync, checkpoints."""

    def __init__(
        self,
        ranks: Ranks | None = None,
        *,
        model_dir: str,
        dtype: str = "float32",
        ppo: PPOConfig | None = None,
        sft: SFTConfig | None = None,
        num_iterations: int = 1,
        seed: int = 0,
        temperature: float = 1.0,
        activation_checkpointing: bool = False,
        algorithm: AlgorithmConfig | None = None,
        loss_norm_tokens: int = 1,
    ):
        """``num_iterations`` sizes the LR schedule; ``temperature`` is the rollout sampler's, so
        that logprobs are those of the distribution tokens were drawn from; ``algorithm``: how the policy
        loss aggregates and whether it holds the KL term; ``loss_norm_tokens``: Dr. GRPO's constant."""
        from transformers import AutoModelForCausalLM

        self.ranks = Ranks.of(ranks, dtype)
        self.ppo = ppo or PPOConfig()
        self.algorithm = algorithm or AlgorithmConfig()
        self.sft = sft or SFTConfig()
        self.temperature = temperature
        self.model_dir = model_dir
        torch.manual_seed(seed)
        model, _ = _load_model(AutoModelForCausalLM, model_dir, self.ranks)
        if activation_checkpointing:
            _checkpoint_activations(model)
        self.model = _shard(model, self.ranks, torch.float32)  # float32 master weights
        self.trainer = _Trainer(
            self.model, self.ranks, self.ppo, self.ppo.actor_lr, num_iterations, seed, loss_norm_tokens
        )
        self._sft_optimizer: torch.optim.Optimizer | None = None
        self._sft_scheduler: Any = None

    @dispatch(Split.replica_rows, Gather.concat)
    def compute_logprobs(self, batch: Mapping[str, Tensor], num_microbatches: int = 1) -> Tensor:
        """log pi(a_t | s_t) of each response token of this rank's slice, [B, T] (0 on padding)."""
        return _in_chunks(
            lambda b: _response_logprobs(self.model, self.ranks, b, self.temperature),
            batch,
            num_microbatches,
            self.ranks,
        )

    def _policy_loss(
        self, minibatch: Mapping[str, Tensor], den: Denominators, hidden: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """PPO-clip aggregated as ``algorithm.loss_agg``, minus the entropy bonus, plus beta * KL (the algorithm's
        estimator, aggregated the same way) when the KL term is in the loss; this rank's share, and its stats."""
        mask_BT, num_tokens, a = minibatch["response_mask"], den.num_tokens, self.algorithm
        logprobs_BT, entropy_BT = response_logprobs(self.model, minibatch, self.temperature, hidden, with_entropy=True)
        loss, stats = policy_loss(
            logprobs_BT,
            minibatch.get("old_logprobs"),  # absent: the update's own, detached (reuses_update_logprobs)
            minibatch["advantages"],
            mask_BT,
            self.ppo.clip_eps,
            num_tokens,
            a.loss_agg,
            den,
        )
        assert entropy_BT is not None  # with_entropy
        # The entropy's gradient stays out of the backward unless it is in the loss.
        entropy = masked_sum(entropy_BT if self.ppo.entropy_coef != 0.0 else entropy_BT.detach(), mask_BT)
        entropy = entropy / num_tokens.clamp(min=1)
        if self.ppo.entropy_coef != 0.0:
            loss = loss - self.ppo.entropy_coef * entropy
        out = {
            "clip_frac": stats.clip_frac,
            "approx_kl": stats.approx_kl,
            "ratio": stats.ratio,
            "entropy": entropy.detach(),
        }
        if a.kl_in == KLPlacement.loss and a.kl_coef != 0.0:
            kl_BT = kl_estimate(logprobs_BT, minibatch["ref_logprobs"], mask_BT, a.kl_estimator)
            kl_loss = aggregate(kl_BT, mask_BT, a.loss_agg, den)
            loss = loss + a.kl_coef * kl_loss
            out["kl_loss"] = kl_loss.detach()
        return loss, out

    @dispatch(Split.ppo_shares, Gather.first)
    def update(
        self, batch: Mapping[str, Tensor], part_sizes: list[int] | None = None, num_microbatches: int = 1
    ) -> dict[str, float]:
        """One PPO iteration on this rank's rows (keys: input_ids, attention_mask, [position_ids],
        response_mask, old_logprobs, advantages; row order and ``part_sizes``: ``_Trainer.run``).
        Returns global means over the optimizer steps: loss, entropy, clip_frac, approx_kl, ratio,
        grad_norm (pre-clip), lr. Without old_logprobs only when the update takes one step
        (``ppo.config.reuses_update_logprobs``): they are its own logprobs, detached."""
        if "old_logprobs" not in batch and not reuses_update_logprobs(self.algorithm, self.ppo):
            raise ValueError(
                f"the update takes {self.ppo.num_epochs} x {self.ppo.num_minibatches} optimizer steps: "
                "it needs the old logprobs (actor_inf), not its own"
            )
        return self.trainer.run(batch, self._policy_loss, part_sizes, num_microbatches)

    def sft_step(self, batch: Mapping[str, Tensor]) -> float:
        """One supervised step on the response tokens (the reference solutions); returns the global
        mean NLL per response token. Uses its own AdamW at ``sft.lr`` on ``sft.lr_schedule``, not the PPO one.
        The warm-up runs before the plan is deployed (``trainer/sft.py``), never on pipeline stages."""
        if self.ranks.pipeline is not None:
            raise ValueError("sft_step runs on a whole model, not on a pipeline stage")
        if self._sft_optimizer is None:
            # The multi-tensor path, not common.optim's fused one: warm-ups are cached by their config
            # (trainer.loop.warm_start), so a cached one and a fresh one stay the same weights.
            self._sft_optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.sft.lr, weight_decay=0.0)
            self._sft_scheduler = build_lr_scheduler(
                self._sft_optimizer,
                self.sft.lr_schedule,
                self.sft.num_warmup_steps,
                max(self.sft.num_steps, 1),
                self.sft.lr_floor,
            )
        batch = _to_device(batch, self.ranks.device)
        mask_BT = batch["response_mask"]
        num_tokens = self.ranks.all_reduce_sum(mask_BT.sum().float())
        with self.ranks.autocast(self.model):
            logprobs_BT = logprobs_from_logits(response_logits(self.model, batch), B.response_tokens(batch))
            loss = -masked_sum(logprobs_BT, mask_BT) / num_tokens.clamp(min=1)
        (loss * self.ranks.num_dp).backward()
        _global_grad_norm_clip(self.model, self.ppo.max_grad_norm)
        self._sft_optimizer.step()
        self._sft_scheduler.step()
        self._sft_optimizer.zero_grad(set_to_none=True)
        return float(self.ranks.all_reduce_sum(loss.detach()).cpu())

    def state_dict_for_sync(self) -> dict[str, Tensor] | None:
        """Full HF-named weights in the compute dtype, on CPU, on rank 0 (None elsewhere).

        Collective: every rank must call it. Tied embeddings appear under both names
        (``model.embed_tokens.weight`` and ``lm_head.weight``), as ``model.state_dict()`` has them.
        """
        return _full_state_dict(self.model, self.ranks)

    def save_pretrained(self, directory: str | Path) -> None:
        """Write an HF model directory (weights in float32 + config + the tokenizer) from rank 0."""
        state = _full_state_dict(self.model, self.ranks, dtype=torch.float32)
        if state is not None:
            from transformers import AutoTokenizer, PreTrainedModel

            if not isinstance(self.model, PreTrainedModel):
                raise TypeError(f"{type(self.model).__name__} is not a transformers PreTrainedModel; cannot save it")
            self.model.save_pretrained(directory, state_dict=state)
            AutoTokenizer.from_pretrained(self.model_dir).save_pretrained(directory)
        self.ranks.barrier()

    @dispatch(Split.broadcast, Gather.none)
    def save_checkpoint(self, directory: str | Path) -> None:
        """Model, optimizer, LR schedule, update counter and RNG into ``directory`` (collective)."""
        self.trainer.save(directory)

    @dispatch(Split.broadcast, Gather.none)
    def load_checkpoint(self, directory: str | Path) -> None:
        self.trainer.load(directory)

    def residency(self) -> dict[tuple[str, str], str]:
        return _held("actor", self.model, self.trainer)


class CriticShard:
    """The value model: the policy's backbone with a fresh, zero-initialized scalar head.

    Built as ``AutoModelForTokenClassification(num_labels=1)`` from a causal-LM directory: the
    backbone weights load, the LM head is ignored, and the missing ``score`` head starts at 0 so
    that the first iteration's advantages are plain reward-to-go.
    """

    def __init__(
        self,
        ranks: Ranks | None = None,
        *,
        model_dir: str,
        dtype: str = "float32",
        ppo: PPOConfig | None = None,
        num_iterations: int = 1,
        seed: int = 0,
        activation_checkpointing: bool = False,
        frozen: bool = False,
    ):
        """``frozen``: a critic-inference replica, refilled by reallocation after every update: its
        weights in the compute dtype (as the engine's), no optimizer."""
        from transformers import AutoConfig, AutoModelForTokenClassification

        self.ranks = Ranks.of(ranks, dtype)
        self.ppo = ppo or PPOConfig()
        self.frozen = frozen
        torch.manual_seed(seed)
        config = AutoConfig.from_pretrained(model_dir, num_labels=1, classifier_dropout=0.0)
        weights_dtype = self.ranks.compute_dtype if frozen else torch.float32
        model, missing = _load_model(
            AutoModelForTokenClassification, model_dir, self.ranks, weights_dtype, config=config
        )
        if activation_checkpointing:
            _checkpoint_activations(model)
        head = getattr(model, "score", None)
        if not isinstance(head, nn.Linear):
            raise TypeError(f"{type(model).__name__} has no `score` value head; cannot build a critic from {model_dir}")
        if any(name.startswith("score.") for name in missing):
            with torch.no_grad():
                head.weight.zero_()
                if head.bias is not None:
                    head.bias.zero_()
        if frozen:
            model.requires_grad_(False)
        self.model = _shard(model, self.ranks, weights_dtype)
        self._trainer = (
            None if frozen else _Trainer(self.model, self.ranks, self.ppo, self.ppo.critic_lr, num_iterations, seed)
        )

    @property
    def trainer(self) -> _Trainer:
        if self._trainer is None:
            raise RuntimeError("a frozen critic replica (critic inference) does not train")
        return self._trainer

    def residency(self) -> dict[tuple[str, str], str]:
        return _held("critic_inf" if self.frozen else "critic", self.model, self._trainer)

    @dispatch(Split.replica_rows, Gather.concat)
    def compute_values(self, batch: Mapping[str, Tensor], num_microbatches: int = 1) -> Tensor:
        """V(s_t) for each response token of this rank's slice, [B, T] (0 on padding)."""
        return _in_chunks(self._values, batch, num_microbatches, self.ranks)

    def _values(self, batch: Mapping[str, Tensor]) -> Tensor:
        T = batch["response_mask"].shape[1]
        batch = _to_device(B.trim_padding(batch), self.ranks.device)
        with torch.no_grad(), self.ranks.autocast(self.model):
            hidden = _pipeline_inputs(self.model, self.ranks, batch)
            if self.ranks.pipeline is not None and not self.ranks.pipeline.is_last:
                return torch.zeros(batch["input_ids"].shape[0], T)  # the last stage reports
            values_BT = response_values(self.model, batch, hidden)
        return B.pad_response_columns((values_BT * batch["response_mask"]).cpu(), T)

    def _value_loss(
        self,
        minibatch: Mapping[str, Tensor],
        den: Denominators,
        clip_range: float | None,
        hidden: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        values_BT = response_values(self.model, minibatch, hidden)
        loss, stats = value_loss(
            values_BT,
            minibatch["values"],
            minibatch["returns"],
            minibatch["response_mask"],
            clip_range,
            den.num_tokens,
        )
        return loss, {"clip_frac": stats.clip_frac, "values": stats.values}

    @dispatch(Split.ppo_shares, Gather.first)
    def update(
        self, batch: Mapping[str, Tensor], part_sizes: list[int] | None = None, num_microbatches: int = 1
    ) -> dict[str, float]:
        """One iteration of (clipped) value regression on this rank's rows (keys: input_ids,
        attention_mask, [position_ids], response_mask, values, returns; row order and
        ``part_sizes``: ``_Trainer.run``). Returns global means: loss, clip_frac, values, grad_norm
        (pre-clip), lr, and clip_range (-1: no clipping)."""
        # The rows arrive once per epoch (batch.update_rows): every row equally often, so the
        # statistics of the returns are those of the batch.
        clip_range = value_clip_range(
            batch["returns"],
            batch["response_mask"],
            self.ppo.value_clip_eps,
            self.ppo.value_clip.value,
            self.ranks.all_reduce_sum,
        )
        stats = self.trainer.run(
            batch,
            lambda minibatch, den, hidden=None: self._value_loss(minibatch, den, clip_range, hidden),
            part_sizes,
            num_microbatches,
        )
        return {**stats, "clip_range": -1.0 if clip_range is None else clip_range}

    @dispatch(Split.broadcast, Gather.none)
    def save_checkpoint(self, directory: str | Path) -> None:
        self.trainer.save(directory)

    @dispatch(Split.broadcast, Gather.none)
    def load_checkpoint(self, directory: str | Path) -> None:
        self.trainer.load(directory)


class ReferenceShard:
    """The frozen reference policy: logprobs only, from weights held in the compute dtype. The policy
    computes from the same values (FSDP2 casts its float32 weights per layer), so KL(pi || pi_ref) is 0
    before the first update when both take the same rows (``Ranks.autocast``)."""

    def __init__(
        self,
        ranks: Ranks | None = None,
        *,
        model_dir: str,
        dtype: str = "float32",
        seed: int = 0,
        temperature: float = 1.0,
        offload: bool = False,
    ):
        """``offload``: the weights wait in (pinned) host memory between calls; a replica sharded by TP
        or pipeline stages cannot (``runtime.topology.check_supported`` refuses such a plan)."""
        from transformers import AutoModelForCausalLM

        from models.stored_weights import cast_weights

        self.ranks = Ranks.of(ranks, dtype)
        if offload and self.ranks.sharded:
            raise ValueError("offload needs an unsharded reference replica (tp = pp = 1)")
        self.temperature = temperature
        self.offload = offload
        self.memory = DeviceMemory(self.ranks.device)
        torch.manual_seed(seed)
        model, _ = _load_model(AutoModelForCausalLM, model_dir, self.ranks, self.ranks.compute_dtype)
        model.requires_grad_(False)
        if offload:  # straight to host memory: the device sees it only during its calls
            cast_weights(model, self.ranks.compute_dtype)
            self.model = model
            self.memory.to_host("ref", model)
        else:
            self.model = _shard(model, self.ranks, self.ranks.compute_dtype)

    @dispatch(Split.replica_rows, Gather.concat)
    def compute_logprobs(self, batch: Mapping[str, Tensor], num_microbatches: int = 1) -> Tensor:
        """log pi_ref(a_t | s_t) of each response token of this rank's slice, [B, T] (0 on padding)."""
        if self.offload:
            self.memory.to_device("ref", self.model)
        try:
            return _in_chunks(
                lambda b: _response_logprobs(self.model, self.ranks, b, self.temperature),
                batch,
                num_microbatches,
                self.ranks,
            )
        finally:
            if self.offload:
                self.memory.to_host("ref", self.model)

    def residency(self) -> dict[tuple[str, str], str]:
        return {("ref", "weights"): "host" if "ref" in self.memory.on_host else "device"}


def _full_state_dict(model: nn.Module, ranks: Ranks, dtype: torch.dtype | None = None) -> dict[str, Tensor] | None:
    """Unsharded, HF-named CPU state dict on the group's first rank (None on the others); collective
    over the model's group when sharded.

    Goes through the reallocation core (``reallocation.sync.iter_full_weights``): the first rank
    keeps its own FSDP shards and receives only the rest, bucket by bucket, instead of every rank
    all-gathering every parameter. Tied weights appear under both names, as in ``state_dict()``.
    """
    from reallocation.sync import clean_name, drain, iter_full_weights

    dtype = dtype or ranks.compute_dtype
    if ranks.model_sharded:
        weights = iter_full_weights(model, dst_rank=ranks.first_global_rank, dtype=dtype, group=ranks.model_group)
    else:  # one rank (maybe inside a larger world): nothing to move
        weights = ((clean_name(n), p) for n, p in model.named_parameters())
    if ranks.model_rank != 0:
        drain(weights)
        return None
    state = {name: tensor.detach().to("cpu", dtype).clone() for name, tensor in weights}
    if ranks.pipeline is not None and shares_embedding(model):  # the first stage's head is a pass-through
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    # named_parameters() lists a tied parameter once; the HF state dict has it under every name.
    names_by_param: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names_by_param.setdefault(id(param), []).append(clean_name(name))
    for names in names_by_param.values():
        held = next((n for n in names if n in state), None)
        if held is not None:
            for name in names:
                state.setdefault(name, state[held])
    return state
