#!/usr/bin/env python3
"""gemv_loops.py - SASS counts of the inner loop of src/backend/cuda/gemv_mma.cu's k_gmma per weight
super-step (64 bytes of 16 rows: 1 KB of weights per warp), for the nvfp4 forms of MS_CU_GEMV_FP4
(v1 = FMT 2, v2 = 3, v2o = 4, v3 = 5) and fp8/bf16 for reference, without nvdisasm: each k_gmma<F, M,
NT> is compiled alone for sm_90a (nvcc -cubin -lineinfo) and measured with sass_count.py (opcode table
and loop bounds there). Run from the repository root: tools/sass/gemv_loops.py [F,M,NT ...]
(default: the nvfp4 forms at M = 0 and 1, NT = 1)."""
import collections, os, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_count as S

SRC = 'src/backend/cuda/gemv_mma.cu'

def loop_line(src, fmt):
    pat = 'for (int j = ks; j < s1; j += ksplit, i++)' if fmt == 5 else 'for (int j = s0 + ks; j < s1; j += 2 * ksplit)'
    for n, l in enumerate(src.splitlines(), 1):
        if pat in l: return n, (1 if fmt == 5 else 2)
    sys.exit('loop of FMT %d not found in %s' % (fmt, SRC))

def main():
    src = open(SRC).read()
    cut = src.index('/* ---- host side ---- */')
    combos = [tuple(map(int, a.split(','))) for a in sys.argv[1:]] or \
             [(f, m, 1) for m in (1, 0) for f in (2, 3, 4, 5)]
    tmp = tempfile.mkdtemp()
    print('%-12s %5s %5s | %6s %5s %5s %5s %5s %5s | %s' % ('k_gmma', 'regs', 'spill', 'total', 'alu', 'fma', 'fp16',
                                                         'tens', 'lsu', 'per super-step, by opcode'))
    for f, m, nt in combos:
        regs, spill, raw, ops, where = S.compile_one(
            src[:cut] + '\ntemplate __global__ void k_gmma<%d, %d, %d>(gm_args);\n' % (f, m, nt), tmp, 'one.cu')
        L, per = loop_line(src, f)
        line_of = [n for _, n in where]
        ends = [i for i in range(len(ops)) if ops[i] & 0x1ff == 0x147 and raw[i] >> 63 and line_of[i] == L]
        if not ends: sys.exit('no backward branch of line %d in k_gmma<%d,%d,%d>' % (L, f, m, nt))
        hi = ends[0]
        lo = S.bra_target(raw[hi], hi)
        byn, byp = collections.Counter(), collections.Counter()
        for i in range(lo, hi + 1):
            name, pipe = S.NAMES.get(ops[i], ('op%03x' % ops[i], '?'))
            if name == 'NOP': continue
            byn[name] += 1
            byp[pipe.rstrip('?')] += 1
        tot = sum(byn.values())
        d = lambda v: '%.1f' % (v / per)
        print('%-12s %5s %5s | %6s %5s %5s %5s %5s %5s | %s' % (
            '<%d,%d,%d>' % (f, m, nt), regs, spill, d(tot), d(byp['alu']), d(byp['fma']), d(byp['fp16']), d(byp['tensor']),
            d(byp['lsu']), ' '.join('%s=%s' % (k, d(v)) for k, v in sorted(byn.items(), key=lambda kv: -kv[1]))))

if __name__ == '__main__':
    main()
