#!/usr/bin/env bash
# scripts/gpu_check.sh's own bugs, found here rather than in the one GPU call: packs the
# CUDA build <build>, adds a test binary that segfaults, and runs `gpu_check.sh run` with a
# fake nvidia-smi first on PATH and no CUDA driver, with Open MPI's files hidden (a mount
# namespace binds empty folders and /dev/null over them; skipped, with a note, where
# namespaces cannot be made). Checks that:
#   - the run ends by itself with its closing line and exit status 1 (failures, no early stop);
#   - every step of `gpu_check.sh steps` reports exactly one PASS, FAIL or SKIP line, and no
#     step that needs a GPU passes without one;
#   - the segfaulting binary is one FAIL line naming SIGSEGV, the kernels after it still run;
#   - the nccl step's 2-rank --device cpu control (tests/store/torchrun_env.py, Gloo) runs
#     with Open MPI hidden, and its GPU sub-checks fail without a GPU (none passes); the step
#     run again on --device cpu (NCCL_CHECK_DEVICE=cpu) passes every sub-check but the bench;
#   - the --device cpu runs of the train steps succeed as one rank with torchrun's
#     variables, with Open MPI hidden (the store world; no MPI_Init, no orted), while the
#     packed ndmesh started as an MPI singleton (NDMESH_BACKEND=mpi) fails there: the hiding works;
#     a packed kernel test starts there too (its tests skip without a GPU);
#   - the machine's lines come first, failing logs' last lines are printed;
#   - the bf16 step repeats its failing cuda run with NDMESH_EPILOGUES=off and says so;
#   - with a fake getconf saying glibc 2.35, packed libraries that need 2.36 give way to the
#     machine's own copies;
#   - $OUT holds the summary and the log archive only (at most 8 files, each under 16 MiB),
#     and the archive holds the steps' logs.
# Usage: bash tests/gpu/gpu_check_selftest.sh <build>
set -uo pipefail
build=$(cd "${1:?usage: gpu_check_selftest.sh <build>}" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-selftest.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
errors=0
fail() {
  echo "FAIL: $*" >&2
  errors=$((errors + 1))
}

cd "$root" || exit 1
# xz -0: the selftest's pack is thrown away, its speed matters more than its size.
if ! XZ_OPT="-0 -T1" timeout 300 bash scripts/gpu_check.sh pack "$build" "$tmp/pack" > "$tmp/pack.log" 2>&1; then
  cat "$tmp/pack.log" >&2
  echo "FAIL: gpu_check.sh pack failed" >&2
  exit 1
fi
tail -n 1 "$tmp/pack.log"

# A test binary that segfaults, added to the pack.
mkdir "$tmp/unpacked"
tar -C "$tmp/unpacked" -xJf "$tmp/pack/gpu.tar.xz"
printf '#!/bin/sh\necho "a test that crashes"\nkill -SEGV $$\n' > "$tmp/unpacked/bin/gpu_test_aaa_crash"
chmod +x "$tmp/unpacked/bin/gpu_test_aaa_crash"
XZ_OPT="-0 -T1" tar -C "$tmp/unpacked" -cJf "$tmp/pack/gpu.tar.xz" bin lib glibc_required glibc_needs
packed_ndmesh=$tmp/unpacked/bin/ndmesh

mkdir "$tmp/fake"
cat > "$tmp/fake/nvidia-smi" << 'EOF'
#!/bin/sh
# A stand-in: an H100's lines, no driver behind them.
case "$*" in
  *--query-gpu*) echo "NVIDIA H100 80GB HBM3, 81559 MiB, 580.65.06" ;;
  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  *) echo "| NVIDIA-SMI 580.65.06    Driver Version: 580.65.06    CUDA Version: 13.0 |" ;;
esac
EOF
chmod +x "$tmp/fake/nvidia-smi"
# A machine with glibc 2.35 (Ubuntu 22.04): the packed libraries that need 2.36 give way to
# the machine's own copies.
real_getconf=$(command -v getconf)
printf '#!/bin/sh\n[ "$1" = GNU_LIBC_VERSION ] && { echo "glibc 2.35"; exit 0; }\nexec %s "$@"\n' "$real_getconf" \
  > "$tmp/fake/getconf"
chmod +x "$tmp/fake/getconf"

have_driver=0
python3 -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' 2> /dev/null && have_driver=1

# hide: a shell command binding empty folders over Open MPI's run-time files and /dev/null
# over its binaries and libraries (the pack's copies of the libraries stay visible).
hidden=0
hide=true
if unshare --mount --propagation private true 2> /dev/null; then
  hidden=1
  mkdir "$tmp/empty"
  hide=true
  for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/share/openmpi /etc/openmpi /usr/lib/x86_64-linux-gnu/pmix2; do
    [ -d "$d" ] && hide+=" && mount --bind $tmp/empty $d"
  done
  for f in /usr/bin/orted /usr/bin/orterun /usr/bin/mpirun /usr/lib/x86_64-linux-gnu/libmpi.so.40* \
    /usr/lib/x86_64-linux-gnu/libopen-rte.so.40* /usr/lib/x86_64-linux-gnu/libopen-pal.so.40*; do
    [ -f "$f" ] && hide+=" && mount --bind /dev/null $(readlink -f "$f")"
  done
else
  echo "note: cannot make a mount namespace here; Open MPI stays visible to the run" >&2
fi

start=$SECONDS
runner=(bash scripts/gpu_check.sh run "$build" "$tmp/pack")
[ $hidden -eq 1 ] && runner=(unshare --mount --propagation private -- bash -c "$hide && exec ${runner[*]@Q}")
PATH="$tmp/fake:$PATH" OUT="$tmp/out" timeout 420 "${runner[@]}" > "$tmp/run.log" 2>&1
rc=$?
echo "gpu_check.sh run: exit status $rc in $((SECONDS - start)) s"
summary=$tmp/out/gpu_check_summary.txt
archive=$tmp/out/gpu_check_logs.tar.xz

if [ $have_driver -eq 0 ] && [ $rc -ne 1 ]; then
  fail "gpu_check.sh run exited $rc, expected 1 (failures reported; 124 is a timeout, 2 an early stop)"
fi
tail -n 1 "$tmp/run.log" | grep -qE '^== (PASS|FAIL): [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped of [0-9]+ steps' ||
  fail "the run's last line is not its closing line: $(tail -n 1 "$tmp/run.log")"
[ -f "$summary" ] || fail "no summary file $summary"

# One result line per step, none missing, none doubled, none unknown.
mapfile -t steps < <(bash scripts/gpu_check.sh steps)
[ ${#steps[@]} -ge 10 ] || fail "gpu_check.sh steps lists ${#steps[@]} steps"
gpu_steps=" gpu kernels kernels-bench train-default train-recompute-selective train-recompute-full train-llama checkpoint offload-host bf16 nccl calibrate gpt2-ndmesh gpt2-memory gpt2-plan gpt2-torch gpt2-bf16 "
for s in "${steps[@]}"; do
  n=$(grep -cE "^(PASS|FAIL|SKIP) $s \[" "$summary")
  [ "$n" -eq 1 ] || fail "step $s has $n result lines in the summary, expected 1"
  if [ $have_driver -eq 0 ] && [[ $gpu_steps == *" $s "* ]] && grep -qE "^PASS $s \[" "$summary"; then
    fail "step $s passed without a GPU driver: $(grep -E "^PASS $s \[" "$summary")"
  fi
done
results=$(grep -cE '^(PASS|FAIL|SKIP) [a-z0-9-]+ \[' "$summary")
[ "$results" -eq ${#steps[@]} ] || fail "$results result lines for ${#steps[@]} steps"

# The segfault is one FAIL line, and the binaries after it ran.
grep -q 'FAIL gpu_test_aaa_crash: killed by signal 11 (SIGSEGV)' "$summary" ||
  fail "the segfaulting test binary is not a FAIL line naming SIGSEGV"
grep -qE '(PASS|FAIL) gpu_test_layernorm' "$summary" || fail "the kernel tests after the crashing one did not run"

# calibrate before the gpt2 steps; without a GPU it fails in ndmesh's one line (not in the
# script), and gpt2-plan, which needs its hardware file, says so.
order=$(bash scripts/gpu_check.sh steps | tr '\n' ' ')
[[ $order == *" calibrate gpt2-ndmesh gpt2-memory gpt2-plan "* ]] ||
  fail "the steps' order does not run calibrate before the gpt2 steps and gpt2-plan after gpt2-memory: $order"
if [ $have_driver -eq 0 ]; then
  grep -qE '^FAIL calibrate \[.*ndmesh calibrate --device cuda: ' "$summary" ||
    fail "calibrate without a GPU: $(grep -E '^(PASS|FAIL|SKIP) calibrate ' "$summary")"
  tar -xJOf "$archive" ./calibrate.err 2> /dev/null | grep -q -- '--device cuda: ' ||
    fail "calibrate without a GPU: ndmesh's line is not in calibrate.err of the log archive"
  grep -qE '^FAIL gpt2-plan \[.*not run: calibrate wrote no hardware file' "$summary" ||
    fail "gpt2-plan without calibrate's file: $(grep -E '^(PASS|FAIL|SKIP) gpt2-plan ' "$summary")"
  # A failing cuda bf16 run is repeated with every cuBLASLt epilogue apart, and the line says how that went.
  grep -qE '^FAIL bf16 \[.*--precision bf16: .*; with NDMESH_EPILOGUES=off too: ' "$summary" ||
    fail "bf16 without a GPU: not repeated with NDMESH_EPILOGUES=off: $(grep -E '^(PASS|FAIL|SKIP) bf16 ' "$summary")"
fi

# The cpu runs: one rank with torchrun's variables, Open MPI hidden; only cuda may fail.
for s in train-default train-recompute-selective train-recompute-full train-llama; do
  grep -qE "^FAIL $s \[.*--device cpu" "$summary" && fail "$s: the --device cpu run failed: $(grep -E "^FAIL $s \[" "$summary")"
  [[ $(tar -xJOf "$archive" "./$s.cpu.out" 2> /dev/null) == *'"losses"'* ]] || fail "$s: no --device cpu JSON in the log archive"
done
# The nccl step: its launch of 2 ranks needs no GPU and no Open MPI; nothing else passes here.
grep -q '^  PASS nccl/launch: ' "$summary" || fail "nccl: the 2-rank --device cpu launch failed: $(grep 'nccl/launch' "$summary")"
if [ $have_driver -eq 0 ]; then
  grep -E '^  PASS nccl/' "$summary" | grep -v 'nccl/launch' | grep -q . &&
    fail "nccl: a GPU sub-check passed without a GPU: $(grep -E '^  PASS nccl/' "$summary" | grep -v nccl/launch)"
  grep -q '^  FAIL nccl/reference: ' "$summary" || fail "nccl: no FAIL line for the single-GPU reference without a GPU"
fi
if [ $hidden -eq 1 ]; then
  # The control: the same hiding stops the packed ndmesh when it starts MPI (a singleton: by
  # hand a process starts none, NDMESH_BACKEND=mpi asks for one).
  if unshare --mount --propagation private -- bash -c "$hide && exec env LD_LIBRARY_PATH='$tmp/unpacked/lib' NDMESH_BACKEND=mpi \
    timeout 60 '$packed_ndmesh' train --layers 1 --hidden 32 --heads 2 --seq 16 --vocab 64 --markov-vocab 64 \
    --batch 2 --steps 1 --eval-batches 0 --threads 1 --device cpu" > "$tmp/mpi.log" 2>&1; then
    fail "with Open MPI hidden, the packed ndmesh still started MPI as a singleton: the hiding does not work"
  fi
  # The kernels' tests need no part of Open MPI but its libraries either (skipped: no GPU).
  if [ $have_driver -eq 0 ] && ! unshare --mount --propagation private -- bash -c "$hide && exec env \
    LD_LIBRARY_PATH='$tmp/unpacked/lib' timeout 60 '$tmp/unpacked/bin/gpu_test_gelu'" > "$tmp/kernel.log" 2>&1; then
    fail "with Open MPI hidden, the packed gpu_test_gelu fails without NDMESH_REQUIRE_GPU: $(tail -n 3 "$tmp/kernel.log")"
  fi
fi

# The nccl step's own plumbing on --device cpu (NCCL_CHECK_DEVICE=cpu), Open MPI hidden: every
# layout launched as torchrun would and compared with the serial run, the 4 and 8 rank ones,
# the killed rank (the bench needs a GPU: skipped).
runner=(bash scripts/gpu_check.sh run "$build" "$tmp/pack")
[ $hidden -eq 1 ] && runner=(unshare --mount --propagation private -- bash -c "$hide && exec ${runner[*]@Q}")
start=$SECONDS
GPU_CHECK_STEPS=nccl NCCL_CHECK_DEVICE=cpu PATH="$tmp/fake:$PATH" OUT="$tmp/out-nccl" timeout 300 "${runner[@]}" \
  > "$tmp/run-nccl.log" 2>&1
echo "gpu_check.sh run of the nccl step on the cpu: exit status $? in $((SECONDS - start)) s"
grep -q '^PASS nccl \[' "$tmp/out-nccl/gpu_check_summary.txt" 2> /dev/null ||
  fail "the nccl step on --device cpu failed: $(grep -E '^ *(FAIL|PASS|SKIP) nccl' "$tmp/run-nccl.log" | tr '\n' ';')"
n=$(grep -cE '^  PASS nccl/' "$tmp/out-nccl/gpu_check_summary.txt" 2> /dev/null)
[ "${n:-0}" -eq 15 ] || fail "the nccl step on --device cpu passed ${n:-0} sub-checks, expected 15 (all but the bench)"

# The machine's glibc (2.35, faked) is older than the packed libstdc++'s need (2.36 here).
grep '^glibc: ' "$tmp/run.log"
if grep -q '^lib/libstdc++.so.6 2.36' "$tmp/unpacked/glibc_needs"; then
  grep -q 'glibc: the packed libstdc++.so.6 needs glibc 2.36, this machine has 2.35: the machine.s own is used' \
    "$tmp/run.log" || fail "the packed libstdc++ that needs a newer glibc was not replaced by the machine's"
fi

# The machine first, failing logs' last lines.
# The script's own Python must run on the GPU machine's Python (3.10+): no syntax it lacks.
! grep 'SyntaxError' "$tmp/run.log" ||
  fail "a Python error of the script itself (not of the GPU) in the run's output"
head -n 12 "$tmp/run.log" | grep -q 'nvidia-smi' || fail "the run does not start with nvidia-smi's lines"
for what in 'glibc' 'driver.s CUDA version' 'cuBLASLt: ' 'GPU: NVIDIA'; do
  sed -n '1,/^== steps/p' "$tmp/run.log" | grep -q "$what" || fail "the machine's lines before the steps lack '$what'"
done
grep -q -- '-- last lines of train-default.cuda.err' "$tmp/run.log" || fail "a failing log's last lines are not printed"

# What comes back: the summary and the archive, within the limits.
files=$(find "$tmp/out" -type f | wc -l)
[ "$files" -le 8 ] || fail "$files files in \$OUT, at most 8 come back"
[ "$(ls "$tmp/out" | tr '\n' ' ')" = "gpu_check_logs.tar.xz gpu_check_summary.txt " ] ||
  fail "\$OUT holds $(ls "$tmp/out" | tr '\n' ' '), expected the summary and the archive"
big=$(find "$tmp/out" -type f -size +16383k)
[ -z "$big" ] || fail "files over 16 MiB in \$OUT: $big"
listing=$(tar -tJf "$archive" 2> /dev/null)
for log in ./gpu_test_attention.log ./gpu_test_aaa_crash.log ./kernels.out ./train-llama.cuda.err ./gpt2-torch.err; do
  grep -qx "$log" <<< "$listing" || fail "the log archive lacks $log"
done

if [ $errors -gt 0 ]; then
  echo "---- gpu_check.sh run's output:" >&2
  cat "$tmp/run.log" >&2
  exit 1
fi
echo "PASS: every step reported, the summary and the log archive written, no early stop"
