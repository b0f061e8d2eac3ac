#!/usr/bin/env bash
# The sanitizer setup with hwloc's plugins loaded (make sanitize runs this under its SAN_ENV).
# Open MPI's hwloc loads every plugin of libhwloc-plugins at MPI_Init; its GPU probes (OpenCL,
# GL) pull in libOpenCL, libX11 and libXNVCtrl, modules with thread-local storage. With GCC 12's
# sanitizer runtime intercepting __tls_get_addr, one of their dynamic TLS blocks at 16 mod 4096
# made LeakSanitizer's tracer fault at exit (tests/sanitize/dtls_probe.c has the mechanism).
# One sanitized `ndmesh train` with the plugins enabled must exit cleanly, and the plugins must
# really have been loaded (checked in the dynamic loader's own log), or the test tests nothing.
# It runs as an MPI singleton (NDMESH_BACKEND=mpi): started by hand, ndmesh starts no MPI.
set -euo pipefail
ndmesh=${1:?usage: train_hwloc.sh path/to/ndmesh}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

unset HWLOC_COMPONENTS HWLOC_PLUGINS_BLACKLIST HWLOC_PLUGINS_PATH
status=0
NDMESH_BACKEND=mpi LD_DEBUG=files LD_DEBUG_OUTPUT="$tmp/ld" "$ndmesh" train --layers 1 --hidden 32 --heads 2 --seq 16 --batch 4 \
  --steps 1 --threads 1 > "$tmp/out.txt" 2> "$tmp/err.txt" || status=$?
if [ "$status" -ne 0 ]; then
  tail -n 20 "$tmp/err.txt" >&2
  fail "sanitized ndmesh train exited $status with hwloc's plugins enabled"
fi
grep -q 'LeakSanitizer\|AddressSanitizer\|runtime error' "$tmp/err.txt" && { cat "$tmp/err.txt" >&2; fail "sanitizer report"; }
grep -q '^step 1/1 loss ' "$tmp/out.txt" || fail "no step line: $(cat "$tmp/out.txt")"
loaded=$(cat "$tmp"/ld.* | grep -o 'file=[^ ]*hwloc_[a-z]*\.so' | sort -u | sed 's|.*/||' | tr '\n' ' ')
[ -n "$loaded" ] || fail "no hwloc plugin was loaded, so this run tests nothing: install libhwloc-plugins (make deps)"
echo "ok: clean exit with hwloc plugins loaded: $loaded"
