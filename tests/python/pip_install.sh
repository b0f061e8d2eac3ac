#!/usr/bin/env bash
# `pip install .` of a clean copy of the repository into a fresh virtual environment,
# offline: the build backend (scikit-build-core) comes from the wheelhouse WHEELS that
# `make deps` fills from PyPI, the C++ dependencies from Debian. Then, from outside the
# source tree: `import ndmesh` prints the version of project() in CMakeLists.txt, which is
# also `ndmesh --version`'s and the CMake package's; `ndmesh --help` works; `pip wheel`
# (the same build folder, so only packing) holds the package, the stubs and the command;
# the stubs match the extension (mypy.stubtest) and type-check a caller (mypy), where the
# wheelhouse has mypy.
#
#   pip_install.sh SOURCE WORK PYTHON WHEELS [CMAKE_BUILD]
# SOURCE: the repository; WORK: a scratch folder (emptied); PYTHON: the interpreter the
# venv is made from (Debian's python3: pybind11-dev and python3-dev belong to it); WHEELS:
# the wheelhouse; CMAKE_BUILD: a configured build folder whose ndmeshConfigVersion.cmake
# must carry the same version. Exit 77 (skipped) when the wheelhouse has no scikit-build-core.
#
# The wheel is built with CUDA, the tests and the benchmarks off (pyproject.toml) and,
# where ccache is installed, through it, with the flags of the project's own build
# (Unix Makefiles, -DNDMESH_WERROR=ON) but -O0: a warm cache makes it a link step.
set -euo pipefail
SRC=$(cd "$1" && pwd)
WORK=$2
PY=$3
WHEELS=$(cd "$4" 2>/dev/null && pwd || echo "$4")
CMAKE_BUILD=${5:+$(cd "$5" && pwd)}

if ! ls "$WHEELS"/scikit_build_core-*.whl >/dev/null 2>&1; then
  echo "SKIPPED: no scikit-build-core wheel in $WHEELS (Debian 12 does not package it; 'make deps' downloads it from PyPI)"
  exit 77
fi
if ! "$PY" -c "import venv, ensurepip" 2>/dev/null; then
  echo "SKIPPED: $PY cannot make a virtual environment (Debian: python3-venv)"
  exit 77
fi

rm -rf "$WORK"
mkdir -p "$WORK/src"
WORK=$(cd "$WORK" && pwd)
# A clean copy: what git tracks plus new files it does not ignore (no build folders).
if git -C "$SRC" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$SRC" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$WORK/src")
else
  (cd "$SRC" && tar --exclude='./build*' --exclude=./.wheels -cf - .) | (cd "$WORK/src" && tar -xf -)
fi

"$PY" -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
# -O0 instead of the package's -O3: what this checks is the packaging (and a 2-step
# ndmesh.train() of a tiny model), and a cold build (CI has no compiler cache) is the test's
# time: -O1 takes about 60% of -O3's CPU, -O0 0.7 to 1.1 of -O1's (three library sources).
args="-DNDMESH_WERROR=ON '-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG'"
if command -v ccache >/dev/null; then args="$args -DCMAKE_CXX_COMPILER_LAUNCHER=ccache"; fi
export CC=${CC:-cc} CXX=${CXX:-c++} CMAKE_ARGS="$args" CMAKE_GENERATOR="Unix Makefiles" CMAKE_BUILD_PARALLEL_LEVEL=2 \
  SKBUILD_BUILD_DIR="$WORK/src/build" PIP_DISABLE_PIP_VERSION_CHECK=1
start=$(date +%s)
"$VPY" -m pip install -q --no-index --find-links "$WHEELS" "$WORK/src"
echo "pip install .: $(($(date +%s) - start)) s (wheelhouse $WHEELS)"

want=$(sed -n 's/^project(ndmesh VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")
fail() { echo "FAIL: $*"; exit 1; }
cd "$WORK"  # not the source tree: the installed package must be the one imported
got=$("$VPY" -c "import ndmesh; print(ndmesh.__version__)")
[ "$got" = "$want" ] || fail "ndmesh.__version__ is '$got', CMakeLists.txt's project() says '$want'"
where=$("$VPY" -c "import ndmesh, ndmesh._ndmesh; print(ndmesh._ndmesh.__file__)")
case $where in "$WORK/venv/"*) ;; *) fail "ndmesh was imported from $where, not the venv" ;; esac
[ -x "$WORK/venv/bin/ndmesh" ] || fail "pip install did not put the ndmesh command into $WORK/venv/bin"
"$WORK/venv/bin/ndmesh" --help | grep -q "ndmesh mesh\|mesh " || fail "ndmesh --help does not list the commands"
got=$("$WORK/venv/bin/ndmesh" --version)
[ "$got" = "ndmesh $want" ] || fail "ndmesh --version says '$got', want 'ndmesh $want'"
if [ -n "$CMAKE_BUILD" ]; then
  got=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")/\1/p' "$CMAKE_BUILD/cmake/ndmeshConfigVersion.cmake")
  [ "$got" = "$want" ] || fail "the CMake package says version '$got', want '$want'"
fi
"$VPY" -c "import ndmesh; assert ndmesh.Mesh(dp=2, tp=2).group(3, 'dp') == [1, 3]"
# ndmesh.train() trains in the venv's interpreter (the report's losses, one per step).
"$VPY" -c "import ndmesh; r = ndmesh.train(steps=2, layers=1, hidden=16, heads=2, kv_heads=1, seq=8, batch=2,
markov_vocab=8, threads=1, eval_batches=1); assert r['steps'] == 2 and len(r['losses']) == 2, r" > /dev/null ||
  fail "ndmesh.train() of the installed package"
echo "venv: ndmesh $want imported from $where; ndmesh --help and --version work; ndmesh.train() trains"

# pip wheel: the same build folder, so only the packing is new.
"$VPY" -m pip wheel -q --no-index --find-links "$WHEELS" --no-deps -w "$WORK/wheel" "$WORK/src"
"$VPY" - "$WORK/wheel" "$want" <<'EOF'
import glob, sys, zipfile
wheel = glob.glob(f"{sys.argv[1]}/ndmesh-{sys.argv[2]}-*.whl")
assert len(wheel) == 1, f"want one ndmesh {sys.argv[2]} wheel in {sys.argv[1]}, found {wheel}"
names = zipfile.ZipFile(wheel[0]).namelist()
for want in ("ndmesh/__init__.py", "ndmesh/torch.py", "ndmesh/_ndmesh.pyi", "ndmesh/py.typed"):
    assert want in names, f"{want} is not in {wheel[0]}: {names}"
assert any(n.startswith("ndmesh/_ndmesh.") and n.endswith(".so") for n in names), names
assert any(n.endswith(".data/scripts/ndmesh") for n in names), names
assert not any(n.endswith(".a") or "/include/" in n for n in names), f"C++ install files in the wheel: {names}"
print(f"pip wheel: {wheel[0].rsplit('/', 1)[1]}, {len(names)} files")
EOF

# Type stubs: stubtest compares them with the extension, mypy checks a caller against them.
if ! ls "$WHEELS"/mypy-*.whl >/dev/null 2>&1; then
  echo "stubs: SKIPPED: no mypy wheel in $WHEELS ('make deps' downloads it from PyPI)"
  exit 0
fi
"$VPY" -m pip install -q --no-index --find-links "$WHEELS" mypy
mkdir -p "$WORK/check" && cd "$WORK/check"  # nothing here for mypy to take for the package
"$VPY" -m mypy.stubtest --mypy-config-file "$SRC/pyproject.toml" --allowlist "$SRC/tests/python/stubtest_allowlist.txt" ndmesh
"$VPY" -m mypy --config-file "$SRC/pyproject.toml" --strict "$SRC/tests/python/typed_caller.py"
# A wrong call must be caught: the stubs type every call (no Any that lets it through).
printf 'import ndmesh\nm = ndmesh.Mesh(dp=2)\nx: str = m.group(0, "dp")\nndmesh.plan("llama3-8b", gpus="8", global_batch=8)\n' \
  >"$WORK/wrong.py"
if out=$("$VPY" -m mypy --config-file "$SRC/pyproject.toml" "$WORK/wrong.py"); then
  fail "mypy accepted wrong calls: $out"
fi
echo "$out" | grep -q 'Incompatible types in assignment' || fail "mypy missed the wrong return type: $out"
echo "$out" | grep -q 'Argument "gpus" to "plan"' || fail "mypy missed the wrong argument type: $out"
echo "stubs: mypy.stubtest and mypy --strict pass, wrong calls are reported ($("$VPY" -m mypy --version))"
