#!/usr/bin/env bash
# gpu-pack.sh - packs a prebuilt CUDA build for the GPU machine into .gpu/b.txz (under the device
# tool's 64 MiB carry limit): the moeserve binary (and with TRACE_BUILD a kernel-trace build of it), the GPU
# test programs and the bundled libraries,
# stripped and xz-compressed (decompressing takes ~256 MiB of memory). Run after `make build`. On the GPU machine:
#   python3 -c "import tarfile; tarfile.open('.gpu/b.txz').extractall('.gpu')" && BUILD=.gpu/build scripts/gpu-check.sh
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
scripts/bundle-libs.sh "$BUILD" >/dev/null
rm -rf .gpu/build && mkdir -p .gpu/build/tests
cp "$BUILD/moeserve" .gpu/build/
# TRACE_BUILD: a CU_TRACE=1 build dir whose moeserve goes along as moeserve-trace; BASE_BUILD: an older
# build's moeserve as moeserve-base, the same run's baseline (scripts/gpu-idle-ab.sh)
if [ -n "${TRACE_BUILD:-}" ]; then cp "$TRACE_BUILD/moeserve" .gpu/build/moeserve-trace; fi
if [ -n "${BASE_BUILD:-}" ]; then cp "$BASE_BUILD/moeserve" .gpu/build/moeserve-base; fi
cp -r "$BUILD/lib" .gpu/build/
# TESTS: the test programs to pack (default: gpu-check's), EXTRA_TESTS more
for t in ${TESTS-backend/test_cuda_ops moe/test_moe_cuda model/test_forward_cache model/test_mtp engine/test_spec_model dist/test_comm_nccl} ${EXTRA_TESTS:-}; do
  mkdir -p ".gpu/build/tests/$(dirname "$t")"
  cp "$BUILD/tests/$t" ".gpu/build/tests/$t"
done
find .gpu/build -type f -perm -u+x -exec strip --strip-unneeded {} + 2>/dev/null || true
# one xz block with a dictionary larger than the tar: the statically linked programs share most of
# their bytes, which a 256 MiB window finds (32 MB with xz -6, about 16 MB like this)
(cd .gpu && tar cf - build | xz --lzma2=preset=9e,dict=256MiB -T1 > b.txz)
ls -l .gpu/b.txz | awk '{printf "%s: %.1f MB\n", $9, $5 / 1e6}'
