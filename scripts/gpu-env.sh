# gpu-env.sh - sourced by the GPU-machine scripts (gpu-check, gpu-bench, gpu-profile): repo root as
# the working directory, BUILD (prebuilt here, default build) and OUT (logs, default ./gpu-out),
# the carried libraries on the loader path, NVLink multicast off, BIN = the moeserve binary.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$BUILD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
BIN=$BUILD/moeserve
