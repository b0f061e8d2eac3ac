#!/usr/bin/env bash
# The GPU check: every CUDA kernel test, --device cuda against --device cpu, a checkpoint
# from the GPU resumed on the CPU, and GPT-2 small's speed against PyTorch's, in one command
# of at most 10 minutes on a GPU machine that cannot build ndmesh (no compiler, no Open MPI,
# no OpenBLAS there; one H100/H200, a CUDA 13 driver, nvcc, PyTorch with its pip NVIDIA
# libraries). Pack here, run there (docs/gpu.md).
#
#   bash scripts/gpu_check.sh pack [build] [dir]
#       On the CPU machine, in a CUDA build (default build/): builds ndmesh, every gpu_test_*,
#       bench_gpu_kernels and bench_gpu_model (the emulator's model of a step, which needs no
#       GPU), and writes <dir>/gpu.tar.xz (default dir: build/gpu-check,
#       git-ignored): the binaries (stripped) and every shared library they load from this
#       machine but glibc's, the driver's and cuBLAS/cuBLASLt (the GPU machine has those).
#       Open MPI's libraries are packed only because ndmesh is linked with them: every step
#       starts one rank with torchrun's variables (RANK=0 WORLD_SIZE=1 LOCAL_RANK=0
#       MASTER_ADDR=127.0.0.1 MASTER_PORT=<a free port>), which uses the TCP store and never
#       calls MPI_Init, so no orted, plugin or help file of Open MPI is needed. Any failure
#       is printed and exits 2.
#   bash scripts/gpu_check.sh run [build] [dir]
#       On the GPU machine, from the repository root, with <dir> copied there (the
#       repository's tracked files plus build/gpu-check). Never stops early: each step
#       below ends in one PASS, FAIL or SKIP line, a failing command's last lines are
#       printed, and a failing GPU command is run once more with CUDA_LAUNCH_BLOCKING=1.
#       It first prints the machine: nvidia-smi, driver and CUDA versions, glibc, the
#       cuBLASLt, cuDNN, NCCL and CUDA runtime files found and their versions as loaded
#       (cublasLtGetVersion, ...), the GPU's name and memory, compute-sanitizer, torch.
#       Returned in $OUT (default <dir>/out), two files: gpu_check_summary.txt and
#       gpu_check_logs.tar.xz (every log and JSON; rewritten after each step).
#       GPU_CHECK_STEPS="nccl ..." runs only those steps (NCCL_CHECK_DEVICE=cpu: scripts/gpu_nccl.sh).
#   bash scripts/gpu_check.sh steps
#       The steps' names, one a line.
#
# Steps, with the most seconds each may take (its commands' timeouts; a failing GPU command's
# rerun with CUDA_LAUNCH_BLOCKING=1 shares its command's bound). Every bound is cut to what is
# left of 540 s, and a step with no time left is a FAIL line, so the run ends within about
# 9 minutes, under the 10-minute bound of one command:
#   (the machine's lines first: seconds; 30 to 60 s timeouts on each of their commands)
#   gpu                       90  nvidia-smi sees a GPU and the driver initialises (cuInit)
#   glibc                     30  every packed binary finds its libraries and glibc symbol versions
#                                 (ldd; packed ones that need a newer glibc give way to the machine's)
#   cublaslt                  30  libcublasLt.so.13, else .so.12, from the toolkit or PyTorch's
#                                 nvidia/*/lib, loads and answers cublasLtGetVersion
#   kernels                  115  every gpu_test_* with NDMESH_REQUIRE_GPU=1 (scripts/gpu_kernels.sh; with
#                                 cuDNN built, gpu_test_attention_cudnn: cuDNN's SDPA against the flash kernel)
#   kernels-bench             60  bench_gpu_kernels (kernels against cuBLAS / device copies)
#   train-default             70  ndmesh train --device cuda (35) against --device cpu (35) on
#   train-recompute-selective 70    the same model, seed and batch: losses within 1e-5 relative,
#   train-recompute-full      70    step-1 gradient norm 1e-5, later norms 1e-4
#   train-llama               70    (tests/mpi/train_lib.sh's bounds; train-llama: --arch llama, an untied head)
#   checkpoint                70  saved on cuda at step 10 (35), resumed on cpu (35): steps 11-20
#                                 within 1e-4 of train-default's cpu run
#   offload-host              35  --device cuda --offload optimizer (moments and fp32 master in pinned host
#                                 memory, 0.05 MiB chunks) against train-default's cuda run: its bounds,
#                                 bit for bit or not said (host loop vs CUDA AdamW kernel), PCIe bytes
#   bf16                     110  --precision bf16 (bf16 operands at the matrix products) tracks fp32 on
#                                 cuda over 300 steps, for the default model and a 6-layer 384-wide
#                                 one at --lr 1e-3: losses within 1% at every step, the step-1 gradient
#                                 norm within 2% (22 s each run; on the CPU 0.05% and 0.02%; at the
#                                 default lr the wide model's warmup spikes: docs/train.md); and cuda bf16
#                                 against cpu bf16 (10 s each) over the default model's first 20 steps,
#                                 the cuda run with NDMESH_ATTENTION=flash (cuDNN's attention rounds
#                                 more than the CPU's bf16): losses 2e-4, step-1 gradient norm 5e-5
#                                 (bf16 against fp32 differ there by 2e-4), later norms 5e-3; a cuda
#                                 bf16 run or comparison that fails runs once more with NDMESH_EPILOGUES=off
#                                 (every cuBLASLt epilogue apart), which rules the epilogues in or out
#   nccl                     200  several ranks on the one GPU (scripts/gpu_nccl.sh): dp 2, tp 2 + sp,
#                                 pp 2 1F1B and interleaved, cp 2, dp 2 + ZeRO 2, dp 2 + ZeRO 3 (a wider model) on NCCL (NCCL_HOSTID
#                                 per rank over loopback), 4 and 8 ranks staged over Gloo, each against
#                                 the single-GPU run; a killed rank; NCCL vs Gloo bus bandwidth
#   calibrate                 30  ndmesh calibrate --device cuda --seconds 8: the GPU's fp32 and bf16
#                                 product rates, copies, pinned host links, memory; the hardware file
#                                 (calibrate.toml) is in the log archive and its keys in the summary
#   gpt2-ndmesh               90  GPT-2 small body (12 x 768, 12 heads, sequence 1024, vocabulary
#                                 1024, batch 8) fp32: 40 steps, tokens/s over the last 35
#   gpt2-memory               15  its device peak against ndmesh plan memory's prediction
#   gpt2-plan                 15  ndmesh plan memory of that run on calibrate.toml: its step time
#                                 within 25% of gpt2-ndmesh's, its memory within 10% of the peak
#   gpt2-torch                75  scripts/gpt2_torch_baseline.py, same shape, fp32, TF32 off: 5
#                                 warm-up steps, 30 timed; ndmesh's tokens/s as a ratio of it
#   gpt2-bf16                235  GPT-2 small in bf16 on a token file (scripts/make_token_file.py: 12 x 768,
#                                 12 heads, sequence 1024, vocabulary 50257 padded to 128, micro-batch
#                                 16; 5 warm-up steps, 30 timed): ndmesh --precision bf16 (40; only
#                                 noted while refused; attention on cuDNN where built), the same with
#                                 NDMESH_ATTENTION=flash (40; cuDNN's tokens/s as a ratio of it), PyTorch
#                                 eager (35) and torch.compile (90) with bf16 autocast, fused AdamW, flash
#                                 SDPA; tokens/s, MFU over 989 TFLOP/s, peak memory, ndmesh's tokens/s as
#                                 ratios of PyTorch's; and ndmesh plan memory --precision bf16 of the run on
#                                 calibrate.toml against its step time and peak (noted, not a condition)
#   profile                  100  ndmesh train --kernel-times over 8 steps of gpt2-bf16's run (GPU time
#                                 per operation and product shape, host waits), then the measured time
#                                 per kernel class against bench_gpu_model's modelled time of the same step
#                                 (the emulator's account of it at calibrate.toml's rates, or
#                                 docs/hardware/h200-calibrated.toml's: what calibrates the model), then its
#                                 GPU time a step again with NDMESH_EPILOGUES=off and with
#                                 NDMESH_DETERMINISTIC=0, each where 20 s are left), then nsys (when on the
#                                 machine) over 20 steps: the GPU's busy time against the wall, the top
#                                 kernels by time, and the CUDA API calls that wait
#   torchrun                  60  tests/store/torch2.sh with the machine's PyTorch 2.x: ndmesh ranks (--device cpu)
#                                 at torch's TCPStore, torch's client at ndmesh's store, and
#                                 torchrun --nproc_per_node=4 --no-python ndmesh train --dp 2 --tp 2,
#                                 each against the serial run (SKIP without torch >= 2)
#   kernels-memcheck          90  the kernel tests under compute-sanitizer (SKIP without it)
#   kernels-racecheck         90
#   (the kernel steps: gpu_kernels.sh's own budget, 100, 45, 75 and 75 s, plus 15 s to end it)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/gpu_lib.sh
. "$here/gpu_lib.sh"
mode=${1:-}
build=${2:-build}
dir=${3:-$build/gpu-check}
total_budget=540

steps=(gpu glibc cublaslt kernels kernels-bench train-default train-recompute-selective train-recompute-full
  train-llama checkpoint offload-host bf16 nccl calibrate gpt2-ndmesh gpt2-memory gpt2-plan gpt2-torch gpt2-bf16 profile
  torchrun kernels-memcheck kernels-racecheck)

pack() {
  [ -f "$build/CMakeCache.txt" ] || { echo "gpu_check.sh: no build in $build (make build first)" >&2; exit 2; }
  local tests
  tests=$(gpu_kernel_tests "$build")
  [ -n "$tests" ] || { echo "gpu_check.sh: $build has no gpu_test_* targets: configure it with -DNDMESH_CUDA=ON" >&2; exit 2; }
  # shellcheck disable=SC2086,SC2046
  cmake --build "$build" -j2 --target ndmesh $tests bench_gpu_kernels bench_gpu_allreduce bench_gpu_model > /dev/null ||
    { echo "gpu_check.sh: building ndmesh and the GPU tests in $build failed (cmake --build $build)" >&2; exit 2; }
  # grep reads all of ldd's output: with -q it may stop early, and under pipefail the SIGPIPE
  # of ldd would say "built without CUDA" of a CUDA build.
  ldd "$build/bin/ndmesh" | grep libcudart > /dev/null ||
    { echo "gpu_check.sh: $build/bin/ndmesh is built without CUDA: configure with -DNDMESH_CUDA=ON" >&2; exit 2; }
  rm -rf "$dir" && mkdir -p "$dir" || { echo "gpu_check.sh: cannot create $dir" >&2; exit 2; }
  # shellcheck disable=SC2086,SC2046
  gpu_pack "$dir/gpu.tar.xz" "$build/bin/ndmesh" $(printf "$build/tests/%s " $tests) "$build/bench/bench_gpu_kernels" \
    "$build/bench/bench_gpu_allreduce" "$build/bench/bench_gpu_model" ||
    exit 2
  echo "gpu_check.sh: $(du -h "$dir/gpu.tar.xz" | cut -f1) in $dir/gpu.tar.xz (needs glibc >=" \
    "$(tar -xJOf "$dir/gpu.tar.xz" glibc_required)); copy the repository with $dir to the GPU machine and run" \
    "'bash scripts/gpu_check.sh run$([ "$build" = build ] || echo " $build")' there, from the repository root"
}

# ---- run: helpers ---------------------------------------------------------------------

declare -A reported=()
failed=0 current="" step_start=0 out="" logs="" summary="" archive="" work="" libs=""
one_rank=()

# report <PASS|FAIL|SKIP> <step> <text>: the step's one line, in the summary and printed.
report() {
  local status=$1 text=$3
  case $status in
    PASS | FAIL | SKIP) ;;
    *) status=FAIL text="no result line (got '$1 $3')" ;;
  esac
  reported[$2]=1
  [ "$status" = FAIL ] && failed=1
  echo "$status $2 [$((SECONDS - step_start)) s]: $text" | tee -a "$summary"
}

# note <text>: a line of the summary that is not a step's result.
note() { echo "$*" | tee -a "$summary"; }

# tail_of <file>...: the last lines of each failing log, indented, printed and in the summary.
tail_of() {
  local f
  for f in "$@"; do
    [ -s "$f" ] || continue
    echo "    -- last lines of $(basename "$f"):"
    tail -n 12 "$f" | cut -c 1-400 | sed 's/^/    /'
  done | tee -a "$summary"
}

# bound <seconds>: the step's bound, cut to what is left of the run's budget (0: none left).
bound() {
  local left=$((total_budget - SECONDS))
  [ "$left" -lt 5 ] && left=0
  echo $(($1 < left ? $1 : left))
}

# save_logs: every log into the archive (a log over 4 MiB keeps its first and last 2 MiB).
save_logs() {
  local f
  for f in "$logs"/*; do
    [ -f "$f" ] || continue
    if [ "$(stat -c %s "$f")" -gt $((4 << 20)) ]; then
      { head -c $((2 << 20)) "$f" && printf '\n[... cut by gpu_check.sh ...]\n' && tail -c $((2 << 20)) "$f"; } > "$f.cut" &&
        mv "$f.cut" "$f"
    fi
  done
  tar -C "$logs" -cJf "$archive.part" . 2> /dev/null && mv "$archive.part" "$archive" ||
    echo "gpu_check.sh: cannot write $archive" | tee -a "$summary"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2> /dev/null ||
    echo $((20000 + RANDOM % 20000))
}

# ndmesh <seconds> <name> <args>...: one rank of the packed ndmesh started as torchrun would
# (the store world: no MPI_Init, no orted), stdout and stderr in <name>.out/.err.
ndmesh() {
  local seconds=$1 name=$2
  shift 2
  one_rank_env
  timeout -k 5 "$seconds" "${one_rank[@]}" "$work/bin/ndmesh" "$@" > "$logs/$name.out" 2> "$logs/$name.err"
}

# one_rank_env: one_rank=(env ...), the command prefix of one rank of the packed binaries
# started as torchrun would, with their libraries and a free port.
one_rank_env() {
  one_rank=(env LD_LIBRARY_PATH="$libs" RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1
    MASTER_PORT="$(free_port)")
}

# ndmesh_gpu <seconds> <name> <args>...: as ndmesh; when it fails, once more with
# CUDA_LAUNCH_BLOCKING=1 (<name>.blocking.out/.err). Prints why it failed; returns its status.
ndmesh_gpu() {
  local seconds=$1 name=$2 rc rc2 start=$SECONDS
  shift 2
  ndmesh "$seconds" "$name" "$@"
  rc=$?
  [ $rc -eq 0 ] && return 0
  local msg left
  msg="$(describe $rc "$seconds")"
  left=$(bound $((seconds - (SECONDS - start))))
  if [ "$left" -ge 5 ]; then
    CUDA_LAUNCH_BLOCKING=1 ndmesh "$left" "$name.blocking" "$@"
    rc2=$?
    msg+="; once more with CUDA_LAUNCH_BLOCKING=1: $([ $rc2 -eq 0 ] && echo passed || describe $rc2 "$left")"
  fi
  echo "$msg"
  return $rc
}

# json_of <name>: <name>.out's last line (ndmesh train --json) into <name>.json.
json_of() { tail -n 1 "$logs/$1.out" > "$logs/$1.json" 2> /dev/null; }

# py <name> <comparison> <args>...: scripts/gpu_check_compare.py in the machine's python3; its
# last line is the result (PASS or FAIL ...), a Python error becomes a FAIL line.
py() {
  local name=$1
  shift
  timeout -k 5 60 python3 "$here/gpu_check_compare.py" "$@" > "$logs/$name.compare.out" 2>&1
  if grep -qE '^(PASS|FAIL)' "$logs/$name.compare.out"; then
    grep -E '^(PASS|FAIL)' "$logs/$name.compare.out" | tail -n 1
  else
    echo "FAIL python: $(tail -n 1 "$logs/$name.compare.out")"
  fi
}

# ---- run: the steps ---------------------------------------------------------------------

machine() {
  note "== gpu_check.sh on $(hostname) at $(date -u '+%Y-%m-%d %H:%M:%S UTC'), pack $dir/gpu.tar.xz"
  note "== nvidia-smi"
  if command -v nvidia-smi > /dev/null; then
    timeout 30 nvidia-smi 2>&1 | head -n 20 | tee -a "$summary"
    note "GPU: $(timeout 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -n 4 | tr '\n' ';')"
    note "driver's CUDA version: $(timeout 30 nvidia-smi 2>&1 | grep -o 'CUDA Version: *[0-9.]*' | head -n 1 | sed 's/.*: *//')"
  else
    note "nvidia-smi: not on PATH"
  fi
  note "glibc: $(getconf GNU_LIBC_VERSION 2>&1); the pack needs >= $(cat "$work/glibc_required" 2> /dev/null)"
  tee -a "$summary" < "$logs/glibc.log"
  note "kernel: $(uname -r); CPUs: $(nproc); python3: $(python3 --version 2>&1)"
  note "== NVIDIA libraries found (toolkit, system, PyTorch's pip nvidia/*/lib) and their versions as loaded"
  local files=() name d
  for name in libcublasLt.so.13 libcublasLt.so.12 libcublas.so.13 libcublas.so.12 libcudnn.so.9 libcudnn.so.8 \
    libnccl.so.2 libcudart.so.13 libcudart.so.12 libcuda.so.1; do
    while read -r d; do
      [ -n "$d" ] && [ -e "$d/$name" ] && files+=("$d/$name")
    done <<< "$GPU_LIB_DIRS"
  done
  mapfile -t files < <(for d in "${files[@]}"; do readlink -f "$d"; done | awk '!seen[$0]++')
  [ ${#files[@]} -gt 0 ] || note "none in: $(tr '\n' ' ' <<< "$GPU_LIB_DIRS")"
  timeout -k 5 60 python3 - "${files[@]}" << 'EOF' 2>&1 | tee -a "$summary"
import ctypes, os, sys
for path in sys.argv[1:]:
    base, real = os.path.basename(path), os.path.realpath(path)
    try:
        lib = ctypes.CDLL(path)
        v = ctypes.c_int(0)
        if base.startswith("libcublasLt"):
            f = lib.cublasLtGetVersion; f.restype = ctypes.c_size_t; what = f"cublasLtGetVersion {f()}"
        elif base.startswith("libcublas"):
            what = "loaded"
        elif base.startswith("libcudnn"):
            f = lib.cudnnGetVersion; f.restype = ctypes.c_size_t; what = f"cudnnGetVersion {f()}"
        elif base.startswith("libnccl"):
            lib.ncclGetVersion(ctypes.byref(v)); what = f"ncclGetVersion {v.value}"
        elif base.startswith("libcudart"):
            lib.cudaRuntimeGetVersion(ctypes.byref(v)); what = f"cudaRuntimeGetVersion {v.value}"
        else:
            lib.cuDriverGetVersion(ctypes.byref(v)); what = f"cuDriverGetVersion {v.value}"
    except Exception as e:
        what = f"cannot load: {e}"
    print(f"{path} ({os.path.basename(real)}): {what}")
EOF
  gpu_find_cublaslt | tee -a "$summary"
  if [ -n "$NCCL_LIB" ]; then
    note "NCCL: took $NCCL_LIB (the packed binaries find it on LD_LIBRARY_PATH)"
  else
    note "NCCL: no libnccl.so.2 in the toolkit, the system or the pip nvidia/*/lib folders: ndmesh will not start"
  fi
  if [ -n "$CUDNN_LIB" ]; then
    note "cuDNN: took $CUDNN_LIB (its folder on LD_LIBRARY_PATH: ndmesh loads libcudnn.so.9 and its sub-libraries on first use)"
  else
    note "cuDNN: no libcudnn.so.9 in the toolkit, the system or the pip nvidia/*/lib folders: bf16 attention runs on the flash kernel, gpu_test_attention_cudnn fails"
  fi
  local cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2> /dev/null | head -n 1)
  note "compute-sanitizer: ${cs:-not found}"
  note "nsys: $(find_nsys || echo not found)"
  note "torch: $(timeout 60 python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "GPU available:", torch.cuda.is_available())' 2>&1 | tail -n 1)"
}

step_gpu() {
  local smi="" cu
  if ! command -v nvidia-smi > /dev/null; then
    smi="nvidia-smi is not on PATH"
  elif ! timeout 30 nvidia-smi -L > "$logs/nvidia-smi.log" 2>&1 || ! grep -q '^GPU ' "$logs/nvidia-smi.log"; then
    smi="nvidia-smi -L lists no GPU: $(tail -n 1 "$logs/nvidia-smi.log")"
  fi
  cu=$(timeout -k 5 "$(bound 60)" python3 -c '
import ctypes
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    print(f"no CUDA driver: {e}"); raise SystemExit(1)
n = ctypes.c_int(0)
r = cuda.cuInit(0)
if r != 0:
    print(f"cuInit failed: CUresult {r}"); raise SystemExit(1)
cuda.cuDeviceGetCount(ctypes.byref(n))
print(("OK" if n.value > 0 else "no device:") + f" {n.value} device(s)")' 2>&1 | tail -n 1)
  if [ -z "$smi" ] && [[ $cu == OK* ]]; then
    report PASS gpu "$(head -n 1 "$logs/nvidia-smi.log"); the driver (cuInit): $cu"
  else
    report FAIL gpu "${smi:+$smi; }the driver (cuInit): $cu"
  fi
}

# glibc: every packed binary finds every library and symbol version it needs (ldd, with the
# packed libraries that fit this machine's glibc).
step_glibc() {
  local have missing
  have=$(getconf GNU_LIBC_VERSION 2> /dev/null | awk '{print $2}')
  missing=$(cd "$work/bin" && timeout -k 5 30 env LD_LIBRARY_PATH="$libs" ldd ./* 2>&1 |
    awk '/^\.\// {bin = $1} /not found/ {print bin " " $0}' | tr -s ' \t' ' ' | sort -u | head -n 20)
  if [ -n "$missing" ]; then
    report FAIL glibc "glibc $have here (the pack needs >= $(cat "$work/glibc_required")); not found: $(tr '\n' ';' <<< "$missing")"
  else
    report PASS glibc "glibc $have here; every packed binary finds its libraries ($(wc -l < "$logs/glibc.log") packed ones replaced by the machine's)"
  fi
}

step_cublaslt() {
  if [ -z "$CUBLASLT" ]; then
    report FAIL cublaslt "neither libcublasLt.so.13 nor .so.12 in the toolkit, the system or PyTorch's nvidia/*/lib"
    return
  fi
  local v
  v=$(timeout -k 5 "$(bound 30)" python3 -c 'import ctypes, sys
f = ctypes.CDLL(sys.argv[1]).cublasLtGetVersion; f.restype = ctypes.c_size_t; print(f())' "$CUBLASLT" 2>&1 | tail -n 1)
  if [[ $v =~ ^[0-9]+$ ]]; then
    report PASS cublaslt "took $CUBLASLT, cublasLtGetVersion $v (the packed binaries find it on LD_LIBRARY_PATH)"
  else
    report FAIL cublaslt "took $CUBLASLT, but it does not load: $v"
  fi
}

# kernels_step <step> <bound> <gpu_kernels.sh run flags>...
kernels_step() {
  local step=$1 seconds
  seconds=$(bound "$2")
  shift 2
  if [ "$seconds" -eq 0 ]; then
    report FAIL "$step" "not run: no time left of the $total_budget s budget"
    return
  fi
  timeout -k 10 $((seconds + 15)) bash "$here/gpu_kernels.sh" run "$build" --work "$work" --logs "$logs" \
    --budget "$seconds" "$@" > "$logs/$step.out" 2>&1
  local rc=$? lines
  lines=$(grep -cE '^(PASS|FAIL|SKIP) ' "$logs/$step.out")
  if grep -q '^SKIP ' "$logs/$step.out" && [ "$lines" -eq 1 ]; then
    report SKIP "$step" "$(sed -n 's/^SKIP [^:]*: //p' "$logs/$step.out")"
  elif [ $rc -eq 0 ] && [ "$lines" -gt 0 ]; then
    report PASS "$step" "$(grep -c '^PASS ' "$logs/$step.out") binaries passed"
  else
    report FAIL "$step" "$(grep -c '^FAIL ' "$logs/$step.out") of $lines binaries failed ($(describe $rc "$seconds") of gpu_kernels.sh)"
    [ "$lines" -gt 0 ] || tail_of "$logs/$step.out"
  fi
  sed 's/^/  /' "$logs/$step.out" | grep -vE '^  cuBLASLt: ' | head -n 80 | tee -a "$summary"
}

# The small model of the equivalence steps: --device cuda must reproduce --device cpu.
model=(train --layers 4 --hidden 128 --heads 4 --kv-heads 2 --seq 64 --vocab 256 --markov-vocab 256 --batch 8
  --steps 20 --seed 11 --eval-batches 2 --threads 4 --json)

step_train() {
  local step=$1 name=${1#train-} seconds why
  shift
  seconds=$(bound 35)
  [ "$seconds" -eq 0 ] && { report FAIL "$step" "not run: no time left of the $total_budget s budget"; return; }
  ndmesh "$seconds" "$step.cpu" "${model[@]}" "$@" --device cpu
  local rc=$?
  if [ $rc -ne 0 ]; then
    report FAIL "$step" "--device cpu $*: $(describe $rc "$seconds")"
    tail_of "$logs/$step.cpu.err"
    return
  fi
  json_of "$step.cpu"
  seconds=$(bound 35)
  if ! why=$(ndmesh_gpu "$seconds" "$step.cuda" "${model[@]}" "$@" --device cuda); then
    report FAIL "$step" "--device cuda $*: $why"
    tail_of "$logs/$step.cuda.err" "$logs/$step.cuda.blocking.err"
    return
  fi
  json_of "$step.cuda"
  local r
  r=$(py "$step" equal "$logs/$step.cpu.json" "$logs/$step.cuda.json")
  report "${r%% *}" "$step" "cuda against cpu${*:+ ($*)}: ${r#* }"
  if [ "$name" = default ]; then
    # Which cuBLASLt the packed ndmesh loaded (its one log line).
    grep -h 'cuBLASLt' "$logs/$step.cuda.err" | head -n 1 | sed 's/^/  ndmesh: /' | tee -a "$summary"
  fi
}

step_checkpoint() {
  local seconds why
  seconds=$(bound 35)
  [ "$seconds" -eq 0 ] && { report FAIL checkpoint "not run: no time left of the $total_budget s budget"; return; }
  if [ ! -s "$logs/train-default.cpu.json" ]; then
    report FAIL checkpoint "not run: train-default's --device cpu run did not finish"
    return
  fi
  rm -rf "$work/gpu.ckpt"
  if ! why=$(ndmesh_gpu "$seconds" checkpoint.cuda "${model[@]}" --device cuda --until 10 --save "$work/gpu.ckpt"); then
    report FAIL checkpoint "saving on cuda: $why"
    tail_of "$logs/checkpoint.cuda.err" "$logs/checkpoint.cuda.blocking.err"
    return
  fi
  seconds=$(bound 35)
  ndmesh "$seconds" checkpoint.cpu "${model[@]}" --device cpu --load "$work/gpu.ckpt"
  local rc=$?
  if [ $rc -ne 0 ]; then
    report FAIL checkpoint "resuming on cpu: $(describe $rc "$seconds")"
    tail_of "$logs/checkpoint.cpu.err"
    return
  fi
  json_of checkpoint.cpu
  local r
  r=$(py checkpoint resumed "$logs/train-default.cpu.json" "$logs/checkpoint.cpu.json")
  report "${r%% *}" checkpoint "${r#* }"
}

# --offload optimizer on cuda (pinned host memory) against train-default's cuda run.
step_offload_host() {
  local seconds why
  seconds=$(bound 35)
  [ "$seconds" -eq 0 ] && { report FAIL offload-host "not run: no time left of the $total_budget s budget"; return; }
  if [ ! -s "$logs/train-default.cuda.json" ]; then
    report FAIL offload-host "not run: train-default's --device cuda run did not finish"
    return
  fi
  if ! why=$(ndmesh_gpu "$seconds" offload-host.cuda "${model[@]}" --device cuda --offload optimizer \
    --offload-chunk-mb 0.05); then
    report FAIL offload-host "--device cuda --offload optimizer: $why"
    tail_of "$logs/offload-host.cuda.err" "$logs/offload-host.cuda.blocking.err"
    return
  fi
  json_of offload-host.cuda
  local r
  r=$(py offload-host offload "$logs/train-default.cuda.json" "$logs/offload-host.cuda.json")
  report "${r%% *}" offload-host "${r#* }"
}

# bf16 against fp32 on cuda: the default model and a 6-layer 384-wide one, 300 steps each;
# then cuda bf16 against cpu bf16 over the default model's first 20 steps (--until 20: the
# same learning-rate schedule).
bf16_models=("default:" "wide:--layers 6 --hidden 384 --heads 6 --lr 1e-3")
bf16_run=(train --steps 300 --seed 11 --eval-batches 0 --threads 4 --json)

# cuda_bf16_against_cpu <name> <NAME=value>...: the default model's first 20 steps on cuda in
# bf16 with those variables set, against bf16.default.cpu; prints one PASS or FAIL line.
cuda_bf16_against_cpu() {
  local name=$1 seconds rc
  shift
  seconds=$(bound 10)
  [ "$seconds" -gt 0 ] || { echo "FAIL $name not run: no time left of the $total_budget s budget"; return; }
  (
    export "${@?}"  # NAME=value pairs
    ndmesh "$seconds" "$name" "${bf16_run[@]}" --until 20 --device cuda --precision bf16
  )
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAIL the default model on --device cuda with $*: $(describe $rc "$seconds")"
    tail_of "$logs/$name.err" >&2
    return
  fi
  json_of "$name"
  py "$name" bf16-devices "$logs/bf16.default.cpu.json" "$logs/$name.json"
}

step_bf16() {
  local seconds rc entry name pairs=()
  for entry in "${bf16_models[@]}"; do
    name=${entry%%:*}
    local shape=()
    read -r -a shape <<< "${entry#*:}"
    local precision
    for precision in bf16 fp32; do
      seconds=$(bound 22)
      [ "$seconds" -eq 0 ] && { report FAIL bf16 "not run: no time left of the $total_budget s budget"; return; }
      ndmesh "$seconds" "bf16.$name.$precision" "${bf16_run[@]}" "${shape[@]}" --device cuda --precision $precision
      rc=$?
      if [ $rc -ne 0 ]; then
        local apart="" again
        again=$(bound 22)
        if [ $precision = bf16 ] && [ "$again" -gt 0 ]; then  # the epilogues ruled in or out
          NDMESH_EPILOGUES=off ndmesh "$again" "bf16.$name.apart" "${bf16_run[@]}" "${shape[@]}" --device cuda \
            --precision bf16
          local rc_apart=$?
          if [ $rc_apart -eq 0 ]; then
            apart="; with NDMESH_EPILOGUES=off it ran: the cuBLASLt epilogues are the cause"
          else
            apart="; with NDMESH_EPILOGUES=off too: $(describe $rc_apart "$again")"
          fi
        fi
        report FAIL bf16 "$name model, --precision $precision: $(describe $rc "$seconds")$apart"
        tail_of "$logs/bf16.$name.$precision.err"
        return
      fi
      json_of "bf16.$name.$precision"
    done
    pairs+=("$logs/bf16.$name.fp32.json" "$logs/bf16.$name.bf16.json")
  done
  local r r2
  r=$(py bf16 bf16 "${pairs[@]}")
  seconds=$(bound 10)
  [ "$seconds" -gt 0 ] && ndmesh "$seconds" bf16.default.cpu "${bf16_run[@]}" --until 20 --device cpu --precision bf16
  rc=$?
  if [ "$seconds" -eq 0 ]; then
    r2="FAIL cuda against cpu bf16 not run: no time left of the $total_budget s budget"
  elif [ $rc -ne 0 ]; then
    r2="FAIL the default model on --device cpu: $(describe $rc "$seconds")"
    tail_of "$logs/bf16.default.cpu.err"
  else
    json_of bf16.default.cpu
    # cuDNN's attention (the cuda bf16 default) also rounds q, k, v and P to bf16, which the
    # CPU's bf16 does not: the devices are compared with the flash kernel on the GPU (its
    # 300-step tracking of fp32 above is cuDNN's).
    r2=$(cuda_bf16_against_cpu bf16.default.flash NDMESH_ATTENTION=flash)
    # A failure here: once more with every epilogue apart (NDMESH_EPILOGUES=off), which says
    # whether cuBLASLt's fused bias, GELU, dGELU and bias gradients are the cause.
    [ "${r2%% *}" = PASS ] ||
      r2="$r2; with NDMESH_EPILOGUES=off: $(cuda_bf16_against_cpu bf16.default.apart NDMESH_ATTENTION=flash \
        NDMESH_EPILOGUES=off)"
  fi
  local status=PASS
  [ "${r%% *}" = PASS ] && [ "${r2%% *}" = PASS ] || status=FAIL
  report $status bf16 "${r#* }; ${r2#* }"
}

# The GPU's rates for the planner: the hardware file stays in the logs (calibrate.toml).
find_nsys() {
  command -v nsys 2> /dev/null ||
    ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys /usr/lib/nsight-systems*/bin/nsys 2> /dev/null |
    head -n 1 | grep .
}

# model_against_measured: bench_gpu_model's account of gpt2-bf16's step (the CUDA emulator, no
# GPU needed) at this GPU's calibrated rates, its modelled time per kernel class against what
# --kernel-times measured (kernel-times.out's JSON line): the table goes into the summary
# (profile.model.out in the logs), so that the next model of a step starts from this GPU.
model_against_measured() {
  local hw=$logs/calibrate.toml seconds
  [ -s "$hw" ] || hw=$here/../docs/hardware/h200-calibrated.toml
  seconds=$(bound 45)
  if [ ! -x "$work/bin/bench_gpu_model" ] || [ "$seconds" -lt 30 ]; then
    note="$note; model: not run ($([ -x "$work/bin/bench_gpu_model" ] && echo "$seconds s left" || echo "no bench_gpu_model in the pack"))"
    return
  fi
  timeout -k 5 "$seconds" env LD_LIBRARY_PATH="$libs" "$work/bin/bench_gpu_model" --model gpt2-124m --precision bf16 \
    --batch 16 --seq 1024 --vocab 50257 --hardware "$hw" --measured "$logs/kernel-times.out" \
    > "$logs/profile.model.out" 2> "$logs/profile.model.err"
  local rc=$?
  if [ $rc -eq 0 ] && grep -q '^measured' "$logs/profile.model.out"; then
    note="$note; modelled step $(grep -o 'modelled step [0-9.]* ms' "$logs/profile.model.out" | head -n 1 | sed 's/modelled step //')"
    sed -n '/^measured/,$p' "$logs/profile.model.out" | sed 's/^/  /' >> "$logs/kernel-times.table"
  else
    note="$note; bench_gpu_model --measured: $(describe $rc "$seconds"): $(tail -n 1 "$logs/profile.model.err")"
  fi
}

# profile: where gpt2-bf16's step time goes, for the next round of speed work (issue 33).
# First ndmesh's own kernel times (ndmesh train --kernel-times: an event after every
# operation, no tool needed), then nsys where the machine has it.
step_profile() {
  local seconds nsys tokens=$work/gpt2-bf16.tokens.bin rep=$work/profile-bf16 rc result note
  seconds=$(bound 100)
  [ "$seconds" -lt 20 ] && { report FAIL profile "not run: $seconds s left of the $total_budget s budget"; return; }
  if [ ! -f "$tokens" ] && ! timeout -k 5 30 python3 "$here/make_token_file.py" "$tokens" --tokens 700000 \
    --vocab 50257 --format llmc > "$logs/profile.tokens.log" 2>&1; then
    report FAIL profile "scripts/make_token_file.py: $(tail -n 1 "$logs/profile.tokens.log")"
    return
  fi
  ndmesh "$(bound 35)" kernel-times train "${gpt2_bf16_shape[@]}" --data "$tokens" --data-format llmc --steps 8 \
    --eval-batches 0 --threads 8 --json --device cuda --precision bf16 --kernel-times
  rc=$?
  if [ $rc -eq 0 ] && grep -q '^kernel times' "$logs/kernel-times.out"; then
    result=PASS
    note="kernel times: $(grep '^kernel times' "$logs/kernel-times.out" | sed 's/^kernel times //')"
    sed -n '/^kernel times/,/^[^ k]/p' "$logs/kernel-times.out" | grep '^  ' | sed 's/^/  /' > "$logs/kernel-times.table"
    model_against_measured
  else
    result=FAIL
    note="ndmesh train --kernel-times: $(describe $rc 35)"
    tail_of "$logs/kernel-times.err" "$logs/kernel-times.out"
  fi
  # The same with every cuBLASLt epilogue apart, and with cuDNN's choice of attention backward
  # (not its deterministic engine): what each gains or costs, GPU time a step.
  local variant name
  for variant in NDMESH_EPILOGUES=off NDMESH_DETERMINISTIC=0; do
    if [ $result != PASS ] || [ "$(bound 25)" -lt 20 ]; then break; fi
    name=kernel-times-${variant%%=*}
    export "${variant?}"  # NAME=value, for this run only
    ndmesh "$(bound 25)" "$name" train "${gpt2_bf16_shape[@]}" --data "$tokens" --data-format llmc --steps 8 \
      --eval-batches 0 --threads 8 --json --device cuda --precision bf16 --kernel-times
    rc=$?
    unset "${variant%%=*}"
    if [ $rc -eq 0 ] && grep -q '^kernel times' "$logs/$name.out"; then
      note="$note; with $variant: $(grep -o '[0-9.]* ms of GPU time a step' "$logs/$name.out")"
    else
      note="$note; with $variant: $(describe $rc 25)"
    fi
  done
  if ! nsys=$(find_nsys); then
    report $result profile "$note; nsys is not on this machine"
    [ -f "$logs/kernel-times.table" ] && tee -a "$summary" < "$logs/kernel-times.table"
    return
  fi
  seconds=$(bound 40)
  if [ "$seconds" -lt 30 ]; then
    report $result profile "$note; nsys not run: $seconds s left of the $total_budget s budget"
    [ -f "$logs/kernel-times.table" ] && tee -a "$summary" < "$logs/kernel-times.table"
    return
  fi
  # nsys runs with the machine's libraries; env gives the packed ndmesh its own.
  one_rank_env
  timeout -k 5 $((seconds - 25)) "$nsys" profile --trace cuda,nvtx --sample none --cpuctxsw none \
    --force-overwrite true -o "$rep" "${one_rank[@]}" "$work/bin/ndmesh" train \
    "${gpt2_bf16_shape[@]}" --data "$tokens" --data-format llmc --steps 20 --eval-batches 0 --threads 8 --json \
    --device cuda --precision bf16 > "$logs/profile.out" 2> "$logs/profile.err"
  rc=$?
  if [ $rc -ne 0 ] || [ ! -f "$rep.nsys-rep" ]; then
    report FAIL profile "$note; nsys profile of 20 bf16 steps: $(describe $rc $((seconds - 25)))"
    [ -f "$logs/kernel-times.table" ] && tee -a "$summary" < "$logs/kernel-times.table"
    tail_of "$logs/profile.err" "$logs/profile.out"
    return
  fi
  timeout -k 5 25 "$nsys" stats --force-export true --report cuda_gpu_kern_sum,cuda_api_sum,cuda_gpu_mem_time_sum \
    --format csv --output "$logs/profile" "$rep.nsys-rep" > "$logs/profile.stats.log" 2>&1
  timeout -k 5 30 python3 "$here/gpu_profile_summary.py" "$logs" > "$logs/profile.summary" 2>&1
  local r
  r=$(head -n 1 "$logs/profile.summary")
  case $r in PASS* | FAIL*) ;; *) r="FAIL python: $(tail -n 1 "$logs/profile.summary")" ;; esac
  [ "$result" = FAIL ] && r="FAIL ${r#* }"
  report "${r%% *}" profile "$note; nsys: ${r#* }"
  [ -f "$logs/kernel-times.table" ] && tee -a "$summary" < "$logs/kernel-times.table"
  tail -n +2 "$logs/profile.summary" | grep '^  ' | tee -a "$summary"
}

# torchrun: the packed ndmesh (a wrapper that sets its libraries) through store.torch2's script.
step_torchrun() {
  local seconds rc py
  seconds=$(bound 60)
  [ "$seconds" -lt 15 ] && { report FAIL torchrun "not run: $seconds s left of the $total_budget s budget"; return; }
  py=$(command -v python3)
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$libs" "$work/bin/ndmesh" > "$work/ndmesh-torch2"
  chmod +x "$work/ndmesh-torch2"
  timeout -k 5 "$seconds" bash "$here/../tests/store/torch2.sh" "$work/ndmesh-torch2" "$py" > "$logs/torchrun.out" 2>&1
  rc=$?
  case $rc in
    0) report PASS torchrun "$(grep -E '^[123]\. ' "$logs/torchrun.out" | tr '\n' ' ')" ;;
    77) report SKIP torchrun "$(tail -n 1 "$logs/torchrun.out")" ;;
    *) report FAIL torchrun "tests/store/torch2.sh: $(describe $rc "$seconds")"; tail_of "$logs/torchrun.out" ;;
  esac
}

step_calibrate() {
  local seconds why
  seconds=$(bound 30)
  [ "$seconds" -lt 10 ] && { report FAIL calibrate "not run: $seconds s left of the $total_budget s budget"; return; }
  rm -f "$logs/calibrate.toml"
  if ! why=$(ndmesh_gpu "$seconds" calibrate calibrate --device cuda --seconds 8 --disk-mib 64 \
    --output "$logs/calibrate.toml"); then
    report FAIL calibrate "ndmesh calibrate --device cuda: $why"
    tail_of "$logs/calibrate.err" "$logs/calibrate.blocking.err"
    return
  fi
  local r
  r=$(py calibrate calibration "$logs/calibrate.toml")
  report "${r%% *}" calibrate "${r#* }"
  sed -n '/^\[hardware\]/,/^$/p' "$logs/calibrate.toml" | sed 's/^/  /' | tee -a "$summary"
}

# GPT-2 small's body; the vocabulary is 1024, not 50304: the Markov source has at most 1024
# tokens and the vocabulary must match the data.
gpt2_shape=(--layers 12 --hidden 768 --heads 12 --seq 1024 --vocab 1024 --batch 8)
gpt2_warmup=5
gpt2_steps=40

step_gpt2_ndmesh() {
  local seconds why
  seconds=$(bound 90)
  [ "$seconds" -eq 0 ] && { report FAIL gpt2-ndmesh "not run: no time left of the $total_budget s budget"; return; }
  if ! why=$(ndmesh_gpu "$seconds" gpt2 train "${gpt2_shape[@]}" --kv-heads 12 --markov-vocab 1024 \
    --steps $gpt2_steps --eval-batches 0 --threads 8 --json --device cuda); then
    report FAIL gpt2-ndmesh "$why"
    tail_of "$logs/gpt2.err" "$logs/gpt2.blocking.err"
    return
  fi
  json_of gpt2
  # The step lines' tok/s is the mean since the start: step k ended at k * tokens / tok/s.
  local r
  r=$(py gpt2-ndmesh speed "$logs/gpt2.out" "$gpt2_warmup" $((8 * 1024)) "$logs/gpt2.speed.json")
  report "${r%% *}" gpt2-ndmesh "${r#* }"
  grep -h 'cuBLASLt' "$logs/gpt2.err" | head -n 1 | sed 's/^/  ndmesh: /' | tee -a "$summary"
}

step_gpt2_memory() {
  local seconds
  seconds=$(bound 15)
  if [ ! -s "$logs/gpt2.json" ]; then
    report FAIL gpt2-memory "not run: gpt2-ndmesh did not finish"
    return
  fi
  ndmesh "$seconds" plan-memory plan memory "${gpt2_shape[@]/--batch/--micro-batch}" --precision fp32 --no-dropout \
    --attention flash --mlp gelu --json
  local rc=$?
  if [ $rc -ne 0 ]; then
    report FAIL gpt2-memory "ndmesh plan memory: $(describe $rc "$seconds")"
    tail_of "$logs/plan-memory.err"
    return
  fi
  local r
  r=$(py gpt2-memory memory "$logs/gpt2.json" "$logs/plan-memory.out")
  report "${r%% *}" gpt2-memory "${r#* }"
}

# The planner's step time and memory for gpt2-ndmesh's run, on the GPU's calibrated rates.
step_gpt2_plan() {
  local seconds rc
  seconds=$(bound 15)
  if [ ! -s "$logs/calibrate.toml" ]; then
    report FAIL gpt2-plan "not run: calibrate wrote no hardware file"
    return
  fi
  if [ ! -s "$logs/gpt2.json" ] || [ ! -s "$logs/gpt2.speed.json" ]; then
    report FAIL gpt2-plan "not run: gpt2-ndmesh did not finish"
    return
  fi
  ndmesh "$seconds" plan-gpt2 plan memory "${gpt2_shape[@]/--batch/--micro-batch}" --precision fp32 --no-dropout \
    --attention flash --mlp gelu --hardware "$logs/calibrate.toml" --json
  rc=$?
  if [ $rc -ne 0 ]; then
    report FAIL gpt2-plan "ndmesh plan memory --hardware calibrate.toml: $(describe $rc "$seconds")"
    tail_of "$logs/plan-gpt2.err"
    return
  fi
  local r
  r=$(py gpt2-plan plan "$logs/plan-gpt2.out" "$logs/gpt2.speed.json" "$logs/gpt2.json")
  report "${r%% *}" gpt2-plan "${r#* }"
}

step_gpt2_torch() {
  local seconds rc
  seconds=$(bound 75)
  [ "$seconds" -eq 0 ] && { report FAIL gpt2-torch "not run: no time left of the $total_budget s budget"; return; }
  timeout -k 5 "$seconds" python3 "$here/gpt2_torch_baseline.py" "${gpt2_shape[@]}" --warmup 5 --steps 30 \
    > "$logs/gpt2-torch.json" 2> "$logs/gpt2-torch.err"
  rc=$?
  if [ $rc -ne 0 ]; then
    report FAIL gpt2-torch "scripts/gpt2_torch_baseline.py: $(describe $rc "$seconds"): $(tail -n 1 "$logs/gpt2-torch.err")"
    tail_of "$logs/gpt2-torch.err"
    return
  fi
  local r
  r=$(py gpt2-torch torch "$logs/gpt2-torch.json" "$logs/gpt2.speed.json")
  report "${r%% *}" gpt2-torch "${r#* }"
}

# The nccl step (several ranks on the one GPU).
# shellcheck source=scripts/gpu_nccl.sh
. "$here/gpu_nccl.sh"

# GPT-2 small in bf16 on a token file (the vocabulary 50257 needs one): ndmesh, and PyTorch
# eager and compiled, in the same call.
gpt2_bf16_shape=(--layers 12 --hidden 768 --heads 12 --seq 1024 --vocab 50257 --batch 16)

step_gpt2_bf16() {
  local seconds rc tokens=$work/gpt2-bf16.tokens.bin
  seconds=$(bound 235)
  [ "$seconds" -lt 30 ] && { report FAIL gpt2-bf16 "not run: $seconds s left of the $total_budget s budget"; return; }
  # 40 batches of 16 x 1025 tokens, and some.
  if ! timeout -k 5 30 python3 "$here/make_token_file.py" "$tokens" --tokens 700000 --vocab 50257 --format llmc \
    > "$logs/gpt2-bf16.tokens.log" 2>&1; then
    report FAIL gpt2-bf16 "scripts/make_token_file.py: $(tail -n 1 "$logs/gpt2-bf16.tokens.log")"
    return
  fi
  local note=""
  seconds=$(bound 40)
  ndmesh "$seconds" gpt2-bf16 train "${gpt2_bf16_shape[@]}" --data "$tokens" --data-format llmc --steps 35 \
    --eval-batches 0 --threads 8 --json --device cuda --precision bf16
  rc=$?
  rm -f "$logs/gpt2-bf16.speed.json"
  if [ $rc -eq 0 ]; then
    local r
    r=$(py gpt2-bf16.speed speed "$logs/gpt2-bf16.out" 5 $((16 * 1024)) "$logs/gpt2-bf16.speed.json")
    [ "${r%% *}" = PASS ] || note="; ndmesh: ${r#* }"
    # ndmesh plan of this run on the calibrated file (issue 33's bar: the step within 25%, the
    # device peak within 10%), reported beside the speeds, not a condition of this step.
    json_of gpt2-bf16
    seconds=$(bound 10)
    if [ -s "$logs/calibrate.toml" ] && [ -s "$logs/gpt2-bf16.speed.json" ] && [ "$seconds" -ge 5 ]; then
      if ndmesh "$seconds" plan-gpt2-bf16 plan memory "${gpt2_bf16_shape[@]/--batch/--micro-batch}" \
        --precision bf16 --no-dropout --attention flash --mlp gelu --hardware "$logs/calibrate.toml" --json; then
        r=$(py plan-gpt2-bf16 plan "$logs/plan-gpt2-bf16.out" "$logs/gpt2-bf16.speed.json" "$logs/gpt2-bf16.json")
        note+="; plan: ${r#* }"
      else
        note+="; ndmesh plan memory --precision bf16: $(head -n 1 "$logs/plan-gpt2-bf16.err")"
      fi
    fi
    # The same run with attention on the fp32 flash kernel: cuDNN attention's speed as a ratio.
    seconds=$(bound 40)
    if [ "$seconds" -ge 20 ]; then
      NDMESH_ATTENTION=flash ndmesh "$seconds" gpt2-bf16.flash train "${gpt2_bf16_shape[@]}" --data "$tokens" \
        --data-format llmc --steps 35 --eval-batches 0 --threads 8 --json --device cuda --precision bf16
      rc=$?
      local rf
      rf=$(py gpt2-bf16.flash.speed speed "$logs/gpt2-bf16.flash.out" 5 $((16 * 1024)) "$logs/gpt2-bf16.flash.speed.json")
      if [ $rc -eq 0 ] && [ "${rf%% *}" = PASS ] && [ -f "$logs/gpt2-bf16.speed.json" ]; then
        note+="; attention: cuDNN (default) tokens/s over NDMESH_ATTENTION=flash's: $(python3 -c '
import json, sys
a, b = (json.load(open(p))["tokens_per_second"] for p in sys.argv[1:])
print(f"{a / b:.3f} ({a:.0f} / {b:.0f})")' "$logs/gpt2-bf16.speed.json" "$logs/gpt2-bf16.flash.speed.json" 2>&1 | tail -n 1)"
      else
        note+="; NDMESH_ATTENTION=flash run: $([ $rc -eq 0 ] && echo "${rf#* }" || describe $rc "$seconds")"
      fi
      grep -h 'cuDNN' "$logs/gpt2-bf16.err" | head -n 3 | sed 's/^/  /' | tee -a "$summary"
    fi
  elif grep -q 'not implemented' "$logs/gpt2-bf16.err"; then
    note="; ndmesh --precision bf16 refused: $(head -n 1 "$logs/gpt2-bf16.err")"
  else
    note="; ndmesh: $(describe $rc "$seconds")"
    tail_of "$logs/gpt2-bf16.err"
  fi
  local mode
  for mode in eager compiled; do
    seconds=$(bound $([ $mode = eager ] && echo 35 || echo 90))
    [ "$seconds" -lt 10 ] && continue
    timeout -k 5 "$seconds" python3 "$here/gpt2_torch_baseline.py" "${gpt2_bf16_shape[@]}" --pad-vocab 128 \
      --precision bf16 $([ $mode = compiled ] && echo --compile) --data "$tokens" --warmup 5 --steps 30 \
      > "$logs/gpt2-bf16.torch-$mode.json" 2> "$logs/gpt2-bf16.torch-$mode.err"
    rc=$?
    if [ $rc -ne 0 ]; then
      note+="; PyTorch $mode: $(describe $rc "$seconds"): $(tail -n 1 "$logs/gpt2-bf16.torch-$mode.err")"
      tail_of "$logs/gpt2-bf16.torch-$mode.err"
    fi
  done
  local r
  r=$(py gpt2-bf16 bf16-bench "$logs/gpt2-bf16.torch-eager.json" "$logs/gpt2-bf16.torch-compiled.json" \
    "$logs/gpt2-bf16.speed.json")
  report "${r%% *}" gpt2-bf16 "${r#* }$note"
}

on_signal() {
  report FAIL "${current:-gpu_check}" "gpu_check.sh was stopped by a signal during this step"
  save_logs
  exit 1
}

run() {
  out=${OUT:-$dir/out}
  mkdir -p "$out" || { echo "gpu_check.sh: cannot create $out" >&2; exit 2; }
  summary=$out/gpu_check_summary.txt archive=$out/gpu_check_logs.tar.xz
  : > "$summary"
  logs=$(mktemp -d "${TMPDIR:-/tmp}/ndmesh-gpu-check-logs.XXXXXX")
  work=$(mktemp -d "${TMPDIR:-/tmp}/ndmesh-gpu-check.XXXXXX")
  trap on_signal TERM INT
  if ! gpu_unpack "$dir/gpu.tar.xz" "$work" 2> "$logs/unpack.log"; then
    note "gpu_check.sh: cannot unpack $dir/gpu.tar.xz ($(head -n 1 "$logs/unpack.log")): run 'bash scripts/gpu_check.sh pack' on the CPU machine and copy $dir here"
  fi
  gpu_fit_glibc "$work" > "$logs/glibc.log" 2>&1
  GPU_LIB_DIRS=$(gpu_lib_dirs)
  CUBLASLT=$(gpu_find libcublasLt.so.13 libcublasLt.so.12)
  NCCL_LIB=$(gpu_find libnccl.so.2)
  CUDNN_LIB=$(gpu_find libcudnn.so.9)
  export GPU_LIB_DIRS CUBLASLT NCCL_LIB CUDNN_LIB
  libs=$(gpu_libraries "$work")
  current=machine
  machine
  save_logs
  note "== steps (run 'bash scripts/gpu_check.sh steps' for their list; bounds in its header)"
  local s
  # GPU_CHECK_STEPS="a b": only those steps (the self-test's run of the nccl step on the CPU).
  [ -n "${GPU_CHECK_STEPS:-}" ] && read -r -a steps <<< "$GPU_CHECK_STEPS"
  for s in "${steps[@]}"; do
    current=$s step_start=$SECONDS
    if [ ! -x "$work/bin/ndmesh" ] && [ "$s" != gpu ]; then
      report FAIL "$s" "not run: no unpacked pack"
      continue
    fi
    case $s in
      gpu) step_gpu ;;
      glibc) step_glibc ;;
      cublaslt) step_cublaslt ;;
      kernels) kernels_step kernels 100 --what tests ;;
      kernels-bench) kernels_step kernels-bench 45 --what bench ;;
      train-default) step_train train-default ;;
      train-recompute-selective) step_train train-recompute-selective --recompute selective ;;
      train-recompute-full) step_train train-recompute-full --recompute full ;;
      train-llama) step_train train-llama --arch llama --ffn 256 ;;
      checkpoint) step_checkpoint ;;
      offload-host) step_offload_host ;;
      bf16) step_bf16 ;;
      nccl) step_nccl ;;
      calibrate) step_calibrate ;;
      gpt2-ndmesh) step_gpt2_ndmesh ;;
      gpt2-memory) step_gpt2_memory ;;
      gpt2-plan) step_gpt2_plan ;;
      gpt2-torch) step_gpt2_torch ;;
      gpt2-bf16) step_gpt2_bf16 ;;
      profile) step_profile ;;
      torchrun) step_torchrun ;;
      kernels-memcheck) kernels_step kernels-memcheck 75 --what tests --tool memcheck ;;
      kernels-racecheck) kernels_step kernels-racecheck 75 --what tests --tool racecheck ;;
      *) report FAIL "$s" "gpu_check.sh has no such step" ;;
    esac
    [ -n "${reported[$s]:-}" ] || report FAIL "$s" "reported nothing (a bug of gpu_check.sh)"
    save_logs
  done
  current=""
  local pass fail skip
  pass=$(grep -c '^PASS ' "$summary") fail=$(grep -c '^FAIL ' "$summary") skip=$(grep -c '^SKIP ' "$summary")
  note "== $([ $failed -eq 0 ] && echo PASS || echo FAIL): $pass passed, $fail failed, $skip skipped of ${#steps[@]} steps in $SECONDS s;" \
    "summary $summary, logs $archive"
  save_logs
  rm -rf "$logs" "$work"
  exit $failed
}

case $mode in
  pack) pack "$@" ;;
  run) run ;;
  steps) printf '%s\n' "${steps[@]}" ;;
  *)
    echo "usage: bash scripts/gpu_check.sh pack|run [build] [dir], or steps" >&2
    exit 2
    ;;
esac
