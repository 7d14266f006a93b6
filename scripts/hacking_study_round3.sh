#!/usr/bin/env bash
# The reward-hacking study, round 3 (docs/hacking_study/round3/PREREGISTRATION.md), as pre-registered:
#   1. the pilot: raw PRM on seeds 10 and 11, 160 iterations;
#   2. the decision: `python -m studies.hacking.round3 decide` -> 80 or 160 iterations for the main runs;
#   3. the main runs: seeds 0-4, every arm of a seed before the next seed (each finished seed gives paired
#      comparisons): success, prm, prm_alpha_matched, prm_clip_delta_matched.
# Resumable: a finished run (summary.json) is skipped, an interrupted one resumes from its last checkpoint, so
# the same command continues the study after any stop. Run it from a `git worktree` of a fixed commit:
#   git worktree add ../study-r3 COMMIT && cd ../study-r3 && ln -s ../main/.venv .venv
#   nohup bash scripts/hacking_study_round3.sh > outputs/hacking_study_round3.log 2>&1 &
# `touch outputs/hacking_study_round3/PAUSE` holds the study before its next run (for a timing measurement on
# a quiet machine); removing the file lets it go on.
set -uo pipefail
cd "$(dirname "$0")/.."
# The venv may be another checkout's editable install: this tree's code, in the driver and in Ray's workers.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
ROOT=outputs/hacking_study_round3
SEEDS="${SEEDS:-0 1 2 3 4}"
ARMS="${ARMS:-success prm prm_alpha_matched prm_clip_delta_matched}"
mkdir -p "$ROOT"
num_done=0
seconds_done=0

run() {  # run NAME REWARD SEED ITERATIONS: one named run, resumed if it was interrupted, tried at most 3 times
  local name=$1 reward=$2 seed=$3 iterations=$4 attempt start
  if [ -f "outputs/$name/summary.json" ]; then
    echo "[study] $name: done"
    return
  fi
  while [ -f "$ROOT/PAUSE" ]; do sleep 20; done
  start=$(date +%s)
  for attempt in 1 2 3; do
    echo "[study] $name: $(date -u +%FT%TZ) start (attempt $attempt)"
    if .venv/bin/python train.py experiment=hacking_study_round3 "+reward=$reward" "run.seed=$seed" \
      "run.num_iterations=$iterations" "run.name=$name" >>"outputs/${name//\//_}.log" 2>&1; then
      break
    fi
    echo "[study] $name: failed (log: outputs/${name//\//_}.log)"
  done
  num_done=$((num_done + 1))
  seconds_done=$((seconds_done + $(date +%s) - start))
  echo "[study] $name: $(date -u +%FT%TZ) end ($(( ($(date +%s) - start) / 60 )) min; mean $((seconds_done / num_done / 60)) min a run this session)"
}

for seed in 10 11; do
  run "hacking_study_round3/pilot/prm_seed$seed" prm "$seed" 160
done
if [ ! -f "$ROOT/decision.json" ]; then
  .venv/bin/python -m studies.hacking.round3 decide "$ROOT/pilot" --json "$ROOT/decision.json" || exit 1
fi
iterations=$(.venv/bin/python -c "import json; print(json.load(open('$ROOT/decision.json'))['num_iterations'])")
echo "[study] the pilot's decision: $iterations iterations for the main runs"
num_runs=$(( $(echo $SEEDS | wc -w) * $(echo $ARMS | wc -w) ))
index=0
for seed in $SEEDS; do
  for arm in $ARMS; do
    index=$((index + 1))
    echo "[study] main run $index of $num_runs"
    run "hacking_study_round3/${arm}_seed$seed" "$arm" "$seed" "$iterations"
  done
done
echo "[study] all runs done: python -m studies.hacking.round3_summary $ROOT --out docs/hacking_study/round3 --export"
