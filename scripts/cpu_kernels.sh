#!/usr/bin/env bash
# Prints the environment that selects one CPU kernel set, for `env $(bash scripts/cpu_kernels.sh SET) ...`
# (docs/development.md, "Tolerances"): the equivalence tests must pass under every set, since each sums in its
# own order and vector width.
#   native   nothing: torch (ATen), MKL and oneDNN use the widest vector unit the CPU has
#   avx2     ATen's AVX2 kernels, MKL and oneDNN limited to AVX2
#   default  ATen's scalar (compiler-vectorized) kernels, MKL to SSE4.2, oneDNN to SSE4.1
#   second   the set the CI runs the equivalence tests under besides native: avx2 on a CPU with AVX-512
#            (its native set is then AVX-512), default on one without (its native set is AVX2 or less)
# avx2 and default also get their own TorchInductor cache: torch 2.13 keys a cached CPU kernel by the source and
# not by the ATen capability, so a kernel compiled under AVX-512 and reused under avx2 runs with the wrong
# vector width (vLLM's compiled vocab mask then returns out-of-range token ids for a TP-2 engine), and reused
# under default fails to compile (`at::vec` undeclared). native keeps torch's own cache directory.
set -euo pipefail
set_name="${1:-second}"
if [ "$set_name" = second ]; then
  if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then set_name=avx2; else set_name=default; fi
fi
inductor_cache() { echo "TORCHINDUCTOR_CACHE_DIR=${TMPDIR:-/tmp}/torchinductor_$(id -un)_$1"; }
case "$set_name" in
  native) echo "" ;;
  avx2) echo "ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 $(inductor_cache avx2)" ;;
  default) echo "ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41 $(inductor_cache default)" ;;
  *) echo "error: unknown CPU kernel set '$set_name' (native, avx2, default or second)" >&2; exit 1 ;;
esac
