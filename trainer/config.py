"""The root typed config. Hydra composes YAML onto this schema, so typos and bad values fail at start.

The defaults are the built-in CPU run (`python train.py`): the tiny model, an SFT warm-up on the
synthetic task, then PPO at a learning rate and batch that suit a 0.4M-parameter model. Runs on
real models override them in one place: `configs/experiment/` (e.g. `experiment=reward_paper_1.5b`).

After `train.py`, no code sees a DictConfig: components get their own plain dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from hydra.core.config_store import ConfigStore

from mathtask.config import DataConfig
from models.config import ModelConfig
from planning.config import ClusterConfig
from ppo.config import AlgorithmConfig, PPOConfig, SFTConfig
from rewards.config import RewardConfig, RewardModelConfig


class SeedPer(Enum):
    call = "call"
    prompt = "prompt"


@dataclass
class RolloutConfig:
    num_prompts: int = 64
    """Prompts per iteration."""
    num_samples_per_prompt: int = 8
    max_prompt_tokens: int = 256
    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    system_prompt: str = ""
    prompt_suffix: str = ""
    """Appended to each question, e.g. 'Please reason step by step, and put your final answer within \\boxed{}.'"""
    seed_per: SeedPer = SeedPer.call
    """How generation is seeded; every request carries a seed either way (``models.vllm_engine.call_seeds``).
    ``call``: a call's requests seeded from the call's seed and their position, so the same run (plan and
    seed) draws the same samples, but another generation layout (more or fewer engines) draws others.
    ``prompt``: each prompt's samples seeded from its own tokens, the same under any layout."""
    enforce_eager: bool = True
    """The vLLM engines run eagerly (verl's default: a first run needs no graph capture or compile, and
    no memory for graph pools). False: vLLM captures CUDA graphs (faster decoding on a GPU), and the plan
    prices their pools (``planning.lifecycle.engine_workspace_bytes``)."""

    def __post_init__(self) -> None:
        for name in ("num_prompts", "num_samples_per_prompt", "max_prompt_tokens", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name}={getattr(self, name)}: must be >= 1")
        if not self.temperature > 0:
            raise ValueError(
                f"rollout.temperature={self.temperature}: PPO samples its rollouts and divides the logits "
                "by the temperature, so it must be > 0 (greedy rollouts have no logprobs to train on)"
            )
        if self.top_p != 1.0:
            # The ratio, the KL penalty and the entropy use the full softmax at this temperature; with
            # nucleus sampling the rollout policy is a different (truncated) distribution, and PPO's
            # importance ratio would be off for every token.
            raise ValueError(
                f"rollout.top_p={self.top_p}: PPO rollouts must sample the full softmax (top_p=1.0), "
                "because the logprobs, ratio and KL are computed from it; lower rollout.temperature "
                "to sharpen sampling instead"
            )


@dataclass
class CriticConfig:
    from_policy: bool = True
    """Build the critic from the policy's backbone with a fresh value head."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Used only when from_policy is false."""


@dataclass
class RunConfig:
    name: str = ""
    """A fixed run directory, outputs/<name> (an absolute path is used as it is), e.g.
    `run.name=reward_paper_1.5b/prm_clip_delta/seed0`: relaunching the same command resumes from its
    last checkpoint. Empty: a new timestamped directory, outputs/<date>/<time>. Single runs only (a
    `-m` sweep names its job directories itself)."""
    num_iterations: int = 20
    seed: int = 0
    eval_every: int = 10
    """Held-out success every N iterations (0: only before and after training)."""
    num_heldout_samples: int = 4
    """Sampled (temperature) held-out accuracy with this many samples per problem; 0 = greedy only."""
    checkpoint_every: int = 10
    """A checkpoint every N iterations, and after the last (0: only after the last)."""
    keep_checkpoints: int = 2
    """How many of the newest complete checkpoints stay in <run dir>/checkpoints; older ones are deleted
    as new ones are written (each holds the policy and critic with their optimizer state)."""
    resume: bool = True
    """Resume from the last complete checkpoint in the run directory if there is one."""
    num_logged_samples: int = 4
    """Sample generations written per iteration."""
    rollouts_every: int = 0
    """Every N iterations, the iteration's whole batch of rollouts (response, success, learned reward,
    steps) to rollouts/iter_NNNNNN.jsonl (0: never)."""
    max_restarts: int = 0
    """When a device process or vLLM engine dies (killed, out of memory), restart the cluster from the
    last complete checkpoint up to this many times (each restart logged in metrics.jsonl); 0: stop with
    one line naming the device, the call, the cause and the command that resumes."""
    dry_run: bool = False
    """Print the execution plan (per call: devices, layout, predicted seconds and memory) and exit
    without starting Ray or loading weights."""

    def __post_init__(self) -> None:
        if self.num_iterations < 1:
            raise ValueError(f"run.num_iterations={self.num_iterations}: must be >= 1")
        if self.keep_checkpoints < 1:
            raise ValueError(
                f"run.keep_checkpoints={self.keep_checkpoints}: must be >= 1 (the newest is what a relaunch resumes)"
            )
        for name in (
            "eval_every",
            "num_heldout_samples",
            "checkpoint_every",
            "num_logged_samples",
            "rollouts_every",
            "max_restarts",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"run.{name}={getattr(self, name)}: must be >= 0")


@dataclass
class RewardModelsConfig:
    """The reward models the options use: `+reward=orm` reads `orm`, the four PRM options read `prm`
    (configs/reward/model/). Two keys, so that one sweep's ORM and PRM runs can use different models."""

    prm: RewardModelConfig = field(default_factory=lambda: RewardModelConfig(path="builtin:synthetic-prm"))
    orm: RewardModelConfig = field(default_factory=lambda: RewardModelConfig(path="builtin:synthetic-orm"))


@dataclass
class TrainConfig:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    reward_models: RewardModelsConfig = field(default_factory=RewardModelsConfig)
    data: DataConfig = field(default_factory=DataConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        check_reward_model(self)
        check_algorithm(self)


MOVED_KEYS = {
    f"ppo.{key}": f"algorithm.{key}"
    for key in ("kl_coef", "kl_controller", "kl_target", "kl_horizon", "gamma", "lam", "whiten_advantages")
}
"""Old name -> the key's home in ``algorithm``: an override of the old name says the new one, and a checkpoint
whose config uses the old names resumes (``trainer.run_dir.checkpoint_config``)."""


def check_algorithm(cfg: TrainConfig) -> None:
    """What the algorithm needs of the rest of the config."""
    from ppo.critic_free import Estimator

    a = cfg.algorithm
    if a.estimator in (Estimator.grpo, Estimator.rloo) and cfg.rollout.num_samples_per_prompt < 2:
        raise ValueError(
            f"algorithm={a.name} ({a.estimator.value}) compares the responses to one prompt: it needs "
            f"rollout.num_samples_per_prompt >= 2 (got {cfg.rollout.num_samples_per_prompt})"
        )


# Public reward models for a real policy, with the overrides for their input format (hub ids; download them
# to a local directory on a machine with hub access, as for the policy).
PUBLIC_PRM_HINT = (
    "a PRM such as Math-Shepherd (peiyi9979/math-shepherd-mistral-7b-prm, a causal LM read at a step tag): "
    "reward_models.prm.path=/models/math-shepherd reward_models.prm.readout=step_tag "
    "\"reward_models.prm.step_tag=' ки'\" reward_models.prm.good_token=+ reward_models.prm.bad_token=- "
    "\"reward_models.prm.question_template='{question} '\""
)
PUBLIC_ORM_HINT = (
    "an ORM with a sequence-classification head, such as Skywork/Skywork-Reward-Llama-3.1-8B-v0.2: "
    "reward_models.orm.path=/models/skywork-reward reward_models.orm.readout=seq_cls, or one trained on your policy's "
    "own samples with python -m rewards.train_rm kind=orm (as the paper did)"
)


def check_reward_model(cfg: TrainConfig) -> None:
    """A built-in synthetic reward model (a 2-layer model trained on the synthetic arithmetic task) cannot
    judge a hub policy's solutions: refuse the pair at start instead of training against noise."""
    from models.config import ModelSource
    from rewards.config import BUILTIN_REWARD_MODELS, RewardKind

    path = cfg.reward.model.path
    # Only hub/HF-directory policies: the tiny model and the packaged SmolLM2 run the synthetic task the built-ins know.
    if not cfg.reward.has_model or path not in BUILTIN_REWARD_MODELS or cfg.model.source != ModelSource.hf:
        return
    hint = PUBLIC_ORM_HINT if cfg.reward.kind == RewardKind.orm else PUBLIC_PRM_HINT
    raise ValueError(
        f"reward.model.path={path} is a 2-layer reward model trained on the synthetic arithmetic task; it cannot "
        f"score the solutions of model={cfg.model.name} ({cfg.model.path}). Point reward_models.{cfg.reward.kind.value}.path "
        f"(or reward.model.path) at a real reward model, e.g. {hint}"
    )


def _run_dir(name: str, timestamp: str) -> str:
    """hydra.run.dir: outputs/<run.name> when it is set (a fixed directory: relaunching resumes), else the timestamp."""
    from pathlib import Path

    return str(Path("outputs") / (name or timestamp))


def register_configs() -> None:
    """Register the schema so `configs/train.yaml` can list `train_schema` first in its defaults, and the
    `run_dir` resolver that turns run.name into the run directory."""
    from omegaconf import OmegaConf

    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    if not OmegaConf.has_resolver("run_dir"):
        OmegaConf.register_new_resolver("run_dir", _run_dir)
