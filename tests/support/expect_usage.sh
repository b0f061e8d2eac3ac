# Shared by the command-line tests (sourced after they define `tmp` and `fail`).
# expect_usage <needle> <command...>: the command exits 2 (bad input) and its output says the
# needle. With USAGE_LINES=N set, the output is also at most N lines (one line: the error alone).
expect_usage() {
  local needle=$1
  shift
  set +e
  "$@" > "$tmp/out.txt" 2>&1
  local rc=$?
  set -e
  [ "$rc" -eq 2 ] || fail "'$*' exited $rc, expected 2: $(cat "$tmp/out.txt")"
  if [ -n "${USAGE_LINES:-}" ]; then
    [ "$(wc -l < "$tmp/out.txt")" -le "$USAGE_LINES" ] ||
      fail "'$*' printed more than $USAGE_LINES line(s): $(cat "$tmp/out.txt")"
  fi
  grep -qF -- "$needle" "$tmp/out.txt" || fail "'$*' did not say '$needle': $(cat "$tmp/out.txt")"
}
