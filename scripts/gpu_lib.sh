# shellcheck shell=bash
# Shared by scripts/gpu_check.sh and scripts/gpu_kernels.sh (sourced, not run): packing
# binaries built here with the shared libraries they load, and, on the GPU machine, finding
# the NVIDIA libraries and running a packed binary with its libraries. See docs/gpu.md.
#
# The packed libraries apply to the packed binaries only: LD_LIBRARY_PATH is set for
# that one command (env LD_LIBRARY_PATH="$(gpu_libraries <work>)" <binary>); python3, tar, xz
# and nvidia-smi use the machine's own.

# The C library's parts (they must come from the machine that runs the binary), the driver,
# cuBLAS/cuBLASLt, NCCL and cuDNN (the GPU machine's toolkit or PyTorch's pip packages have them;
# libnccl.so.2 is 200 MB and cuDNN's engines 500 MB, beyond what a device call carries; ndmesh
# loads cuDNN with dlopen, so ldd never lists it anyway).
gpu_not_packed() {
  case $1 in
    libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | libresolv.so* | libutil.so* | \
      libanl.so* | libnsl.so* | libmvec.so* | libcuda.so* | libnvidia-*.so* | libcublas* | libnccl* | libcudnn*) return 0 ;;
  esac
  return 1
}

# gpu_pack <tarball> <binary>...: bin/ (the binaries, stripped), lib/ (every shared library
# they load from this machine but gpu_not_packed's) and glibc_required (the newest GLIBC_
# symbol version they need) in one xz tarball. Any failure is printed and returns 2.
gpu_pack() {
  local tarball=$1 stage deps lib b
  shift
  stage=$(mktemp -d "${TMPDIR:-/tmp}/ndmesh-pack.XXXXXX") || return 2
  mkdir -p "$stage/bin" "$stage/lib"
  for b in "$@"; do
    if ! [ -x "$b" ] || ! strip -o "$stage/bin/$(basename "$b")" "$b"; then
      echo "pack: cannot copy $b (missing or not an executable: build it first)" >&2
      rm -rf "$stage"
      return 2
    fi
  done
  if ! deps=$(ldd "$stage"/bin/* 2>&1); then
    echo "pack: ldd failed on the binaries: $(tail -n 3 <<< "$deps" | tr '\n' ' ')" >&2
    rm -rf "$stage"
    return 2
  fi
  if grep -q 'not found' <<< "$deps"; then
    echo "pack: libraries not found here: $(grep 'not found' <<< "$deps" | sort -u | tr -s ' \t\n' ' ')" >&2
    rm -rf "$stage"
    return 2
  fi
  for lib in $(awk '/=> \// {print $3}' <<< "$deps" | sort -u); do
    gpu_not_packed "$(basename "$lib")" && continue
    if ! cp -L "$lib" "$stage/lib/"; then
      echo "pack: cannot copy $lib" >&2
      rm -rf "$stage"
      return 2
    fi
  done
  local f
  for f in "$stage"/bin/* "$stage"/lib/*; do
    echo "${f#"$stage"/} $(objdump -T "$f" 2> /dev/null | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n 1)"
  done > "$stage/glibc_needs"
  awk '{print $2}' "$stage/glibc_needs" | sort -V | tail -n 1 > "$stage/glibc_required"
  if ! tar -C "$stage" -cJf "$tarball.part" bin lib glibc_required glibc_needs || ! mv "$tarball.part" "$tarball"; then
    echo "pack: cannot write $tarball" >&2
    rm -rf "$stage" "$tarball.part"
    return 2
  fi
  rm -rf "$stage"
}

# gpu_kernel_tests <build>: the gpu_test_* targets' names, one a line.
gpu_kernel_tests() {
  (cd "$1" && cmake --build . --target help) | sed -n 's/^\.\.\. \(gpu_test_[a-z_]*\)$/\1/p'
}

# describe <exit status> <seconds allowed>: why a command ended unsuccessfully.
describe() {
  if [ "$1" -eq 124 ] || [ "$1" -eq 137 ]; then
    echo "timed out after $2 s"
  elif [ "$1" -gt 128 ]; then
    echo "killed by signal $(($1 - 128)) (SIG$(kill -l $(($1 - 128)) 2> /dev/null || echo '?'))"
  else
    echo "exit status $1"
  fi
}

# gpu_unpack <tarball> <work>: a fresh <work> holding bin/, lib/, glibc_required and
# glibc_needs (each file's newest GLIBC_ symbol version).
gpu_unpack() {
  rm -rf "$2" && mkdir -p "$2" && tar -C "$2" -xJf "$1"
}

# gpu_fit_glibc <work>: a packed library that needs a newer glibc than this machine's is
# moved out of lib/ when the machine has its own (libstdc++.so.6, say); one line each.
gpu_fit_glibc() {
  local have file need
  have=$(getconf GNU_LIBC_VERSION 2> /dev/null | awk '{print $2}')
  [ -n "$have" ] && [ -f "$1/glibc_needs" ] || return 0
  while read -r file need; do
    [[ $file == lib/* ]] && [ -n "$need" ] || continue
    [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | tail -n 1)" = "$have" ] && continue
    # grep reads the whole list: with -q it may stop early, and under pipefail the SIGPIPE
    # of ldconfig would turn a found library into "not found".
    if "$(command -v ldconfig || echo /sbin/ldconfig)" -p 2> /dev/null | grep "^[[:space:]]*${file#lib/} " > /dev/null; then
      mkdir -p "$1/lib-newer-glibc" && mv "$1/$file" "$1/lib-newer-glibc/" &&
        echo "glibc: the packed ${file#lib/} needs glibc $need, this machine has $have: the machine's own is used"
    else
      echo "glibc: the packed ${file#lib/} needs glibc $need, this machine has $have and no ${file#lib/} of its own"
    fi
  done < "$1/glibc_needs"
}

# gpu_lib_dirs: the folders the NVIDIA libraries are looked for in, in order: the CUDA
# toolkit, the system's library folders, then PyTorch's pip packages (site-packages/nvidia/*/lib,
# e.g. nvidia/cu13/lib or nvidia/cublas/lib).
gpu_lib_dirs() {
  { gpu_lib_dirs_all | while read -r d; do readlink -f "$d"; done; } | awk 'NF && !seen[$0]++'
}

gpu_lib_dirs_all() {
  local d
  for d in ${CUDA_HOME:+$CUDA_HOME/lib64 $CUDA_HOME/lib $CUDA_HOME/targets/x86_64-linux/lib} \
    /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
    /usr/local/cuda-*/lib64 /usr/local/cuda-*/lib /usr/local/cuda-*/targets/x86_64-linux/lib \
    /usr/lib/x86_64-linux-gnu /usr/lib64 /lib/x86_64-linux-gnu; do
    [ -d "$d" ] && echo "$d"
  done
  timeout 60 python3 - << 'EOF' 2> /dev/null
import glob, os, site, sys
roots = []
try:
    import nvidia
    roots += list(nvidia.__path__)
except Exception:
    pass
places = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()] + sys.path
roots += [os.path.join(p, "nvidia") for p in places if p]
seen = set()
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "*", "lib"))):
        if os.path.isdir(d) and d not in seen:
            seen.add(d)
            print(d)
EOF
  true
}

# gpu_find <soname>...: the first existing file, trying each soname in turn through every
# folder of gpu_lib_dirs (GPU_LIB_DIRS caches them); nothing printed when none exists.
gpu_find() {
  local name d
  [ -n "${GPU_LIB_DIRS:-}" ] || GPU_LIB_DIRS=$(gpu_lib_dirs)
  for name in "$@"; do
    while read -r d; do
      [ -n "$d" ] && [ -e "$d/$name" ] && { echo "$d/$name"; return 0; }
    done <<< "$GPU_LIB_DIRS"
  done
  return 0
}

# gpu_find_cublaslt: sets CUBLASLT (the file, or empty) and prints one line saying which
# it took: libcublasLt.so.13, else .so.12, from the toolkit or PyTorch's pip packages.
gpu_find_cublaslt() {
  CUBLASLT=$(gpu_find libcublasLt.so.13 libcublasLt.so.12)
  if [ -n "$CUBLASLT" ]; then
    echo "cuBLASLt: took $CUBLASLT"
  else
    echo "cuBLASLt: neither libcublasLt.so.13 nor libcublasLt.so.12 in:" $GPU_LIB_DIRS
  fi
}

# gpu_libraries <work>: LD_LIBRARY_PATH for the packed binaries: the pack's lib/, then the
# folder of the cuBLASLt that gpu_find_cublaslt took, then those of NCCL_LIB (libnccl.so.2)
# and CUDNN_LIB (libcudnn.so.9, gpu_find's; cuDNN attention dlopens it, and it its
# sub-libraries libcudnn_graph, libcudnn_engines_*, libcudnn_ops, ... beside it) when elsewhere;
# with cuDNN, those of NVRTC (libnvrtc.so.13 and .so.12, for cuDNN's runtime-compiled engines,
# whichever CUDA its build wants).
gpu_libraries() {
  local p="$1/lib${CUBLASLT:+:$(dirname "$CUBLASLT")}" lib nvrtc=()
  [ -n "${CUDNN_LIB:-}" ] && nvrtc=("$(gpu_find libnvrtc.so.13)" "$(gpu_find libnvrtc.so.12)")
  for lib in "${NCCL_LIB:-}" "${CUDNN_LIB:-}" "${nvrtc[@]}"; do
    [ -n "$lib" ] && [[ ":$p:" != *":$(dirname "$lib"):"* ]] && p+=":$(dirname "$lib")"
  done
  echo "$p"
}
