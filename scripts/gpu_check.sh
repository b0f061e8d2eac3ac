#!/usr/bin/env bash
# The GPU check of issue 24, in one call on a GPU machine that cannot build ndmesh (no
# compiler, no Open MPI, no OpenBLAS there: ../shared/design/GPU.md). Pack here, run there.
#
#   bash scripts/gpu_check.sh pack [build]
#       On the CPU machine, in a CUDA build (default build/): the kernels' bundle
#       (scripts/gpu_kernels.sh pack: every gpu_test_* and bench_gpu_kernels) and
#       build/gpu-check/ndmesh.tar.xz: the ndmesh command, the shared libraries it loads
#       from this machine (not glibc, not cuBLAS/cuBLASLt: the GPU machine's CUDA 13 has
#       them) and Open MPI's run-time files (orted, its plugins, help texts and
#       configuration), which a process of one rank needs to start MPI. Checked here with
#       Open MPI hidden (a mount namespace binding empty folders over its files): the
#       unpacked command trains with --device cpu. Carry build/gpu-kernels and
#       build/gpu-check (both git-ignored).
#   bash scripts/gpu_check.sh run [build]
#       On the GPU machine, from the repository root, one summary at the end:
#       1. the CUDA kernels against their CPU twins (gpu_kernels.sh run: NDMESH_REQUIRE_GPU=1,
#          so a missing GPU fails) and bench_gpu_kernels;
#       2. ndmesh train --device cuda against --device cpu on the same model, seed and batch:
#          per-step losses within 1e-5 relative, the step-1 gradient norm within 1e-5, later
#          norms within 1e-4 (the CPU tests' bounds, tests/mpi/train_lib.sh);
#       3. --precision bf16 (refused in one line until it exists: the refusal is checked);
#       4. the GPT-2 small body (12 layers, hidden 768, 12 heads, sequence 1024) in fp32 on
#          the GPU: tokens/s, device memory peak beside ndmesh plan memory's prediction for
#          the same model. The vocabulary is 1024, not 50304: the Markov source has at most
#          1024 tokens and the vocabulary must match the data (byte-level --data has 256).
#       Logs under $OUT (or build/gpu-check/out).
#
# With the device tool:
#   run(command="bash scripts/gpu_check.sh run", carry=["build/gpu-kernels", "build/gpu-check"])
set -euo pipefail
mode=${1:-}
build=${2:-build}
here=$(cd "$(dirname "$0")" && pwd)
dest=$build/gpu-check
ompi_lib=/usr/lib/x86_64-linux-gnu/openmpi

pack() {
  bash "$here/gpu_kernels.sh" pack "$build"
  [ -x "$build/bin/ndmesh" ] || { echo "gpu_check.sh: no $build/bin/ndmesh (make build first)" >&2; exit 2; }
  ldd "$build/bin/ndmesh" | grep -q libcudart ||
    { echo "gpu_check.sh: $build was configured without CUDA (-DNDMESH_CUDA=ON)" >&2; exit 2; }
  local stage=$dest/stage
  rm -rf "$dest" && mkdir -p "$stage/bin" "$stage/lib" "$stage/ompi/lib/x86_64-linux-gnu" "$stage/ompi/share"
  strip -o "$stage/bin/ndmesh" "$build/bin/ndmesh"
  # Open MPI relocated under OPAL_PREFIX=<work>/ompi: its libdir and plugins keep their
  # place below the prefix (/usr), its help texts under share/openmpi.
  cp -a "$ompi_lib" "$stage/ompi/lib/x86_64-linux-gnu/"
  rm -rf "$stage/ompi/lib/x86_64-linux-gnu/openmpi/include"
  cp -a /usr/share/openmpi "$stage/ompi/share/"
  mkdir -p "$stage/ompi/etc" && cp -a /etc/openmpi/. "$stage/ompi/etc/"
  # A process of one rank starts MPI as a singleton, which forks orted from <prefix>/bin.
  mkdir -p "$stage/ompi/bin" && cp "$(command -v orted)" "$stage/ompi/bin/"
  # Every library the command and Open MPI's plugins load, but the C library and cuBLAS.
  { ldd "$stage/bin/ndmesh" "$stage/ompi/bin/orted"; find "$stage/ompi" -name '*.so*' -type f -exec ldd {} + 2>/dev/null; } |
    awk '/=> \// {print $3}' | sort -u | while read -r lib; do
      case $(basename "$lib") in
        libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libcublas*) ;;
        *) cp -Ln "$lib" "$stage/lib/" 2> /dev/null || true ;;
      esac
    done
  tar -C "$stage" -cJf "$dest/ndmesh.tar.xz" bin lib ompi
  rm -rf "$stage"
  echo "gpu_check.sh: $(du -h "$dest/ndmesh.tar.xz" | cut -f1) in $dest/ndmesh.tar.xz; carry $build/gpu-kernels" \
    "and $dest, then run 'bash scripts/gpu_check.sh run' on the GPU machine"
}

# setup_env <work>: the unpacked command finds its libraries, cuBLASLt and Open MPI.
setup_env() {
  local work=$1 lt
  lt=$(ls /usr/local/cuda*/lib*/libcublasLt.so.13* /usr/local/cuda*/targets/*/lib/libcublasLt.so.13* \
    /usr/lib/x86_64-linux-gnu/libcublasLt.so.13* 2> /dev/null | head -1 || true)
  if [ -z "$lt" ]; then  # PyTorch's pip packages: site-packages/nvidia/*/lib
    lt=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2> /dev/null |
      xargs -r -I{} find {} -name 'libcublasLt.so.13*' | head -1 || true)
  fi
  export LD_LIBRARY_PATH="$work/lib:$work/ompi/lib/x86_64-linux-gnu/openmpi/lib${lt:+:$(dirname "$lt")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OPAL_PREFIX=$work/ompi OPAL_SYSCONFDIR=$work/ompi/etc
  export OMPI_MCA_mca_base_component_path=$work/ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  CUBLASLT=${lt:-not found}
}

# rel_check <what> <a.json> <b.json>: losses 1e-5, step-1 norm 1e-5, later norms 1e-4.
rel_check() {
  python3 - "$@" << 'EOF'
import json, sys
what, a, b = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
def rel(x, y):
    return max((abs(p - q) / abs(p) if p else abs(q)) for p, q in zip(x, y)) if x else 0.0
if len(a["losses"]) != len(b["losses"]) or len(a["grad_norms"]) != len(b["grad_norms"]):
    print(f"FAIL {what}: different numbers of steps"); sys.exit(1)
l, g1, g = rel(a["losses"], b["losses"]), rel(a["grad_norms"][:1], b["grad_norms"][:1]), rel(a["grad_norms"][1:], b["grad_norms"][1:])
ok = l < 1e-5 and g1 < 1e-5 and g < 1e-4
print(f"{'PASS' if ok else 'FAIL'} {what}: max relative difference: losses {l:.3g} (bound 1e-5), "
      f"step-1 gradient norm {g1:.3g} (1e-5), later gradient norms {g:.3g} (1e-4)")
sys.exit(0 if ok else 1)
EOF
}

run() {
  local out=${OUT:-$dest/out} work=/tmp/ndmesh-gpu-check failed=0
  mkdir -p "$out" && rm -rf "$work" && mkdir -p "$work"
  [ -f "$dest/ndmesh.tar.xz" ] || { echo "gpu_check.sh: no $dest/ndmesh.tar.xz (pack it on the CPU machine)" >&2; exit 2; }
  tar -C "$work" -xJf "$dest/ndmesh.tar.xz"
  setup_env "$work"
  local ndmesh=$work/bin/ndmesh summary=$out/gpu_check_summary.txt
  : > "$summary"

  echo "== 1. kernels against their CPU twins, and their benchmark" | tee -a "$summary"
  if OUT=$out bash "$here/gpu_kernels.sh" run "$build" > "$out/kernels.log" 2>&1; then
    echo "PASS kernels" | tee -a "$summary"
  else
    failed=1
    echo "FAIL kernels (kernels.log)" | tee -a "$summary"
  fi
  grep -E '^(PASS|FAIL)' "$out/summary.txt" 2> /dev/null | sed 's/^/  /' | tee -a "$summary" || true

  echo "== 2. ndmesh train --device cuda against --device cpu (cuBLASLt: $CUBLASLT)" | tee -a "$summary"
  local model=(--layers 4 --hidden 128 --heads 4 --kv-heads 2 --seq 64 --vocab 256 --markov-vocab 256 --batch 8
    --steps 20 --seed 11 --eval-batches 2 --threads 4 --json)
  local layout
  for layout in "" "--recompute selective" "--recompute full" "--untied"; do
    local name=${layout// /_}
    name=${name:-default}
    # shellcheck disable=SC2086
    if "$ndmesh" train "${model[@]}" $layout --device cpu > "$out/cpu_$name.out" 2> "$out/cpu_$name.err" &&
      "$ndmesh" train "${model[@]}" $layout --device cuda > "$out/cuda_$name.out" 2> "$out/cuda_$name.err"; then
      tail -n 1 "$out/cpu_$name.out" > "$out/cpu_$name.json"
      tail -n 1 "$out/cuda_$name.out" > "$out/cuda_$name.json"
      rel_check "fp32 cuda vs cpu ${layout:-(defaults)}" "$out/cpu_$name.json" "$out/cuda_$name.json" |
        tee -a "$summary" || failed=1
    else
      failed=1
      echo "FAIL fp32 ${layout:-(defaults)}: $(tail -q -n 3 "$out"/c*_"$name".err | tr '\n' ' ')" | tee -a "$summary"
    fi
  done
  # A checkpoint written on the GPU loads on the CPU.
  if "$ndmesh" train "${model[@]}" --device cuda --until 10 --save "$out/gpu.ckpt" > /dev/null 2> "$out/ckpt.err" &&
    "$ndmesh" train "${model[@]}" --device cpu --load "$out/gpu.ckpt" > "$out/resumed.out" 2>> "$out/ckpt.err"; then
    tail -n 1 "$out/resumed.out" > "$out/resumed.json"
    python3 - "$out/cpu_default.json" "$out/resumed.json" << 'EOF' | tee -a "$summary" || failed=1
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
d = max(abs(p - q) / abs(p) for p, q in zip(a["losses"][10:], b["losses"]))
print(f"{'PASS' if d < 1e-4 else 'FAIL'} checkpoint saved on cuda at step 10, resumed on cpu: losses of steps 11-20 within {d:.3g} of the cpu run (bound 1e-4)")
sys.exit(0 if d < 1e-4 else 1)
EOF
  else
    failed=1
    echo "FAIL checkpoint cuda -> cpu: $(tail -n 2 "$out/ckpt.err" | tr '\n' ' ')" | tee -a "$summary"
  fi

  echo "== 3. bf16" | tee -a "$summary"
  if "$ndmesh" train "${model[@]}" --device cuda --precision bf16 > "$out/bf16.out" 2> "$out/bf16.err"; then
    tail -n 1 "$out/bf16.out" > "$out/bf16.json"
    python3 -c 'import json,sys; a,b=json.load(open(sys.argv[1])),json.load(open(sys.argv[2])); d=abs(a["final_loss"]-b["final_loss"])/a["final_loss"]; print(f"bf16 final loss {b[\"final_loss\"]:.5f} vs fp32 {a[\"final_loss\"]:.5f}: {100*d:.2f}% (20 steps; the issue asks 1% after 300)")' \
      "$out/cuda_default.json" "$out/bf16.json" | tee -a "$summary"
  else
    echo "bf16: $(head -n 1 "$out/bf16.err")" | tee -a "$summary"
  fi

  echo "== 4. GPT-2 small body (vocabulary 1024), fp32, one GPU" | tee -a "$summary"
  local gpt2=(--layers 12 --hidden 768 --heads 12 --kv-heads 12 --seq 1024 --vocab 1024 --markov-vocab 1024
    --batch 8 --steps 10 --eval-batches 0 --threads 8 --json)
  if "$ndmesh" train "${gpt2[@]}" --device cuda > "$out/gpt2.out" 2> "$out/gpt2.err"; then
    tail -n 1 "$out/gpt2.out" > "$out/gpt2.json"
    "$ndmesh" plan memory --layers 12 --hidden 768 --heads 12 --seq 1024 --vocab 1024 --micro-batch 8 \
      --precision fp32 --no-dropout --attention flash --mlp gelu --json > "$out/plan_memory.json" 2> "$out/plan_memory.err" || true
    python3 - "$out/gpt2.json" "$out/plan_memory.json" << 'EOF' | tee -a "$summary"
import json, sys
r = json.load(open(sys.argv[1]))
peak = r.get("memory_bytes", {}).get("device_peak", 0)
line = f"tokens/s {r.get('tokens_per_second', 0):.0f} (fp32, batch 8 x 1024), device peak {peak / 2**30:.2f} GiB"
try:
    planned = json.load(open(sys.argv[2]))["memory_bytes"]["total"]
    line += f"; ndmesh plan memory: {planned / 2**30:.2f} GiB, measured/planned {peak / planned:.3f} (issue: within 10%)"
except Exception as e:
    line += f"; plan memory failed: {e}"
print(line)
EOF
  else
    failed=1
    echo "FAIL GPT-2 small: $(tail -n 2 "$out/gpt2.err" | tr '\n' ' ')" | tee -a "$summary"
  fi

  echo "== $([ $failed -eq 0 ] && echo PASS || echo FAIL): summary in $summary" | tee -a "$summary"
  exit $failed
}

case $mode in
  pack) pack ;;
  run) run ;;
  *) echo "usage: bash scripts/gpu_check.sh pack|run [build]" >&2; exit 2 ;;
esac
