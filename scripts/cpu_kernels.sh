#!/usr/bin/env bash
# Prints the environment that selects one CPU kernel set, for `env $(bash scripts/cpu_kernels.sh SET) ...`
# (docs/development.md, "Tolerances"): the equivalence tests must pass under every set, since each sums in its
# own order and vector width.
#   native   nothing: torch (ATen), MKL and oneDNN use the widest vector unit the CPU has
#   avx2     ATen's AVX2 kernels, MKL and oneDNN limited to AVX2
#   default  ATen's scalar (compiler-vectorized) kernels, MKL to SSE4.2, oneDNN to SSE4.1
#   second   the set the CI runs the equivalence tests under besides native: avx2 on a CPU with AVX-512
#            (its native set is then AVX-512), default on one without (its native set is AVX2 or less)
set -euo pipefail
set_name="${1:-second}"
if [ "$set_name" = second ]; then
  if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then set_name=avx2; else set_name=default; fi
fi
case "$set_name" in
  native) echo "" ;;
  avx2) echo "ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2" ;;
  default) echo "ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41" ;;
  *) echo "error: unknown CPU kernel set '$set_name' (native, avx2, default or second)" >&2; exit 1 ;;
esac
