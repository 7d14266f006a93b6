#!/usr/bin/env bash
# Runs the test suite in a loopback-only network namespace when the kernel allows one
# (Ray, torch.distributed and vLLM open sockets; nothing may leave the machine).
# pytest's exit code 5 (no tests collected) is a failure here, not a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
# The environment defaults live in one place, common/env.py (tests/conftest.py applies them too).
eval "$(.venv/bin/python -m common.env)"
export REALM_CACHE_DIR="${REALM_CACHE_DIR:-$PWD/.cache/realm-test}"
# Which CPU kernels the sums run in (scripts/cpu_kernels.sh selects another set): the equivalence tests'
# bounds hold under every set (docs/development.md, "Tolerances").
aten="$(.venv/bin/python -c 'import torch; print(torch.backends.cpu.get_cpu_capability())' 2>/dev/null || echo unknown)"
echo "[tests] CPU kernels: ATen ${aten}, MKL ${MKL_ENABLE_INSTRUCTIONS:-native}, oneDNN ${ONEDNN_MAX_CPU_ISA:-native}, TorchInductor cache ${TORCHINDUCTOR_CACHE_DIR:-torch default}"
cmd=(.venv/bin/python -m pytest -p no:cacheprovider --durations=15 "$@")
if [ "${REALM_NO_NETNS:-0}" != "1" ] && command -v unshare >/dev/null && unshare -n true 2>/dev/null; then
  echo "[tests] running in a loopback-only network namespace"
  unshare -n bash -c 'ip link set lo up 2>/dev/null || true; exec "$@"' _ "${cmd[@]}"
  rc=$?
else
  echo "[tests] no network namespace available; running with loopback-bound sockets only"
  "${cmd[@]}"
  rc=$?
fi
elapsed=$(( $(date +%s) - started ))
echo "[tests] total $((elapsed / 60)) min $((elapsed % 60)) s, load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
if [ "$rc" -eq 5 ]; then
  echo "[tests] pytest collected no tests: failing" >&2
  exit 1
fi
exit "$rc"
