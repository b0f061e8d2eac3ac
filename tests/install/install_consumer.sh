#!/usr/bin/env bash
# ndmesh as a dependency: installs the build into a temporary prefix, then
#  1. checks the installed layout (headers, libraries, command, CMake package, ndmesh.pc),
#  2. configures and builds tests/install/consumer with find_package(ndmesh) and runs it
#     on 4 ranks under mpirun (ProcessGroups over a Mesh, each group checked by all_reduce),
#  3. builds a program with `pkg-config --cflags --libs ndmesh` and checks its tp groups
#     against a closed form,
#  4. runs the installed command, and imports the installed Python module when it was built.
# usage: install_consumer.sh <build dir> <python or -> <mpirun and its options...>
set -euo pipefail
build=$1 python=$2
shift 2
mpirun=("$@")
[ "$python" = "-" ] && python=""
here=$(cd "$(dirname "$0")" && pwd)
prefix=$(mktemp -d /tmp/ndmesh-install.XXXXXX)
trap 'rm -rf "$prefix"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" > "$prefix.log" 2>&1 || { cat "$prefix.log"; fail "cmake --install"; }
rm -f "$prefix.log"
libdir=$(cd "$prefix" && ls -d lib*/cmake/ndmesh | head -1 | xargs dirname | xargs dirname)
for f in bin/ndmesh include/ndmesh/mesh/mesh.hpp include/ndmesh/comm/process_groups.hpp \
         "$libdir/cmake/ndmesh/ndmeshConfig.cmake" "$libdir/cmake/ndmesh/ndmeshTargets.cmake" \
         "$libdir/pkgconfig/ndmesh.pc"; do
  [ -e "$prefix/$f" ] || fail "$f is not installed under the prefix"
done
for layer in core mesh config launch comm nn model parallel plan; do
  [ -e "$prefix/$libdir/libndmesh_$layer.a" ] || fail "$libdir/libndmesh_$layer.a is not installed"
done
echo "installed: headers, 9 layer libraries, bin/ndmesh, $libdir/cmake/ndmesh, $libdir/pkgconfig/ndmesh.pc"

# 2. find_package(ndmesh) from a consumer project, run on 4 ranks.
cmake -S "$here/consumer" -B "$prefix/consumer-build" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_TYPE=Release > "$prefix/configure.log" 2>&1 || { cat "$prefix/configure.log"; fail "consumer configure"; }
cmake --build "$prefix/consumer-build" > "$prefix/build.log" 2>&1 || { cat "$prefix/build.log"; fail "consumer build"; }
out=$("${mpirun[@]}" -np 4 "$prefix/consumer-build/consumer" 2>&1) || { echo "$out"; fail "consumer run"; }
echo "$out"
grep -q "^consumer ok: 4 ranks, groups verified" <<< "$out" || fail "consumer did not report success"

# 3. pkg-config (its Cflags carry -std=c++20: the command line here sets no standard).
flags=$(PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig" pkg-config --cflags --libs ndmesh) || fail "pkg-config ndmesh"
g++ "$here/pkgconfig_main.cpp" -o "$prefix/pkgconfig_main" $flags || fail "build with pkg-config flags: $flags"
got=$("$prefix/pkgconfig_main")
want=$(for base in 0 2 4 6; do echo "$base $((base + 1)) "; done)
[ "$got" = "$want" ] || fail "pkg-config program printed '$got', want '$want'"
echo "pkg-config: built and ran a program with: $flags"

# 4. The installed command and Python package.
"$prefix/bin/ndmesh" mesh --dims a=2,b=3 --json | grep -q '"world_size":6' || fail "installed ndmesh mesh"
if [ -n "$python" ]; then
  site="$prefix/$libdir/python3/dist-packages"
  { ls "$site"/ndmesh/_ndmesh*.so && [ -f "$site/ndmesh/__init__.py" ] && [ -f "$site/ndmesh/torch.py" ]; } >/dev/null 2>&1 ||
    fail "the Python package (ndmesh/_ndmesh*.so, __init__.py, torch.py) is not installed in $site"
  got=$(cd / && PYTHONPATH="$site" "$python" -c 'import ndmesh; print(ndmesh.__file__.startswith("'"$site"'"), ndmesh.Mesh(tp=2, dp=3).groups("dp"))')
  [ "$got" = "True [[0, 2, 4], [1, 3, 5]]" ] || fail "installed Python module: got '$got'"
  echo "python: the installed module imports from $site"
fi
echo "install test passed"
