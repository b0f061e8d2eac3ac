#!/usr/bin/env python3
"""The tests that skipped in a ctest run, with the reason each gave, and whether the reason is one
this machine may have.

Reads ctest's JUnit report (`ctest --output-junit FILE`). A skipped test is one ctest reports as
not run: a test script that exited 77, or a GoogleTest case that called GTEST_SKIP. Its reason
is the line after GoogleTest's "Skipped", else the output's first line that starts with "SKIP"
(or says "skip"), else its last line.

A skip fails the run (exit 1) when its reason is one `make deps` or the user running the tests
removes: it names a Debian package of the Makefile's DEB_PACKAGES (make deps installs them all,
so the package is missing only when the install is broken), or it asks for root while the tests
run as root. Any other reason (no GPU, no network to PyPI, PyTorch 2 where Debian has 1.13, a
single-rank run of a two-rank test) is listed and passes.

usage: test_skips.py <ctest junit.xml> <Makefile>
"""
import os
import re
import sys
import xml.etree.ElementTree as ET


def deb_packages(makefile):
    text = open(makefile, encoding="utf-8").read()
    m = re.search(r"^DEB_PACKAGES\s*:?=\s*((?:.*\\\n)*.*)$", text, re.M)
    if not m:
        return set()
    return set(m.group(1).replace("\\\n", " ").split())


def reason_of(output):
    lines = [line.strip() for line in (output or "").splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.endswith(": Skipped") and i + 1 < len(lines):  # GoogleTest: file:line: Skipped, then the message
            return lines[i + 1]
    for line in lines:
        if line.startswith("SKIP") or re.search(r"\bskip", line, re.I):
            return line
    return lines[-1] if lines else "(no output)"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    junit, makefile = sys.argv[1], sys.argv[2]
    if not os.path.exists(junit):
        sys.exit(f"test_skips.py: no ctest report {junit} (ctest --output-junit writes it)")
    packages = deb_packages(makefile)
    root = os.geteuid() == 0
    skipped, bad = [], []
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("skipped") is None:
            continue
        out = case.find("system-out")
        reason = reason_of(out.text if out is not None else "")
        name = case.get("name")
        skipped.append((name, reason))
        words = set(re.findall(r"[A-Za-z0-9][A-Za-z0-9.+-]*[A-Za-z0-9]", reason))
        wanted = sorted(words & packages)
        if wanted:
            bad.append(f"{name}: skipped for want of {', '.join(wanted)}, which make deps installs: {reason}")
        elif root and re.search(r"\b(needs|requires|as|run as) root\b", reason):
            bad.append(f"{name}: skipped for want of root, but the tests run as root: {reason}")
    if skipped:
        # One line per reason, with the tests that gave it (the GPU tests' reason is shared by many).
        by_reason = {}
        for name, reason in skipped:
            by_reason.setdefault(reason, []).append(name)
        print(f"skipped: {len(skipped)} tests")
        for reason, names in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            print(f"  {len(names):4d}  {reason}  ({shown})")
    else:
        print("skipped: none")
    for line in bad:
        print(f"FAIL: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
