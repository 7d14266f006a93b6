#!/usr/bin/env bash
# Issue 27's GPU check on ONE GPU, in a few minutes: an FSDP2 bf16 training step (NCCL, world of 1), offload
# round trips to pinned host memory with memory_reserved back at its baseline, bf16 KL = 0, and the batched
# point-to-point exchange (scripts/gpu_check.py says what each check does). Needs only python3 with torch
# (CUDA) and transformers: no vLLM, Ray, Hydra, OmegaConf or package registry. One PASS/FAIL/NOTE line per
# check, then a summary line; exit status 1 if any check failed.
#   bash scripts/gpu_check.sh          # on the GPU machine
#   bash scripts/gpu_check.sh --cpu    # the same checks on CPU over gloo (tests/test_gpu_check.py runs this)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-lo}" MASTER_ADDR=127.0.0.1
exec timeout 600 "$PY" scripts/gpu_check.py "$@"
