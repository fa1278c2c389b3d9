#!/bin/bash
# Runs a command as a CPU of a lower class runs it (docs/development.md, "CPU classes"), on any
# x86-64 machine of that class or above:
#   avx2         AVX2 only (AMD Zen 2/3, Intel before Skylake-SP): ATen's AVX2 kernels, our
#                AVX2 kernels, MKL's AVX2 kernels (float32 GEMM at ~0.65x of its AVX-512
#                rate, as on such a machine), oneDNN capped at AVX2 (so ATen's bf16/fp16 GEMMs leave oneDNN for
#                its generic loop, as on the real machine: measured 0.3-5 GFLOP/s, bench/README.md
#                cpu_gemm), and core/cpu_gemm's rule sees the cap and takes the widened path;
#   avx512       AVX-512 without bf16 arithmetic (Skylake-SP, Cascade Lake): oneDNN emulates bf16;
#   avx512-bf16  AVX512-BF16 without AMX or AVX512-FP16 (AMD Zen 4, Cooper Lake).
# What it cannot lower: the CPU's own instruction timings and caches, and cpuinfo's feature flags
# (read by LibTorch, which the caps above override where they matter).
# Usage: scripts/as_cpu_class.sh CLASS COMMAND [ARGS...]
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 avx2|avx512|avx512-bf16 COMMAND [ARGS...]" >&2
  exit 2
fi
class=$1
shift
case "$class" in
  avx2) isa=(avx2 AVX2 avx2 AVX2) ;;
  avx512) isa=(avx512 AVX512_CORE avx512 AVX512) ;;
  avx512-bf16) isa=(avx512 AVX512_CORE_BF16 avx512 AVX512) ;;
  *)
    echo "$0: unknown CPU class '$class' (avx2, avx512, avx512-bf16)" >&2
    exit 2
    ;;
esac
export ATEN_CPU_CAPABILITY=${isa[0]} ONEDNN_MAX_CPU_ISA=${isa[1]} MIXTRAIN_CPU_CAPABILITY=${isa[2]}
export MKL_ENABLE_INSTRUCTIONS=${isa[3]}
echo "as_cpu_class: $class (ATEN_CPU_CAPABILITY=$ATEN_CPU_CAPABILITY" \
  "ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA MIXTRAIN_CPU_CAPABILITY=$MIXTRAIN_CPU_CAPABILITY" \
  "MKL_ENABLE_INSTRUCTIONS=$MKL_ENABLE_INSTRUCTIONS)" >&2
exec "$@"
