# emu_lib.sh - what the host emulations of CUDA kernels (tests/backend/test_*_emu.sh) share; sourced, not
# run. emu_init NAME sets OUTDIR (the build folder's NAME/) and the test's name for fail; emu_build FN
# calls the script's build function FN with the address and undefined-behaviour sanitizers as its
# arguments, and again without them where the toolchain has none, and fails the test with the compiler's
# log when neither builds.

# emu_init NAME: from the repository root
emu_init() {
  EMU_NAME=$1
  OUTDIR=${MS_BUILD:-build}/$1
  mkdir -p "$OUTDIR"
}

# fail WHY: the test's one failure line and its count line, then exit
fail() {
  echo "FAIL $1"
  echo "## test_$EMU_NAME: 0 passed, 1 failed"
  exit 1
}

EMU_SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

# emu_build FN: FN [extra compiler flags...] builds the emulation; its log goes to $OUTDIR/build.log
emu_build() {
  if ! "$1" $EMU_SAN 2>"$OUTDIR/build.log"; then
    "$1" 2>>"$OUTDIR/build.log" || { cat "$OUTDIR/build.log"; fail "building the emulation"; }
  fi
}
