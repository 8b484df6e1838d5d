#!/usr/bin/env bash
# Copies the non-system shared libraries that build/moeserve and the test binaries need (jansson,
# microhttpd, onig, utf8proc, openblas + gfortran/quadmath, curl and its dependencies, xxhash, ...)
# into BUILD/lib, so a build made on this Debian machine runs on the GPU machine (Ubuntu 24.04 with
# CUDA 13 but none of our Debian packages). The binaries carry rpath $ORIGIN/lib; test binaries
# deeper in BUILD/tests get LD_LIBRARY_PATH from scripts/gpu-check.sh.
# Not copied: glibc and the loader, libstdc++/libgcc_s (newer there) and CUDA's own libraries
# (present in /usr/local/cuda/lib64 there). Usage: scripts/bundle-libs.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
mkdir -p "$BUILD/lib"
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda|libcublas|libcudart|libnccl|libnvidia)'
bins=("$BUILD/moeserve")
while IFS= read -r t; do bins+=("$t"); done < <(find "$BUILD/tests" -type f -perm -u+x -name 'test_*' 2>/dev/null)
n=0
for lib in $(for b in "${bins[@]}"; do ldd "$b" 2>/dev/null | awk '$3 ~ /^\// {print $1 " " $3}'; done | sort -u | awk '{print $1 "=" $2}'); do
  name=${lib%%=*}; path=${lib#*=}
  [[ $name =~ $skip ]] && continue
  [[ $path == /usr/local/cuda* ]] && continue
  if [ ! -e "$BUILD/lib/$name" ] || [ "$path" -nt "$BUILD/lib/$name" ]; then
    cp -L "$path" "$BUILD/lib/$name"
  fi
  n=$((n + 1))
done
echo "bundle-libs: $n libraries in $BUILD/lib ($(du -sh "$BUILD/lib" | cut -f1))"
