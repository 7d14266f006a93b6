#!/usr/bin/env bash
# Train the synthetic-task PRM and ORM that builtin:synthetic-prm / builtin:synthetic-orm resolve to
# (into the model cache, $REALM_CACHE_DIR or ~/.cache/realm), and print their held-out accuracies.
# The two train side by side, one thread each (about 5 minutes for both on an idle 2-core CPU);
# already-trained ones are reused.
# Extra arguments are Hydra overrides for both, e.g. `device=cuda` (not part of the cache key).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" -m rewards.train_rm kind=prm "$@" &
prm=$!
"$PY" -m rewards.train_rm kind=orm "$@" &
orm=$!
status=0
wait "$prm" || status=$?
wait "$orm" || status=$?
exit "$status"
