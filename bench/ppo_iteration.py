"""Benchmark: time per phase of a realm iteration (PPO, or ``--algorithm`` a critic-free one), and end-to-end
tokens/s against TRL's PPOTrainer (``ppo``) or GRPOTrainer (``grpo``, ``dr_grpo``).

    .venv/bin/python bench/ppo_iteration.py --install-trl      # once, needs the package registry
    unshare -n bash -c 'ip link set lo up && .venv/bin/python bench/ppo_iteration.py --json bench/out/ppo_iteration.json'

The issue's two workloads, and the plan runtime against the pre-plan fixed placement::

    bench/ppo_iteration.py --json out/default.json --num-prompts 64 --samples-per-prompt 8 --placement-baseline
    bench/ppo_iteration.py --json out/smollm2.json --model smollm2-135m --num-prompts 16 --samples-per-prompt 4 \
        --max-new-tokens 256 --iterations 1 --trl-microbatch-rows 4

GRPO against TRL's GRPOTrainer, the same two workloads with ``--algorithm grpo`` (realm runs ``algorithm=grpo``)::

    bench/ppo_iteration.py --algorithm grpo --json out/grpo_default.json --iterations 3 --num-prompts 64 \
        --samples-per-prompt 8
    bench/ppo_iteration.py --algorithm grpo --json out/grpo_smollm2.json --model smollm2-135m --num-prompts 16 \
        --samples-per-prompt 4 --max-new-tokens 256 --iterations 2 --trl-microbatch-rows 4

One fixed workload, run twice in the same process tree one after the other (so both see the same
machine load; the load average before and after each is recorded):

1. realm: ``trainer.loop.train`` on the default config (``configs/train.yaml``: tiny model,
   synthetic task, local Ray, vLLM generation, FSDP2-ready training workers) with the workload's
   overrides. Phase times come from its ``metrics.jsonl`` (``time/generate``, ``time/reward``,
   ``time/inference``, ``time/train``, ``time/sync``, ``time/iteration``); ``other`` is the rest of
   the iteration (padding, KL-shaped rewards, GAE, whitening, metrics).
2. TRL: ``trl.experimental.ppo.PPOTrainer`` (TRL 0.29.1, the last release with PPO) in a
   subprocess (``bench/_trl_ppo.py``) with the same tiny policy, a reference copy, value and
   reward models built from the same directory (``AutoModelForSequenceClassification``,
   ``num_labels=1``), the same prompt token ids per iteration in the same order, the same batch
   (prompts x samples), response length, temperature, stop at EOS, PPO epochs, minibatches,
   learning rate, KL coefficient, gamma, lambda, policy clip range and value loss
   (``trl_value_clip``: no value clipping in either by default; the output says when the two value
   losses differ). TRL is installed with ``pip --no-deps --target .cache/bench-deps/trl-0.29.1``
   and put on that subprocess's PYTHONPATH only; the project's virtual environment never gets it.
   With ``--algorithm grpo`` (or ``dr_grpo``): ``trl.GRPOTrainer`` (``bench/_trl_grpo.py``) with the same policy
   and a reference copy, the same prompt token ids per iteration in the same order, samples per prompt
   (``num_generations``), response length, temperature, generation with TRL's own ``transformers.generate``
   (no vLLM), the same optimizer steps on the same number of rows (``trl_grpo_settings``: its
   ``num_iterations``, ``steps_per_generation`` and gradient accumulation), KL coefficient (k3 in the loss),
   loss aggregation, clip range and learning rate, and realm's grader as its reward function; the output lists
   what differs. Other algorithms (rloo, reinforce_pp: the KL term in the reward) run realm alone.

Tokens/s is end to end: generated tokens (up to and including EOS) over the wall time of whole
PPO iterations, model loading and start-up excluded. Reported means are over the iterations after
the first (the first includes warm-up: vLLM graph capture, allocator growth); tokens/s is their
total tokens over their total time. The TRL process runs on as many torch threads as realm's
workers use in total (``cluster.num_cpus``: each device process and its vLLM engine get the cores
shared out over the plan's devices, ``runtime.placement.threads_per_device``); ``--trl-threads``
changes it.

FLOP accounting (``bench/flops.py``): the float32 matmul peak of one thread and of all threads,
measured before realm and after TRL (best of both); every forward of realm's device shards logs its
counts (``runtime/device/work_log.py``: rows, columns, real tokens, attention pairs, LM-head positions);
per call of the timed iterations the FLOPs from the model's shapes (real tokens and padding apart),
achieved GFLOPS over the call's wall time, the fraction of the peak of the cores it used, the rate its own
matmul shapes reach alone on those cores (``bench.flops.call_matmul_rate``) and so the share of its time
its matmuls take, the share of its time inside forwards, and its fixed cost: the same call on an (almost)
empty batch, the run's plan deployed a second time (``bench/empty_calls.py``; ``--skip-empty-calls`` leaves
it out).

Writes the JSON atomically (``--json``), a PNG bar chart next to it and ``<name>_flops.png`` (per call:
GFLOPS on real tokens, on padding, and the peak of its cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

for _key, _value in {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)

TRL_VERSION = "0.29.1"
TRL_DIR = REPO / ".cache" / "bench-deps" / f"trl-{TRL_VERSION}"
REALM_PHASES = ("generate", "reward", "inference", "train", "sync", "other")
TRL_PHASES = ("generate", "inference", "train", "other")
PLACEMENT_BASELINE = ("cluster.plan=disjoint", "cluster.devices_per_node=4")
"""The fixed per-role placement the trainer had before execution plans: generation, actor training,
critic and reference each on a device (a worker process) of its own."""
PHASE_LABELS = {
    "generate": "generate",
    "reward": "reward",
    "inference": "old/ref/critic logprobs and values (+ rewards, advantages: TRL)",
    "train": "updates (actor, and critic with PPO)",
    "sync": "weight sync -> vLLM",
    "other": "other",
}


def _log(msg: str) -> None:
    print(f"[bench] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------- TRL install


def trl_installed() -> bool:
    return (TRL_DIR / "trl" / "experimental" / "ppo" / "ppo_trainer.py").exists()


def install_trl() -> None:
    """``pip install --no-deps --target`` into a temp dir, then rename: idempotent and never half-done."""
    if trl_installed():
        _log(f"TRL {TRL_VERSION} already installed in {TRL_DIR}")
        return
    TRL_DIR.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=TRL_DIR.parent, prefix=f".trl-{TRL_VERSION}."))
    _log(f"installing trl=={TRL_VERSION} (no deps) into {TRL_DIR}")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-compile",
        "--retries",
        "1",
        "--timeout",
        "15",
        "--target",
        str(tmp),
        f"trl=={TRL_VERSION}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not (tmp / "trl" / "experimental" / "ppo").is_dir():
        subprocess.run(["rm", "-rf", str(tmp)])
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(
            f"pip install trl=={TRL_VERSION} failed (rc {proc.returncode}): {' | '.join(tail)}. "
            f"It needs the package registry: run `.venv/bin/python bench/ppo_iteration.py "
            f"--install-trl` outside the loopback-only namespace first."
        )
    try:
        os.replace(tmp, TRL_DIR)
    except OSError:  # another run installed it meanwhile
        subprocess.run(["rm", "-rf", str(tmp)])
    _log(f"installed TRL {TRL_VERSION}")


# ---------------------------------------------------------------------------------------------- realm


def realm_config(args, extra: tuple[str, ...] = ()):
    """The default config (configs/train.yaml via Hydra) with the benchmark workload's overrides
    (``extra`` last: the placement baseline's)."""
    from hydra import compose, initialize_config_dir

    from trainer.compose import to_train_config
    from trainer.config import register_configs

    register_configs()
    overrides = [
        f"algorithm={args.algorithm}",
        f"rollout.num_prompts={args.num_prompts}",
        f"rollout.num_samples_per_prompt={args.samples_per_prompt}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        f"run.num_iterations={args.iterations}",
        "run.eval_every=0",
        "run.checkpoint_every=0",
        "run.num_heldout_samples=0",
        "run.resume=false",
        f"data.heldout_limit={args.heldout_limit}",
        "sft.num_steps=0",
        *([f"model={args.model}"] if args.model else []),
        *args.realm_override,
        *extra,
    ]
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    return to_train_config(cfg), overrides


def iteration_prompts(cfg) -> list[list[dict[str, Any]]]:
    """Per iteration, the prompts realm rolls out, in its order: each prompt's token ids, gold answer and dataset
    (what the grader needs), once per prompt (realm samples ``rollout.num_samples_per_prompt`` of each)."""
    from transformers import AutoTokenizer

    from models.registry import resolve_model_dir
    from trainer.loop import load_data
    from trainer.rollout import iteration_problems, prompt_ids, prompt_text

    r = cfg.rollout
    train_problems, _ = load_data(cfg)
    tok = AutoTokenizer.from_pretrained(resolve_model_dir(cfg.model))
    out = []
    for it in range(cfg.run.num_iterations):
        prompts = []
        for p in iteration_problems(train_problems, it, r.num_prompts, cfg.run.seed):
            ids = prompt_ids(
                tok,
                prompt_text(tok, p.question, r.system_prompt, r.prompt_suffix),
                r.max_prompt_tokens,
                f"problem {p.id}",
            )
            prompts.append({"ids": ids, "gold": p.answer, "dataset": p.dataset})
        out.append(prompts)
    return out


def iteration_prompt_ids(cfg, prompts: list[list[dict[str, Any]]]) -> list[list[list[int]]]:
    """Per iteration, the prompt token ids of every rollout row: each prompt's ids repeated n times (realm's row
    order)."""
    n = cfg.rollout.num_samples_per_prompt
    return [[p["ids"] for p in it for _ in range(n)] for it in prompts]


def run_realm(cfg, run_dir: Path) -> dict:
    rollouts = cfg.rollout.num_prompts * cfg.rollout.num_samples_per_prompt
    from trainer.loop import train
    from trainer.metrics import read_metrics

    t = time.monotonic()
    load_before = os.getloadavg()
    train(cfg, run_dir)
    load_after = os.getloadavg()
    return {
        "status": "ok",
        "wall_s_incl_startup_and_evals": time.monotonic() - t,
        "load_avg_before": load_before,
        "load_avg_after": load_after,
        "iterations": realm_iterations(read_metrics(run_dir), rollouts),
    }


def call_seconds(row: dict) -> dict[str, float]:
    """Each model function call's duration from the plan runtime's ``call/<name>/start_s`` and
    ``call/<name>/end_s`` (calls on disjoint devices overlap, so these need not add up)."""
    out = {}
    for key, start in row.items():
        if key.startswith("call/") and key.endswith("/start_s"):
            name = key[len("call/") : -len("/start_s")]
            end = row.get(f"call/{name}/end_s")
            if end is not None:
                out[name] = end - start
    return out


def realm_iterations(rows: list[dict], rollouts: int) -> list[dict]:
    """Per-iteration phase times and token counts from ``metrics.jsonl`` rows.

    Row 0 holds only the held-out success before training (no ``time/iteration``): not an iteration.
    """
    iterations = []
    for row in rows:
        if "time/iteration" not in row:
            continue
        phases = {k: row[f"time/{k}"] for k in REALM_PHASES if f"time/{k}" in row}
        total = row["time/iteration"]
        phases["other"] = max(0.0, total - sum(phases.values()))
        iterations.append(
            {
                "iteration": row["iteration"],
                **phases,
                "iteration_s": total,
                "tokens": round(row["response/length"] * rollouts),
                "tokens_per_s": row["throughput/tokens_per_s"],
                "response_length": row["response/length"],
                "rows": rollouts,
                "stopped_at_eos": round((1.0 - row["response/truncated"]) * rollouts),
                "calls": call_seconds(row),
            }
        )
    if not iterations:
        raise RuntimeError("metrics.jsonl has no timed iteration (rows without time/iteration only)")
    return iterations


def run_placement_baseline(args, realm: dict, run_dir: Path) -> dict:
    """realm again with the placement baseline's overrides (the pre-plan fixed placement by default):
    the plan runtime's iteration time against it, same workload, same process, one after the other."""
    extra = tuple(args.placement_baseline or PLACEMENT_BASELINE)
    cfg, _ = realm_config(args, extra)
    _log(f"[placement baseline] realm with {' '.join(extra)}")
    baseline = run_realm(cfg, run_dir)
    summarize(baseline, REALM_PHASES)
    ratio = baseline["mean_s"]["iteration_s"] / realm["mean_s"]["iteration_s"]
    _log(
        f"placement baseline: {baseline['mean_s']['iteration_s']:.2f} s/iteration; the plan's speed-up over it "
        f"{ratio:.2f}x"
    )
    return {"overrides": list(extra), "baseline": baseline, "speedup_of_plan": ratio}


# ---------------------------------------------------------------------------------------------- TRL


def trl_value_clip(ppo) -> dict[str, Any]:
    """TRL's ``cliprange_value`` for realm's value-loss setting (``ppo.value_clip``), and whether the
    two critics then minimise the same loss.

    TRL's PPO always takes 1/2 max((V - R)^2, (clamp(V, V_old - c, V_old + c) - R)^2), c in reward units:
    - ``none`` (realm's default: plain regression, 1/2 (V - R)^2): c = infinity (None in the JSON
      spec; the TRL process passes ``float("inf")``), so the clamp is a no-op and the loss is the same.
    - ``raw`` (c = value_clip_eps in reward units): the same loss.
    - ``return_std`` (c = value_clip_eps x the iteration's return std): TRL has no such option; it gets
      c = value_clip_eps in reward units, and the result says the losses differ.
    """
    mode = ppo.value_clip.value
    if mode == "none":
        return {"realm": mode, "trl_cliprange_value": None, "same_loss": True, "note": "no value clipping in either"}
    note = f"both clip value moves at {ppo.value_clip_eps} in reward units"
    if mode == "return_std":
        note = (
            f"differs: realm clips value moves at {ppo.value_clip_eps} x each iteration's return std, TRL at "
            f"{ppo.value_clip_eps} in reward units (TRL has no return-scaled range)"
        )
    return {"realm": mode, "trl_cliprange_value": ppo.value_clip_eps, "same_loss": mode == "raw", "note": note}


TRL_TRAINERS = {"ppo": "PPOTrainer", "grpo": "GRPOTrainer", "dr_grpo": "GRPOTrainer"}
"""realm's algorithm (``algorithm.name``) -> the TRL trainer this benchmark runs against it; others run realm alone."""


def trl_grpo_settings(cfg, microbatch_rows: int = 0) -> dict[str, Any]:
    """TRL's ``GRPOConfig`` for realm's critic-free algorithm on the benchmark workload, and where the two differ.

    Raises ValueError naming the setting when GRPOTrainer cannot run the algorithm (a KL term in the reward, an
    estimator other than a group mean). The update is laid out so that both take the same optimizer steps on
    the same number of rows: TRL generates ``per_device_train_batch_size x steps_per_generation`` rows at once
    (realm's prompts x samples), passes over them ``num_iterations`` times (realm's ``ppo.num_epochs``), and
    steps its optimizer every ``gradient_accumulation_steps`` micro-batches, so each step takes one of realm's
    ``ppo.num_minibatches`` minibatches; ``microbatch_rows`` (0: the whole minibatch) sets its micro-batch.

    Worked example, the default run's workload (64 x 8 = 512 rows, 2 epochs x 4 minibatches of 128 rows), no
    micro-batching: per_device_train_batch_size 128, gradient_accumulation_steps 1, steps_per_generation 4,
    num_iterations 2: 8 optimizer steps of 128 rows each, as realm's.
    """
    from ppo.config import KLEstimator, KLPlacement, LossAgg
    from ppo.critic_free import Estimator

    a, p, r = cfg.algorithm, cfg.ppo, cfg.rollout
    if a.estimator != Estimator.grpo:
        raise ValueError(f"algorithm.estimator={a.estimator.value}: TRL's GRPOTrainer has group-mean baselines only")
    if a.kl_coef != 0.0 and a.kl_in != KLPlacement.loss:
        raise ValueError("algorithm.kl_in=reward: TRL's GRPOTrainer has its KL term in the loss only")
    rows = r.num_prompts * r.num_samples_per_prompt
    if rows % p.num_minibatches:
        raise ValueError(f"{rows} rows do not split into ppo.num_minibatches={p.num_minibatches} equal minibatches")
    minibatch = rows // p.num_minibatches
    micro = microbatch_rows or minibatch
    if minibatch % micro:
        raise ValueError(f"--trl-microbatch-rows {micro} must divide the minibatch of {minibatch} rows")
    loss_types = {
        LossAgg.seq_mean_token_mean: "grpo",
        LossAgg.token_mean: "bnpo",
        LossAgg.seq_mean_token_sum_norm: "dr_grpo",
    }
    differs = [
        "advantages: TRL divides by the group's unbiased std + 1e-4, realm by its population std (1 below 1e-4): "
        f"TRL's are sqrt((n - 1) / n) = {((r.num_samples_per_prompt - 1) / r.num_samples_per_prompt) ** 0.5:.3f} "
        "of realm's; a group of equal rewards gives 0 in both"
        if a.group_std
        else "advantages: reward minus the group mean in both (no std)",
        "minibatch order: TRL shuffles a generation batch once and takes the same minibatches in each pass, "
        "realm reshuffles every epoch",
    ]
    if micro != minibatch and a.loss_agg != LossAgg.seq_mean_token_sum_norm:
        differs.append(
            f"loss: TRL aggregates each {micro}-row micro-batch ({loss_types[a.loss_agg]}) and averages them, "
            f"realm aggregates the whole {minibatch}-row minibatch"
        )
    if a.kl_coef != 0.0 and a.kl_estimator != KLEstimator.k3:
        differs.append(f"KL: TRL's loss term is k3, realm's {a.kl_estimator.value}")
    norm = a.loss_agg_num_tokens or r.max_new_tokens
    if a.loss_agg == LossAgg.seq_mean_token_sum_norm and norm != r.max_new_tokens:
        differs.append(f"loss: TRL's Dr. GRPO constant is max_completion_length {r.max_new_tokens}, realm's {norm}")
    spec = {
        "layout": {
            "per_device_train_batch_size": micro,
            "gradient_accumulation_steps": minibatch // micro,
            "steps_per_generation": rows // micro,
            "num_iterations": p.num_epochs,
        },
        "loss_type": loss_types[a.loss_agg],
        "scale_rewards": "group" if a.group_std else "none",
        "beta": a.kl_coef,
        "clip_eps": p.clip_eps,
        "lr": p.actor_lr,
        "max_grad_norm": p.max_grad_norm,
        "num_generations": r.num_samples_per_prompt,
        "max_new_tokens": r.max_new_tokens,
        "temperature": r.temperature,
        "top_p": r.top_p,
    }
    same = (
        f"{p.num_epochs} x {p.num_minibatches} optimizer steps of {minibatch} rows per iteration; loss "
        f"{a.loss_agg.value} (TRL loss_type={spec['loss_type']}); KL beta {a.kl_coef}"
        + (" (k3 in the loss)" if a.kl_coef else "")
        + f"; clip {p.clip_eps}; lr {p.actor_lr}; reward: realm's grader (success)"
        + (
            "; old logprobs: the update's own in both (one step per generation batch)"
            if p.num_epochs == p.num_minibatches == 1
            else "; old logprobs: a forward of their own in both"
        )
    )
    return {"trainer": "GRPOTrainer", "spec": spec, "same": same, "differs": differs}


def trl_spec(cfg, prompts: list[list[dict[str, Any]]], work: Path, microbatch_rows: int) -> tuple[str, dict[str, Any]]:
    """(the TRL script, its spec) for realm's algorithm; ValueError when this benchmark has no TRL counterpart."""
    from models.registry import resolve_model_dir

    common = {
        "model_dir": str(resolve_model_dir(cfg.model)),
        "dtype": cfg.model.dtype,
        "seed": cfg.run.seed,
        "output_dir": str(work / "trl-output"),
    }
    trainer = TRL_TRAINERS.get(cfg.algorithm.name)
    if trainer == "GRPOTrainer":
        settings = trl_grpo_settings(cfg, microbatch_rows)
        return "_trl_grpo.py", {**common, **settings["spec"], "iterations": prompts}
    if trainer != "PPOTrainer" or not cfg.algorithm.has_critic:
        raise ValueError(
            f"algorithm={cfg.algorithm.name}: no TRL counterpart in this benchmark (it has {TRL_TRAINERS})"
        )
    a, p = cfg.algorithm, cfg.ppo
    return "_trl_ppo.py", {
        **common,
        "lr": p.actor_lr,
        "num_epochs": p.num_epochs,
        "num_minibatches": p.num_minibatches,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "temperature": cfg.rollout.temperature,
        "kl_coef": a.kl_coef,
        "gamma": a.gamma,
        "lam": a.lam,
        "clip_eps": p.clip_eps,
        "cliprange_value": trl_value_clip(p)["trl_cliprange_value"],
        "iteration_prompt_ids": iteration_prompt_ids(cfg, prompts),
        "microbatch_rows": microbatch_rows,
    }


def run_trl(cfg, prompts: list[list[dict[str, Any]]], work: Path, threads: int, microbatch_rows: int = 0) -> dict:
    """TRL's trainer for realm's algorithm (``TRL_TRAINERS``) in a subprocess on ``threads`` torch threads."""
    try:
        script, spec = trl_spec(cfg, prompts, work, microbatch_rows)
    except ValueError as e:
        return {"status": "skipped", "error": str(e)}
    spec_path, out_path = work / "trl_spec.json", work / "trl_result.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ)
    # The TRL install first; the repository for the GRPO reward function (realm's grader).
    env["PYTHONPATH"] = os.pathsep.join([str(TRL_DIR), str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["TRL_EXPERIMENTAL_SILENCE"] = "1"
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    env["HF_DATASETS_OFFLINE"] = "1"
    env["TRANSFORMERS_VERBOSITY"] = "error"
    load_before = os.getloadavg()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / script), str(spec_path), str(out_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=str(work),
    )
    tail: list[str] = []
    assert proc.stdout is not None  # stdout=PIPE
    for line in proc.stdout:  # progress lines through; HF's per-step metric dicts and load bars kept quiet
        line = line.rstrip("\n")
        tail = (tail + [line])[-25:]
        if line.startswith("[trl"):
            print(line, flush=True)
    rc = proc.wait()
    load_after = os.getloadavg()
    if rc != 0 or not out_path.exists():
        error = next((l for l in reversed(tail) if "Error" in l or "error" in l), tail[-1] if tail else "")
        return {
            "status": "error",
            "error": f"TRL's {TRL_TRAINERS[cfg.algorithm.name]} exited with rc {rc}: {error.strip()}",
            "output_tail": tail,
            "load_avg_before": load_before,
            "load_avg_after": load_after,
        }
    result = json.loads(out_path.read_text())
    for row in result["iterations"]:
        row["other"] = max(0.0, row["iteration_s"] - row["generate"] - row["inference"] - row["train"])
    result.update(load_avg_before=load_before, load_avg_after=load_after, torch_threads_requested=threads)
    return result


# ---------------------------------------------------------------------------------------------- FLOPs


def measure_peaks() -> dict[str, float]:
    """The float32 matmul peak of one thread and of all the machine's threads, in this run."""
    from bench.flops import matmul_peak_gflops

    threads = os.cpu_count() or 1
    return {
        "one_thread_gflops": matmul_peak_gflops(1),
        "all_threads_gflops": matmul_peak_gflops(threads),
        "threads": threads,
    }


def generation_flops(cfg, prompts: list[list[int]], generated_tokens: float) -> dict[str, float]:
    """actor_gen's FLOPs per iteration from its token counts (vLLM logs no counts): the decoder's linear
    layers on every prompt and generated token, the LM head on every generated token. Attention is left out
    (no per-row lengths; at these lengths under 5% of the total), so this is a floor."""
    from bench.flops import ModelShape
    from models.registry import resolve_model_dir

    shape = ModelShape.from_dir(resolve_model_dir(cfg.model))
    prompt_tokens = sum(len(p) for p in prompts)
    flops = (
        shape.linear_flops_per_token * (prompt_tokens + generated_tokens)
        + 2 * shape.hidden * shape.vocab * generated_tokens
    )
    return {"gflop": flops / 1e9, "prompt_tokens": prompt_tokens, "generated_tokens": generated_tokens}


def flop_accounting(cfg, realm: dict, run_dir: Path, work_dir: Path, peaks: dict, empty: dict) -> dict[str, Any]:
    """Per call of the timed iterations: FLOPs (real tokens, padding apart), achieved GFLOPS, the fraction of
    the peak of the cores it used, and its empty-call time (``bench/flops.py``, ``bench/empty_calls.py``)."""
    from bench.flops import ModelShape, call_matmul_rate, call_report, read_work_log, work_by_call
    from models.registry import resolve_model_dir
    from planning.execution_plan import ExecutionPlan

    plan = ExecutionPlan.load(run_dir / "plan.yaml")
    actor = ModelShape.from_dir(resolve_model_dir(cfg.model))
    critic = actor if cfg.critic.from_policy else ModelShape.from_dir(resolve_model_dir(cfg.critic.model))
    timed = [i - 1 for i in realm["timed_iterations"]]  # metrics number iterations from 1
    work = work_by_call({"actor": actor, "critic": critic}, read_work_log(work_dir), timed)
    pair = (peaks["one_thread_gflops"], peaks["all_threads_gflops"])
    calls = {}
    for call, w in sorted(work.items()):
        alloc = plan.calls["actor_train" if call == "actor_inf" else call]
        seconds = realm["mean_call_s"].get(call, 0.0)
        shape = critic if call.startswith("critic") else actor
        rate = call_matmul_rate(shape, w, call, len(alloc.devices))
        calls[call] = call_report(w, len(timed), seconds, len(alloc.devices), pair, empty.get(call), rate)
        calls[call]["devices"] = sorted(alloc.devices)
    return {"plan": plan.source, "peaks": peaks, "calls": calls, "unaccounted_plan": _unaccounted(plan)}


def _unaccounted(plan) -> list[str]:
    """Calls whose FLOPs the per-rank counts would misstate: tensor-parallel ranks share rows (counted
    once per rank) and a pipeline's earlier stages log nothing."""
    return [name for name, a in plan.calls.items() if a.tp > 1 or a.pp > 1]


def print_flops(flops: dict) -> None:
    peaks = flops["peaks"]
    print(
        f"\nmatmul peak (float32, 2048^2, best of 8): {peaks['one_thread_gflops']:.0f} GFLOPS on 1 thread, "
        f"{peaks['all_threads_gflops']:.0f} on {peaks['threads']}"
    )
    print(
        "| call | GFLOP (+ padding) | s | GFLOPS | cores | % of their peak | its matmuls alone, GFLOPS "
        "| matmuls' share of its time | padding | forwards' share | empty call s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for call, c in flops["calls"].items():
        empty = f"{c['empty_call_s']:.2f}" if c["empty_call_s"] is not None else "-"
        rate = c.get("matmul_rate_gflops")
        of_rate = f"{100 * c['fraction_of_matmul_rate']:.0f}%" if rate else "-"
        print(
            f"| {call} | {c['gflop']:.0f} (+{c['padding_gflop']:.0f}) | {c['seconds']:.2f} | {c['gflops']:.1f} | "
            f"{c['cores']} | {100 * c['fraction_of_peak']:.0f}% | {f'{rate:.0f}' if rate else '-'} | {of_rate} | "
            f"{100 * c['padding_fraction']:.0f}% | "
            f"{100 * c['forward_share']:.0f}% | {empty} |"
        )
    if flops.get("generation"):
        g = flops["generation"]
        print(f"actor_gen: {g['gflop']:.0f} GFLOP (linear layers and head, no attention), {g['gflops']:.1f} GFLOPS")


def plot_flops(result: dict, path: Path) -> None:
    """Per call: achieved GFLOPS on real tokens, GFLOPS spent on padding, the peak of its cores and the rate
    of its own matmul shapes alone."""
    import matplotlib

    from common.files import atomic_save_figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    calls = result["flops"]["calls"]
    names = list(calls)
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(names) + 2.8))
    real = [calls[n]["gflops"] for n in names]
    padding = [calls[n]["gflops_incl_padding"] - calls[n]["gflops"] for n in names]
    ax.barh(names, real, color="tab:blue", label="GFLOPS on real tokens")
    ax.barh(names, padding, left=real, color="tab:gray", alpha=0.5, label="GFLOPS spent on padding")
    for i, n in enumerate(names):
        ax.plot(
            [calls[n]["peak_gflops"]] * 2,
            [i - 0.4, i + 0.4],
            color="tab:red",
            lw=2,
            label="matmul peak of its cores" if i == 0 else None,
        )
        if calls[n].get("matmul_rate_gflops"):
            ax.plot(
                [calls[n]["matmul_rate_gflops"]] * 2,
                [i - 0.4, i + 0.4],
                color="black",
                lw=2,
                ls=":",
                label="its own matmul shapes alone" if i == 0 else None,
            )
        ax.text(real[i] + padding[i], i, f" {100 * calls[n]['fraction_of_peak']:.0f}%", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GFLOP/s (float32; model FLOPs over the call's wall time)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2)  # below: bars reach both sides
    best = max(names, key=lambda n: calls[n]["fraction_of_peak"])
    worst = min(names, key=lambda n: calls[n]["fraction_of_peak"])
    w = result["workload"]
    ax.set_title(
        f"{w['model']}, {w['rollouts']} x {w['max_new_tokens']} tokens: {best} reaches "
        f"{100 * calls[best]['fraction_of_peak']:.0f}% of its cores' matmul peak, {worst} "
        f"{100 * calls[worst]['fraction_of_peak']:.0f}%",
        fontsize=9,
    )
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=100)
    _log(f"wrote {path}")


# ---------------------------------------------------------------------------------------------- summary


def summarize(part: dict, phases: tuple[str, ...]) -> None:
    """Means over the iterations after the first (all of them if there is only one)."""
    rows = part["iterations"]
    timed = rows[1:] or rows
    part["timed_iterations"] = [r["iteration"] for r in timed]
    part["mean_s"] = {k: sum(r.get(k, 0.0) for r in timed) / len(timed) for k in (*phases, "iteration_s")}
    calls = sorted({c for r in timed for c in r.get("calls", {})})
    part["mean_call_s"] = {c: sum(r.get("calls", {}).get(c, 0.0) for r in timed) / len(timed) for c in calls}
    part["tokens"] = sum(r["tokens"] for r in timed)
    part["rows"] = sum(r["rows"] for r in timed)
    part["stopped_at_eos"] = sum(r["stopped_at_eos"] for r in timed)
    part["tokens_per_s"] = part["tokens"] / sum(r["iteration_s"] for r in timed)


def trl_label(result: dict) -> str:
    """'TRL PPOTrainer', 'TRL GRPOTrainer' (results written before --algorithm: PPO)."""
    return f"TRL {result['workload'].get('trl_trainer') or 'PPOTrainer'}"


def print_table(result: dict) -> None:
    realm, trl = result["realm"], result["trl"]
    trl_ok = trl.get("status") == "ok"
    w = result["workload"]
    print()
    print(
        f"workload: algorithm {w.get('algorithm', 'ppo')}, {w['num_prompts']} prompts x {w['samples_per_prompt']} "
        f"samples = {w['rollouts']} rollouts, up to {w['max_new_tokens']} new tokens, {w['ppo_epochs']} epochs x "
        f"{w['minibatches']} minibatches, {w['iterations']} iterations (means over iterations "
        f"{realm['timed_iterations']}), model {w['model']}"
    )
    if "value_clip" in w:
        print(f"value loss (ppo.value_clip={w['value_clip']['realm']}): {w['value_clip']['note']}")
    settings = w.get("trl_settings") or {}
    if settings.get("trainer"):
        print(f"same in both: {settings['same']}")
        for line in settings["differs"]:
            print(f"differs: {line}")
    print(f"| phase (s / iteration) | realm | {trl_label(result)} |")
    print("| --- | ---: | ---: |")
    for k in REALM_PHASES:
        t = f"{trl['mean_s'][k]:.2f}" if trl_ok and k in trl["mean_s"] else "-"
        print(f"| {PHASE_LABELS[k]} | {realm['mean_s'][k]:.2f} | {t} |")
    t = f"{trl['mean_s']['iteration_s']:.2f}" if trl_ok else "-"
    print(f"| **iteration** | **{realm['mean_s']['iteration_s']:.2f}** | **{t}** |")
    t = f"{trl['tokens_per_s']:.1f}" if trl_ok else "n/a"
    print(f"| end-to-end tokens/s | {realm['tokens_per_s']:.1f} | {t} |")
    t = f"{trl['tokens'] / trl['rows']:.1f} ({trl['stopped_at_eos']}/{trl['rows']} at EOS)" if trl_ok else "-"
    print(
        f"| tokens per response | {realm['tokens'] / realm['rows']:.1f} ({realm['stopped_at_eos']}/{realm['rows']} at EOS) | {t} |"
    )
    if realm.get("mean_call_s"):
        print(
            "realm per call (s / iteration; calls on disjoint devices overlap): "
            + ", ".join(f"{c} {v:.2f}" for c, v in sorted(realm["mean_call_s"].items(), key=lambda kv: -kv[1]))
        )
    placement = result.get("placement")
    if placement:
        base = placement["baseline"]
        print(
            f"placement baseline ({' '.join(placement['overrides'])}): {base['mean_s']['iteration_s']:.2f} s/iteration, "
            f"{base['tokens_per_s']:.1f} tokens/s; the plan's speed-up over it (baseline s / plan s): "
            f"{placement['speedup_of_plan']:.2f}x"
        )
    if trl_ok:
        print(f"ratio realm / TRL tokens/s: {result['ratio_realm_over_trl']:.2f}x")
    else:
        print(f"{trl_label(result)} did not run: {trl.get('error')}")
    print(f"note: {result['note']}")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    from common.files import atomic_save_figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    realm, trl = result["realm"], result["trl"]
    trl_ok = trl.get("status") == "ok"
    fig, (ax_p, ax_t) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    names = ["realm"] + ([trl_label(result)] if trl_ok else [])
    parts = [realm] + ([trl] if trl_ok else [])
    colors = dict(zip(REALM_PHASES, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for i, part in enumerate(parts):
        bottom = 0.0
        for k in REALM_PHASES:
            v = part["mean_s"].get(k, 0.0)
            ax_p.barh(i, v, left=bottom, color=colors[k], label=PHASE_LABELS[k] if i == 0 else None)
            bottom += v
    ax_p.set_yticks(range(len(names)))
    ax_p.set_yticklabels(names)
    ax_p.invert_yaxis()
    timed = realm.get("timed_iterations") or []
    ax_p.set_xlabel(
        "seconds per iteration (mean after the first)"
        if len(timed) != 1 or timed[0] != 1
        else "seconds of the one iteration (warm-up included)"
    )
    ax_p.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    ax_p.set_title("time per phase")
    rates = [p["tokens_per_s"] for p in parts]
    ax_t.bar(names, rates, color=["tab:blue", "tab:orange"][: len(names)])
    for i, v in enumerate(rates):
        ax_t.text(i, v, f"{v:.0f}" if v >= 10 else f"{v:.2f}", ha="center", va="bottom")
    ax_t.set_ylabel("generated tokens / s (end to end)")
    ratio = result.get("ratio_realm_over_trl")
    ax_t.set_title(f"realm / TRL = {ratio:.2f}x" if ratio else "TRL did not run")
    w = result["workload"]
    verdict = (
        f"realm {ratio:.2f}x TRL's tokens/s (realm's workers on {w['realm_threads']} cores, TRL on "
        f"{w['trl_torch_threads']} threads)"
        if ratio
        else "realm alone"
    )
    fig.suptitle(
        f"{w.get('algorithm', 'ppo').upper()} iteration, {w['model']}, {w['rollouts']} rollouts x up to {w['max_new_tokens']} tokens: {verdict}",
        fontsize=10,
    )
    fig.tight_layout()
    atomic_save_figure(fig, path, dpi=100)
    _log(f"wrote {path}")


def write_json(result: dict, path: Path) -> None:
    from common.files import atomic_write_json

    atomic_write_json(path, result)
    _log(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="output JSON path (PNG written next to it)")
    parser.add_argument("--install-trl", action="store_true", help=f"install TRL {TRL_VERSION} into {TRL_DIR} and exit")
    parser.add_argument("--iterations", type=int, default=4, help="iterations per trainer (the first is warm-up)")
    parser.add_argument(
        "--algorithm",
        default="ppo",
        help="realm's algorithm (configs/algorithm/); TRL runs PPOTrainer for ppo, GRPOTrainer for grpo and "
        "dr_grpo, nothing for the others",
    )
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--samples-per-prompt", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--heldout-limit", type=int, default=8, help="realm's before/after eval (outside the timing)")
    parser.add_argument(
        "--trl-threads",
        type=int,
        default=0,
        help="torch threads of the TRL process (0: what realm's Ray workers get, OMP_NUM_THREADS or 1)",
    )
    parser.add_argument(
        "--trl-microbatch-rows",
        type=int,
        default=0,
        help="TRL's forward/backward micro-batch in rows (0: one per minibatch). TRL 0.29.1 ties gradient "
        "accumulation to its rollout batch, so this runs one minibatch per epoch in micro-batches of this "
        "many rows: the same passes over the same rows, fewer optimizer steps (SmolLM2-135M's full-vocabulary "
        "logits of a 16-row minibatch ran this 24 GiB machine out of memory)",
    )
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--model", default="", help="model config (configs/model/), e.g. smollm2-135m; default: tiny")
    parser.add_argument(
        "--realm-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Hydra override for realm's runs (repeatable)",
    )
    parser.add_argument(
        "--placement-baseline",
        nargs="*",
        metavar="KEY=VALUE",
        default=None,
        help="also run realm with these overrides (default when given bare: "
        f"{' '.join(PLACEMENT_BASELINE)}) and report its iteration time beside the plan's",
    )
    parser.add_argument(
        "--skip-empty-calls",
        action="store_true",
        help="leave out the fixed per-call cost (it deploys the plan a second time: Ray and vLLM start-up)",
    )
    args = parser.parse_args(argv)
    algorithms = sorted(p.stem for p in (REPO / "configs" / "algorithm").glob("*.yaml"))
    if args.algorithm not in algorithms:
        from common.cli import did_you_mean, fail

        fail(
            f"--algorithm {args.algorithm}: not one of {', '.join(algorithms)}{did_you_mean(args.algorithm, algorithms)}"
        )
    if args.install_trl:
        install_trl()
        return
    if not args.json:
        parser.error("--json is required")
    if args.iterations < 2:
        _log("note: with 1 iteration the means include warm-up")
    out = Path(args.json).resolve()
    result = run_benchmark(args)
    print_table(result)
    print_flops(result["flops"])
    write_json(result, out)
    for draw, path in ((plot, out.with_suffix(".png")), (plot_flops, out.with_name(f"{out.stem}_flops.png"))):
        try:
            draw(result, path)
        except Exception as e:  # noqa: BLE001 - the JSON is the result; a plotting failure is not fatal
            _log(f"no plot {path.name}: {e}")


def _grpo_settings_or_reason(cfg, args) -> dict[str, Any]:
    try:
        settings = trl_grpo_settings(cfg, args.trl_microbatch_rows)
    except ValueError as e:
        return {"trainer": None, "why_not": str(e)}
    return {k: settings[k] for k in ("trainer", "same", "differs")} | {"layout": settings["spec"]["layout"]}


def describe_workload(cfg, overrides: list[str], args, trl_threads: int) -> dict[str, Any]:
    from ppo.config import reuses_update_logprobs

    return {
        "model": cfg.model.name,
        "dtype": cfg.model.dtype,
        "data": cfg.data.name,
        "num_prompts": cfg.rollout.num_prompts,
        "samples_per_prompt": cfg.rollout.num_samples_per_prompt,
        "rollouts": cfg.rollout.num_prompts * cfg.rollout.num_samples_per_prompt,
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "temperature": cfg.rollout.temperature,
        "ppo_epochs": cfg.ppo.num_epochs,
        "minibatches": cfg.ppo.num_minibatches,
        "old_logprobs": "the update's own, detached (one step per batch: no actor_inf)"
        if reuses_update_logprobs(cfg.algorithm, cfg.ppo)
        else "actor_inf (a forward of their own)",
        "iterations": cfg.run.num_iterations,
        "algorithm": cfg.algorithm.name,
        "trl_trainer": TRL_TRAINERS.get(cfg.algorithm.name),
        **({"value_clip": trl_value_clip(cfg.ppo)} if cfg.algorithm.has_critic else {}),
        **({"trl_settings": _grpo_settings_or_reason(cfg, args)} if not cfg.algorithm.has_critic else {}),
        "realm_overrides": overrides,
        "cpu_count": os.cpu_count(),
        "realm_threads": cfg.cluster.num_cpus,
        "trl_torch_threads": trl_threads,
        "trl_microbatch_rows": args.trl_microbatch_rows or None,
    }


def run_benchmark(args) -> dict[str, Any]:
    """Peaks, realm (its forwards logged), the empty calls, the placement baseline and TRL, one after the
    other in this process tree; the result dict (``main`` prints, writes and draws it)."""
    t0 = time.monotonic()
    cfg, overrides = realm_config(args)
    # TRL on as many threads as realm's workers use in total: Ray's CPUs, one worker thread per core.
    trl_threads = args.trl_threads or cfg.cluster.num_cpus
    workload = describe_workload(cfg, overrides, args, trl_threads)
    prompts = iteration_prompts(cfg)
    trl_error = None
    if not args.skip_trl:
        try:
            install_trl()
        except RuntimeError as e:  # reported in the output, never replaced by a number
            trl_error = str(e)
            _log(f"TRL unavailable: {e}")
    peaks = measure_peaks()
    (REPO / ".cache").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ppo-iteration-bench-", dir=REPO / ".cache") as tmp:
        work = Path(tmp)
        realm, flops = run_realm_accounted(args, cfg, work, peaks, prompts)
        placement = None
        if args.placement_baseline is not None:
            placement = run_placement_baseline(args, realm, work / "realm-baseline-run")
        if args.skip_trl:
            trl: dict[str, Any] = {"status": "skipped", "error": "--skip-trl"}
        elif trl_error:
            trl = {"status": "error", "error": trl_error}
        else:
            trainer = TRL_TRAINERS.get(cfg.algorithm.name, "no trainer")
            _log(f"[2/2] TRL {TRL_VERSION} {trainer}, same workload, {trl_threads} torch thread(s)")
            trl = run_trl(cfg, prompts, work, trl_threads, args.trl_microbatch_rows)
            if trl["status"] == "ok":
                summarize(trl, TRL_PHASES)
                _log(f"TRL: {trl['tokens_per_s']:.1f} tokens/s, {trl['mean_s']['iteration_s']:.2f} s/iteration")
            else:
                _log(f"TRL did not run ({trl['status']}): {trl['error']}")
    after = measure_peaks()  # best of both: the peak is what the cores do when they are free
    for key in ("one_thread_gflops", "all_threads_gflops"):
        flops["peaks"][key] = max(peaks[key], after[key])
    ratio = realm["tokens_per_s"] / trl["tokens_per_s"] if trl.get("status") == "ok" else None
    return {
        "workload": workload,
        "realm": realm,
        "trl": trl,
        "ratio_realm_over_trl": ratio,
        "placement": placement,
        "flops": refresh_fractions(flops),
        "note": run_note(realm, trl, cfg.cluster.num_cpus, trl_threads),
        "bench_wall_s": time.monotonic() - t0,
    }


def run_realm_accounted(args, cfg, work: Path, peaks: dict, prompts) -> tuple[dict, dict]:
    """realm's run with every device forward logged (``runtime.device.work_log``), then the empty calls,
    then the FLOP accounting of the timed iterations."""
    from runtime.device.work_log import WORK_LOG_ENV

    _log(
        f"[1/2] realm: {cfg.rollout.num_prompts * cfg.rollout.num_samples_per_prompt} rollouts x "
        f"{cfg.rollout.max_new_tokens} tokens, {args.iterations} iterations (Ray + vLLM start-up first)"
    )
    log_dir = work / "work-log"
    log_dir.mkdir()
    os.environ[WORK_LOG_ENV] = str(log_dir)  # the Ray workers inherit it (common.env.WORKER_KEYS)
    try:
        realm = run_realm(cfg, work / "realm-run")
    finally:
        del os.environ[WORK_LOG_ENV]
    summarize(realm, REALM_PHASES)
    _log(f"realm: {realm['tokens_per_s']:.1f} tokens/s, {realm['mean_s']['iteration_s']:.2f} s/iteration")
    empty: dict[str, Any] = {"median_s": {}}
    if not args.skip_empty_calls:
        from bench import empty_calls

        _log("[1/2] realm's calls on an empty batch (the plan deployed again)")
        empty = empty_calls.measure(cfg, work / "empty-calls-run", plan_path=work / "realm-run" / "plan.yaml")
        _log("empty calls (median s): " + ", ".join(f"{c} {v:.3f}" for c, v in sorted(empty["median_s"].items())))
    flops = flop_accounting(cfg, realm, work / "realm-run", log_dir, peaks, empty["median_s"])
    flops["empty_calls"] = empty
    timed = realm["timed_iterations"]
    generated = realm["tokens"] / len(timed)
    gen_prompts = [row for i in timed for row in iteration_prompt_ids(cfg, prompts)[i - 1]]
    gen = generation_flops(cfg, gen_prompts, generated * len(timed))
    gen = {k: v / len(timed) for k, v in gen.items()}
    seconds = realm["mean_call_s"].get("actor_gen", 0.0)
    flops["generation"] = {**gen, "seconds": seconds, "gflops": gen["gflop"] / seconds if seconds else 0.0}
    return realm, flops


def refresh_fractions(flops: dict) -> dict:
    """Each call's fraction of its cores' peak, against the run's final (best-of) peaks."""
    from bench.flops import peak_of

    peaks = flops["peaks"]
    for c in flops["calls"].values():
        threads = max(1, c["threads_per_device"])
        one, everything = peaks["one_thread_gflops"], peaks["all_threads_gflops"]
        c["peak_gflops"] = peak_of(len(c["devices"]), threads, one, everything, peaks["threads"])
        c["fraction_of_peak"] = c["gflops"] / c["peak_gflops"]
    return flops


def run_note(realm: dict, trl: dict, realm_threads: int, trl_threads: int) -> str:
    loads = f"load average realm {realm['load_avg_before'][0]:.1f}->{realm['load_avg_after'][0]:.1f}"
    if "load_avg_before" in trl:
        loads += f", TRL {trl['load_avg_before'][0]:.1f}->{trl['load_avg_after'][0]:.1f}"
    return (
        "realm and TRL ran one after the other in this one run on the same machine, under the same shared "
        f"load ({loads}, {os.cpu_count()} CPUs); absolute numbers move with the load, the ratio much less. "
        f"realm's workers used {realm_threads} cores in all (one torch thread per core), TRL {trl_threads} "
        "torch thread(s)"
    )


if __name__ == "__main__":
    main()
