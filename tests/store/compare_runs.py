#!/usr/bin/env python3
"""compare_runs.py <serial.json> <parallel.json>: the parallel run reproduces the serial one.

Both files hold `ndmesh train --json`'s last line. Fails (exit 1, one line) when either run
gave no numbers, the step counts differ, or a bound is passed: every loss 1e-5, step 1's
gradient norm 1e-5, later norms 1e-4 (relative to the serial run, as tests/mpi/train_lib.sh).
Prints the three largest differences."""
import json
import sys


def load(path):
    try:
        with open(path) as f:
            run = json.loads(f.read().strip().splitlines()[-1])
        losses, norms = run["losses"], run["grad_norms"]
    except (OSError, ValueError, IndexError, KeyError, TypeError) as e:
        sys.exit(f"FAIL: {path} holds no run's numbers ({e})")
    if not losses or len(losses) != len(norms):
        sys.exit(f"FAIL: {path} holds {len(losses)} losses and {len(norms)} gradient norms")
    return losses, norms


def rel(pairs):
    return max((abs((a - b) / a) for a, b in pairs), default=0.0)


(sl, sn), (pl, pn) = load(sys.argv[1]), load(sys.argv[2])
if len(sl) != len(pl):
    sys.exit(f"FAIL: {len(sl)} serial steps, {len(pl)} parallel steps")
loss, grad1, grad = rel(zip(sl, pl)), rel(zip(sn[:1], pn[:1])), rel(zip(sn[1:], pn[1:]))
print(f"{len(sl)} steps: losses within {loss:.3g}, step-1 gradient norm within {grad1:.3g}, "
      f"later gradient norms within {grad:.3g}")
if loss > 1e-5 or grad1 > 1e-5 or grad > 1e-4:
    sys.exit("FAIL: beyond the bounds (losses 1e-5, step-1 norm 1e-5, later norms 1e-4)")
