#!/usr/bin/env bash
# The CUDA kernels' GPU tests (tests/gpu, ctest prefix gpu.) and their benchmark
# (bench/bench_gpu_kernels) on a GPU machine that cannot build them: no compiler, no
# OpenBLAS, no Open MPI there (docs/gpu.md). Pack here, run there. scripts/gpu_check.sh
# calls this for its kernel steps; alone it is:
#
#   bash scripts/gpu_kernels.sh pack [build] [dir]
#       On the CPU machine, in a CUDA build (default build/): builds every gpu_test_* and
#       bench_gpu_kernels, and writes <dir>/bundle.tar.xz (default dir: build/gpu-kernels):
#       the binaries (stripped) and the shared libraries they load from this machine
#       (OpenBLAS, fmt, libstdc++, the CUDA runtime, ...; not glibc, not cuBLAS/cuBLASLt:
#       the GPU machine's CUDA 13 toolkit or PyTorch's pip packages have those).
#   bash scripts/gpu_kernels.sh run [build] [dir] [--tool memcheck|racecheck] [--budget S]
#                                   [--what tests|bench|all] [--work W] [--logs L]
#       On the GPU machine, from the repository root (copy the repository with <dir>, which
#       is git-ignored): unpacks the bundle (or uses the unpacked pack W), finds cuBLASLt
#       (libcublasLt.so.13, else .so.12, in the toolkit, else PyTorch's nvidia/*/lib), runs
#       each GPU test binary with NDMESH_REQUIRE_GPU=1 (a missing GPU fails instead of
#       skipping), under compute-sanitizer's tool when --tool names one, then the benchmark.
#       A failing binary is run once more with CUDA_LAUNCH_BLOCKING=1 (the error then names
#       the kernel). Everything is bounded by --budget seconds (default 240). One PASS, FAIL
#       or SKIP line per binary on stdout, exit status 0 when all passed. Logs go to L, else
#       into $OUT/kernels_logs.tar.xz ($OUT defaults to <dir>/out).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/gpu_lib.sh
. "$here/gpu_lib.sh"
mode=${1:-}
shift || true
build=build
case ${1:-} in --* | '') ;; *) build=$1 && shift ;; esac
dir=$build/gpu-kernels
case ${1:-} in --* | '') ;; *) dir=$1 && shift ;; esac

usage() {
  echo "usage: bash scripts/gpu_kernels.sh pack [build] [dir] | run [build] [dir] [--tool memcheck|racecheck]" \
    "[--budget SECONDS] [--what tests|bench|all] [--work DIR] [--logs DIR]" >&2
  exit 2
}

pack() {
  [ -f "$build/CMakeCache.txt" ] || { echo "gpu_kernels.sh: no build in $build (make build first)" >&2; exit 2; }
  local tests
  tests=$(gpu_kernel_tests "$build")
  [ -n "$tests" ] || { echo "gpu_kernels.sh: $build has no gpu_test_* targets (configured without CUDA?)" >&2; exit 2; }
  # shellcheck disable=SC2086,SC2046
  cmake --build "$build" -j2 --target $tests bench_gpu_kernels > /dev/null ||
    { echo "gpu_kernels.sh: building the GPU tests failed (cmake --build $build --target bench_gpu_kernels ...)" >&2; exit 2; }
  mkdir -p "$dir" || exit 2
  # shellcheck disable=SC2086,SC2046
  gpu_pack "$dir/bundle.tar.xz" $(printf "$build/tests/%s " $tests) "$build/bench/bench_gpu_kernels" || exit 2
  echo "gpu_kernels.sh: $(du -h "$dir/bundle.tar.xz" | cut -f1) in $dir/bundle.tar.xz: copy the repository with $dir" \
    "to the GPU machine and run 'bash scripts/gpu_kernels.sh run$([ "$build" = build ] || echo " $build")' there"
}

# gpu_bench_ran <name> <log>: false when the benchmark exited 0 without a GPU (it prints
# why and exits 0, so that make bench goes on).
gpu_bench_ran() {
  [ "$1" != bench_gpu_kernels ] || grep -q ' SMs), fp32' "$2"
}

run() {
  local tool="" budget=240 what=all work="" logs="" archive=0
  while [ $# -gt 0 ]; do
    case $1 in
      --tool) tool=${2:-} && shift 2 ;;
      --budget) budget=${2:-} && shift 2 ;;
      --what) what=${2:-} && shift 2 ;;
      --work) work=${2:-} && shift 2 ;;
      --logs) logs=${2:-} && shift 2 ;;
      *) usage ;;
    esac
  done
  case $tool in '' | memcheck | racecheck) ;; *) usage ;; esac
  case $what in tests | bench | all) ;; *) usage ;; esac
  [[ $budget =~ ^[0-9]+$ ]] || usage
  local out=${OUT:-$dir/out} deadline=$((SECONDS + budget)) failed=0
  if [ -z "$logs" ]; then
    mkdir -p "$out" && logs=$(mktemp -d "${TMPDIR:-/tmp}/ndmesh-kernel-logs.XXXXXX") && archive=1
  fi
  mkdir -p "$logs"
  if [ -z "$work" ]; then
    work=/tmp/ndmesh-gpu-kernels
    if ! gpu_unpack "$dir/bundle.tar.xz" "$work" 2> "$logs/unpack.log"; then
      echo "FAIL unpack: cannot unpack $dir/bundle.tar.xz ($(head -n 1 "$logs/unpack.log")): pack it on the CPU machine"
      return 1
    fi
    gpu_fit_glibc "$work"
  fi
  [ -n "${CUBLASLT+set}" ] || gpu_find_cublaslt
  [ -n "${CUDNN_LIB+set}" ] || CUDNN_LIB=$(gpu_find libcudnn.so.9)
  local libs sanitizer=() suffix=""
  libs=$(gpu_libraries "$work")
  if [ -n "$tool" ]; then
    local cs
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2> /dev/null | head -n 1)
    if [ -z "$cs" ]; then
      echo "SKIP compute-sanitizer --tool $tool: compute-sanitizer is not on this machine"
      return 0
    fi
    sanitizer=("$cs" --tool "$tool" --error-exitcode 99 --print-limit 50 --target-processes all)
    suffix=.$tool
  fi

  local t name left allowed rc cap
  local binaries=()
  [ "$what" = bench ] || binaries+=("$work"/bin/gpu_test_*)
  if [ -n "$tool" ] && [ -e "$work/bin/gpu_test_attention_cudnn" ]; then
    # cuDNN's kernels are not ndmesh's to sanitize, and under the tool its engines' run-time
    # compilation outlasts a binary's share of the budget.
    local kept=()
    for t in "${binaries[@]}"; do [ "$(basename "$t")" = gpu_test_attention_cudnn ] || kept+=("$t"); done
    binaries=("${kept[@]}")
    echo "SKIP gpu_test_attention_cudnn$suffix: cuDNN's own kernels (the tool runs ndmesh's)"
  fi
  [ "$what" = tests ] || [ -n "$tool" ] || binaries+=("$work/bin/bench_gpu_kernels")
  local n=${#binaries[@]} i=0
  for t in "${binaries[@]}"; do
    name=$(basename "$t")
    i=$((i + 1))
    left=$((deadline - SECONDS))
    # Up to 40 s (30 under a sanitizer) or a fair share of what is left, if more; the
    # benchmark may take all that is left.
    allowed=$((left / (n - i + 1)))
    cap=$([ -n "$tool" ] && echo 30 || echo 40)
    [ "$allowed" -lt "$cap" ] && allowed=$((cap < left ? cap : left))
    [ "$name" = bench_gpu_kernels ] && allowed=$left
    if [ "$allowed" -lt 5 ]; then
      failed=1
      echo "FAIL $name$suffix: not run, no time left of the ${budget} s budget"
      continue
    fi
    local log=$logs/$name$suffix.log
    # NDMESH_GPU_SANITIZER: tests that run fewer cases under a sanitizer (test_attention).
    timeout -k 5 "$allowed" "${sanitizer[@]}" env LD_LIBRARY_PATH="$libs" NDMESH_REQUIRE_GPU=1 \
      ${tool:+NDMESH_GPU_SANITIZER=$tool} "$t" > "$log" 2>&1
    rc=$?
    [ $rc -eq 0 ] && ! gpu_bench_ran "$name" "$log" && rc=1
    if [ $rc -eq 0 ]; then
      echo "PASS $name$suffix: $(grep -c '^\[       OK' "$log") tests ($(grep -c '^\[ RUN' "$log") run, $(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$log") skipped)"
      continue
    fi
    failed=1
    local line
    line="FAIL $name$suffix: $(describe $rc "$allowed"), log $(basename "$log")"
    left=$((deadline - SECONDS))
    [ "$left" -gt "$allowed" ] && left=$allowed
    if [ -z "$tool" ] && [ "$left" -ge 5 ]; then
      # Once more with synchronous launches, so the error names the kernel that failed.
      timeout -k 5 "$left" env LD_LIBRARY_PATH="$libs" NDMESH_REQUIRE_GPU=1 CUDA_LAUNCH_BLOCKING=1 "$t" \
        > "$logs/$name.blocking.log" 2>&1
      rc=$?
      [ $rc -eq 0 ] && ! gpu_bench_ran "$name" "$logs/$name.blocking.log" && rc=1
      line+="; once more with CUDA_LAUNCH_BLOCKING=1: $([ $rc -eq 0 ] && echo passed || describe $rc "$left"), log $name.blocking.log"
    fi
    echo "$line"
    grep -E 'Failure|differ|Actual|exceeds|error|Error|ERROR|what\(\)|skipped' "$log" | awk '!seen[$0]++' | head -n 12 |
      cut -c 1-400 | sed 's/^/    /'
  done
  if [ $archive -eq 1 ]; then
    tar -C "$logs" -cJf "$out/kernels_logs.tar.xz" . || echo "FAIL archive: cannot write $out/kernels_logs.tar.xz"
    rm -rf "$logs"
  fi
  return $failed
}

case $mode in
  pack) pack ;;
  run)
    run "$@"
    exit $?
    ;;
  *) usage ;;
esac
