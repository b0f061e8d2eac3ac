#!/usr/bin/env python3
"""Write a tokenized dataset as GPU users keep them, for tests and demos (nothing is downloaded).

  python3 scripts/make_token_file.py OUT --tokens N --vocab V [--format llmc|llama3|uint16] [--shards K] [--seed S]

llmc: llm.c's shard format, a header of 256 int32 (magic 20240520, version 1, the token
count) then uint16 tokens; llama3: llm.c's Llama 3 shard (magic 20240801, version 7, uint32
tokens, any vocabulary); with --shards K > 1 it writes OUT_000.bin ... (OUT without .bin),
to be read as --data 'OUT_*.bin'. uint16: nanoGPT's raw train.bin. The tokens are a
seeded random first-order chain over V ids (each id has a few likely successors), so a
model has something to learn.
"""
import argparse
import array
import random
import struct
import sys


def tokens(n, vocab, rng, typecode):
    # each id's successors, drawn up front (a small vocabulary) or on first use (a large one)
    succ = {i: [rng.randrange(vocab) for _ in range(3)] for i in range(vocab)} if vocab <= 65536 else {}
    t, out = rng.randrange(vocab), array.array(typecode)
    for _ in range(n):
        out.append(t)
        if t not in succ:
            succ[t] = [rng.randrange(vocab) for _ in range(3)]
        t = rng.choice(succ[t]) if rng.random() < 0.9 else rng.randrange(vocab)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--tokens", type=int, required=True, help="tokens per file")
    p.add_argument("--vocab", type=int, required=True, help="token ids are in [0, vocab), vocab <= 65536 but for llama3")
    p.add_argument("--format", choices=["llmc", "llama3", "uint16"], default="llmc")
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    limit = 2**31 if a.format == "llama3" else 65536
    if not 2 <= a.vocab <= limit:
        sys.exit(f"make_token_file.py: --vocab={a.vocab} must be in [2, {limit}] for --format {a.format}")
    if a.tokens < 1 or a.shards < 1:
        sys.exit("make_token_file.py: --tokens and --shards must be at least 1")
    rng = random.Random(a.seed)
    base = a.out[:-4] if a.out.endswith(".bin") else a.out
    names = [a.out] if a.shards == 1 else [f"{base}_{k:03d}.bin" for k in range(a.shards)]
    for name in names:
        t = tokens(a.tokens, a.vocab, rng, "I" if a.format == "llama3" else "H")
        if sys.byteorder != "little":
            t.byteswap()
        with open(name, "wb") as f:
            if a.format == "llmc":
                f.write(struct.pack("<256i", 20240520, 1, a.tokens, *([0] * 253)))
            elif a.format == "llama3":
                f.write(struct.pack("<256i", 20240801, 7, a.tokens, *([0] * 253)))
            f.write(t.tobytes())
        print(name)


if __name__ == "__main__":
    main()
