#!/usr/bin/env python3
"""The shape of the user docs, so that it cannot regress (README.md, docs/**/*.md, bench/README.md).

- README.md has at most 150 lines, and its first command (a bash, sh or console block) starts
  within its first 40 lines.
- No prose block runs over 12 lines: a block is a run of non-blank lines outside code fences,
  tables, headings and HTML comments; a list item starts a block of its own.
- No dates (2026-11-26, "November 2026") outside docs/runs/ and CHANGELOG.md: the pages are
  reference pages; dated measurements and histories live in those two places.
- No internal C++ names in the user pages (docs/internals/ and docs/runs/ aside): in prose, no
  backticked `a::b` other than the CMake targets `ndmesh::<layer>`, and no backticked
  CamelCase name outside the public names listed here.
- Every page under docs/ is linked from the README's map of the docs (its "Documentation"
  section), and every link there resolves; every `page.md#anchor` link names a heading of it.
- docs/config.md names every key that src/config/config_file.cpp accepts, as `section.key`.
- Every block that the doc test does not run says why (a skip mark with a reason).

usage: docs_structure.py [repository root]
"""
import os
import re
import sys

MAX_README_LINES = 150
FIRST_COMMAND_BY = 40
MAX_PROSE_LINES = 12
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b|\b(January|February|March|April|May|June|July|August|September|"
                  r"October|November|December) 20\d\d\b")
# Public names a user meets: Python exceptions and classes of the module, PyTorch's and other
# tools' names, file formats. A class of the C++ library's internals is not one of them.
PUBLIC_CAMEL = {
    "ConfigError", "IoError", "TimeoutError", "ValueError", "OSError", "RuntimeError", "DeviceMesh",
    "ProcessGroup", "TCPStore", "MpiDefault", "PyTorch", "OpenBLAS", "OpenMPI", "GitHub", "CMakeLists",
    "FlashAttention", "DeepSpeed", "NVLink", "InfiniBand", "TensorBoard", "LayerNorm", "RMSNorm", "SwiGLU",
    "BF16_Optimizer", "ReduceScatterHalvingDoubling", "MaxTasksPerNode", "PMIx", "CUDA_VISIBLE_DEVICES", "AdamW",
}
LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s+")


def pages(root):
    out = ["README.md"]
    for d, _, files in os.walk(os.path.join(root, "docs")):
        out += sorted(os.path.relpath(os.path.join(d, f), root) for f in files if f.endswith(".md"))
    if os.path.exists(os.path.join(root, "bench", "README.md")):
        out.append("bench/README.md")
    if os.path.exists(os.path.join(root, "CHANGELOG.md")):
        out.append("CHANGELOG.md")
    return out


def anchors(path):
    """The anchors of a page's headings, as GitHub makes them."""
    out, fence = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"^#+\s+(.*)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def prose_blocks(lines):
    """(first line number, [lines]) of each prose block."""
    blocks, cur, start, fence, comment = [], [], 0, False, False
    def flush():
        if cur:
            blocks.append((start, list(cur)))
        cur.clear()
    for n, line in enumerate(lines, 1):
        s = line.strip()
        if s.startswith("```"):
            flush()
            fence = not fence
            continue
        if fence:
            continue
        if comment or s.startswith("<!--"):
            flush()
            comment = "-->" not in s
            continue
        if not s or s.startswith("#") or s.startswith("|") or s.startswith("![") or s.startswith("<"):
            flush()
            continue
        if LIST_ITEM.match(line):
            flush()
        if not cur:
            start = n
        cur.append(line)
    flush()
    return blocks


def outside_code(lines):
    """(line number, line) of the lines outside code fences."""
    fence = False
    for n, line in enumerate(lines, 1):
        if line.strip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            yield n, line


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    os.chdir(root)
    fail = []
    readme = open("README.md", encoding="utf-8").read().split("\n")
    if readme and readme[-1] == "":
        readme.pop()
    if len(readme) > MAX_README_LINES:
        fail.append("README.md has %d lines, more than %d" % (len(readme), MAX_README_LINES))
    first = next((n for n, l in enumerate(readme, 1) if re.match(r"^```(bash|sh|console)\s*$", l)), None)
    if first is None or first > FIRST_COMMAND_BY:
        fail.append("README.md's first command block starts at line %s, not within the first %d lines"
                    % (first, FIRST_COMMAND_BY))

    for page in pages(root):
        lines = open(page, encoding="utf-8").read().split("\n")
        for start, block in prose_blocks(lines):
            if len(block) > MAX_PROSE_LINES:
                fail.append("%s:%d: a prose block of %d lines (at most %d; split it, or make it a list or a table)"
                            % (page, start, len(block), MAX_PROSE_LINES))
        dated = page.startswith("docs/runs/") or page == "CHANGELOG.md"
        user = not (dated or page.startswith("docs/internals/"))
        # Every block the doc test does not run says why.
        for n, line in enumerate(lines, 1):
            m = re.search(r"<!--\s*doc-test:\s*skip\s*(.*?)\s*-->", line)
            if m and not m.group(1).strip("() "):
                fail.append("%s:%d: a skipped block without its reason: <!-- doc-test: skip (why) -->" % (page, n))
        for n, line in outside_code(lines):
            if not dated:
                m = DATE.search(re.sub(r"\]\([^)]*\)", "]", line))  # a link to a run report may name its date
                if m:
                    fail.append("%s:%d: a date (%s) in a reference page; dated reports go to docs/runs/, "
                                "history to CHANGELOG.md" % (page, n, m.group(0)))
            if user:
                for name in re.findall(r"`([^`]+)`", line):
                    if " " in name or name.startswith("-") or "/" in name or "=" in name:
                        continue  # a command, a flag, a path or a setting
                    if "::" in name and not re.fullmatch(r"ndmesh::[a-z]+|std::\w+", name):
                        fail.append("%s:%d: an internal C++ name `%s` in a user page (docs/internals/ is "
                                    "the place for it)" % (page, n, name))
                    word = re.sub(r"\(.*", "", name)
                    if re.fullmatch(r"[A-Z][a-z0-9]+[A-Z]\w*", word) and word not in PUBLIC_CAMEL:
                        fail.append("%s:%d: `%s` looks like an internal C++ class name; user pages say what "
                                    "it does (docs/internals/ may name it)" % (page, n, name))

    # Links to a heading name one that exists.
    for page in pages(root):
        for n, line in outside_code(open(page, encoding="utf-8").read().split("\n")):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                path, _, anchor = target.partition("#")
                if not anchor or re.match(r"^[a-z]+:", target):
                    continue
                dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
                if os.path.isfile(dest) and dest.endswith(".md") and anchor not in anchors(dest):
                    fail.append("%s:%d: the link %s names no heading of %s" % (page, n, target, dest))

    # The map: every page under docs/ linked from the README's Documentation section.
    text = "\n".join(readme)
    m = re.search(r"^## Documentation\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not m:
        fail.append("README.md has no '## Documentation' section (the map of the docs)")
        linked = set()
    else:
        linked = {os.path.normpath(t.split("#")[0]) for t in re.findall(r"\]\(([^)\s]+)\)", m.group(1))}
        for t in linked:
            if not os.path.exists(t):
                fail.append("README.md's map links %s, which does not exist" % t)
    for page in pages(root):
        if page.startswith("docs/") and os.path.normpath(page) not in linked:
            fail.append("%s is not linked from the README's map of the docs (## Documentation)" % page)

    # The config reference names every key the reader accepts.
    src = open("src/config/config_file.cpp", encoding="utf-8").read()
    config = open("docs/config.md", encoding="utf-8").read() if os.path.exists("docs/config.md") else ""
    sections = re.findall(r'r\.section\(\s*root,\s*"(\w+)",\s*\{([^}]*)\}', src)
    if not sections:
        fail.append("found no r.section(root, \"...\", {...}) in src/config/config_file.cpp: update this test")
    for section, keys in sections:
        for key in re.findall(r'"(\w+)"', keys):
            if "`%s.%s`" % (section, key) not in config:
                fail.append("docs/config.md does not describe `%s.%s` (a key src/config/config_file.cpp reads)"
                            % (section, key))

    for f in fail:
        print("FAIL: " + f, file=sys.stderr)
    print("docs structure: %d pages, %d problems" % (len(pages(root)), len(fail)))
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
