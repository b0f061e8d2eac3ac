#!/usr/bin/env python3
"""Writes a raw uint16 token file (nanoGPT's train.bin format) of a seeded first-order
Markov chain: a learnable stream for the tests of held-out evaluation.
usage: make_tokens.py FILE COUNT VOCAB SEED"""
import random
import struct
import sys

path, count, vocab, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(1234)  # the chain itself is the same for every file
table = [[rng.randrange(vocab) for _ in range(3)] for _ in range(vocab)]  # three likely successors
draw = random.Random(seed)
tokens, cur = [], 0
for _ in range(count):
    cur = draw.choice(table[cur]) if draw.random() < 0.9 else draw.randrange(vocab)
    tokens.append(cur)
with open(path, "wb") as f:
    f.write(struct.pack(f"<{count}H", *tokens))
