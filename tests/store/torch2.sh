#!/usr/bin/env bash
# ndmesh and a real PyTorch 2.x, both directions, and torchrun 2.x itself. Skipped (exit
# 77, with the reason) when <python> is empty or imports no torch >= 2.
#  1. ndmesh ranks rendezvous at a 2.x TCPStore as torchrun's agent serves it
#     (torchrun_env.py --agent-store with that python); the ranks name the generation.
#  2. A 2.x client talks to ndmesh's store (torch2_client.py, as rank 1 of a job whose
#     rank 0 serves the store, before rank 1's ndmesh starts).
#  3. torchrun --nproc_per_node=4 --no-python ndmesh train --dp 2 --tp 2.
# Every job must reproduce the serial run (compare_runs.py).
#   torch2.sh <ndmesh> <python with torch 2.x or "">
set -uo pipefail
ndmesh=$1
python=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
if [ -z "$python" ]; then
  echo "SKIPPED: no python with PyTorch 2.x (configure with -DNDMESH_TORCH2_PYTHON=<venv>/bin/python after pip install torch)"
  exit 77
fi
version=$("$python" -c 'import torch, torch.distributed as d; assert d.is_available(); print(torch.__version__)' 2> /dev/null)
case "$version" in
  [2-9].*) ;;
  *) echo "SKIPPED: $python imports no torch >= 2 (${version:-none})"; exit 77 ;;
esac
echo "PyTorch $version at $python"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=(--layers 2 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 0
  --batch 8 --steps 4 --seed 616 --json)
"$ndmesh" train "${model[@]}" 2> /dev/null | tail -n 1 > "$tmp/serial.json" || fail "serial run"
compare() { "$python" "$here/compare_runs.py" "$tmp/serial.json" "$1" || fail "$2 differs from the serial run"; }

# 1. ndmesh clients, torch 2.x's agent store.
NDMESH_LOG=debug timeout -k 5 120 "$python" "$here/torchrun_env.py" --agent-store -np 4 \
  "$ndmesh" train "${model[@]}" --dp 2 --tp 2 > "$tmp/agent.out" 2> "$tmp/agent.err" ||
  fail "ranks at torch $version's agent store: $(grep -v '^\[debug\]' "$tmp/agent.err" | tail -n 3)"
met=$(grep -c "ranks met at .* (c10d protocol v2)" "$tmp/agent.err")
[ "$met" -ge 1 ] || fail "no rank says it met at a v2 store: $(grep 'ranks met' "$tmp/agent.err" | head -n 2)"
grep "^{" "$tmp/agent.out" | tail -n 1 > "$tmp/agent.json"
echo -n "1. ndmesh ranks at torch $version's TCPStore (the agent's, $met ranks said v2): "
compare "$tmp/agent.json" "the job at torch's agent store"

# 2. torch 2.x's client, ndmesh's store (rank 0), before rank 1 joins with --dp 2.
timeout -k 5 120 "$ndmesh" launch --store --no-tag -n 2 -- bash -c \
  '[ "$RANK" = 0 ] || "$1" "$2" >&2 || exit 3; shift 2; exec "$@"' _ "$python" "$here/torch2_client.py" \
  "$ndmesh" train "${model[@]}" --dp 2 > "$tmp/client.out" 2> "$tmp/client.err" ||
  fail "torch $version's client against ndmesh's store: $(tail -n 5 "$tmp/client.err")"
grep "client against ndmesh's store" "$tmp/client.err" || fail "the client did not report: $(tail -n 3 "$tmp/client.err")"
tail -n 1 "$tmp/client.out" > "$tmp/client.json"
echo -n "2. the job after the client: "
compare "$tmp/client.json" "the job whose store torch's client used"

# 3. torchrun 2.x itself.
torchrun=$(dirname "$python")/torchrun
[ -x "$torchrun" ] || torchrun=$(command -v torchrun) || fail "no torchrun beside $python or on PATH"
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
timeout -k 5 180 "$torchrun" --nproc_per_node=4 --master_addr 127.0.0.1 --master_port "$port" --no-python \
  "$ndmesh" train "${model[@]}" --dp 2 --tp 2 > "$tmp/torchrun.out" 2> "$tmp/torchrun.err" ||
  fail "torchrun $version: $(tail -n 5 "$tmp/torchrun.err")"
grep "^{" "$tmp/torchrun.out" | tail -n 1 > "$tmp/torchrun.json"
echo -n "3. torchrun $version --nproc_per_node=4 --no-python ndmesh train --dp 2 --tp 2: "
compare "$tmp/torchrun.json" "torchrun's job"
echo PASS
