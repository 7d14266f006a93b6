#!/usr/bin/env bash
# Shows, without a GPU, that the GPU install resolves: pip resolves `pip install -e ".[gpu]"` (this project's
# pins plus the gpu extra) against the package registry in a throwaway venv, with --dry-run (nothing is
# installed), and prints the versions it chose. Exit status 0: they resolve, with the pins the README states.
#   bash scripts/check_gpu_install.sh            # ~10 min on a 2-core machine (pip downloads wheels for metadata)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PY" -m venv "$work/venv"
# Only the registry: no pip config files (PIP_CONFIG_FILE=/dev/null) and no find-links, which on these CPU
# machines point at local CPU torch wheels and constraints; a GPU node resolves from the registry too.
env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 "$work/venv/bin/pip" install --quiet --dry-run \
  --ignore-installed --report "$work/report.json" ".[gpu]" 2> >(grep -v "^WARNING: Location .* is ignored" >&2)
"$work/venv/bin/python" - "$work/report.json" <<'PYEOF'
import json, sys
chosen = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(open(sys.argv[1]))["install"]}
want = {"torch": "2.13.0", "vllm": "0.32.0", "transformers": "5.19.0", "ray": "2.60.0"}
for name in ("torch", "vllm", "transformers", "tokenizers", "ray", "xformers", "flashinfer-python", "triton", "numpy"):
    if name in chosen:
        print(f"{name}=={chosen[name]}")
print(f"[check_gpu_install] {len(chosen)} packages resolve together")
wrong = {k: chosen.get(k) for k, v in want.items() if chosen.get(k) != v}
if wrong:
    sys.exit(f"[check_gpu_install] resolved {wrong}, expected {want}")
PYEOF
