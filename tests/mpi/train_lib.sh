# Shared by the train_*.sh tests (sourced: `source "$(dirname "$0")/train_lib.sh" "$@"`).
# Arguments of the test: <mpirun command...> <path to ndmesh>. Sets ndmesh, mpirun (each
# launch bounded in time, under `timeout`) and tmp (a folder removed at exit) and defines
# fail, max_rel, run_diffs, expect_same and expect_train_usage.
set -euo pipefail
ndmesh=${*: -1}
# Every launch is bounded on its own (TRAIN_RUN_TIMEOUT_S, default 300 s), so a run that
# hangs fails with its layout's name (the callers print it with the exit status: 124 is a
# communication timeout or this bound) instead of the whole ctest timing out.
mpirun=(timeout -k 10 "${TRAIN_RUN_TIMEOUT_S:-300}" "${@:1:$#-1}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The equivalence bounds (relative to the serial run of the same flags), used by every
# train_*.sh test through expect_same:
#  - every step's loss: 1e-5;
#  - step 1's gradient norm (both runs start from the same weights): 1e-5. Losses alone
#    cannot see a gradient scaled by a constant (a missing or double 1/dp): AdamW's update
#    is nearly invariant to it and so is clipping; the norm is not;
#  - the gradient norms of later steps: GRAD_BOUND. AdamW turns rounding noise in
#    near-zero gradients into sign-sized updates (m / (sqrt(v) + eps)), so the weights, and
#    with them the norms, drift apart faster than the losses. Measured over every layout of
#    train_{dp,tp,pp,cp,4d,recompute,checkpoint}.sh (108 comparisons): step-1 norms within
#    3.1e-8, losses within 2.8e-7, later norms within 1.2e-5 (pp2 1f1b, 3 micro-batches;
#    7.4e-6 dp2 x pp2 x tp2 zb-h1 untied).
# ARCHITECTURE.md's 1e-4 for 4D is the bound of the later norms here for every layout.
LOSS_BOUND=1e-5
GRAD1_BOUND=1e-5
GRAD_BOUND=1e-4

# max_rel <a.json> <b.json> [field...]: the largest relative difference between two runs'
# per-step losses (and the named scalar fields, e.g. final_loss), relative to the first.
max_rel() {
  local a=$1 b=$2 fields="" f
  shift 2
  for f in "$@"; do fields+=" + [.$f]"; done
  jq -n --slurpfile a "$a" --slurpfile b "$b" \
    "[(\$a[0] | .losses$fields), (\$b[0] | .losses$fields)] | transpose
     | map((.[0] - .[1]) / .[0] | if . < 0 then -. else . end) | max"
}

# run_diffs <a.json> <b.json> <k> [field...]: "L G1 G", the largest relative differences
# of b's losses (and the named fields), of its first gradient norm and of its later
# gradient norms against a's from step k + 1 on. k > 0: b resumed after step k from a
# checkpoint of another run, so its first norm counts with the later ones (G1 is 0).
run_diffs() {
  local a=$1 b=$2 k=$3 fields="" f
  shift 3
  for f in "$@"; do fields+=" + [.$f]"; done
  jq -r -n --slurpfile a "$a" --slurpfile b "$b" --argjson k "$k" '
    def rel: map((.[0] - .[1]) / .[0] | if . < 0 then -. else . end) | (max // 0);
    ($a[0].grad_norms[$k:] | length) as $n
    | if ($b[0].grad_norms | length) != $n or ($b[0].losses | length) != $n then "length-mismatch"
      else
        ([($a[0] | .losses[$k:]'"$fields"'), ($b[0] | .losses'"$fields"')] | transpose | rel) as $l
        | ([$a[0].grad_norms[$k:], $b[0].grad_norms] | transpose) as $g
        | (if $k == 0 then ($g[:1] | rel) else 0 end) as $g1
        | (if $k == 0 then ($g[1:] | rel) else ($g | rel) end) as $gl
        | "\($l) \($g1) \($gl)"
      end'
}

# expect_same <what> <a.json> <b.json> [--from k] [field...]: b reproduces a (the serial
# run) within the bounds above; prints the three differences; fails naming the one out of
# bounds.
expect_same() {
  local what=$1 a=$2 b=$3 k=0 d l g1 g
  shift 3
  if [ "${1:-}" = --from ]; then
    k=$2
    shift 2
  fi
  d=$(run_diffs "$a" "$b" "$k" "$@") || fail "$what: cannot compare $a and $b"
  [ "$d" != length-mismatch ] || fail "$what: the runs have different numbers of steps or gradient norms"
  read -r l g1 g <<< "$d"
  echo "$what: max relative difference: losses $l, step-1 gradient norm $g1, later gradient norms $g"
  awk -v d="$l" -v b=$LOSS_BOUND 'BEGIN{exit !(d < b)}' || fail "$what: losses differ by $l (bound $LOSS_BOUND)"
  awk -v d="$g1" -v b=$GRAD1_BOUND 'BEGIN{exit !(d < b)}' ||
    fail "$what: the step-1 gradient norm differs by $g1 (bound $GRAD1_BOUND)"
  awk -v d="$g" -v b=$GRAD_BOUND 'BEGIN{exit !(d < b)}' ||
    fail "$what: later gradient norms differ by $g (bound $GRAD_BOUND)"
}

# expect_train_usage <needle> <ranks> <flags...>: `ndmesh train <flags>` on that many ranks
# exits 2 at once and says the needle.
expect_train_usage() {
  local needle=$1 np=$2
  shift 2
  set +e
  timeout 60 "${mpirun[@]}" -np "$np" "$ndmesh" train "$@" > "$tmp/out.txt" 2>&1
  local rc=$?
  set -e
  [ "$rc" -eq 2 ] || fail "'$*' on $np ranks exited $rc, expected 2: $(cat "$tmp/out.txt")"
  grep -qF -- "$needle" "$tmp/out.txt" || fail "'$*' did not say '$needle': $(cat "$tmp/out.txt")"
}
