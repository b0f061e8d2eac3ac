#!/usr/bin/env bash
# ndmesh launch: the mpirun command it builds, its errors, and a real 2-rank run.
set -uo pipefail
# A rank that hangs ends the job in a minute, well inside the test's timeout.
export NDMESH_TIMEOUT_S=${NDMESH_TIMEOUT_S:-60}
ndmesh=$1
fail() { echo "FAIL: $*"; exit 1; }

# More ranks than cores: --oversubscribe; as root: --allow-run-as-root; tagged output.
cmd=$("$ndmesh" launch -n 64 --dry-run -- prog --flag 1) || fail "dry run exited $?"
echo "$cmd"
[[ "$cmd" == *"mpirun -n 64 "* ]] || fail "no '-n 64': $cmd"
[[ "$cmd" == *"--oversubscribe"* ]] || fail "64 ranks on $(nproc) cores without --oversubscribe"
[[ "$cmd" == *"--tag-output"* ]] || fail "output not rank-tagged"
[[ "$cmd" == *" prog --flag 1" ]] || fail "program not last: $cmd"
if [ "$(id -u)" -eq 0 ]; then
  [[ "$cmd" == *"--allow-run-as-root"* ]] || fail "root without --allow-run-as-root"
else
  [[ "$cmd" != *"--allow-run-as-root"* ]] || fail "--allow-run-as-root when not root"
fi
cmd=$("$ndmesh" launch -n 2 --no-tag --dry-run -- prog) || fail "dry run exited $?"
[[ "$cmd" != *"--tag-output"* ]] || fail "--no-tag still tags: $cmd"
# One rank fits the cores: no --oversubscribe.
cmd=$("$ndmesh" launch -n 1 --dry-run -- prog) || fail "dry run exited $?"
[[ "$cmd" != *"--oversubscribe"* ]] || fail "--oversubscribe for 1 rank: $cmd"
# mpirun options between two `--`, and NDMESH_* variables forwarded.
cmd=$(NDMESH_TIMEOUT_S=7 "$ndmesh" launch -n 2 --dry-run -- --bind-to none -- prog -- x) || fail "exit $?"
echo "$cmd"
[[ "$cmd" == *"-x NDMESH_TIMEOUT_S --bind-to none prog -- x" ]] || fail "options or program misplaced: $cmd"

# No mpirun: a clear error, exit 2.
out=$(PATH=/nonexistent "$ndmesh" launch -n 2 -- prog 2>&1)
rc=$?
echo "$out"
[ "$rc" -eq 2 ] || fail "missing mpirun: exit $rc, expected 2"
[[ "$out" == *"mpirun not found on PATH"*"apt-get install openmpi-bin"* ]] || fail "unclear message: $out"
# No program: exit 2.
out=$("$ndmesh" launch -n 2 2>&1)
[ $? -eq 2 ] || fail "no program: expected exit 2"
[[ "$out" == *"no program to launch"* ]] || fail "unclear message: $out"
# A program that is not there: one line naming it, exit 2 (not mpirun's block and 132).
out=$("$ndmesh" launch -n 2 -- ./no-such-program 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "missing program: exit $rc, expected 2: $out"
[ "$(echo "$out" | wc -l)" -eq 1 ] || fail "missing program: more than one line: $out"
[[ "$out" == *"./no-such-program: no such program"* ]] || fail "unclear message: $out"
out=$("$ndmesh" launch -n 2 -- no-such-program-on-path 2>&1)
[ $? -eq 2 ] || fail "missing program on PATH: expected exit 2"
[[ "$out" == *"no-such-program-on-path: no such program on PATH"* ]] || fail "unclear message: $out"
# mpirun's spelling -np is --np (CLI11 alone reads it as -n p).
cmd=$("$ndmesh" launch -np 3 --dry-run -- prog -np 5) || fail "-np: exit $?"
[[ "$cmd" == *"mpirun -n 3 "*" prog -np 5" ]] || fail "-np not taken as --np, or rewritten after --: $cmd"
out=$("$ndmesh" launch -n 0 -- prog 2>&1)
[ $? -eq 2 ] || fail "-n 0: expected exit 2"
[[ "$out" == *"-n 0 must be at least 1"* ]] || fail "unclear message: $out"

# A real run: two ranks, rank-tagged output, the program's exit status. --tp 2 on 2 ranks:
# dp, pp, cp have 2 groups of one each, tp 1 group of two: 7 groups.
out=$("$ndmesh" launch -n 2 -- "$ndmesh" check --tp 2 2>&1) || fail "launch of check exited $?: $out"
echo "$out"
[[ "$out" == *"[1,0]<stdout>:verified 7 groups: all match the mesh"* ]] || fail "no tagged summary"
"$ndmesh" launch -n 2 -- "$ndmesh" check --tp 4 >/dev/null 2>&1 && fail "a failing program must fail the launch"
echo PASS
