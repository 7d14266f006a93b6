#!/usr/bin/env bash
# The reward paper's comparison (Gao et al. 2024, arXiv 2410.15115): PPO with each of the six reward
# options, each final policy evaluated greedily with the paper's prompt, one table beside the paper's numbers.
#
#   bash scripts/reproduce_reward_paper.sh 1.5b     # experiment=reward_paper_1.5b, MATH-500 + GSM8K
#   bash scripts/reproduce_reward_paper.sh 7b       # experiment=reward_paper_7b
#   bash scripts/reproduce_reward_paper.sh tiny     # the same steps on CPU: tiny model, synthetic task
#
# Environment (all optional except the reward models on a real policy):
#   MODEL_ARGS   overrides for the policy, e.g. "model.path=/models/qwen2.5-math-1.5b-instruct"
#   PRM_PATH, PRM_ARGS   the PRM of prm/prm_clip/prm_delta/prm_clip_delta and its format overrides, e.g.
#                PRM_ARGS="reward_models.prm.readout=step_tag \"reward_models.prm.step_tag=' ки'\"
#                          reward_models.prm.good_token=+ reward_models.prm.bad_token=-
#                          \"reward_models.prm.question_template='{question} '\""
#   ORM_PATH, ORM_ARGS   the ORM of `orm` (another model than the PRM if you like; reward_models.orm.* keys)
#   Every run gets both (reward_models.prm / reward_models.orm; each option reads its own), as one Hydra
#   sweep would: python train.py -m +reward=orm,prm reward_models.prm.path=... reward_models.orm.path=...
#   TRAIN_ARGS   more train.py overrides for every run (e.g. cluster=gpu_2x8 cluster.plan=search)
#   EVAL_ARGS    more `python -m eval` overrides (e.g. limit=100)
#   REWARDS      which options (default: all six, in the paper's order); SEED (default 0)
#   OUT          the sweep's directory (default outputs/reward_paper_<size>; runs are OUT/<reward>/seed<SEED>)
#   BENCHMARKS   eval data configs (default "math500 gsm8k"; tiny: "synthetic")
# Every step resumes: a relaunch continues unfinished runs from their last checkpoint, skips finished
# ones, and evaluations continue from their samples.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE="${1:?usage: scripts/reproduce_reward_paper.sh 1.5b|7b|tiny}"
PY="${PYTHON:-.venv/bin/python}"
case "$SIZE" in
  1.5b|7b) EXPERIMENT="reward_paper_$SIZE"; BENCHMARKS="${BENCHMARKS:-math500 gsm8k}"; EVAL_TOKENS=2048 ;;
  tiny) EXPERIMENT="mini_repro"; BENCHMARKS="${BENCHMARKS:-synthetic}"; EVAL_TOKENS=48 ;;
  *) echo "error: size must be 1.5b, 7b or tiny, not '$SIZE'" >&2; exit 2 ;;
esac
REWARDS="${REWARDS:-success orm prm prm_clip prm_delta prm_clip_delta}"
SEED="${SEED:-0}"
OUT="${OUT:-outputs/reward_paper_$SIZE}"
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac

words() { "$PY" -c 'import shlex, sys; sys.stdout.write("".join(w + "\n" for w in shlex.split(sys.argv[1])))' "${1:-}"; }
mapfile -t model_args < <(words "${MODEL_ARGS:-}")
mapfile -t train_args < <(words "${TRAIN_ARGS:-}")
mapfile -t eval_args < <(words "${EVAL_ARGS:-}")
mapfile -t prm_args < <(words "${PRM_ARGS:-}")
mapfile -t orm_args < <(words "${ORM_ARGS:-}")
[ -n "${PRM_PATH:-}" ] && prm_args=("reward_models.prm.path=$PRM_PATH" "${prm_args[@]}")
[ -n "${ORM_PATH:-}" ] && orm_args=("reward_models.orm.path=$ORM_PATH" "${orm_args[@]}")

runs=()
for reward in $REWARDS; do
  run="$OUT/$reward/seed$SEED"
  if [ -f "$run/summary.json" ]; then
    echo "[reproduce] $reward: finished earlier ($run)"
  else
    echo "[reproduce] $reward: training -> $run"
    # run.name: a fixed run directory, so that relaunching this script resumes the run.
    "$PY" train.py "experiment=$EXPERIMENT" "+reward=$reward" "run.seed=$SEED" "run.name=$run" \
      "${model_args[@]}" "${prm_args[@]}" "${orm_args[@]}" "${train_args[@]}"
  fi
  runs+=("$run")
done

evaluate() {  # evaluate MODEL OUT_DIR: each benchmark, greedy, both graders
  local model="$1" dir="$2" prompt="$3"
  for data in $BENCHMARKS; do
    echo "[reproduce] evaluating $model on $data -> $dir/$data"
    "$PY" -m eval "model=$model" "data=$data" "prompt=$prompt" compare_graders=true "max_new_tokens=$EVAL_TOKENS" \
      "out_dir=$dir/$data" "${eval_args[@]}" >/dev/null
  done
}
for run in "${runs[@]}"; do
  evaluate "$run" "$run/eval" trained
done
# The starting point: the policy's base model, with the prompt the runs were trained on.
first="$("$PY" -c 'import sys; from trainer.export import exported_dir; print(exported_dir(sys.argv[1], log=lambda m: None))' "${runs[0]}")"
base="$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["base_model"])' "$first/realm_export.json")"
evaluate "$base" "$OUT/base/eval" "$first/prompt.yaml"

"$PY" -m eval.report reward-paper-table "$OUT" --size "$SIZE" --seed "$SEED" --benchmarks $BENCHMARKS
