# emu_lib.sh - what the host emulations of CUDA kernels (tests/backend/test_*_emu.sh) share; sourced, not
# run. emu_init NAME sets OUTDIR (the build folder's NAME/) and the test's name for fail; emu_build FN
# calls the script's build function FN with the address and undefined-behaviour sanitizers as its
# arguments, and again without them where the toolchain has none, and fails the test with the compiler's
# log when neither builds; emu_run_both_landings BIN runs the emulation twice, with cp.async copies
# landing at their wait and then at issue (the emulations' MS_EMU_CP_EARLY).

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

# emu_run_both_landings BIN: BIN with copies landing at their wait (a read before the wait or barrier
# shows), then at issue (a copy into a buffer or ring stage still to be read shows); exits with the
# failing pass's status
emu_run_both_landings() {
  local rc=0 r early
  for early in 0 1; do
    MS_EMU_CP_EARLY=$early timeout 900 "$1"
    r=$?
    [ $r = 0 ] || { echo "FAIL emulation (MS_EMU_CP_EARLY=$early) exited with $r"; rc=$r; }
  done
  exit $rc
}
