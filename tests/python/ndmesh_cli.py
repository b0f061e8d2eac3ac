"""Runs the `ndmesh` command for the Python tests: the C++ side they compare against.

NDMESH_BIN is set by ctest (tests/CMakeLists.txt); by hand:
    PYTHONPATH=build/python NDMESH_BIN=build/bin/ndmesh python3 -m pytest tests/python
"""
import json
import os
import subprocess

BIN = os.environ.get("NDMESH_BIN", os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin", "ndmesh"))


def run(*args):
    """(exit code, stdout, stderr) of `ndmesh args...`."""
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def json_of(*args, exit_code=0):
    """The parsed JSON that `ndmesh args... --json` prints; fails on another exit code."""
    code, out, err = run(*args, "--json")
    assert code == exit_code, f"ndmesh {' '.join(map(str, args))} --json exited {code}: {err}"
    return json.loads(out)


def error_of(*args):
    """The message of a bad-input run: exit code 2 and stderr 'ndmesh: <message>'."""
    code, out, err = run(*args)
    assert code == 2, f"ndmesh {' '.join(map(str, args))} exited {code}, want 2: {out}{err}"
    assert err.startswith("ndmesh: "), err
    return err[len("ndmesh: "):].rstrip("\n")
