"""Every reward option composes with every model option; typos and bad values fail at compose time."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from rewards.config import Refinement, RewardKind
from trainer.compose import ConfigError, to_train_config
from trainer.config import TrainConfig, register_configs

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
REWARDS = sorted(p.stem for p in (CONFIGS / "reward").glob("*.yaml"))
MODELS = sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml"))

register_configs()


def _compose(overrides: list[str]) -> TrainConfig:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=overrides))


def test_option_lists_are_complete():
    # The six options of the reward paper, and the hacking study's two controls (raw PRM at Clip-Delta's
    # spread, Clip-Delta at raw PRM's).
    assert REWARDS == [
        "function",
        "orm",
        "prm",
        "prm_alpha_matched",
        "prm_clip",
        "prm_clip_delta",
        "prm_clip_delta_matched",
        "prm_delta",
        "success",
    ]
    assert {
        "tiny",
        "smollm2-135m",
        "qwen2.5-math-1.5b",
        "qwen2.5-math-1.5b-instruct",
        "qwen2.5-math-7b",
        "qwen2.5-math-7b-instruct",
    } <= set(MODELS)


def test_default_is_success_only():
    cfg = _compose([])
    assert cfg.reward.kind == RewardKind.success
    assert cfg.model.name == "tiny"


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("reward", REWARDS)
def test_every_reward_composes_with_every_model(reward, model):
    # A hub policy needs a real reward model (the synthetic built-ins are refused: tests/trainer/test_run_config.py).
    real_rm = (
        ["reward.model.path=/models/rm"] if reward not in ("success", "function") and model.startswith("qwen") else []
    )
    fn = ["reward.function=examples/reward_functions.py:boxed_format"] if reward == "function" else []
    cfg = _compose([f"+reward={reward}", f"model={model}", *real_rm, *fn])
    assert isinstance(cfg, TrainConfig)
    assert cfg.model.name == model
    expected = {
        "success": (RewardKind.success, Refinement.none),
        "orm": (RewardKind.orm, Refinement.none),
        "prm": (RewardKind.prm, Refinement.none),
        "prm_clip": (RewardKind.prm, Refinement.clip),
        "prm_delta": (RewardKind.prm, Refinement.delta),
        "prm_clip_delta": (RewardKind.prm, Refinement.clip_delta),
        "prm_alpha_matched": (RewardKind.prm, Refinement.none),  # the hacking study's controls
        "prm_clip_delta_matched": (RewardKind.prm, Refinement.clip_delta),
        "function": (RewardKind.function, Refinement.none),  # the user's function alone
    }[reward]
    assert (cfg.reward.kind, cfg.reward.refinement) == expected
    matched = {"prm_alpha_matched": Refinement.clip_delta, "prm_clip_delta_matched": Refinement.none}
    assert cfg.reward.alpha_matched_to == matched.get(reward)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["ppo.lamm=0.9"], "lamm"),
        (["+reward=prm_clip", "reward.eta=1.5"], "reward.eta"),
        (["+reward=prm_clip", "reward.refinement=clipp"], "clipp"),
        (["ppo.gamma=2"], "ppo.gamma"),
        (["model.dtype=int3"], "model.dtype"),
        (["+reward=prm", "reward.model.path="], "reward.model.path"),
        (["rollout.num_prompts=many"], "num_prompts"),
        # `+` lifts struct mode, so these used to be added and then silently dropped
        (["+reward=prm_delta", "+reward.no_such_field=1"], "reward.no_such_field"),
        (["+ppo.lamm=0.9"], "ppo.lamm"),
        (["+no_such_group=1"], "no_such_group"),
        (["run.num_iterations=-3"], "run.num_iterations"),
        (["run.num_iterations=0"], "run.num_iterations"),
        (["rollout.temperature=0"], "rollout.temperature"),
        (["rollout.top_p=0.9"], "rollout.top_p"),
        (["rollout.max_new_tokens=0"], "rollout.max_new_tokens"),
        (["ppo.value_clip=rawr"], "value_clip"),
    ],
)
def test_bad_config_fails_with_the_key_named(overrides, fragment):
    with pytest.raises((ConfigError, ConfigCompositionException, Exception)) as info:
        _compose(overrides)
    assert fragment in str(info.value)


def test_unknown_reward_option_names_it():
    with pytest.raises(Exception) as info:
        _compose(["+reward=prm_deltaa"])
    assert "prm_deltaa" in str(info.value)


@pytest.mark.parametrize("reward", REWARDS)
def test_experiments_compose_with_every_reward(reward):
    fn = ["reward.function=examples/reward_functions.py:boxed_format"] if reward == "function" else []
    mini = _compose(["experiment=mini_repro", f"+reward={reward}", *fn])
    assert mini.model.name == "tiny" and mini.run.num_iterations == 16
    real_rm = ["reward_models.prm.path=/models/prm", "reward_models.orm.path=/models/orm"]
    qwen = _compose(["experiment=reward_paper_1.5b", f"+reward={reward}", *real_rm, *fn])
    assert qwen.model.name == "qwen2.5-math-1.5b-instruct" and qwen.cluster.backend == "nccl"
    assert qwen.data.name == "math_train" and qwen.ppo.actor_lr == 1e-6


def test_clip_options_calibrate_eta_so_most_steps_get_zero():
    for name in ("prm_clip", "prm_clip_delta"):
        assert _compose([f"+reward={name}"]).reward.eta_zero_fraction == 0.8
    assert _compose(["+reward=prm_clip", "reward.eta_zero_fraction=null", "reward.eta=0.4"]).reward.eta == 0.4
    assert _compose(["+reward=prm_delta"]).reward.eta_zero_fraction is None


@pytest.mark.parametrize(
    "cluster, num_devices, backend, plan, profile",
    [
        # The CPU default searches, priced with the profile of the 2-core machine it was measured on.
        ("local_cpu", 2, "gloo", "search", "cpu-2core"),
        # No GPU profile has been measured: the GPU clusters keep the rule.
        ("gpu_1x8", 8, "nccl", "heuristic", ""),
        ("gpu_2x8", 16, "nccl", "heuristic", ""),
    ],
)
def test_clusters_name_their_devices_and_default_plans(cluster, num_devices, backend, plan, profile):
    cfg = _compose([f"cluster={cluster}"])
    assert (cfg.cluster.num_devices, cfg.cluster.backend) == (num_devices, backend)
    assert (cfg.cluster.plan, cfg.cluster.profile) == (plan, profile)
    assert cfg.cluster.uses_gpus == (backend == "nccl")


def test_a_shipped_profile_is_found_from_any_working_directory(tmp_path, monkeypatch):
    from planning.config import PROFILES_DIR, profile_path

    monkeypatch.chdir(tmp_path)
    assert profile_path("cpu-2core") == PROFILES_DIR / "cpu-2core.json"
    assert profile_path("cpu-2core").is_file()
    assert profile_path("docs/p.json") == Path("docs/p.json")  # not a shipped name: a path, as given
    with pytest.raises(Exception) as info:
        _compose(["cluster.profile=cpu-8core"])
    shipped = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.json")))
    assert "cpu-2core" in shipped
    assert f"cluster.profile=cpu-8core: no such file, nor a shipped profile ({shipped})" in str(info.value)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["cluster.devices_per_node=0"], "cluster.devices_per_node=0"),
        (["cluster.num_nodes=0"], "cluster.num_nodes=0"),
        (["cluster.hardware=tpu"], "cluster.hardware='tpu'"),
        (["cluster.plan="], "cluster.plan is empty"),
        (["cluster.plan_search_seconds=0"], "cluster.plan_search_seconds=0"),
        (["cluster.actor_num_ranks=8"], "actor_num_ranks"),
        (["model=qwen2.5-math-7b", "model.shape.num_key_value_heads=3"], "num_key_value_heads=3"),
    ],
)
def test_bad_cluster_or_shape_fails_with_the_key_named(overrides, fragment):
    with pytest.raises(Exception) as info:
        _compose(overrides)
    assert fragment in str(info.value)


def test_qwen_math_model_configs_carry_their_shapes():
    small, large = (
        _compose(["model=qwen2.5-math-1.5b-instruct"]).model.shape,
        _compose(["model=qwen2.5-math-7b"]).model.shape,
    )
    assert (small.num_hidden_layers, small.hidden_size, small.num_attention_heads, small.num_key_value_heads) == (
        28,
        1536,
        12,
        2,
    )
    assert (large.num_hidden_layers, large.hidden_size, large.num_attention_heads, large.num_key_value_heads) == (
        28,
        3584,
        28,
        4,
    )
    assert small.tie_word_embeddings and not large.tie_word_embeddings
    assert not _compose([]).model.shape.given  # tiny: derived from model.tiny


@pytest.mark.filterwarnings(r"ignore:\s*'model/tiny' is validated against ConfigStore schema:UserWarning")
def test_train_py_rejects_an_added_unknown_key_before_training(monkeypatch, capsys):
    """The whole entry point, not just the composer: it must stop at start, naming the key."""
    import runpy
    import sys

    import trainer.loop

    def must_not_train(cfg, run_dir):
        raise AssertionError("training started with an unknown key")

    monkeypatch.setattr(trainer.loop, "train", must_not_train)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "train.py",
            "+reward=prm_delta",
            "+reward.no_such_field=1",
            "hydra.run.dir=/tmp/realm-unknown-key-test",
            "hydra.output_subdir=null",
        ],
    )
    with pytest.raises(SystemExit) as info:
        runpy.run_path(str(CONFIGS.parent / "train.py"), run_name="__main__")
    err = capsys.readouterr().err
    assert info.value.code == 1 and err.startswith("error: unknown config key reward.no_such_field"), err
