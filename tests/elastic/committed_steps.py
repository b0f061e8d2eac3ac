#!/usr/bin/env python3
"""The committed steps of an elastic run, from its replicas' `--json` outputs.

Usage: committed_steps.py <steps> <replica output>...

Checks that every step 1..steps was committed, that no replica process printed a step twice
or went back (a healed replica may jump ahead), and that every replica that committed a step
has the same loss, gradient norm and parameter hash for it. Prints the union as one run's
JSON ({"losses", "grad_norms", "replicas"}: replicas is the generation's size per step) for
tests/support/compare_runs.sh to compare with the serial run. Exits 1 with the reason."""
import json
import pathlib
import sys


def main(steps, paths):
    by_step = {}
    for path in paths:
        lines = pathlib.Path(path).read_text().splitlines()
        mine = [json.loads(line) for line in lines if line.startswith('{"elastic_step"')]
        got = [x["elastic_step"] for x in mine]
        if any(b <= a for a, b in zip(got, got[1:])):
            sys.exit(f"{path}: steps {got} repeat or go back")
        for x in mine:
            by_step.setdefault(x["elastic_step"], []).append(x)
    missing = [s for s in range(1, steps + 1) if s not in by_step]
    if missing or len(by_step) != steps:
        sys.exit(f"steps never committed: {missing}; committed: {sorted(by_step)}")
    for s, rows in sorted(by_step.items()):
        if len({(x["loss"], x["grad_norm"], x["param_hash"]) for x in rows}) != 1:
            sys.exit(f"step {s}: replicas disagree on loss, gradient norm or parameter hash: {rows}")
    first = [by_step[s][0] for s in range(1, steps + 1)]
    print(json.dumps({"losses": [x["loss"] for x in first], "grad_norms": [x["grad_norm"] for x in first],
                      "replicas": [x["replicas"] for x in first]}))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(int(sys.argv[1]), sys.argv[2:])
