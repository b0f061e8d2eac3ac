#!/usr/bin/env bash
# A save that fails (the disk full: writes beyond RLIMIT_FSIZE fail with EFBIG once SIGXFSZ
# is ignored) exits non-zero with one line, keeps the previous checkpoint whole and leaves
# no temporary `.DIR.saving` behind, on one rank and on four; a stale `.DIR.saving` (of a
# save that was killed) is named and cleared by the next save.
#   failed_save.sh <ndmesh>
set -uo pipefail
ndmesh=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=(--layers 2 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 0
  --batch 8 --seed 77 --steps 6)
mpirun=(mpirun --oversubscribe --allow-run-as-root -np 4)

# The previous checkpoint, then a save of step 4 into it that cannot write its shards.
"$ndmesh" train "${model[@]}" --until 2 --save "$tmp/ck" > /dev/null 2>&1 || fail "first save"
before=$(md5sum "$tmp/ck"/*)
failing_save() {  # <label> <train flags> <launcher words...>
  local label=$1 layout=$2
  shift 2
  # 64 KiB: the checkpoint's shard (about 170 KiB) does not fit, the output does. Only the
  # ranks get the limit; MPI keeps its own files small (no shared-memory transport, PMIx's
  # hash store).
  OMPI_MCA_btl=self,tcp PMIX_MCA_gds=hash "$@" bash -c 'trap "" XFSZ; ulimit -f 64; exec "$@"' limited \
    "$ndmesh" train "${model[@]}" --until 4 $layout --load "$tmp/ck" --save "$tmp/ck" > "$tmp/out.txt" 2>&1
  local rc=$?
  [ "$rc" -ne 0 ] || fail "$label: a save beyond the file size limit succeeded"
  grep -q "\[checkpoint\].*saving '$tmp/ck'\|\[checkpoint\].*$tmp/.ck.saving" "$tmp/out.txt" ||
    fail "$label: no line naming the failed save: $(tail -n 5 "$tmp/out.txt")"
  [ -e "$tmp/.ck.saving" ] && fail "$label: the failed save left $tmp/.ck.saving: $(ls -la "$tmp/.ck.saving")"
  [ "$(md5sum "$tmp/ck"/*)" = "$before" ] || fail "$label: the previous checkpoint changed"
  "$ndmesh" checkpoint inspect "$tmp/ck" --verify | grep -q "^step 2 " || fail "$label: the previous checkpoint does not verify"
  echo "ok: $label: $(grep -m1 '\[checkpoint\]' "$tmp/out.txt")"
}
failing_save "one rank" ""
failing_save "dp 2 x tp 2" "--dp 2 --tp 2" "${mpirun[@]}" env NDMESH_TIMEOUT_S=60
# A stale temporary directory, as a killed save leaves it: the next save names and clears it.
mkdir -p "$tmp/.ck.saving" && echo leftover > "$tmp/.ck.saving/shard-pp000-tp000.bin"
"$ndmesh" train "${model[@]}" --until 4 --load "$tmp/ck" --save "$tmp/ck" > "$tmp/out.txt" 2>&1 ||
  fail "save over a stale temporary directory: $(tail -n 3 "$tmp/out.txt")"
grep -q "removing '$tmp/.ck.saving', left behind by a save that was interrupted" "$tmp/out.txt" ||
  fail "the stale temporary directory was not named: $(cat "$tmp/out.txt")"
[ -e "$tmp/.ck.saving" ] && fail "the stale temporary directory is still there"
[ "$(jq .step "$tmp/ck/manifest.json")" -eq 4 ] || fail "the new checkpoint is not in place"
echo PASS
