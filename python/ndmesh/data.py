"""Token files for `ndmesh train --data` and `ndmesh eval --data`: llm.c's shards.

    python -m ndmesh.data tokenize --tokenizer tokenizer.json --out DIR [--val-fraction F]
        [--format gpt2|llama3] [--eot TOKEN] [--shard-tokens N] [--force] FILES...

tokenizes each text file (one document each, in the order given) with a Hugging Face
`tokenizer.json` (the `tokenizers` package from PyPI: `pip install tokenizers`) and writes
llm.c's shards into DIR: `train_000000.bin`, ... and, with --val-fraction F, `val_000000.bin`
holding the last F of the tokens (rounded up to a whole token; deterministic: the same files
give the same shards). The format is GPT-2's (a header of 256 int32: magic 20240520, version
1, the token count; uint16 tokens) when the tokenizer's vocabulary fits in uint16, else llm.c's
Llama 3 format (magic 20240801, version 7; uint32 tokens); --format says which. The token ids
are the tokenizer's `encode(text).ids` (its special tokens included, e.g. a Llama 3 BOS);
--eot TOKEN puts that token before every document, as llm.c's scripts put GPT-2's
<|endoftext|>. The ids are held in memory (4 bytes a token) until they are written.

write_shard() and read_shard() write and read one shard.

Bad input (a missing file, an unknown format, a vocabulary that does not fit, an existing
output without --force, no tokenizers package) is one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import array
import math
import os
import struct
import sys
from typing import Any, List, Optional, Sequence, Tuple

GPT2_MAGIC, GPT2_VERSION = 20240520, 1
LLAMA3_MAGIC, LLAMA3_VERSION = 20240801, 7
HEADER_INTS = 256
FORMATS = {"gpt2": (GPT2_MAGIC, GPT2_VERSION, "H"), "llama3": (LLAMA3_MAGIC, LLAMA3_VERSION, "I")}


class DataError(ValueError):
    """Bad input to a data command; the message is one line naming the value and the fix."""


def format_for_vocab(vocab: int) -> str:
    """"gpt2" (uint16 tokens) when ids below `vocab` fit in uint16, else "llama3" (uint32)."""
    return "gpt2" if vocab <= 65536 else "llama3"


def write_shard(path: str, ids: Sequence[int], fmt: str) -> None:
    """Writes `ids` as one llm.c shard in format "gpt2" (uint16) or "llama3" (uint32)."""
    if fmt not in FORMATS:
        raise DataError(f"format={fmt!r} is not an llm.c shard format; use gpt2 or llama3")
    magic, version, code = FORMATS[fmt]
    tokens = array.array(code, ids)  # OverflowError for an id that does not fit
    if sys.byteorder != "little":
        tokens.byteswap()
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{HEADER_INTS}i", magic, version, len(tokens), *([0] * (HEADER_INTS - 3))))
        f.write(tokens.tobytes())


def read_shard(path: str) -> Tuple[str, "array.array[int]"]:
    """The format ("gpt2" or "llama3") and the tokens of the llm.c shard `path`."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < HEADER_INTS * 4:
        raise DataError(f"{path}: {len(raw)} bytes is shorter than llm.c's header of {HEADER_INTS * 4} bytes")
    magic, version, count = struct.unpack_from("<3i", raw)
    for name, (m, v, code) in FORMATS.items():
        if magic == m:
            if version != v:
                raise DataError(f"{path}: llm.c shard version {version} with magic {magic}; want version {v}")
            tokens = array.array(code)
            tokens.frombytes(raw[HEADER_INTS * 4:])
            if sys.byteorder != "little":
                tokens.byteswap()
            if len(tokens) != count or len(raw) != HEADER_INTS * 4 + count * tokens.itemsize:
                raise DataError(f"{path}: the header says {count} tokens but the file holds {len(raw)} bytes")
            return name, tokens
    raise DataError(f"{path}: magic {magic} is not an llm.c shard's ({GPT2_MAGIC} or {LLAMA3_MAGIC})")


def _load_tokenizer(path: str) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise DataError("the tokenizers package is not installed; pip install tokenizers") from None
    if not os.path.isfile(path):
        raise DataError(f"--tokenizer={path}: no such file; pass a Hugging Face tokenizer.json")
    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # the package raises its own Exception subclass
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"--tokenizer={path}: not a tokenizer.json the tokenizers package reads ({first})") from None


def tokenize(tokenizer: str, out: str, files: Sequence[str], val_fraction: float = 0.0, fmt: Optional[str] = None,
             eot: Optional[str] = None, shard_tokens: int = 100_000_000, force: bool = False) -> List[Tuple[str, int]]:
    """Writes the shards (see the module comment); returns (path, tokens) of each shard written."""
    if not 0 <= val_fraction < 1:
        raise DataError(f"--val-fraction={val_fraction} must be in [0, 1), e.g. --val-fraction 0.05")
    if shard_tokens < 1:
        raise DataError(f"--shard-tokens={shard_tokens} must be at least 1, e.g. --shard-tokens 100000000")
    if fmt is not None and fmt not in FORMATS:
        raise DataError(f"--format={fmt} is not a shard format; use gpt2 (uint16) or llama3 (uint32)")
    if not files:
        raise DataError("no input FILES; pass the text files to tokenize")
    for f in files:
        if not os.path.isfile(f):
            raise DataError(f"{f}: no such file; pass text files to tokenize")
    tok = _load_tokenizer(tokenizer)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    fmt = fmt or format_for_vocab(vocab)
    if fmt == "gpt2" and vocab > 65536:
        raise DataError(f"--format=gpt2 holds uint16 ids but {tokenizer} has a vocabulary of {vocab}; use --format llama3")
    eot_id: Optional[int] = None
    if eot is not None:
        eot_id = tok.token_to_id(eot)
        if eot_id is None:
            raise DataError(f"--eot={eot} is not a token of {tokenizer}; e.g. --eot '<|endoftext|>'")
    if os.path.exists(out) and not os.path.isdir(out):
        raise DataError(f"--out={out} is a file; pass a folder")
    old = [n for n in os.listdir(out) if n.endswith(".bin")] if os.path.isdir(out) else []
    if old and not force:
        raise DataError(f"--out={out} already holds shards ({sorted(old)[0]}, ...); pass another folder or --force")
    ids = array.array("I")
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        if eot_id is not None:
            ids.append(eot_id)
        ids.extend(tok.encode(text).ids)
    n_val = math.ceil(val_fraction * len(ids)) if val_fraction > 0 else 0
    if n_val >= len(ids):
        raise DataError(f"--val-fraction={val_fraction} of {len(ids)} tokens leaves nothing to train on")
    os.makedirs(out, exist_ok=True)
    for n in old:
        os.remove(os.path.join(out, n))
    written: List[Tuple[str, int]] = []
    parts = [("train", ids[: len(ids) - n_val]), ("val", ids[len(ids) - n_val:])]
    for split, part in parts:
        for k, at in enumerate(range(0, len(part), shard_tokens)):
            path = os.path.join(out, f"{split}_{k:06d}.bin")
            write_shard(path, part[at : at + shard_tokens], fmt)
            written.append((path, len(part[at : at + shard_tokens])))
    return written


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ndmesh.data", description="Token files for ndmesh (llm.c shards).")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tokenize", help="tokenize text files into llm.c shards with a tokenizer.json")
    t.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json")
    t.add_argument("--out", required=True, help="the folder the shards go to (train_*.bin, val_*.bin)")
    t.add_argument("--val-fraction", type=float, default=0.0, help="the last F of the tokens go to val_*.bin")
    t.add_argument("--format", choices=sorted(FORMATS), default=None,
                   help="gpt2: uint16 (magic 20240520); llama3: uint32 (magic 20240801); default: by the vocabulary")
    t.add_argument("--eot", default=None, help="a token put before every document, e.g. '<|endoftext|>'")
    t.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard at most")
    t.add_argument("--force", action="store_true", help="replace the shards already in --out")
    t.add_argument("files", nargs="+", metavar="FILES", help="text files, one document each")
    a = p.parse_args(argv)
    try:
        written = tokenize(a.tokenizer, a.out, a.files, a.val_fraction, a.format, a.eot, a.shard_tokens, a.force)
    except DataError as e:
        print(f"ndmesh.data: {e}", file=sys.stderr)
        return 2
    fmt, _ = read_shard(written[0][0])
    vocab = _load_tokenizer(a.tokenizer).get_vocab_size(with_added_tokens=True)
    for path, n in written:
        print(f"{path}: {n} tokens")
    kind = "uint16, llm.c GPT-2 format" if fmt == "gpt2" else "uint32, llm.c Llama 3 format"
    print(f"{sum(n for _, n in written)} tokens ({kind}), vocabulary {vocab}: "
          f"ndmesh train --data '{os.path.join(a.out, 'train_*.bin')}' --vocab {vocab}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
