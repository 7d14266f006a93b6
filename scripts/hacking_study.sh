#!/usr/bin/env bash
# The reward-hacking study (docs/hacking_study.md): named runs of configs/experiment/hacking_study.yaml, one
# after another, seed by seed (every option of a seed before the next seed, so that each finished seed gives
# paired comparisons). A finished run (summary.json) is skipped and an interrupted one resumes from its last
# checkpoint, so the same command continues the study after a stop.
#   bash scripts/hacking_study.sh                                   # the first batch: 4 options x 5 seeds
#   SEEDS="0 1" REWARDS="prm_clip prm_delta" bash scripts/hacking_study.sh
#   TAG=eta05 bash scripts/hacking_study.sh reward.eta_zero_fraction=0.5   # a variant: runs named <option>_eta05_seed<S>
# Runs land in outputs/hacking_study/<option>[_<TAG>]_seed<S>/; export them with
#   python -m studies.hacking.round2 outputs/hacking_study --out docs/hacking_study --export
set -uo pipefail
cd "$(dirname "$0")/.."
SEEDS="${SEEDS:-0 1 2 3 4}"
REWARDS="${REWARDS:-success prm prm_clip_delta prm_alpha_matched}"
suffix="${TAG:+_$TAG}"
mkdir -p outputs
for seed in $SEEDS; do
  for reward in $REWARDS; do
    name="hacking_study/${reward}${suffix}_seed${seed}"
    if [ -f "outputs/$name/summary.json" ]; then
      echo "[study] $name: done"
      continue
    fi
    echo "[study] $name: $(date -u +%FT%TZ) start"
    if ! .venv/bin/python train.py experiment=hacking_study "+reward=$reward" "run.seed=$seed" "run.name=$name" "$@" \
      >"outputs/${name//\//_}.log" 2>&1; then
      echo "[study] $name: failed (log: outputs/${name//\//_}.log)"
    fi
    echo "[study] $name: $(date -u +%FT%TZ) end"
  done
done
