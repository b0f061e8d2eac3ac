#!/usr/bin/env python3
"""Runs every command README.md, docs/**/*.md and bench/README.md show, and checks that it behaves as shown.

Fenced blocks tagged `bash` or `sh` are commands: each must exit 0. Blocks tagged `console`
are sessions: each `$ ` line is a command (run in one shell per block, so `cat`, `cd` and
`echo $?` work) and the lines after it are what it prints. A command's output must contain
every shown line, in order (any order for mpirun, whose ranks print concurrently); a `...`
line means lines were left out there. A command whose shown output is an ndmesh error
(`ndmesh: [...]`) must exit non-zero, every other one 0, unless the next command is `echo $?`
and shows the status it must exit with.

The words of a shown line must be printed as shown, and so must its numbers, as far as they
are deterministic:
- a whole number (a step count, a shape, a size in bytes, a group member, a count) exactly;
- a decimal (a loss, a learning rate, a plan's GiB or seconds) within 2% or two units of its
  last shown digit, whichever is larger: losses computed on another CPU's BLAS kernels differ
  in their last digits, a step count taken from another command does not;
- timings and rates not at all: the number after `tok/s` and `eta`, before `tokens/s` (a
  run's, not a plan's `534.0k tokens/s`), `GB/s`, `GFLOP/s`, `TFLOP/s` and `ms`, and the seconds
  of `in X s` and `X s from`/`X s of it` (a run's wall time).

An HTML comment on the line before a block changes what is done with it:
  <!-- doc-test: skip (reason) -->  not run; the reason is printed (a cluster, a GPU, ...)
  <!-- doc-test: file NAME -->      the block's text is written to NAME for later blocks
Commands run in a scratch folder holding `build` (a link to the build folder), a copy of
`docs/`, and links to the repository's other top-level entries, with `ndmesh` on the PATH,
`python3` the interpreter the Python module is built for (NDMESH_DOC_PYTHON, when set), and
Open MPI told it may run as root and oversubscribe (what `--allow-run-as-root
--oversubscribe` say on the command line).

usage: doc_commands.py <path to ndmesh> [file.md ...]
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
MARK = re.compile(r"<!--\s*doc-test:\s*(skip|file)\s*(.*?)\s*-->")
# Timings and rates: replaced by a placeholder in both the shown and the printed line.
VARIABLE = [re.compile(p) for p in (
    r"(?<=tok/s )\d+(\.\d+)?",
    r"(?<=eta )\d+:\d\d(:\d\d)?",
    r"\d+(\.\d+)?(?= tokens/s)",
    r"\d+(\.\d+)?(?= ?(GB/s|GFLOP/s|TFLOP/s|ms\b))",
    r"(?<=\bin )\d+(\.\d+)?(?= s\b)",
    r"\d+(\.\d+)?(?= s (from|of it)\b)",
)]


def variable_free(line):
    line = line.rstrip()
    for v in VARIABLE:
        line = v.sub("~", line)
    return line


def normalise(line):
    return NUMBER.sub("#", variable_free(line))


def numbers_match(expected, actual):
    """True when the numbers of two lines of the same words agree as the module docstring says."""
    want = NUMBER.findall(variable_free(expected))
    got = NUMBER.findall(variable_free(actual))
    if len(want) != len(got):
        return False
    for w, g in zip(want, got):
        if re.fullmatch(r"[-+]?\d+", w):
            if int(w) != int(float(g)) or not re.fullmatch(r"[-+]?\d+", g):
                return False
            continue
        wv, gv = float(w), float(g)
        frac = re.search(r"\.(\d+)", w.split("e")[0].split("E")[0])
        unit = 10.0 ** -(len(frac.group(1)) if frac else 0)
        if re.search(r"[eE]", w):
            unit = abs(wv) * 0.05
        if abs(wv - gv) > max(0.02 * abs(wv), 2 * unit):
            return False
    return True


def blocks(path):
    """(line number, language, text, mark, mark argument) of every fenced block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        mark = MARK.search(prev)
        yield start + 1, lang, "\n".join(lines[i + 1:j]), mark.group(1) if mark else None, mark.group(2) if mark else ""
        i = j + 1


def commands_of_script(text):
    """Commands of a bash block: continuation lines joined, comments and blank lines dropped."""
    out, cur = [], ""
    for line in text.split("\n"):
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        out.append((cur + line).strip())
        cur = ""
    if cur:
        out.append(cur.strip())
    return out


def session_of_console(text):
    """[(command, [expected lines])] of a console block."""
    steps = []
    for line in text.split("\n"):
        if line.startswith("$ "):
            steps.append([line[2:], []])
        elif steps:
            steps[-1][1].append(line)
    for s in steps:
        while s[1] and not s[1][-1].strip():
            s[1].pop()
    return [(c, e) for c, e in steps]


def contains_in_order(expected, actual):
    """None when every expected line appears in order in actual;
    otherwise the first expected line that does not."""
    got = [normalise(a) for a in actual]
    at = 0
    for e in expected:
        if e.strip() == "...":
            continue
        want = normalise(e)
        while at < len(got) and not (got[at] == want and numbers_match(e, actual[at])):
            at += 1
        if at == len(got):
            return e
        at += 1
    return None


def contains_all(expected, actual):
    """For commands whose ranks print concurrently (mpirun): None when every expected line
    appears, each matched to its own output line, in any order;
    otherwise the first expected line left without one. Ranks interleave their lines
    differently from run to run, so the order shown in the docs is one of many."""
    left = list(actual)
    for e in expected:
        if e.strip() == "...":
            continue
        want = normalise(e)
        hit = next((i for i, a in enumerate(left) if normalise(a) == want and numbers_match(e, a)), None)
        if hit is None:
            return e
        del left[hit]
    return None


def run_session(work, env, steps, timeout):
    """Runs the commands in one bash, each output and status captured apart."""
    script = ["cd " + sh_quote(work)]
    for k, (cmd, _) in enumerate(steps):
        script.append("{ %s\n} > %s/.out.%d 2>&1; rc_=$?; echo $rc_ > %s/.rc.%d; (exit $rc_)"
                      % (cmd, sh_quote(work), k, sh_quote(work), k))
    subprocess.run(["bash", "-c", "\n".join(script)], env=env, timeout=timeout, stdin=subprocess.DEVNULL)
    results = []
    for k in range(len(steps)):
        out = open(os.path.join(work, ".out.%d" % k), encoding="utf-8", errors="replace").read()
        rc = int(open(os.path.join(work, ".rc.%d" % k)).read())
        results.append((out, rc))
    return results


def sh_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def main():
    ndmesh = os.path.abspath(sys.argv[1])
    build = os.path.dirname(os.path.dirname(ndmesh))
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    files = sys.argv[2:] or ["README.md"] + sorted(
        os.path.relpath(os.path.join(d, f), root)
        for d, _, names in os.walk(os.path.join(root, "docs")) for f in names if f.endswith(".md")) + [
        "bench/README.md"]
    work = tempfile.mkdtemp(prefix="ndmesh-docs-")
    try:
        for entry in os.listdir(root):
            if entry in ("build", "docs") or entry.startswith("."):
                continue
            os.symlink(os.path.join(root, entry), os.path.join(work, entry))
        os.symlink(build, os.path.join(work, "build"))
        shutil.copytree(os.path.join(root, "docs"), os.path.join(work, "docs"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("NDMESH_")}  # the docs' defaults
        env["PATH"] = os.path.dirname(ndmesh) + os.pathsep + env.get("PATH", "")
        python = os.environ.get("NDMESH_DOC_PYTHON")
        if python:  # `python3` in the docs is the interpreter the module is built for
            pybin = os.path.join(work, ".python-bin")
            os.mkdir(pybin)
            os.symlink(python, os.path.join(pybin, "python3"))
            env["PATH"] = pybin + os.pathsep + env["PATH"]
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                    "OMPI_MCA_rmaps_base_oversubscribe": "1"})
        failures, ran, skipped = [], 0, []
        for f in files:
            for line, lang, text, mark, arg in blocks(os.path.join(root, f)):
                where = "%s:%d" % (f, line)
                if mark == "file":
                    with open(os.path.join(work, arg), "w", encoding="utf-8") as out:
                        out.write(text + "\n")
                    continue
                if lang not in ("bash", "sh", "console"):
                    continue
                if mark == "skip":
                    skipped.append("%s %s" % (where, arg))
                    continue
                if lang == "console":
                    steps = session_of_console(text)
                else:
                    steps = [(c, None) for c in commands_of_script(text)]
                if not steps:
                    continue
                t0 = time.time()
                try:
                    results = run_session(work, env, steps, timeout=600)
                except subprocess.TimeoutExpired:
                    failures.append("%s: timed out after 600 s" % where)
                    continue
                for k, ((cmd, expected), (out, rc)) in enumerate(zip(steps, results)):
                    ran += 1
                    shown_error = expected is not None and any(e.startswith("ndmesh: [") for e in expected[:1])
                    # A command followed by `echo $?` shows its own exit status.
                    shown_rc = None
                    if k + 1 < len(steps) and steps[k + 1][0].strip() == "echo $?" and steps[k + 1][1]:
                        shown_rc = int(steps[k + 1][1][0])
                    if shown_rc is not None and rc != shown_rc:
                        failures.append("%s: `%s` exited %d, the docs show %d:\n%s" % (where, cmd, rc, shown_rc, out[-1500:]))
                    elif shown_rc is None and shown_error and rc == 0:
                        failures.append("%s: `%s` exited 0 but the docs show an error" % (where, cmd))
                    elif shown_rc is None and not shown_error and rc != 0:
                        failures.append("%s: `%s` exited %d:\n%s" % (where, cmd, rc, out[-1500:]))
                    elif expected:
                        concurrent = re.match(r"\s*(\S*/)?mpirun\s", cmd) is not None
                        match = contains_all if concurrent else contains_in_order
                        missing = match(expected, out.split("\n"))
                        if missing is not None:
                            failures.append("%s: `%s` did not print the line shown:\n  %s\nit printed:\n%s"
                                            % (where, cmd, missing, out[-2000:]))
                print("%s: %d command(s), %.1f s" % (where, len(steps), time.time() - t0), flush=True)
        for s in skipped:
            print("not run: " + s)
        for fl in failures:
            print("FAIL: " + fl, file=sys.stderr)
        print("%d commands run from %d files, %d blocks not run (reasons above), %d failures"
              % (ran, len(files), len(skipped), len(failures)))
        return 1 if failures else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
