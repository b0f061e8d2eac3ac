#!/usr/bin/env bash
# The CUDA kernels' GPU tests (tests/gpu, ctest prefix gpu.) and their benchmark
# (bench/bench_gpu_kernels) on a GPU machine that cannot build them: no compiler, no
# OpenBLAS there (../shared/design/GPU.md). Pack here, run there.
#
#   bash scripts/gpu_kernels.sh pack [build]
#       On the CPU machine, in a CUDA build (default build/): builds every gpu_test_* and
#       bench_gpu_kernels, and writes build/gpu-kernels/bundle.tar.xz: the binaries
#       (stripped) and the shared libraries they load from this machine (OpenBLAS, fmt,
#       libstdc++, the CUDA runtime, ...; not glibc, not cuBLAS/cuBLASLt: the GPU machine's
#       CUDA 13 has those). About 15 MB; build/ is git-ignored, so it can be carried.
#   bash scripts/gpu_kernels.sh run [build]
#       On the GPU machine, from the repository root: unpacks the bundle, finds cuBLASLt
#       (the CUDA toolkit, else PyTorch's nvidia/*/lib), runs each GPU test binary with
#       NDMESH_REQUIRE_GPU=1 (a missing GPU fails instead of skipping), then the benchmark;
#       logs under $OUT (or build/gpu-kernels/out), a summary last.
#
# With the device tool: run(command="bash scripts/gpu_kernels.sh run", carry=["build/gpu-kernels"]).
set -euo pipefail
mode=${1:-}
build=${2:-build}
dest=$build/gpu-kernels

pack() {
  [ -f "$build/CMakeCache.txt" ] || { echo "gpu_kernels.sh: no build in $build (make build first)" >&2; exit 2; }
  local tests
  tests=$(cd "$build" && cmake --build . --target help | sed -n 's/^\.\.\. \(gpu_test_[a-z_]*\)$/\1/p')
  [ -n "$tests" ] || { echo "gpu_kernels.sh: $build has no gpu_test_* targets (configured without CUDA?)" >&2; exit 2; }
  # shellcheck disable=SC2086
  cmake --build "$build" -j2 --target $tests bench_gpu_kernels
  rm -rf "$dest" && mkdir -p "$dest/stage/bin" "$dest/stage/lib"
  for t in $tests; do strip -o "$dest/stage/bin/$t" "$build/tests/$t"; done
  strip -o "$dest/stage/bin/bench_gpu_kernels" "$build/bench/bench_gpu_kernels"
  ldd "$dest"/stage/bin/* | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
    case $(basename "$lib") in
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libcublas*) ;;
      *) cp -L "$lib" "$dest/stage/lib/" ;;
    esac
  done
  tar -C "$dest/stage" -cJf "$dest/bundle.tar.xz" bin lib
  rm -rf "$dest/stage"
  echo "gpu_kernels.sh: $(du -h "$dest/bundle.tar.xz" | cut -f1) in $dest/bundle.tar.xz:" \
    "carry $dest and run 'bash scripts/gpu_kernels.sh run' on the GPU machine"
}

run() {
  local out=${OUT:-$dest/out} work=/tmp/ndmesh-gpu-kernels
  mkdir -p "$out" && rm -rf "$work" && mkdir -p "$work"
  tar -C "$work" -xJf "$dest/bundle.tar.xz"
  local lt
  lt=$(ls /usr/local/cuda*/lib*/libcublasLt.so.13* /usr/local/cuda*/targets/*/lib/libcublasLt.so.13* \
    /usr/lib/x86_64-linux-gnu/libcublasLt.so.13* 2>/dev/null | head -1 || true)
  if [ -z "$lt" ]; then  # PyTorch's pip packages: site-packages/nvidia/*/lib
    lt=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null |
      xargs -r -I{} find {} -name 'libcublasLt.so.13*' | head -1 || true)
  fi
  export LD_LIBRARY_PATH="$work/lib${lt:+:$(dirname "$lt")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export NDMESH_REQUIRE_GPU=1
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; echo "cuBLASLt: ${lt:-not found}"; } | tee "$out/summary.txt"
  local failed=0
  for t in "$work"/bin/gpu_test_*; do
    local name
    name=$(basename "$t")
    if "$t" >"$out/$name.log" 2>&1; then
      echo "PASS $name $(grep -c '^\[       OK' "$out/$name.log" || true) tests" | tee -a "$out/summary.txt"
    else
      failed=1
      echo "FAIL $name" | tee -a "$out/summary.txt"
      grep -E 'Failure|differ|Actual|exceeds|error' "$out/$name.log" | head -20 | tee -a "$out/summary.txt"
    fi
  done
  "$work/bin/bench_gpu_kernels" 2>&1 | tee "$out/bench_gpu_kernels.log" | tail -40
  exit $failed
}

case $mode in
  pack) pack ;;
  run) run ;;
  *) echo "usage: bash scripts/gpu_kernels.sh pack|run [build]" >&2; exit 2 ;;
esac
