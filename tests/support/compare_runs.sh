# The comparison of a run with the serial run, shared by every equivalence test
# (tests/mpi/train_*.sh through train_lib.sh, tests/store, tests/multinode, scripts/matrix_4d.sh).
# Sourced; needs jq and a `fail` function. Both runs must have produced their numbers: a run
# whose JSON is missing, empty, cut short or holds no numbers fails the comparison (a
# comparison of two empty lists would otherwise pass; test_compare_runs.sh breaks the
# serial run in each such way and expects each comparison to fail).
#
# The equivalence bounds (relative to the serial run of the same flags):
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
# The design's 1e-4 for 4D layouts is the bound of the later norms here for every layout.
LOSS_BOUND=1e-5
GRAD1_BOUND=1e-5
GRAD_BOUND=1e-4

# run_numbers <run.json>: "ok N" when the file's last JSON object has N >= 1 losses and
# as many gradient norms, all numbers; otherwise a word saying what is wrong.
run_numbers() {
  jq -r -n --slurpfile r "$1" '
    $r[0] as $x
    | if $x == null then "no JSON"
      elif ($x | type) != "object" then "not a JSON object"
      elif ($x.losses | type) != "array" or ($x.losses | length) == 0 then "no losses"
      elif ($x.grad_norms | type) != "array" then "no gradient norms"
      elif ($x.grad_norms | length) != ($x.losses | length) then "\($x.losses | length) losses but \($x.grad_norms | length) gradient norms"
      elif ([$x.losses[], $x.grad_norms[]] | all(type == "number")) | not then "a loss or norm that is not a number"
      else "ok \($x.losses | length)" end' 2> /dev/null || echo "not JSON"
}

# expect_numbers <what> <run.json> [N]: fails unless the run produced its numbers (N steps).
expect_numbers() {
  local what=$1 r n
  r=$(run_numbers "$2")
  [[ $r == ok* ]] || fail "$what: $r in $2${3:+ (expected $3 steps)}"
  [ -z "${3:-}" ] || [ "${r#ok }" = "$3" ] || fail "$what: ${r#ok } steps in $2, expected $3"
}

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
# bounds, or the run that has no numbers to compare.
expect_same() {
  local what=$1 a=$2 b=$3 k=0 d l g1 g
  shift 3
  if [ "${1:-}" = --from ]; then
    k=$2
    shift 2
  fi
  expect_numbers "$what: the reference run" "$a"
  expect_numbers "$what: the run" "$b"
  d=$(run_diffs "$a" "$b" "$k" "$@") || fail "$what: cannot compare $a and $b"
  [ "$d" != length-mismatch ] || fail "$what: the runs have different numbers of steps or gradient norms"
  read -r l g1 g <<< "$d"
  [[ $l =~ ^[0-9.e+-]+$ && $g1 =~ ^[0-9.e+-]+$ && $g =~ ^[0-9.e+-]+$ ]] ||
    fail "$what: the comparison gave no numbers ('$d')"
  echo "$what: max relative difference: losses $l, step-1 gradient norm $g1, later gradient norms $g"
  awk -v d="$l" -v b=$LOSS_BOUND 'BEGIN{exit !(d < b)}' || fail "$what: losses differ by $l (bound $LOSS_BOUND)"
  awk -v d="$g1" -v b=$GRAD1_BOUND 'BEGIN{exit !(d < b)}' ||
    fail "$what: the step-1 gradient norm differs by $g1 (bound $GRAD1_BOUND)"
  awk -v d="$g" -v b=$GRAD_BOUND 'BEGIN{exit !(d < b)}' ||
    fail "$what: later gradient norms differ by $g (bound $GRAD_BOUND)"
}
