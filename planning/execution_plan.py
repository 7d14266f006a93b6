"""Execution plans as data: which GPUs run each PPO model function call, in which layout.

The one plan format shared by the search (``search.py``), its baselines, the ``planning.search``
CLI and the trainer's plan runtime. Pure data: no torch.distributed, no Ray.

A plan gives each call of one PPO iteration a ``CallAllocation``:

- ``devices``  global GPU ids, a set: the runtime and the cost model take them in sorted order (layout
               rank r is the r-th smallest); GPU ``i`` is local GPU ``i % gpus_per_node`` of node
               ``i // gpus_per_node``;
- ``pp, dp, tp`` parallel degrees with ``pp * dp * tp == len(devices)``; ``dp`` means FSDP shards for
               training calls, vLLM replicas for generation and plain data parallel for inference;
- ``num_microbatches``, ``activation_checkpointing`` (training only) and ``offload`` (reference /
               reward inference only: the weights leave the GPU between their calls).

YAML, one flow mapping per call with the default knobs left out (``to_yaml`` writes this)::

    num_nodes: 2
    gpus_per_node: 4
    source: search
    calls:
      actor_gen: {devices: [0, 1, 2, 3], dp: 2, tp: 2}
      rew_inf: {devices: [4], offload: true}
      ref_inf: {devices: [5], offload: true}
      critic_inf: {devices: [6, 7], dp: 2}
      actor_train: {devices: [0, 1, 2, 3, 4, 5, 6, 7], dp: 8, num_microbatches: 4, activation_checkpointing: true}
      critic_train: {devices: [0, 1, 2, 3, 4, 5, 6, 7], dp: 8, num_microbatches: 4}

Every error is a ``PlanError`` naming the file (when loaded from one), the call and the field, e.g.
``plan.yaml: calls.actor_gen.tp=3 does not divide num_attention_heads=14``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from common.files import atomic_write_text
from reallocation.layout import ModelSpec


class Call(StrEnum):
    """The model function calls of one PPO iteration (a member is its name: ``Call.ref_inf == "ref_inf"``)."""

    actor_gen = "actor_gen"
    rew_inf = "rew_inf"
    ref_inf = "ref_inf"
    critic_inf = "critic_inf"
    actor_train = "actor_train"
    critic_train = "critic_train"
    actor_inf = "actor_inf"
    """Not a plan entry: the old logprobs, a forward of the actor on ``actor_train``'s allocation."""


CALLS = tuple(c for c in Call if c != Call.actor_inf)
"""The calls a plan allocates, in its YAML order."""
CALL_MODEL = {
    "actor_gen": "actor",
    "rew_inf": "reward",
    "ref_inf": "ref",
    "critic_inf": "critic",
    "actor_train": "actor",
    "critic_train": "critic",
}
TRAIN, INFERENCE, GENERATE = "train", "inference", "generate"
CALL_KIND = {
    "actor_gen": GENERATE,
    "rew_inf": INFERENCE,
    "ref_inf": INFERENCE,
    "critic_inf": INFERENCE,
    "actor_train": TRAIN,
    "critic_train": TRAIN,
}
OFFLOADABLE = ("rew_inf", "ref_inf")  # frozen models: nothing to keep resident between calls


def graph_calls(models: Mapping[str, Any]) -> tuple[str, ...]:
    """The calls of one iteration's dataflow graph, in plan order, given the models the algorithm has (model
    name -> anything: shapes, directories): generation and actor training always; critic inference and
    training with a "critic" (PPO; a critic-free algorithm has none), reference inference with a "ref" (a KL
    term), reward inference with a "reward" model (the success reward alone needs no device).
    Worked example: {"actor", "ref"} -> (actor_gen, ref_inf, actor_train)."""
    return tuple(c for c in CALLS if CALL_MODEL[c] == "actor" or CALL_MODEL[c] in models)


VLLM_VOCAB_PAD = 64  # vLLM pads the vocabulary to a multiple of 64 before splitting it over TP


class PlanError(ValueError):
    """An invalid execution plan; the message names the file, the call and the field."""


@dataclass(frozen=True)
class CallAllocation:
    """The GPUs and layout of one call: ``pp * dp * tp`` GPUs, ranks in ``devices`` order."""

    devices: tuple[int, ...]
    pp: int = 1
    dp: int = 1
    tp: int = 1
    num_microbatches: int = 1
    activation_checkpointing: bool = False
    offload: bool = False

    def describe(self) -> str:
        """``gpus[0-7] pp1 dp8 tp1 mb4 ckpt``: one human-readable line."""
        devs = self.devices
        contiguous = list(devs) == list(range(devs[0], devs[0] + len(devs)))
        where = f"gpus[{devs[0]}-{devs[-1]}]" if contiguous and len(devs) > 1 else f"gpus{list(devs)}"
        text = f"{where} pp{self.pp} dp{self.dp} tp{self.tp} mb{self.num_microbatches}"
        return text + (" ckpt" if self.activation_checkpointing else "") + (" offload" if self.offload else "")


_INT_KNOBS = ("pp", "dp", "tp", "num_microbatches")
_BOOL_KNOBS = ("activation_checkpointing", "offload")
_CALL_KEYS = {f.name for f in fields(CallAllocation)}
_TOP_KEYS = ("num_nodes", "gpus_per_node", "source", "calls")


@dataclass(frozen=True)
class ExecutionPlan:
    """A ``CallAllocation`` per call of one PPO iteration on ``num_nodes x gpus_per_node`` GPUs."""

    num_nodes: int
    gpus_per_node: int
    calls: dict[str, CallAllocation]
    source: str = ""  # "heuristic", "search", "real_heuristic", "symmetric", "disjoint", or a path
    origin: str = field(default="", compare=False)  # the file it was loaded from: errors name it

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def num_devices(self) -> int:
        """GPUs that some call uses."""
        return len({d for a in self.calls.values() for d in a.devices})

    def node_of(self, device: int) -> int:
        return device // self.gpus_per_node

    def validate(self, specs: Mapping[str, ModelSpec], *, where: str = "") -> None:
        """Check the plan against the models it runs; raise ``PlanError`` on the first problem.

        ``specs`` maps model name ("actor", "critic", "ref", "reward") to its shape; the plan allocates
        exactly the calls of their dataflow graph (``graph_calls``: no critic calls for a critic-free algorithm,
        no ref_inf without a KL term, no rew_inf without a reward model).
        """
        where = where or self.origin or "plan"
        if self.num_nodes < 1 or self.gpus_per_node < 1:
            raise PlanError(f"{where}: num_nodes={self.num_nodes} and gpus_per_node={self.gpus_per_node} must be >= 1")
        unknown = [c for c in self.calls if c not in CALLS]
        if unknown:
            raise PlanError(f"{where}: unknown call(s) {unknown} under calls; known: {list(CALLS)}")
        required = graph_calls(specs)
        missing = [c for c in required if c not in self.calls]
        if missing:
            raise PlanError(f"{where}: calls.{missing[0]} is missing (every call needs an allocation)")
        extra = [c for c in self.calls if c not in required]
        if extra:
            why = {
                "critic": "the algorithm has no critic",
                "ref": "the algorithm has no KL term (algorithm.kl_coef=0)",
                "reward": "the reward has no reward model",
            }[CALL_MODEL[extra[0]]]
            raise PlanError(f"{where}: calls.{extra[0]} is given but {why}; remove it")
        for name in required:
            self._validate_call(name, self.calls[name], specs[CALL_MODEL[name]], f"{where}: calls.{name}")

    def _validate_call(self, name: str, alloc: CallAllocation, spec: ModelSpec, at: str) -> None:
        for knob in _INT_KNOBS:
            value = getattr(alloc, knob)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(f"{at}.{knob}={value!r} must be a positive integer")
        for knob in _BOOL_KNOBS:
            if not isinstance(getattr(alloc, knob), bool):
                raise PlanError(f"{at}.{knob}={getattr(alloc, knob)!r} must be true or false")
        devices = alloc.devices
        if not devices:
            raise PlanError(f"{at}.devices is empty")
        for d in devices:
            if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < self.num_gpus:
                raise PlanError(
                    f"{at}.devices has {d!r}, outside 0..{self.num_gpus - 1} "
                    f"({self.num_nodes} nodes x {self.gpus_per_node} GPUs)"
                )
        if len(set(devices)) != len(devices):
            raise PlanError(f"{at}.devices={list(devices)} lists a device twice")
        if len(devices) != alloc.pp * alloc.dp * alloc.tp:
            raise PlanError(
                f"{at}.devices has {len(devices)} GPUs but pp*dp*tp = "
                f"{alloc.pp}*{alloc.dp}*{alloc.tp} = {alloc.pp * alloc.dp * alloc.tp}"
            )
        if spec.num_heads % alloc.tp:
            raise PlanError(f"{at}.tp={alloc.tp} does not divide num_attention_heads={spec.num_heads}")
        if spec.num_kv_heads % alloc.tp and alloc.tp % spec.num_kv_heads:
            raise PlanError(
                f"{at}.tp={alloc.tp} and num_key_value_heads={spec.num_kv_heads}: "
                "one must divide the other (vLLM's rule)"
            )
        if spec.num_layers % alloc.pp:
            raise PlanError(f"{at}.pp={alloc.pp} does not divide num_hidden_layers={spec.num_layers}")
        if CALL_KIND[name] == GENERATE:
            padded = -(-spec.vocab_size // VLLM_VOCAB_PAD) * VLLM_VOCAB_PAD
            if padded % alloc.tp:
                raise PlanError(f"{at}.tp={alloc.tp} does not divide the padded vocabulary {padded}")
        if alloc.activation_checkpointing and CALL_KIND[name] != TRAIN:
            raise PlanError(f"{at}.activation_checkpointing applies to training calls only")
        if alloc.offload and name not in OFFLOADABLE:
            raise PlanError(f"{at}.offload applies to {' and '.join(OFFLOADABLE)} only")

    def to_dict(self) -> dict[str, Any]:
        default = CallAllocation(devices=(0,))
        calls = {}
        for name in CALLS:
            if name in self.calls:
                alloc = self.calls[name]
                entry: dict[str, Any] = {"devices": list(alloc.devices)}
                for knob in _INT_KNOBS + _BOOL_KNOBS:
                    if getattr(alloc, knob) != getattr(default, knob):
                        entry[knob] = getattr(alloc, knob)
                calls[name] = entry
        return {"num_nodes": self.num_nodes, "gpus_per_node": self.gpus_per_node, "source": self.source, "calls": calls}

    def to_yaml(self) -> str:
        """Plain YAML, one flow mapping per call (see the module docstring)."""
        data = self.to_dict()
        lines = [f"num_nodes: {data['num_nodes']}", f"gpus_per_node: {data['gpus_per_node']}"]
        if self.source:
            lines.append(f"source: {_yaml_scalar(self.source)}")
        lines.append("calls:" if data["calls"] else "calls: {}")
        for name, entry in data["calls"].items():
            items = ", ".join(f"{k}: {_yaml_value(v)}" for k, v in entry.items())
            lines.append(f"  {name}: {{{items}}}")
        return "\n".join(lines) + "\n"

    def save(self, path: str | Path) -> None:
        """Write ``to_yaml()`` atomically (temp file in the same directory, then rename)."""
        atomic_write_text(Path(path), self.to_yaml())

    @classmethod
    def load(cls, path: str | Path) -> ExecutionPlan:
        """Read a plan file; ``source`` becomes the path when the file does not set one."""
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise PlanError(f"{path}: cannot read execution plan ({e.strerror})") from e
        plan = cls.from_yaml(text, where=str(path))
        return replace(plan, source=plan.source or str(path), origin=str(path))

    @classmethod
    def from_yaml(cls, text: str, where: str = "<plan>") -> ExecutionPlan:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise PlanError(f"{where}: not valid YAML: {e}") from e
        return cls.from_dict(data, where=where)

    @classmethod
    def from_dict(cls, data: Any, where: str = "<plan>") -> ExecutionPlan:
        """Parse plain data (e.g. a loaded YAML or OmegaConf container); rejects unknown keys."""
        if not isinstance(data, Mapping):
            raise PlanError(f"{where}: expected a mapping with keys {list(_TOP_KEYS)}, got {type(data).__name__}")
        unknown = [k for k in data if k not in _TOP_KEYS]
        if unknown:
            raise PlanError(f"{where}: unknown key(s) {unknown}; expected {list(_TOP_KEYS)}")
        for key in ("num_nodes", "gpus_per_node", "calls"):
            if key not in data:
                raise PlanError(f"{where}: missing key {key!r}")
        for key in ("num_nodes", "gpus_per_node"):
            if isinstance(data[key], bool) or not isinstance(data[key], int):
                raise PlanError(f"{where}: {key}={data[key]!r} must be an integer")
        if not isinstance(data["calls"], Mapping):
            raise PlanError(f"{where}: calls must be a mapping from call name to allocation")
        calls = {str(name): _parse_call(entry, f"{where}: calls.{name}") for name, entry in data["calls"].items()}
        source = data.get("source") or ""
        return cls(data["num_nodes"], data["gpus_per_node"], calls, str(source))


def _parse_call(entry: Any, at: str) -> CallAllocation:
    if not isinstance(entry, Mapping):
        raise PlanError(f"{at}: expected a mapping like {{devices: [0, 1], dp: 2}}, got {entry!r}")
    unknown = [k for k in entry if k not in _CALL_KEYS]
    if unknown:
        raise PlanError(f"{at}: unknown key(s) {unknown}; expected {sorted(_CALL_KEYS)}")
    if "devices" not in entry:
        raise PlanError(f"{at}.devices is missing")
    devices = entry["devices"]
    if isinstance(devices, int) and not isinstance(devices, bool):
        devices = [devices]
    if not isinstance(devices, (list, tuple)):
        raise PlanError(f"{at}.devices={devices!r} must be a list of GPU ids")
    for d in devices:
        if isinstance(d, bool) or not isinstance(d, int):
            raise PlanError(f"{at}.devices has {d!r}, not an integer GPU id")
    knobs = {k: entry[k] for k in _INT_KNOBS + _BOOL_KNOBS if k in entry}
    for k in _INT_KNOBS:
        if k in knobs and (isinstance(knobs[k], bool) or not isinstance(knobs[k], int)):
            raise PlanError(f"{at}.{k}={knobs[k]!r} must be an integer")
    for k in _BOOL_KNOBS:
        if k in knobs and not isinstance(knobs[k], bool):
            raise PlanError(f"{at}.{k}={knobs[k]!r} must be true or false")
    return CallAllocation(devices=tuple(devices), **knobs)


def _yaml_scalar(text: str) -> str:
    """``text`` bare when YAML reads it back as the same string, else quoted."""
    import json

    import yaml

    try:
        plain = yaml.safe_load(text) == text and ":" not in text and "#" not in text
    except yaml.YAMLError:
        plain = False
    return text if plain else json.dumps(text)


def _yaml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)
