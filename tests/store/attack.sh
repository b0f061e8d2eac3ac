#!/usr/bin/env bash
# The store of a running `ndmesh launch --store` job under attack (tests/store/attack.py,
# loopback only): the 22-byte MULTI_SET of 2^26 keys and a client that never reads its
# replies are dropped, rank 0 stays small, and the job still reproduces the serial run.
# Ranks 1-3 start 3 s late, so the attacks reach the store while rank 0 waits for them
# at the rendezvous (a server stalled by the slow client would never let them meet).
#   attack.sh <ndmesh> <python3>
set -uo pipefail
ndmesh=$1
python=$2
here=$(cd "$(dirname "$0")" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
# Under AddressSanitizer (make sanitize) freed blocks wait in a quarantine of 256 MiB before
# their memory is reused: the attack's freed 1 MiB replies then fill rank 0's resident set
# whatever the store does (198 MiB measured against 48 MiB in the Release build). A small
# quarantine keeps the bound below about the store.
if [ -n "${ASAN_OPTIONS:-}" ]; then export ASAN_OPTIONS="$ASAN_OPTIONS:quarantine_size_mb=16"; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=(--layers 2 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 0
  --batch 8 --steps 3 --seed 515 --json)
"$ndmesh" train "${model[@]}" 2> /dev/null | tail -n 1 > "$tmp/serial.json" || fail "serial run"
NDMESH_INIT_TIMEOUT_S=30 timeout -k 5 90 "$ndmesh" launch --store --no-tag -n 4 -- \
  bash -c '[ "$RANK" = 0 ] || sleep 3; exec "$0" "$@"' "$ndmesh" train "${model[@]}" --dp 2 --tp 2 \
  > "$tmp/par.out" 2> "$tmp/err" &
job=$!
timeout -k 5 60 "$python" "$here/attack.py" "$job" > "$tmp/attack" 2>&1
attacked=$?
wait "$job"
rc=$?
cat "$tmp/attack"
[ "$attacked" -eq 0 ] || fail "the store did not drop an attacker"
[ "$rc" -eq 0 ] || fail "the job under attack exited $rc: $(tail -n 3 "$tmp/err")"
tail -n 1 "$tmp/par.out" > "$tmp/par.json"
"$python" "$here/compare_runs.py" "$tmp/serial.json" "$tmp/par.json" || fail "the job under attack differs from the serial run"
peak=$(sed -n 's/^peak_rss_mib //p' "$tmp/attack")
[ -n "$peak" ] && [ "$peak" -lt 200 ] || fail "rank 0 grew to ${peak:-?} MiB resident (bound 200 MiB)"
echo "rank 0's peak resident memory under attack: $peak MiB"
echo PASS
