"""`python -m ndmesh.data tokenize` against the tokenizers package (run by hf_tokenize.sh).

A byte-level BPE tokenizer.json is trained here on local text (nothing downloaded). The shards
are read back with this file's own reader (struct, not ndmesh.data's): their header, their
format, and their ids, which must be the tokenizer's encode(text).ids of each document after
--eot, train then the last --val-fraction as val. ndmesh train reads the shard (its data line),
and `ndmesh eval` of one checkpoint gives the same loss on the GPT-2 shard, the Llama 3 shard
and a raw uint16 file this test writes from the tokenizer's ids. Bad input exits 2 in one line.

    hf_tokenize.py <ndmesh> <scratch folder>
"""
import json
import math
import os
import struct
import subprocess
import sys

from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

ndmesh, tmp = sys.argv[1], sys.argv[2]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(args, expect=0, env=None):
    r = subprocess.run(args, capture_output=True, text=True, env=env)
    if r.returncode != expect:
        sys.exit(f"FAIL: {' '.join(args)} exited {r.returncode}, want {expect}:\n{r.stdout}{r.stderr}")
    return r


# Two documents: the GPL (English) and a few lines with non-ASCII text.
docs = [os.path.join(tmp, "gpl.txt"), os.path.join(tmp, "more.txt")]
with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
    gpl = f.read()
open(docs[0], "w", encoding="utf-8").write(gpl)
open(docs[1], "w", encoding="utf-8").write("Grüße aus Zürich: ndmesh tokenizes 24 × 7 days.\n" * 20)

tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train(docs, trainer)
tok_json = os.path.join(tmp, "tokenizer.json")
tok.save(tok_json)
vocab = tok.get_vocab_size(with_added_tokens=True)
eot = tok.token_to_id("<|endoftext|>")
expected = []
for d in docs:
    expected += [eot] + tok.encode(open(d, encoding="utf-8").read()).ids
check(len(expected) > 5000 and max(expected) < vocab, f"tokenizer: vocabulary {vocab}, {len(expected)} tokens")


def read(path):
    """(magic, version, ids) of an llm.c shard, read with struct."""
    raw = open(path, "rb").read()
    magic, version, count = struct.unpack_from("<3i", raw)
    width = {20240520: 2, 20240801: 4}[magic]
    check(len(raw) == 1024 + count * width, f"{os.path.basename(path)}: {count} tokens fill the file after the header")
    return magic, version, list(struct.unpack_from(f"<{count}{'H' if width == 2 else 'I'}", raw, 1024))


cmd = [sys.executable, "-m", "ndmesh.data", "tokenize", "--tokenizer", tok_json, "--eot", "<|endoftext|>"]
n_val = math.ceil(0.1 * len(expected))
for fmt, magic, version in (("gpt2", 20240520, 1), ("llama3", 20240801, 7)):
    out = os.path.join(tmp, fmt)
    args = cmd + ["--out", out, "--val-fraction", "0.1", "--shard-tokens", "4000"]
    run(args + (["--format", "llama3"] if fmt == "llama3" else []) + docs)
    names = sorted(os.listdir(out))
    train = [n for n in names if n.startswith("train_")]
    check(names == train + ["val_000000.bin"] and len(train) == math.ceil((len(expected) - n_val) / 4000),
          f"{fmt}: shards {names}")
    ids = []
    for n in train:
        m, v, t = read(os.path.join(out, n))
        check((m, v) == (magic, version), f"{fmt}: {n} has magic {m} version {v}")
        ids += t
    m, v, val = read(os.path.join(out, "val_000000.bin"))
    check(ids == expected[: len(expected) - n_val], f"{fmt}: the train shards hold the tokenizer's ids")
    check(val == expected[len(expected) - n_val:], f"{fmt}: the val shard holds the last {n_val} of them")

# The default format is GPT-2's for this small vocabulary; one shard, no val shard.
run(cmd + ["--out", os.path.join(tmp, "auto")] + docs)
m, v, ids = read(os.path.join(tmp, "auto", "train_000000.bin"))
check((m, v, ids) == (20240520, 1, expected) and os.listdir(os.path.join(tmp, "auto")) == ["train_000000.bin"],
      "default format: GPT-2's, all tokens in train_000000.bin")

# ndmesh reads them: train's data line, and one checkpoint's eval equal on both formats and on a
# raw uint16 file of the tokenizer's ids.
raw = os.path.join(tmp, "ids.bin")
open(raw, "wb").write(struct.pack(f"<{len(expected)}H", *expected))
ck = os.path.join(tmp, "ck")
r = run([ndmesh, "train", "--data", os.path.join(tmp, "auto", "train_000000.bin"), "--vocab", str(vocab),
         "--layers", "1", "--hidden", "16", "--heads", "2", "--kv-heads", "1", "--seq", "16", "--batch", "2",
         "--steps", "2", "--threads", "1", "--save", ck])
check(f"tokens={len(expected)} format=llmc" in r.stdout, "ndmesh train reads the GPT-2 shard: "
      + next((line for line in r.stdout.splitlines() if line.startswith("data:")), "no data line"))
losses = {}
for name, path in (("gpt2", os.path.join(tmp, "gpt2", "train_000000.bin")),
                   ("llama3", os.path.join(tmp, "llama3", "train_000000.bin")), ("raw", raw)):
    r = run([ndmesh, "eval", "--load", ck, "--data", path, "--seq", "16", "--batch", "4", "--batches", "8",
             "--threads", "1", "--json"])
    losses[name] = json.loads(r.stdout.strip().splitlines()[-1])["loss"]
check(losses["gpt2"] == losses["llama3"] == losses["raw"], f"ndmesh eval: the same loss on every format {losses}")

# Bad input: one line, exit 2.
for what, args, needle in (
    ("a missing input file", cmd + ["--out", os.path.join(tmp, "x"), os.path.join(tmp, "nope.txt")], "nope.txt: no such file"),
    ("an existing output", cmd + ["--out", os.path.join(tmp, "auto")] + docs, "already holds shards"),
    ("a val fraction of 1", cmd + ["--out", os.path.join(tmp, "y"), "--val-fraction", "1"] + docs, "--val-fraction=1.0"),
    ("an unknown --eot", [sys.executable, "-m", "ndmesh.data", "tokenize", "--tokenizer", tok_json, "--eot", "<eos>",
                          "--out", os.path.join(tmp, "z")] + docs, "--eot=<eos> is not a token"),
):
    r = run(args, expect=2)
    lines = r.stderr.strip().splitlines()
    check(len(lines) == 1 and needle in lines[0], f"{what}: exit 2, {lines}")
# Without the tokenizers package (Debian's python3 has none): the line says how to get it.
if subprocess.run(["/usr/bin/python3", "-c", "import tokenizers"], capture_output=True).returncode != 0:
    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", ""))
    r = run(["/usr/bin/python3", "-m", "ndmesh.data", "tokenize", "--tokenizer", tok_json, "--out",
             os.path.join(tmp, "w")] + docs, expect=2, env=env)
    check(r.stderr.strip() == "ndmesh.data: the tokenizers package is not installed; pip install tokenizers",
          f"no tokenizers package: {r.stderr.strip()}")

if failures:
    sys.exit(f"{len(failures)} failures")
print("all checks pass")
