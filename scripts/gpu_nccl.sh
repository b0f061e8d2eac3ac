# shellcheck shell=bash
# The `nccl` step of scripts/gpu_check.sh (sourced by it, after its helpers): several ranks on
# the one GPU of the check machine, each launched as torchrun would (tests/store/torchrun_env.py
# of the repository copy: no mpirun there), every layout compared with the single-GPU run of the
# same model (gpu_check_compare.py equal: losses 1e-5, step-1 gradient norm 1e-5, later 1e-4,
# the bounds of tests/support/compare_runs.sh, which needs jq that the machine may lack).
#
# Two NCCL ranks on one GPU: NCCL refuses two ranks on one device, so (test-only) each rank
# gets its own NCCL_HOSTID and NCCL talks over loopback sockets (NCCL_SOCKET_IFNAME=lo,
# NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1): slow, correct. 4 and 8 ranks run over Gloo with
# device buffers staged through pinned host memory (NDMESH_BACKEND=gloo).
#
# Sub-checks, each with its own timeout (all cut to what is left of the step's
# NCCL_STEP_BUDGET, 200 s, and of the run's budget); one indented line each:
#   reference      30  the single-GPU run (--device cuda, one rank)
#   launch         30  the 2-rank launch itself, --device cpu over Gloo (no GPU needed)
#   dp2            40  NCCL, 2 ranks: --dp 2
#   tp2-sp         40  --tp 2 --sequence-parallel
#   pp2-1f1b       40  --pp 2 --micro-batch 2 --schedule 1f1b
#   pp2-interleaved 40 --pp 2 --vpp 2 --micro-batch 2 --schedule interleaved
#   pp2-zbh1       40  --pp 2 --micro-batch 2 --schedule zb-h1 (the split backward on the device)
#   cp2            40  --cp 2 (ring attention on the device, kv blocks over NCCL)
#   dp2-zero2      40  --dp 2 --zero 2
#   dp2-bf16   30+40  --dp 2 --grad-dtype bf16 (buckets rounded, reduced and widened on the device)
#                      against the same flags on --device cpu over Gloo, and half dp2's bytes
#   dp2-zero3  30+40  --dp 2 --zero 3 on a wider model (2 x 512: a rank's freed half of a block
#                      spans whole 2 MiB chunks, which CUDA's virtual memory gives back and maps
#                      again) against its own one-GPU run, and a lower device peak than it
#   staged4        45  Gloo staged, 4 ranks: --dp 2 --tp 2 --sequence-parallel
#   staged8        60  Gloo staged, 8 ranks: --dp 2 --pp 2 --tp 2 --micro-batch 2
#   staged4-cp     45  Gloo staged, 4 ranks: --dp 2 --cp 2
#   fault          40  NCCL dp 2 with NDMESH_TIMEOUT_S=8, rank 1 killed at step 3: the other ends
#                      non-zero within 16 s with a line naming the group (NCCL's watchdog) or
#                      the members (the Gloo bootstrap's host operation that saw the peer go)
#   bench          40  bench_gpu_allreduce, 2 ranks: NCCL (cuda) and Gloo (cpu) bus bandwidth
#                      up to 16 MiB (the loopback arrangement is no speed claim)
# NCCL_CHECK_DEVICE=cpu runs every sub-check on --device cpu over Gloo (the bench is skipped):
# the step's own plumbing (launch, JSON, comparison, kill) tried where no GPU is.
# Expected on an H100: about 2 to 2.5 minutes (each run a few seconds: CUDA and NCCL start-up, 6 steps).

NCCL_STEP_BUDGET=${NCCL_STEP_BUDGET:-200}
# NCCL_CHECK_ONLY="pp2-1f1b cp2": only those sub-checks (and the reference), to rerun a failure
# with, say, NCCL_DEBUG=INFO.
nccl_only=${NCCL_CHECK_ONLY:-}
nccl_wanted() { [ -z "$nccl_only" ] || [[ " $nccl_only " == *" $1 "* ]]; }
# cpu: every sub-check on --device cpu (Gloo), to try the step's plumbing where no GPU is.
nccl_device=${NCCL_CHECK_DEVICE:-cuda}
nccl_shape=(train --layers 4 --hidden 64 --heads 4 --kv-heads 2 --seq 32 --vocab 64 --markov-vocab 64 --batch 8
  --seed 23 --eval-batches 0 --threads 2)
nccl_model=("${nccl_shape[@]}" --steps 6 --json)
# The one-GPU NCCL arrangement (test-only): per-rank NCCL_HOSTID is set by nccl_ranks.
nccl_env=(NCCL_SOCKET_IFNAME=lo NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)

# nccl_bound <seconds>: cut to what is left of the step's budget and of the run's.
nccl_bound() {
  local s left
  s=$(bound "$1")
  left=$((nccl_deadline - SECONDS))
  [ "$left" -lt 5 ] && left=0
  echo $((s < left ? s : left))
}

# nccl_ranks <seconds> <name> <ranks> [VAR=VALUE...] -- <program args...>: the ranks of the
# packed ndmesh (or bench) started as torchrun would; output in <name>.out/.err.
nccl_ranks() {
  local seconds=$1 name=$2 n=$3 r
  shift 3
  local envs=() sets=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  for ((r = 0; r < n; r++)); do sets+=(--set "$r:NCCL_HOSTID=ndmesh-gpu-check-rank$r"); done
  timeout -k 5 "$seconds" env LD_LIBRARY_PATH="$libs" "${nccl_env[@]}" "${envs[@]}" \
    python3 "$here/../tests/store/torchrun_env.py" "${sets[@]}" -np "$n" "$@" > "$logs/$name.out" 2> "$logs/$name.err"
}

# nccl_sub <PASS|FAIL|SKIP> <name> <text>: one sub-check's indented line.
nccl_sub() {
  [ "$1" = FAIL ] && nccl_failed=$((nccl_failed + 1))
  [ "$1" = PASS ] && nccl_passed=$((nccl_passed + 1))
  echo "  $1 nccl/$2: $3" | tee -a "$summary"
}

# nccl_layout <name> <ranks> [VAR=VALUE...] -- <layout flags...>: a layout against the reference.
nccl_layout() {
  local name=$1 n=$2 seconds rc
  nccl_wanted "$name" || return 0
  shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  seconds=$(nccl_bound "$nccl_timeout")
  [ "$seconds" -eq 0 ] && { nccl_sub FAIL "$name" "not run: no time left"; return; }
  nccl_ranks "$seconds" "nccl-$name" "$n" "${envs[@]}" -- "$work/bin/ndmesh" "${nccl_model[@]}" "$@" --device "$nccl_device"
  rc=$?
  if [ $rc -ne 0 ]; then
    nccl_sub FAIL "$name" "$* on $n ranks: $(describe $rc "$seconds")"
    tail_of "$logs/nccl-$name.err"
    return
  fi
  grep -E '^\{' "$logs/nccl-$name.out" | tail -n 1 > "$logs/nccl-$name.json"
  local r
  r=$(py "nccl-$name" equal "$logs/nccl-reference.json" "$logs/nccl-$name.json")
  nccl_sub "${r%% *}" "$name" "$* on $n ranks ($(grep -q NDMESH_BACKEND=gloo <<< "${envs[*]}" && echo staged over gloo || echo nccl)) against one GPU: ${r#* }"
}

# dp2-bf16: --dp 2 --grad-dtype bf16 over NCCL against the same flags on --device cpu over Gloo,
# with the equal bounds: a bf16 sum of two terms is the same in any order, so the runs differ by
# the devices' fp32 arithmetic only (where that moves an element across a bf16 rounding midpoint,
# that element's reduced gradient moves by 2^-8 relative: far below the bounds in a norm or a
# loss); and bf16 on the wire: grad_comm_bytes_per_step half the fp32 dp2 run's.
nccl_bf16() {
  local seconds rc r half full
  nccl_wanted dp2-bf16 || return 0
  seconds=$(nccl_bound 30)
  [ "$seconds" -eq 0 ] && { nccl_sub FAIL dp2-bf16 "not run: no time left"; return; }
  if ! nccl_ranks "$seconds" nccl-dp2-bf16-cpu 2 -- "$work/bin/ndmesh" "${nccl_model[@]}" --dp 2 --grad-dtype bf16 \
    --device cpu; then
    nccl_sub FAIL dp2-bf16 "the --device cpu run on 2 ranks (gloo): $(describe $? "$seconds")"
    tail_of "$logs/nccl-dp2-bf16-cpu.err"
    return
  fi
  grep -E '^\{' "$logs/nccl-dp2-bf16-cpu.out" | tail -n 1 > "$logs/nccl-dp2-bf16-cpu.json"
  seconds=$(nccl_bound "$nccl_timeout")
  [ "$seconds" -eq 0 ] && { nccl_sub FAIL dp2-bf16 "not run: no time left"; return; }
  nccl_ranks "$seconds" nccl-dp2-bf16 2 -- "$work/bin/ndmesh" "${nccl_model[@]}" --dp 2 --grad-dtype bf16 \
    --device "$nccl_device"
  rc=$?
  if [ $rc -ne 0 ]; then
    nccl_sub FAIL dp2-bf16 "--dp 2 --grad-dtype bf16 on 2 ranks: $(describe $rc "$seconds")"
    tail_of "$logs/nccl-dp2-bf16.err"
    return
  fi
  grep -E '^\{' "$logs/nccl-dp2-bf16.out" | tail -n 1 > "$logs/nccl-dp2-bf16.json"
  r=$(py nccl-dp2-bf16 equal "$logs/nccl-dp2-bf16-cpu.json" "$logs/nccl-dp2-bf16.json")
  half=$(grep -o '"grad_comm_bytes_per_step":[0-9]*' "$logs/nccl-dp2-bf16.json" | cut -d: -f2)
  full=$(grep -o '"grad_comm_bytes_per_step":[0-9]*' "$logs/nccl-dp2.json" 2> /dev/null | cut -d: -f2)
  [ -n "$half" ] && [ -n "$full" ] && [ $((2 * half)) -eq "$full" ] ||
    r="FAIL grad_comm_bytes_per_step ${half:-none}, not half the fp32 dp2 run's ${full:-none}; ${r#* }"
  nccl_sub "${r%% *}" dp2-bf16 "--dp 2 --grad-dtype bf16 on 2 ranks ($([ "$nccl_device" = cuda ] && echo nccl || echo gloo)) against the same on --device cpu (gloo): ${r#* }"
}

# dp2-zero3: ZeRO-3 on NCCL, its parameters in mappable device memory. The layouts' model is too
# small for a freed part to span a whole chunk (2 MiB), so this one is wider: against its own
# single-GPU run with the equal bounds, and its device peak below that run's (each rank keeps
# half the parameters and frees what it gathers).
nccl_zero3() {
  local seconds rc r why one two
  nccl_wanted dp2-zero3 || return 0
  local wide=(train --layers 2 --hidden 512 --heads 4 --kv-heads 2 --seq 32 --vocab 64 --markov-vocab 64 --batch 8
    --seed 23 --eval-batches 0 --threads 2 --steps 6 --json)
  seconds=$(nccl_bound 30)
  [ "$seconds" -eq 0 ] && { nccl_sub FAIL dp2-zero3 "not run: no time left"; return; }
  if ! why=$(ndmesh_gpu "$seconds" nccl-zero3-reference "${wide[@]}" --device "$nccl_device"); then
    nccl_sub FAIL dp2-zero3 "the single-GPU run of the 2 x 512 model: $why"
    tail_of "$logs/nccl-zero3-reference.err"
    return
  fi
  json_of nccl-zero3-reference
  seconds=$(nccl_bound "$nccl_timeout")
  [ "$seconds" -eq 0 ] && { nccl_sub FAIL dp2-zero3 "not run: no time left"; return; }
  nccl_ranks "$seconds" nccl-dp2-zero3 2 -- "$work/bin/ndmesh" "${wide[@]}" --dp 2 --zero 3 --device "$nccl_device"
  rc=$?
  if [ $rc -ne 0 ]; then
    nccl_sub FAIL dp2-zero3 "--dp 2 --zero 3 on 2 ranks: $(describe $rc "$seconds")"
    tail_of "$logs/nccl-dp2-zero3.err"
    return
  fi
  grep -E '^\{' "$logs/nccl-dp2-zero3.out" | tail -n 1 > "$logs/nccl-dp2-zero3.json"
  r=$(py nccl-dp2-zero3 equal "$logs/nccl-zero3-reference.json" "$logs/nccl-dp2-zero3.json")
  one=$(grep -o '"device_peak":[0-9.e+]*' "$logs/nccl-zero3-reference.json" | cut -d: -f2)
  two=$(grep -o '"device_peak":[0-9.e+]*' "$logs/nccl-dp2-zero3.json" | cut -d: -f2)
  if [ "$nccl_device" = cuda ] && ! python3 -c "import sys; sys.exit(0 if 0 < float('$two') < float('$one') else 1)" 2> /dev/null; then
    r="FAIL device peak ${two:-none} B with ZeRO-3 on 2 ranks, not below one GPU's ${one:-none} B; ${r#* }"
  else
    r="$r; device peak ${two:-?} B against one GPU's ${one:-?} B"
  fi
  # The gradient work space backed at once (mappable too: about two of the 2 blocks here).
  r="$r; gradient work space $(grep -o '"grad_workspace":[0-9.e+]*' "$logs/nccl-dp2-zero3.json" | cut -d: -f2) B"
  nccl_sub "${r%% *}" dp2-zero3 "--dp 2 --zero 3 (2 x 512) on 2 ranks ($([ "$nccl_device" = cuda ] && echo nccl || echo gloo)) against one GPU: ${r#* }"
}

nccl_fault() {
  local seconds timeout_s=8 job victim start elapsed rc
  nccl_wanted fault || return 0
  seconds=$(nccl_bound 40)
  [ "$seconds" -lt 20 ] && { nccl_sub FAIL fault "not run: no time left"; return; }
  NDMESH_TIMEOUT_S=$timeout_s timeout -k 5 "$seconds" env LD_LIBRARY_PATH="$libs" "${nccl_env[@]}" \
    python3 "$here/../tests/store/torchrun_env.py" --keep-going --set 0:NCCL_HOSTID=ndmesh-fault-rank0 \
    --set 1:NCCL_HOSTID=ndmesh-fault-rank1 -np 2 "$work/bin/ndmesh" "${nccl_shape[@]}" \
    --steps 100000 --dp 2 --device "$nccl_device" > "$logs/nccl-fault.out" 2> "$logs/nccl-fault.err" &
  job=$!
  for _ in $(seq 1 $((seconds * 10 - 150))); do
    grep -q '^step 3/' "$logs/nccl-fault.out" "$logs/nccl-fault.err" 2> /dev/null && break
    kill -0 "$job" 2> /dev/null || break
    sleep 0.1
  done
  if ! kill -0 "$job" 2> /dev/null || ! grep -q '^step 3/' "$logs/nccl-fault.out" "$logs/nccl-fault.err" 2> /dev/null; then
    wait "$job"
    nccl_sub FAIL fault "training did not reach step 3 before the kill ($(describe $? "$seconds"))"
    tail_of "$logs/nccl-fault.err"
    return
  fi
  # timeout -> torchrun_env.py (env execs it) -> the ranks; rank 1 is the launcher's second child.
  victim=$(pgrep -P "$(pgrep -P "$job" | head -n 1)" | sed -n 2p)
  if [ -z "$victim" ]; then
    nccl_sub FAIL fault "no rank process to kill (a bug of gpu_nccl.sh)"
    kill "$job" 2> /dev/null
    wait "$job"
    return
  fi
  kill -9 "$victim" 2> /dev/null
  start=$SECONDS
  wait "$job"
  rc=$?
  elapsed=$((SECONDS - start))
  local line
  # The line that ends the job: NCCL's watchdog names the group; a host operation on the Gloo
  # bootstrap that sees the peer's socket close first names the members ("among world ranks").
  line=$(grep -m 1 -E 'on group [a-z-]+|NCCL failed on group' "$logs/nccl-fault.err")
  [ -n "$line" ] || line=$(grep -m 1 -E 'among world ranks' "$logs/nccl-fault.err")
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$elapsed" -lt $((2 * timeout_s)) ] && [ -n "$line" ]; then
    nccl_sub PASS fault "rank 1 killed at step 3: the job ended in ${elapsed} s (limit $((2 * timeout_s)) s), exit $rc: ${line#*ndmesh: }"
  else
    nccl_sub FAIL fault "rank 1 killed at step 3: exit $rc after ${elapsed} s (limit $((2 * timeout_s)) s, non-zero, a line naming the group): ${line:-no such line}"
    tail_of "$logs/nccl-fault.err"
  fi
}

nccl_bench() {
  local seconds rc
  nccl_wanted bench || return 0
  [ "$nccl_device" = cuda ] || { nccl_sub SKIP bench "needs --device cuda"; return; }
  seconds=$(nccl_bound 40)
  [ "$seconds" -eq 0 ] && { nccl_sub FAIL bench "not run: no time left"; return; }
  nccl_ranks "$seconds" nccl-bench 2 -- "$work/bin/bench_gpu_allreduce" $((16 << 20))
  rc=$?
  if [ $rc -ne 0 ]; then
    nccl_sub FAIL bench "bench_gpu_allreduce on 2 ranks: $(describe $rc "$seconds")"
    tail_of "$logs/nccl-bench.err"
    return
  fi
  local last
  last=$(grep '"busbw_ratio"' "$logs/nccl-bench.out" | tail -n 1)
  nccl_sub PASS bench "2 ranks, 16 MiB: $(grep '"device":"cuda"' "$logs/nccl-bench.out" | tail -n 1 | grep -o '"busbw_gbps":[0-9.]*') (nccl, cuda) vs $(grep '"device":"cpu"' "$logs/nccl-bench.out" | tail -n 1 | grep -o '"busbw_gbps":[0-9.]*') (gloo, cpu), $last; loopback sockets on one GPU: not a speed claim"
  sed 's/^/    /' "$logs/nccl-bench.out" | tee -a "$summary"
}

step_nccl() {
  nccl_deadline=$((SECONDS + NCCL_STEP_BUDGET)) nccl_failed=0 nccl_passed=0 nccl_timeout=40
  local seconds rc why
  # The launch itself, no GPU needed: 2 ranks, --device cpu over Gloo (no mpirun, no Open MPI).
  seconds=$(nccl_bound 30)
  if ! nccl_wanted launch; then
    :
  elif nccl_ranks "$seconds" nccl-launch 2 -- "$work/bin/ndmesh" "${nccl_model[@]}" --dp 2 --device cpu &&
    grep -q '"losses"' "$logs/nccl-launch.out"; then
    nccl_sub PASS launch "2 ranks started as torchrun would, --dp 2 --device cpu over gloo"
  else
    nccl_sub FAIL launch "2 ranks, --dp 2 --device cpu: $(describe $? "$seconds")"
    tail_of "$logs/nccl-launch.err"
  fi
  seconds=$(nccl_bound 30)
  if ! why=$(ndmesh_gpu "$seconds" nccl-reference "${nccl_model[@]}" --device "$nccl_device"); then
    nccl_sub FAIL reference "the single-GPU run: $why"
    tail_of "$logs/nccl-reference.err"
    report FAIL nccl "no single-GPU reference, so no multi-rank GPU run was tried ($nccl_passed passed)"
    return
  fi
  json_of nccl-reference
  nccl_sub PASS reference "one GPU, $(grep -o '"losses":\[[^,]*' "$logs/nccl-reference.json" | head -n 1)..."
  nccl_layout dp2 2 -- --dp 2
  nccl_layout tp2-sp 2 -- --tp 2 --sequence-parallel
  nccl_layout pp2-1f1b 2 -- --pp 2 --micro-batch 2 --schedule 1f1b
  nccl_layout pp2-interleaved 2 -- --pp 2 --vpp 2 --micro-batch 2 --schedule interleaved
  nccl_layout pp2-zbh1 2 -- --pp 2 --micro-batch 2 --schedule zb-h1
  nccl_layout cp2 2 -- --cp 2
  nccl_layout dp2-zero2 2 -- --dp 2 --zero 2
  nccl_bf16
  nccl_zero3
  nccl_timeout=45 nccl_layout staged4 4 NDMESH_BACKEND=gloo -- --dp 2 --tp 2 --sequence-parallel
  nccl_timeout=60 nccl_layout staged8 8 NDMESH_BACKEND=gloo -- --dp 2 --pp 2 --tp 2 --micro-batch 2
  nccl_timeout=45 nccl_layout staged4-cp 4 NDMESH_BACKEND=gloo -- --dp 2 --cp 2
  nccl_fault
  nccl_bench
  if [ "$nccl_failed" -eq 0 ]; then
    report PASS nccl "$nccl_passed sub-checks passed (lines above)"
  else
    report FAIL nccl "$nccl_failed sub-checks failed, $nccl_passed passed (lines above)"
  fi
}
