#!/usr/bin/env bash
# The cost model against real runs on this CPU (docs/plan_search.md, "Calibration on this CPU"): a profile
# of the tiny model's layers and of an empty call, six plans run through train.py (the benchmark's
# workload under three plans, the simulated 2 x 4 cluster test's three plans), then predicted against
# measured seconds per iteration. Run it with the machine otherwise quiet; every run records the load
# averages around it (load.json). About 6 minutes on 2 cores.
#   bash scripts/plan_calibration.sh [OUT_DIR]      # default outputs/plan_calibration
# Writes OUT_DIR/profile.json, OUT_DIR/empty_calls.json, the run directories, and
# docs/plan_iteration_calibration.jsonl (one row per run and a summary row). OUT_DIR/profile.json is what
# planning/profiles/cpu-2core.json (local_cpu's cluster.profile) was copied from; on another machine pass it
# as cluster.profile=OUT_DIR/profile.json.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-outputs/plan_calibration}"
py=.venv/bin/python
eval "$($py -m common.env)"
mkdir -p "$out"
load() { $py -c 'import os, json; print(json.dumps(list(os.getloadavg())))'; }

echo "[calibration] $(date -u +%FT%TZ) profile (load $(load))"
# The tiny model's layers only. With SmolLM2-135M's too (--models tiny,smollm2-135m), the search priced SmolLM2
# by its own layers and chose FSDP over both devices for its training (predicted 434 s an iteration); the
# heuristic's FSDP layout measured 428 s there, the side-by-side plan that the tiny-scaled pricing picks 214 s
# (docs/plan_search.md): FSDP's gloo collectives are priced as overlapped with compute, which on 2 shared
# cores they are not.
$py -m planning.profile --out "$out/profile.json" --models tiny
# The benchmark's workload (bench/ppo_iteration.py --num-prompts 64 --samples-per-prompt 8).
bench=(rollout.num_prompts=64 rollout.num_samples_per_prompt=8 rollout.max_new_tokens=48 run.num_iterations=3
  run.eval_every=0 run.checkpoint_every=0 run.num_heldout_samples=0 run.resume=false data.heldout_limit=8
  sft.num_steps=0)
echo "[calibration] $(date -u +%FT%TZ) empty calls (load $(load))"
$py bench/empty_calls.py --profile "$out/profile.json" --json "$out/empty_calls.json" "${bench[@]}"

run() {
  local name=$1
  shift
  local before
  before=$(load)
  echo "[calibration] $(date -u +%FT%TZ) $name (load $before)"
  rm -rf "${out:?}/$name"
  $py train.py "${bench[@]}" "$@" "hydra.run.dir=$out/$name" >"$out/$name.log" 2>&1
  echo "{\"before\": $before, \"after\": $(load)}" >"$out/$name/load.json"
}
# The heuristic and disjoint rules ignore the profile; the search prices with the one just measured.
run bench_heuristic cluster.plan=heuristic
run bench_disjoint cluster.plan=disjoint cluster.devices_per_node=4
run bench_search cluster.plan=search "cluster.profile=$out/profile.json"

echo "[calibration] $(date -u +%FT%TZ) the cluster test's three plans (load $(load))"
rm -rf "${out:?}/cluster"
before=$(load)
bash scripts/run_tests.sh tests/runtime/test_cluster.py -k three_plans --basetemp "$out/cluster" -q || echo "[calibration] the cluster test failed; its runs are still measured"
cluster=$(dirname "$(ls -d "$out"/cluster/test_three_plans*/heuristic | head -1)")
for plan in heuristic disjoint tp; do
  echo "{\"before\": $before, \"after\": $(load)}" >"$cluster/$plan/load.json"
done

$py bench/plan_calibration.py --profile "$out/profile.json" --jsonl docs/plan_iteration_calibration.jsonl --runs \
  "bench_heuristic=$out/bench_heuristic" "bench_disjoint=$out/bench_disjoint" "bench_search=$out/bench_search" \
  "cluster_heuristic=$cluster/heuristic" "cluster_disjoint_inference=$cluster/disjoint" \
  "cluster_tensor_parallel=$cluster/tp"
