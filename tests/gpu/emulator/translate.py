#!/usr/bin/env python3
"""Rewrites a CUDA source for the CPU emulator (cuda_runtime.h beside this file):
   kernel<<<grid, block, smem, stream>>>(args)  ->  ::emu::launch(kernel, grid, block, smem, stream, args)
   extern __shared__ T name[];                   ->  T* name = ::emu::dynamic_shared<T>();
Usage: translate.py IN.cu OUT.cpp"""
import os
import re
import sys


def translate(text: str) -> str:
    launch = re.compile(r"([\w:]+(?:<[^<>()]*>)?)\s*<<<(.*?)>>>\s*\(", re.S)
    text, launches = launch.subn(lambda m: f"::emu::launch({m.group(1)}, {m.group(2)}, ", text)
    shared = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w:]+)\s+(\w+)\[\];")
    text = shared.sub(lambda m: f"{m.group(1)}* {m.group(2)} = ::emu::dynamic_shared<{m.group(1)}>();", text)
    if "<<<" in text or ">>>" in text:
        raise SystemExit("translate.py: a launch it could not rewrite is left")
    return text


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        out = translate(f.read())
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    with open(dst, "w", encoding="utf-8") as f:
        f.write(f'// Generated from {src} by tests/gpu/emulator/translate.py: do not edit.\n#line 1 "{src}"\n')
        f.write(out)


if __name__ == "__main__":
    main()
