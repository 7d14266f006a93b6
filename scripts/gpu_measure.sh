#!/usr/bin/env bash
# Everything one lent GPU measures for realm in one run (a few minutes; torch and transformers only, no vLLM,
# Ray, Hydra or OmegaConf): the GPU check, the policy step's split and profile (gpu_check.sh --step-split),
# and the whole-model host floor of the 1.5B and 7B shapes (python -m planning.profile --base ...), every
# output under OUT_DIR: gpu_check.log, step_split.log, overheads.log and PROFILE.json, the shipped profile
# with the measured host floors added (the layer measurements kept).
#   bash scripts/gpu_measure.sh OUT_DIR                 # on the GPU machine (H200: planning/profiles/h200.json)
#   bash scripts/gpu_measure.sh OUT_DIR --cpu           # the same steps on CPU with the tiny model (a smoke test)
# Exit status: the first failing step's (every step still runs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:?usage: bash scripts/gpu_measure.sh OUT_DIR [--cpu]}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${2:-}" = "--cpu" ]; then
  CHECK=(--cpu) SPLIT=(--cpu --step-split --rows 2,4 --prompt 8 --response 8)
  PROFILE=(--device cpu --models tiny --base planning/profiles/cpu-2core.json --out "$OUT_DIR/cpu-2core.json")
else
  CHECK=() SPLIT=(--step-split)
  PROFILE=(--device cuda --models qwen2.5-math-1.5b,qwen2.5-math-7b --base planning/profiles/h200.json
           --out "$OUT_DIR/h200.json")
  nvidia-smi >"$OUT_DIR/nvidia_smi.txt" 2>&1
fi
status=0
step() {  # step NAME LOG COMMAND...: run it, its output to the terminal and LOG, note its exit status
  local name=$1 log=$2
  shift 2
  local start=$SECONDS
  "$@" 2>&1 | tee "$OUT_DIR/$log"
  local rc=${PIPESTATUS[0]}
  echo "gpu_measure: $name rc=$rc ($((SECONDS - start)) s)" | tee -a "$OUT_DIR/$log"
  [ "$status" -ne 0 ] || status=$rc
}
step gpu_check gpu_check.log bash scripts/gpu_check.sh "${CHECK[@]}"
step step_split step_split.log bash scripts/gpu_check.sh "${SPLIT[@]}"
step overheads overheads.log timeout 300 "$PY" -m planning.profile "${PROFILE[@]}"
exit "$status"
