"""Reads the event files of `ndmesh train --tensorboard DIR` with TensorBoard's own reader
(EventAccumulator, from the tensorboard package of PyPI) and compares every scalar with
the metrics file of the same run: the same steps and the same numbers (as float32).
usage: tensorboard_reader.py DIR METRICS.jsonl"""
import json
import math
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

tb_dir, metrics = sys.argv[1], sys.argv[2]
rows = [json.loads(line) for line in open(metrics)]
acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
want_tags = {"loss", "lr", "grad_norm", "tokens_per_second", "peak_memory_bytes", "val_loss"}
assert tags == want_tags, f"scalar tags {sorted(tags)}, want {sorted(want_tags)}"
checked = 0
for tag in sorted(tags):
    events = acc.Scalars(tag)
    want = [(r["step"], r[tag]) for r in rows if r.get(tag) is not None]
    got = [(e.step, e.value) for e in events]
    assert [s for s, _ in got] == [s for s, _ in want], f"{tag}: steps {[s for s, _ in got]} vs {[s for s, _ in want]}"
    for (step, a), (_, b) in zip(got, want):
        assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-30), f"{tag} at step {step}: TensorBoard {a}, metrics {b}"
        checked += 1
print(f"TensorBoard read {checked} scalars ({len(tags)} tags) equal to the metrics file")
