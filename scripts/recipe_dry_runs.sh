#!/usr/bin/env bash
# Dry runs of the reward paper recipes on the H100 clusters: the table of docs/plan_search.md ("Dry runs of
# the reward paper recipes") and the example dry run docs/runtime/dry_run_reward_paper_1.5b.txt.
# Nothing is downloaded: the models' shapes are known to trainer/plan_select.py.
#   bash scripts/recipe_dry_runs.sh [OUT_DIR]    (16 dry runs; the searches have 30 s of CPU time each)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/recipe_dry_runs}
mkdir -p "$out"
py=${PYTHON:-.venv/bin/python}
prm=(+reward=prm_clip_delta reward_models.prm.path=peiyi9979/math-shepherd-mistral-7b-prm)

dry_run() {  # NAME OVERRIDES...: the dry run's output in $out/NAME.txt, its last line on stdout
  local name=$1
  shift
  HF_HUB_OFFLINE=0 "$py" train.py run.dry_run=true "$@" hydra.run.dir="$out/$name.d" >"$out/$name.txt" 2>&1 ||
    { echo "error: dry run $name failed: $out/$name.txt" >&2; tail -3 "$out/$name.txt" >&2; exit 1; }
  tail -1 "$out/$name.txt"
}

cell() {  # the predicted s/iteration and peak GiB/GPU of a summary line: "186.56 | 27.4"
  sed -E 's/.*predicted ([0-9.]+) s\/iteration, peak ([0-9.]+) GiB.*/\1 | \2/'
}

echo "| recipe | cluster | reward | heuristic: s/iteration | peak GiB/GPU | search: s/iteration | peak GiB/GPU |"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: |"
for recipe in 1.5b 7b; do
  for cluster in gpu_1x8 gpu_2x8; do
    for reward in success prm; do
      args=(experiment=reward_paper_$recipe cluster=$cluster)
      [[ $reward == prm ]] && args+=("${prm[@]}")
      name=${recipe}_${cluster}_${reward}
      heuristic=$(dry_run "${name}_heuristic" "${args[@]}" cluster.plan=heuristic | cell)
      searched=$(dry_run "${name}_search" "${args[@]}" cluster.plan=search | cell)
      label=$([[ $reward == prm ]] && echo "PRM (7B)" || echo success)
      nodes=${cluster#gpu_}
      echo "| ${recipe^^} | ${nodes/x/ × } | $label | $heuristic | $searched |"
    done
  done
done
{
  echo '$ HF_HUB_OFFLINE=0 python train.py run.dry_run=true experiment=reward_paper_1.5b hydra.run.dir=/tmp/dr_example'
  sed -E "s#$out/1.5b_gpu_1x8_success_heuristic.d#/tmp/dr_example#" "$out/1.5b_gpu_1x8_success_heuristic.txt"
} >"$out/dry_run_reward_paper_1.5b.txt"
echo "example: $out/dry_run_reward_paper_1.5b.txt" >&2
