#!/usr/bin/env bash
# The critic-free algorithms against PPO on the default workload (docs/algorithms.md):
#   1. the success reward, seeds 0-2, algorithm ppo, grpo, rloo, reinforce_pp: 20 iterations each (the default run);
#   2. GRPO with process rewards: +reward=prm_clip_delta and +reward=prm, seed 0, 40 iterations.
# Resumable: a finished run (summary.json) is skipped, an interrupted one resumes from its last checkpoint. Run it
# from a `git worktree` of a fixed commit; `touch outputs/algorithm_comparison/PAUSE` holds it before its next run.
#   python -m studies.algorithms outputs/algorithm_comparison --out docs/algorithms --export
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
ROOT=outputs/algorithm_comparison
SEEDS="${SEEDS:-0 1 2}"
ALGORITHMS="${ALGORITHMS:-ppo grpo rloo reinforce_pp}"
mkdir -p "$ROOT"

run() {  # run NAME ARGS...: one named run, resumed if it was interrupted, tried at most 3 times
  local name=$1 attempt start
  shift
  if [ -f "outputs/$name/summary.json" ]; then
    echo "[comparison] $name: done"
    return
  fi
  while [ -f "$ROOT/PAUSE" ]; do sleep 20; done
  start=$(date +%s)
  for attempt in 1 2 3; do
    echo "[comparison] $name: $(date -u +%FT%TZ) start (attempt $attempt)"
    if .venv/bin/python train.py "$@" "run.name=$name" >>"outputs/${name//\//_}.log" 2>&1; then
      break
    fi
    echo "[comparison] $name: failed (log: outputs/${name//\//_}.log)"
  done
  echo "[comparison] $name: $(date -u +%FT%TZ) end ($(( ($(date +%s) - start) / 60 )) min)"
}

for seed in $SEEDS; do
  for algorithm in $ALGORITHMS; do
    run "algorithm_comparison/${algorithm}_seed$seed" "algorithm=$algorithm" "run.seed=$seed"
  done
done
for reward in prm_clip_delta prm; do
  run "algorithm_comparison/grpo_${reward}_seed0" algorithm=grpo "+reward=$reward" run.seed=0 run.num_iterations=40 \
    run.rollouts_every=20
done
echo "[comparison] all runs done: python -m studies.algorithms $ROOT --out docs/algorithms --export"
