#!/usr/bin/env python3
"""gvb_loops.py - SASS counts of src/backend/cuda/gemv_bf16.cu's streaming bf16 GEMV (k_gvb<NT, MODE, TC, D>) per
512-byte warp step, without nvdisasm: each instance is compiled alone for sm_90a (nvcc -cubin -lineinfo) and
its step loop (the backward branch of the form's `for (int s0 = 0; s0 < nsteps; s0 += D)` line, D
steps unrolled) measured with sass_count.py's opcode table. The row-end block (from `if (--cleft == 0) {`
or `if (++cj == spr) {` to its `ci++;` line, with gemv_tc.cuh's gt_sum: the warp sum and partial store,
once a row, not once a step) is counted apart, so `step` is what every step issues. Run from the repository root:
tools/sass/gvb_loops.py [NT,MODE,TC[,D] ...] (default: NT 1, modes 0 and 1, TC 0 and 1, D = GB_D)."""
import collections, os, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_count as S

SRC = 'src/backend/cuda/gemv_bf16.cu'
TCH = 'src/backend/cuda/gemv_tc.cuh'
GB_D = 8

def line_of_text(lines, text, start=0):
    for n in range(start, len(lines)):
        if text in lines[n]: return n + 1
    sys.exit('"%s" not found in %s' % (text, SRC))

def main():
    src = open(SRC).read()
    lines = src.splitlines()
    cut = src.index('/* ---- The claiming form')
    combos = [tuple(map(int, a.split(','))) for a in sys.argv[1:]] or [(1, m, tc) for m in (0, 1) for tc in (0, 1)]
    combos = [c + (GB_D,) if len(c) == 3 else c for c in combos]
    tc_at = line_of_text(lines, 'if constexpr (TC) {', line_of_text(lines, 'cu_norm_stage(a.nin'))
    loops, rows = {}, {}
    for tc, start, end_text in ((1, tc_at, 'if (--cleft == 0) {'), (0, tc_at, 'if (++cj == spr) {')):
        r0 = line_of_text(lines, end_text, start)
        loops[tc] = max(n + 1 for n in range(start, r0) if 'for (int s0 = 0; s0 < nsteps; s0 += D)' in lines[n])
        rows[tc] = (r0, line_of_text(lines, 'ci++;', r0))
    tl = open(TCH).read().splitlines()
    s0 = line_of_text(tl, 'float gt_sum(')
    s1 = line_of_text(tl, 'return r;', s0)
    def in_row(tc, f, n):
        return (f == os.path.basename(SRC) and rows[tc][0] <= n <= rows[tc][1]) or (f == os.path.basename(TCH) and s0 <= n <= s1)
    tmp = tempfile.mkdtemp()
    print('%-12s %5s %5s | %6s %6s | %s' % ('k_gvb', 'regs', 'spill', 'step', 'row', 'per step, by opcode'))
    for nt, m, tc, d in combos:
        regs, spill, raw, ops, line_of = S.compile_one(
            src[:cut] + '\ntemplate __global__ void k_gvb<%d, %d, %d, %d>(gb_args);\n' % (nt, m, tc, d), tmp, 'gemv_bf16.cu')
        main_file = os.path.basename(SRC)
        ends = [i for i in range(len(ops)) if ops[i] & 0x1ff == 0x147 and raw[i] >> 63 and line_of[i] == (main_file, loops[tc])]
        if not ends: sys.exit('no backward branch of line %d in k_gvb<%d,%d,%d,%d>' % (loops[tc], nt, m, tc, d))
        hi = ends[-1]
        lo = S.bra_target(raw[hi], hi)
        step, row = collections.Counter(), 0
        for i in range(lo, hi + 1):
            name, _ = S.NAMES.get(ops[i], ('op%03x' % ops[i], '?'))
            if name == 'NOP': continue
            if in_row(tc, *line_of[i]): row += 1
            else: step[name] += 1
        per = lambda v: '%.1f' % (v / d)
        print('%-12s %5s %5s | %6s %6s | %s' % ('<%d,%d,%d,%d>' % (nt, m, tc, d), regs, spill, per(sum(step.values())), per(row),
              ' '.join('%s=%s' % (k, per(v)) for k, v in sorted(step.items(), key=lambda kv: -kv[1]))))

if __name__ == '__main__':
    main()
