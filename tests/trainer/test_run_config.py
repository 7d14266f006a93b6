"""run.name (a fixed, resumable run directory), the synthetic-reward-model guard and the reward paper recipes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from trainer.compose import ConfigError, to_train_config
from trainer.config import register_configs

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
REWARDS = ["success", "orm", "prm", "prm_clip", "prm_delta", "prm_clip_delta"]

register_configs()


def _compose(overrides: list[str], hydra: bool = False):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=hydra)
        return cfg if hydra else to_train_config(cfg)


def _run_dir(overrides: list[str]) -> str:
    cfg = _compose(overrides, hydra=True)
    return OmegaConf.select(cfg, "hydra.run.dir")


def test_run_name_gives_a_fixed_directory_under_outputs():
    assert (
        _run_dir(["run.name=reward_paper_1.5b/prm_clip_delta/seed0"])
        == "outputs/reward_paper_1.5b/prm_clip_delta/seed0"
    )
    assert _run_dir(["run.name=/data/runs/a"]) == "/data/runs/a"
    stamped = _run_dir([])
    assert stamped.startswith("outputs/20") and stamped.count("/") == 2  # outputs/<date>/<time>


@pytest.mark.parametrize("reward, names", [("prm_clip_delta", "math-shepherd"), ("orm", "Skywork-Reward")])
def test_synthetic_reward_model_with_a_hub_policy_fails_naming_a_public_one(reward, names):
    with pytest.raises(ConfigError) as info:
        _compose([f"+reward={reward}", "model=qwen2.5-math-1.5b-instruct"])
    message = str(info.value)
    assert "builtin:synthetic-" in message and names in message
    if reward.startswith("prm"):
        for override in (
            "reward_models.prm.readout=step_tag",
            "reward_models.prm.step_tag=' ки'",
            "reward_models.prm.good_token=+",
            "reward_models.prm.bad_token=-",
            "reward_models.prm.question_template='{question} '",
        ):
            assert override in message
    # The tiny policy on the synthetic task keeps its built-ins; a real reward model is accepted.
    assert _compose([f"+reward={reward}"]).reward.model.path.startswith("builtin:synthetic-")
    assert _compose([f"+reward={reward}", "model=qwen2.5-math-1.5b-instruct", "reward.model.path=/m/rm"])


def test_one_sweep_points_orm_and_prm_runs_at_different_reward_models():
    """`-m +reward=orm,prm_delta reward_models.prm.path=A reward_models.orm.path=B`: each job reads its own."""
    both = ["model=qwen2.5-math-1.5b-instruct", "reward_models.prm.path=/m/prm", "reward_models.orm.path=/m/orm"]
    prm = _compose(["+reward=prm_delta", *both, "reward_models.prm.readout=step_tag", "reward_models.prm.good_token=+"])
    orm = _compose(["+reward=orm", *both, "reward_models.prm.readout=step_tag"])
    assert (prm.reward.model.path, prm.reward.model.readout.value, prm.reward.model.good_token) == (
        "/m/prm",
        "step_tag",
        "+",
    )
    assert (orm.reward.model.path, orm.reward.model.readout.value) == ("/m/orm", "auto")
    # reward.model.* still overrides one run's field on top of its reward_models entry.
    one = _compose(["+reward=orm", *both, "reward.model.batch_size=4"])
    assert (one.reward.model.path, one.reward.model.batch_size) == ("/m/orm", 4)


@pytest.mark.parametrize(
    "size, model, num_prompts", [("1.5b", "qwen2.5-math-1.5b-instruct", 1024), ("7b", "qwen2.5-math-7b-instruct", 4096)]
)
@pytest.mark.parametrize("cluster, num_devices", [("gpu_1x8", 8), ("gpu_2x8", 16)])
@pytest.mark.parametrize("plan", ["heuristic", "search"])
def test_reward_paper_recipes(size, model, num_prompts, cluster, num_devices, plan):
    cfg = _compose(
        [
            f"experiment=reward_paper_{size}",
            "+reward=prm_clip_delta",
            "reward.model.path=/m/prm",
            f"cluster={cluster}",
            f"cluster.plan={plan}",
        ]
    )
    assert cfg.model.name == model and cfg.sft.num_steps == 0
    assert (cfg.rollout.num_prompts, cfg.rollout.num_samples_per_prompt) == (num_prompts, 8)  # the paper's batch
    assert (
        cfg.algorithm.gamma == 1.0
        and cfg.algorithm.kl_coef == 0.1
        and (cfg.data.name, cfg.data.heldout) == ("math_train", "math500")
    )
    assert (cfg.cluster.num_devices, cfg.cluster.plan) == (num_devices, plan)
    # Trained on the prompt `python -m eval` uses for MATH-500 / GSM8K (qwen_math_cot).
    from mathtask.prompts import TEMPLATES

    assert cfg.rollout.system_prompt == TEMPLATES["qwen_math_cot"].system and not cfg.rollout.prompt_suffix
    assert TEMPLATES["qwen_math_cot"].user == "{question}"


@pytest.mark.parametrize("reward", REWARDS)
def test_orm_and_prm_runs_take_their_own_reward_model(reward):
    """scripts/reproduce_reward_paper.sh passes PRM_PATH to the PRM options and ORM_PATH to `orm`."""
    path = "/m/orm" if reward == "orm" else "/m/prm"
    extra = [] if reward == "success" else [f"reward.model.path={path}"]
    cfg = _compose(["experiment=reward_paper_1.5b", f"+reward={reward}", *extra])
    assert cfg.reward.model.path == ("" if reward == "success" else path)
