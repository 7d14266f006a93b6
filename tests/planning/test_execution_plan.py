"""Execution plans as data: the YAML round trip, layouts per call kind, and validation errors that
name the file, the call and the field."""

import pytest

from planning.execution_plan import CALLS, CallAllocation, ExecutionPlan, PlanError, graph_calls
from reallocation.layout import ModelSpec

# Qwen2.5-Math-1.5B's shape: 12 heads, 2 kv heads, 28 layers.
QWEN_1_5B = ModelSpec(
    num_layers=28,
    hidden_size=1536,
    intermediate_size=8960,
    num_heads=12,
    num_kv_heads=2,
    head_dim=128,
    vocab_size=151936,
    tie_word_embeddings=True,
    qkv_bias=True,
)
# 14 heads (SmolLM2-360M-like), 2 kv heads, 32 layers.
FOURTEEN_HEADS = ModelSpec(
    num_layers=32,
    hidden_size=896,
    intermediate_size=2432,
    num_heads=14,
    num_kv_heads=2,
    head_dim=64,
    vocab_size=49152,
    tie_word_embeddings=True,
)
SPECS = {"actor": QWEN_1_5B, "critic": QWEN_1_5B, "ref": QWEN_1_5B, "reward": QWEN_1_5B}

EXAMPLE = """\
num_nodes: 2
gpus_per_node: 4
source: search
calls:
  actor_gen:    {devices: [0, 1, 2, 3], dp: 2, tp: 2}
  rew_inf:      {devices: [4], offload: true}
  ref_inf:      {devices: [5], offload: true}
  critic_inf:   {devices: [6, 7], dp: 2}
  actor_train:  {devices: [0, 1, 2, 3, 4, 5, 6, 7], dp: 8, num_microbatches: 4, activation_checkpointing: true}
  critic_train: {devices: [0, 1, 2, 3, 4, 5, 6, 7], dp: 8, num_microbatches: 4}
"""


def example() -> ExecutionPlan:
    return ExecutionPlan.from_yaml(EXAMPLE, where="plan.yaml")


def test_example_parses_validates_and_round_trips(tmp_path):
    plan = example()
    plan.validate(SPECS)
    assert plan.num_devices == 8 and plan.num_gpus == 8 and plan.source == "search"
    assert plan.calls["actor_gen"] == CallAllocation(devices=(0, 1, 2, 3), dp=2, tp=2)
    assert plan.calls["rew_inf"].offload and not plan.calls["critic_inf"].offload
    train = plan.calls["actor_train"]
    assert (train.dp, train.num_microbatches, train.activation_checkpointing) == (8, 4, True)
    assert ExecutionPlan.from_yaml(plan.to_yaml()) == plan
    path = tmp_path / "sub" / "plan.yaml"
    plan.save(path)
    assert ExecutionPlan.load(path) == plan
    assert [p.name for p in path.parent.iterdir()] == ["plan.yaml"]  # no temp file left behind
    # Default knobs are left out of the YAML; one line per call.
    text = plan.to_yaml()
    assert "  rew_inf: {devices: [4], offload: true}\n" in text
    assert "pp:" not in text and len(text.splitlines()) == 4 + len(CALLS)


def test_load_without_source_records_the_path(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(EXAMPLE.replace("source: search\n", ""))
    assert ExecutionPlan.load(path).source == str(path)


def test_num_devices_counts_distinct_gpus():
    plan = example()
    calls = dict(
        plan.calls,
        actor_train=CallAllocation(devices=(0, 1, 2, 3), dp=4),
        critic_train=CallAllocation(devices=(0, 1, 2, 3), dp=4),
    )
    assert ExecutionPlan(2, 4, calls).num_devices == 8  # 0-3 + 4 + 5 + 6, 7
    del calls["rew_inf"], calls["critic_inf"], calls["ref_inf"]
    assert ExecutionPlan(2, 4, calls).num_devices == 4


@pytest.mark.parametrize(
    "edit, spec, message",
    [
        (
            {"actor_gen": "{devices: [0, 1, 2], tp: 3}"},
            FOURTEEN_HEADS,
            "plan.yaml: calls.actor_gen.tp=3 does not divide num_attention_heads=14",
        ),
        (
            {"actor_gen": "{devices: [0, 1, 2, 3, 4, 5, 6], tp: 7}"},
            FOURTEEN_HEADS,
            "calls.actor_gen.tp=7 and num_key_value_heads=2: one must divide the other",
        ),
        ({"critic_inf": "{devices: [6, 7], pp: 2}"}, FOURTEEN_HEADS, None),  # 32 layers / 2: fine
        (
            {"critic_inf": "{devices: [6, 7, 5], pp: 3}"},
            FOURTEEN_HEADS,
            "calls.critic_inf.pp=3 does not divide num_hidden_layers=32",
        ),
        ({"critic_inf": "{devices: [6, 8], dp: 2}"}, QWEN_1_5B, "calls.critic_inf.devices has 8, outside 0..7"),
        (
            {"critic_inf": "{devices: [6, 6], dp: 2}"},
            QWEN_1_5B,
            r"calls.critic_inf.devices=\[6, 6\] lists a device twice",
        ),
        (
            {"critic_inf": "{devices: [6, 7]}"},
            QWEN_1_5B,
            r"calls.critic_inf.devices has 2 GPUs but pp\*dp\*tp = 1\*1\*1 = 1",
        ),
        (
            {"critic_inf": "{devices: [6], num_microbatches: 0}"},
            QWEN_1_5B,
            "calls.critic_inf.num_microbatches=0 must be",
        ),
        (
            {"critic_inf": "{devices: [6], activation_checkpointing: true}"},
            QWEN_1_5B,
            "calls.critic_inf.activation_checkpointing applies to training calls only",
        ),
        (
            {"critic_inf": "{devices: [6], offload: true}"},
            QWEN_1_5B,
            "calls.critic_inf.offload applies to rew_inf and ref_inf",
        ),
    ],
)
def test_validation_names_call_and_field(edit, spec, message):
    text = EXAMPLE
    for name, entry in edit.items():
        old = next(line for line in text.splitlines() if line.strip().startswith(name + ":"))
        text = text.replace(old, f"  {name}: {entry}")
    plan = ExecutionPlan.from_yaml(text, where="plan.yaml")
    specs = {"actor": spec, "critic": spec, "ref": spec, "reward": spec}
    if message is None:
        plan.validate(specs)
        return
    with pytest.raises(PlanError, match=message):
        plan.validate(specs, where="plan.yaml")


def test_validate_uses_the_loaded_file_name(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        EXAMPLE.replace("tp: 2}", "tp: 3}").replace("dp: 2, ", "dp: 1, ").replace("[0, 1, 2, 3], dp", "[0, 1, 2], dp")
    )
    with pytest.raises(PlanError, match=r"bad\.yaml: calls\.actor_gen\.tp=3 does not divide num_attention_heads=14"):
        ExecutionPlan.load(path).validate(
            {"actor": FOURTEEN_HEADS, "critic": FOURTEEN_HEADS, "ref": FOURTEEN_HEADS, "reward": FOURTEEN_HEADS}
        )


def test_reward_call_matches_the_reward_model():
    plan = example()
    with pytest.raises(PlanError, match="calls.rew_inf is given but the reward has no reward model"):
        plan.validate({"actor": QWEN_1_5B, "critic": QWEN_1_5B, "ref": QWEN_1_5B})
    without = ExecutionPlan(2, 4, {k: v for k, v in plan.calls.items() if k != "rew_inf"})
    without.validate({"actor": QWEN_1_5B, "critic": QWEN_1_5B, "ref": QWEN_1_5B})
    with pytest.raises(PlanError, match="calls.rew_inf is missing"):
        without.validate(SPECS)


def test_the_plan_allocates_exactly_the_algorithms_graph():
    """A critic-free algorithm's specs have no critic (and without a KL term no ref): its plan has no critic
    calls (no ref_inf); a PPO plan given to it is refused, naming the call and why."""
    plan = example()
    critic_free = ExecutionPlan(2, 4, {k: v for k, v in plan.calls.items() if not k.startswith("critic")})
    critic_free.validate({"actor": QWEN_1_5B, "ref": QWEN_1_5B, "reward": QWEN_1_5B})
    with pytest.raises(PlanError, match="calls.critic_inf is given but the algorithm has no critic; remove it"):
        plan.validate({"actor": QWEN_1_5B, "ref": QWEN_1_5B, "reward": QWEN_1_5B})
    with pytest.raises(
        PlanError, match=r"calls.ref_inf is given but the algorithm has no KL term \(algorithm.kl_coef=0\)"
    ):
        critic_free.validate({"actor": QWEN_1_5B, "reward": QWEN_1_5B})
    assert graph_calls({"actor": 1, "ref": 1}) == ("actor_gen", "ref_inf", "actor_train")


@pytest.mark.parametrize(
    "text, message",
    [
        (EXAMPLE + "extra: 1\n", r"plan.yaml: unknown key\(s\) \['extra'\]"),
        (
            EXAMPLE.replace("offload: true}", "offlod: true}", 1),
            r"plan.yaml: calls.rew_inf: unknown key\(s\) \['offlod'\]",
        ),
        (EXAMPLE.replace("dp: 2, tp: 2", "dp: two, tp: 2"), "calls.actor_gen.dp='two' must be an integer"),
        (EXAMPLE.replace("offload: true}", "offload: 1}", 1), "calls.rew_inf.offload=1 must be true or false"),
        (EXAMPLE.replace("{devices: [5], offload: true}", "{offload: true}"), "calls.ref_inf.devices is missing"),
        (EXAMPLE.replace("  rew_inf:      {devices: [4], offload: true}\n", "  rew_gen: {devices: [4]}\n"), None),
        ("num_nodes: 1\ncalls: {}\n", "missing key 'gpus_per_node'"),
        ("- 1\n- 2\n", "expected a mapping"),
        ("calls: {a: [}\n", "not valid YAML"),
    ],
)
def test_parse_errors_name_the_key(text, message):
    if message is None:  # an unknown call name parses, and validation names it
        with pytest.raises(PlanError, match=r"unknown call\(s\) \['rew_gen'\]"):
            ExecutionPlan.from_yaml(text, where="plan.yaml").validate(SPECS)
        return
    with pytest.raises(PlanError, match=message):
        ExecutionPlan.from_yaml(text, where="plan.yaml")


def test_describe_is_one_readable_line():
    plan = example()
    assert plan.calls["actor_train"].describe() == "gpus[0-7] pp1 dp8 tp1 mb4 ckpt"
    assert plan.calls["rew_inf"].describe() == "gpus[4] pp1 dp1 tp1 mb1 offload"
    assert CallAllocation(devices=(8, 0), dp=2).describe() == "gpus[8, 0] pp1 dp2 tp1 mb1"


def test_source_with_special_characters_round_trips():
    plan = ExecutionPlan(1, 1, {}, source="plans/a b: c.yaml")
    assert ExecutionPlan.from_yaml(plan.to_yaml()).source == "plans/a b: c.yaml"
    assert ExecutionPlan.from_yaml(ExecutionPlan(1, 1, {}, source="true").to_yaml()).source == "true"
