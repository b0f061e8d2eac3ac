#!/usr/bin/env bash
# Watching a run (docs/watching.md): every learning-rate schedule's rates against its
# formula (computed here independently), a resume in the middle of a WSD decay equal to the
# uninterrupted run (losses and rates bit for bit), the metrics file appended on resume from
# an earlier checkpoint (the lines past it dropped), background checkpoints (--save-every)
# that change no loss and --keep, --log-every, mfu with --hardware, `ndmesh plot` writing a
# valid SVG (and a PNG through rsvg-convert), and bad values refused with one line.
set -euo pipefail
ndmesh=${1:?usage: train_watch.sh path/to/ndmesh}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
small=(--layers 1 --hidden 32 --heads 2 --kv-heads 1 --seq 16 --batch 4 --markov-vocab 16 --threads 1
  --eval-batches 2)

# Each schedule's learning rates, step by step, against its formula.
for sched in cosine linear wsd constant; do
  "$ndmesh" train "${small[@]}" --steps 40 --warmup 5 --lr 0.01 --min-lr-ratio 0.1 --decay-fraction 0.25 \
    --lr-schedule "$sched" --metrics "$tmp/$sched.jsonl" > /dev/null || fail "--lr-schedule $sched"
  python3 - "$tmp/$sched.jsonl" "$sched" <<'PY' || fail "--lr-schedule $sched: the rates are not the formula's"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
kind, lr, warmup, steps, floor, frac = sys.argv[2], 0.01, 5, 40, 0.001, 0.25
def want(i):  # step i, 0-based
    if i < warmup:
        return lr * (i + 1) / warmup
    p = min(max((i - warmup) / (steps - warmup), 0.0), 1.0)
    if kind == "cosine":
        return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * p))
    if kind == "linear":
        return floor + (lr - floor) * (1 - p)
    if kind == "constant":
        return lr
    start = max(warmup, steps - round(frac * steps))  # wsd: constant, then linear over the last quarter
    if i < start:
        return lr
    return floor + (lr - floor) * (1 - min((i + 1 - start) / (steps - start), 1.0))
assert [r["step"] for r in rows] == list(range(1, 41)), [r["step"] for r in rows]
bad = [(r["step"], r["lr"], want(r["step"] - 1)) for r in rows if abs(r["lr"] - want(r["step"] - 1)) > 1e-12 * lr]
assert not bad, f"{kind}: (step, lr, formula) {bad[:5]}"
if kind == "wsd":
    assert rows[29]["lr"] == lr and rows[30]["lr"] < lr and abs(rows[39]["lr"] - floor) < 1e-15, \
        "the decay is steps 31..40, down to lr_min"
print(f"{kind}: 40 rates match the formula")
PY
done
grep -q "train: batch 4, steps 1..1, lr 0.01 (warmup 5, wsd: constant to step 30, then linear to 0.1x)" <(
  "$ndmesh" train "${small[@]}" --steps 40 --warmup 5 --lr 0.01 --decay-fraction 0.25 --lr-schedule wsd --until 1) ||
  fail "the header does not describe the wsd schedule"

# A resume in the middle of the WSD decay (step 35 of 31..40) equals the uninterrupted run;
# the background checkpoints (--save-every 5, --keep 2) change no loss.
wsd=("${small[@]}" --steps 40 --warmup 5 --lr 0.01 --lr-schedule wsd --decay-fraction 0.25 --json)
"$ndmesh" train "${wsd[@]}" --metrics "$tmp/full.jsonl" | tail -n 1 > "$tmp/full.json" || fail "the uninterrupted run"
"$ndmesh" train "${wsd[@]}" --until 35 --save "$tmp/ck" --save-every 5 --keep 2 --metrics "$tmp/part.jsonl" \
  | tail -n 1 > "$tmp/first.json" || fail "the run to step 35"
jq -e -n --slurpfile a "$tmp/full.json" --slurpfile b "$tmp/first.json" \
  '$a[0].losses[:35] == $b[0].losses and $a[0].lrs[:35] == $b[0].lrs' > /dev/null ||
  fail "background checkpoints changed the losses of steps 1..35"
[ "$(jq .step "$tmp/ck/manifest.json")" -eq 35 ] || fail "the final checkpoint is not step 35"
[ "$(jq .step "$tmp/ck.step-000030/manifest.json")" -eq 30 ] || fail "--keep 2 did not keep step 30 as ck.step-000030"
ls "$tmp" | grep -q '^ck.step-0000[12]' && fail "--keep 2 left older checkpoints: $(ls "$tmp")"
[ -e "$tmp/.ck.saving" ] && fail "a temporary checkpoint directory was left behind"
jq -e '.lr_schedule == {"name": "wsd", "lr": 0.01, "warmup": 5, "steps": 40, "min_lr_ratio": 0.1,
  "decay_fraction": 0.25}' "$tmp/ck/manifest.json" > /dev/null || fail "the manifest does not record the schedule"
"$ndmesh" train "${wsd[@]}" --load "$tmp/ck" | tail -n 1 > "$tmp/rest.json" || fail "the resume at step 35"
jq -e -n --slurpfile a "$tmp/full.json" --slurpfile b "$tmp/rest.json" \
  '$b[0].first_step == 36 and $a[0].losses[35:] == $b[0].losses and $a[0].lrs[35:] == $b[0].lrs' > /dev/null ||
  fail "resumed in the WSD decay: $(jq -c '{losses, lrs}' "$tmp/rest.json") vs $(jq -c '{losses: .losses[35:], lrs: .lrs[35:]}' "$tmp/full.json")"
# From the background checkpoint of step 30 (kept by --keep): the metrics file drops steps
# 31..35 and is appended to, steps 1..40 once each, with the uninterrupted run's numbers.
"$ndmesh" train "${wsd[@]}" --load "$tmp/ck.step-000030" --metrics "$tmp/part.jsonl" | tail -n 1 > "$tmp/rest30.json" ||
  fail "the resume at step 30"
jq -e -n --slurpfile a "$tmp/full.json" --slurpfile b "$tmp/rest30.json" '$a[0].losses[30:] == $b[0].losses' > /dev/null ||
  fail "resumed from the background checkpoint of step 30: other losses"
jq -e -n --slurpfile a "$tmp/full.jsonl" --slurpfile b "$tmp/part.jsonl" \
  '($a | map([.step, .loss, .lr])) == ($b | map([.step, .loss, .lr]))' > /dev/null ||
  fail "the appended metrics file is not the uninterrupted run's: steps $(jq -c -s 'map(.step)' "$tmp/part.jsonl")"
# Another schedule than the checkpoint's is said, not refused.
"$ndmesh" train "${small[@]}" --steps 40 --warmup 5 --lr 0.01 --load "$tmp/ck" > "$tmp/other.txt" || fail "resume, cosine"
grep -q "^note: $tmp/ck was saved by a run with --lr-schedule wsd" "$tmp/other.txt" || fail "no note on the other schedule"

# --log-every 5 of 12 steps: lines for steps 5, 10 and 12.
"$ndmesh" train "${small[@]}" --steps 12 --log-every 5 > "$tmp/log.txt" || fail "--log-every"
[ "$(grep -o '^step [0-9]*/12' "$tmp/log.txt" | tr '\n' ' ')" = "step 5/12 step 10/12 step 12/12 " ] ||
  fail "--log-every 5: $(grep '^step' "$tmp/log.txt")"

# Evaluation without held-out data uses the evaluation stream; mfu with --hardware.
"$ndmesh" train "${small[@]}" --steps 12 --eval-every 4 --hardware h100 --metrics "$tmp/mfu.jsonl" --json > "$tmp/ev.txt" ||
  fail "--eval-every on the Markov source"
[ "$(grep -c '^val_loss [0-9.]* at step [0-9]* (2 batches of the evaluation stream)$' "$tmp/ev.txt")" -eq 3 ] ||
  fail "not 3 evaluation lines: $(grep val_loss "$tmp/ev.txt")"
jq -e -s 'all(.[]; .mfu > 0 and .mfu < 1)' "$tmp/mfu.jsonl" > /dev/null || fail "mfu with --hardware h100: $(head -n 1 "$tmp/mfu.jsonl")"

# ndmesh plot: a valid SVG with the three curves and a point per evaluation; a PNG.
"$ndmesh" train "${small[@]}" --steps 30 --eval-every 10 --metrics "$tmp/run.jsonl" > /dev/null || fail "run to plot"
"$ndmesh" plot "$tmp/run.jsonl" -o "$tmp/run.svg" > "$tmp/plot.txt" || fail "plot: $(cat "$tmp/plot.txt")"
grep -q "^wrote $tmp/run.svg (30 steps)$" "$tmp/plot.txt" || fail "plot said: $(cat "$tmp/plot.txt")"
python3 - "$tmp/run.svg" <<'PY' || fail "the plot is not the SVG expected"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
assert root.tag == ns + "svg", root.tag
lines = root.findall(f"{ns}polyline")
assert len(lines) == 3, f"{len(lines)} curves, want loss, val_loss and lr"
assert len(root.findall(f"{ns}circle")) == 3, "want a point per evaluation (steps 10, 20, 30)"
assert max(len(l.get("points").split()) for l in lines) == 30, "the loss curve has not 30 points"
texts = " ".join(t.text or "" for t in root.iter(f"{ns}text"))
assert "learning rate" in texts and "val_loss" in texts, texts
PY
command -v rsvg-convert > /dev/null || fail "rsvg-convert is not installed (Debian librsvg2-bin, in the Makefile's deps)"
"$ndmesh" plot "$tmp/run.jsonl" -o "$tmp/run.png" > /dev/null || fail "plot -o png"
[ "$(head -c 8 "$tmp/run.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || fail "the .png is not a PNG"

# Bad input: exit 2 with one line naming the flag (or the file and its line).
USAGE_LINES=1
source "$(dirname "$0")/../support/expect_usage.sh"
echo "the quick brown fox jumps over the lazy dog" > "$tmp/text.txt"
expect_usage "--val-fraction=1.5 must be in (0, 1)" "$ndmesh" train --data "$tmp/text.txt" --seq 8 --val-fraction 1.5
expect_usage "--val-fraction=0 must be in (0, 1)" "$ndmesh" train --data "$tmp/text.txt" --seq 8 --val-fraction 0
expect_usage "--val-fraction=0.1 needs --data FILE" "$ndmesh" train --val-fraction 0.1
expect_usage "--val-fraction=0.1 with --val-data=$tmp/text.txt: give one held-out set" "$ndmesh" train \
  --data "$tmp/text.txt" --val-fraction 0.1 --val-data "$tmp/text.txt"
expect_usage "--val-data is empty" "$ndmesh" train --val-data ""
expect_usage "--val-data=$tmp/missing.txt: no such file" "$ndmesh" train --val-data "$tmp/missing.txt" --steps 1
expect_usage "--eval-every=0 must be at least 1" "$ndmesh" train --eval-every 0
expect_usage "--eval-every=5 with --eval-batches=0" "$ndmesh" train --eval-every 5 --eval-batches 0
expect_usage "--keep=0 must be at least 1" "$ndmesh" train --keep 0 --save "$tmp/k.ckpt"
expect_usage "--keep=2 needs --save DIR" "$ndmesh" train --keep 2
expect_usage "--lr-schedule=step is not a learning-rate schedule (cosine, linear, wsd, constant)" "$ndmesh" train \
  --lr-schedule step
expect_usage "--decay-fraction=0 must be in (0, 1]" "$ndmesh" train --decay-fraction 0
expect_usage "--log-every=0 must be at least 1" "$ndmesh" train --log-every 0
expect_usage "--metrics=/nonexistent/m.jsonl: the folder '/nonexistent' does not exist" "$ndmesh" train \
  --metrics /nonexistent/m.jsonl
expect_usage "--metrics=$tmp: is a directory" "$ndmesh" train --metrics "$tmp"
expect_usage "--tensorboard=$tmp/text.txt: is a file" "$ndmesh" train --tensorboard "$tmp/text.txt"
expect_usage "--hardware nowhere/h.toml: no such file" "$ndmesh" train --hardware nowhere/h.toml
printf '{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.4}\n{"step": 3, "loss": \n' > "$tmp/broken.jsonl"
expect_usage "$tmp/broken.jsonl:3: not JSON" "$ndmesh" plot "$tmp/broken.jsonl" -o "$tmp/b.svg"
printf '{"step": 1, "loss": 2.5}\n{"step": 1, "loss": 2.4}\n' > "$tmp/twice.jsonl"
expect_usage "$tmp/twice.jsonl:2: step 1 after step 1" "$ndmesh" plot "$tmp/twice.jsonl" -o "$tmp/b.svg"
printf '{"loss": 2.5}\n' > "$tmp/nostep.jsonl"
expect_usage "$tmp/nostep.jsonl:1: no whole-number \"step\"" "$ndmesh" plot "$tmp/nostep.jsonl" -o "$tmp/b.svg"
expect_usage "$tmp/missing.jsonl: no such file" "$ndmesh" plot "$tmp/missing.jsonl" -o "$tmp/b.svg"
expect_usage "-o $tmp/b.pdf: the picture's name must end in .svg or .png" "$ndmesh" plot "$tmp/run.jsonl" -o "$tmp/b.pdf"
echo "train_watch.sh: ok"
