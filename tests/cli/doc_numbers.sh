#!/usr/bin/env bash
# The doc test's comparison of shown and printed lines can fail: a step count, a shape, a
# group member or a plan figure that differs is a mismatch, a loss within 2% and a timing are
# not (doc_commands.py's docstring gives the rules).
#   doc_numbers.sh <ndmesh> (unused)
exec python3 - "$(dirname "$0")" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import doc_commands as d

cases = [  # (shown, printed, must match)
    ("step 100/1000 loss 1.7509 lr 0.0003 grad_norm 0.470 tok/s 21821 eta 0:29",
     "step 100/100 loss 1.7509 lr 0.0003 grad_norm 0.470 tok/s 21821 eta 0:29", False),  # another --steps
    ("step 100/100 loss 1.7509 lr 0.0003 grad_norm 0.470 tok/s 21821 eta 0:29",
     "step 100/100 loss 1.7512 lr 0.0003 grad_norm 0.475 tok/s 999 eta 1:02", True),  # rounding, timing
    ("final loss 1.7236 (mean of 8 evaluation batches)", "final loss 1.9012 (mean of 8 evaluation batches)", False),
    ("final loss 1.7236 (mean of 8 evaluation batches)", "final loss 1.7236 (mean of 9 evaluation batches)", False),
    ("1000 steps in 32.4 s, 31638 tokens/s", "1000 steps in 3.1 s, 999 tokens/s", True),
    ("   1   2   4   4   16 zb-h1   15.709    534.0k", "   1   2   4   4   16 zb-h1   15.709    634.0k", False),
    ("   1   2   4   4   16 zb-h1   15.709    534.0k", "   1   2   4   4   16 zb-h1   17.709    534.0k", False),
    ('{"steps":200,"parameters":97920}', '{"steps":50,"parameters":97920}', False),
    ("      0: 0 8  nodes 0..1", "      0: 0 9  nodes 0..1", False),
    ("tensors: 52 (189568 parameters)", "tensors: 52 (189568 parameters)", True),
    ("loss 3.4970 lr 3e-05", "loss 3.4970 lr 3e-04", False),
]
bad = 0
for shown, printed, want in cases:
    got = d.contains_in_order([shown], [printed]) is None
    if got != want:
        bad += 1
        print("FAIL: %r against %r: %s, want %s" % (shown, printed, "match" if got else "mismatch",
                                                 "match" if want else "mismatch"))
print("doc numbers: %d cases, %d wrong" % (len(cases), bad))
sys.exit(1 if bad else 0)
PY
