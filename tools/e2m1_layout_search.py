#!/usr/bin/env python3
"""e2m1_layout_search.py - is there a load-time bit layout of an NVFP4 word that decodes cheaper?

The fused MoE kernel (src/backend/cuda/moe_fused.cu) turns each 32-bit word of 8 e2m1 values into 4
bf16x2 registers for mma.sync: each register needs, in both 16-bit halves, the 3 magnitude bits at
6..8 (exponent low bits + mantissa top bit: a bf16 subnormal-or-normal of value * 2^-126) and the sign
at 15, every other bit zero; an HMUL2 by the block scale then normalises it. With the checkpoint's
nibble order this costs 13 integer instructions a word (gemv_mma.cuh gm_fp4x8_v2). A load-time
permutation of the word's bits could cost less; this script searches the layouts reachable by a few
instruction shapes and prints how many exist (0 = none):

  A  7 ops: identity + 3 rotations (SHF.L.W), one LOP3 mask each (a tiling of Z_32 by rotations)
  B  8 ops: 3 rotations, 3 registers from one view, 1 register from 2 views (mask + LOP3 merge)
  C  8 ops: 1 rotation, 1 register direct, 3 by byte permutes (PRMT of two views) + mask
  D  8 ops: 2 rotations, 2 registers direct, 2 by PRMT of two views + mask
  E  8 ops: 3 rotations, 3 registers direct, 1 by PRMT of two of the four views + mask
  F  9 ops: 3 rotations, each register from 1 or 2 of the 4 views, at most 2 from two

Every output byte needs its top bit (bits 7, 15, 23, 31 of each register), 16 bits in all; a rotation
by r supplies them only from source bits of residue 7 - r mod 8, 4 such bits a residue, so a solution
needs 4 views with distinct rotations mod 8 (case F skips the others).

Run: python3 tools/e2m1_layout_search.py   (pure Python, a few minutes; case F is the slow one)
"""
import itertools
import sys

T = [6, 7, 8, 15]
S = frozenset(T + [t + 16 for t in T])          # bits one bf16x2 register needs
PAT = [(6, 7), (0, 7), (6, 7), (0, 7)]           # S's bits inside each byte of the register


def pre(d):
    """Source bits that a left rotation by d brings onto S."""
    return frozenset((s - d) % 32 for s in S)


def byte_src(view, k, j):
    """Source bits feeding output byte j's needed bits from byte k of rotl(w, view) (PRMT keeps bit
    positions inside a byte)."""
    return frozenset((8 * k + i - view) % 32 for i in PAT[j])


def match(rest, views):
    """Can one register take its 8 bits from `rest`, each target bit through one of `views`?"""
    Sl = sorted(S)

    def dfs(i, used):
        if i == 8:
            return True
        for d in views:
            p = (Sl[i] - d) % 32
            if p in rest and p not in used and dfs(i + 1, used | {p}):
                return True
        return False
    return len(rest) == 8 and dfs(0, frozenset())


def prmt_cover(rest, views, nregs):
    """Cover `rest` with nregs registers, each byte from a byte of one of <= 2 views."""
    opts = [[(byte_src(v, k, j), v) for v in views for k in range(4) if byte_src(v, k, j) <= rest] for j in range(4)]

    def dfs(slot, used, regviews):
        if slot == 4 * nregs:
            return len(used) == len(rest)
        j = slot % 4
        if j == 0:
            regviews = frozenset()
        for b, v in opts[j]:
            nv = regviews | {v}
            if not (b & used) and len(nv) <= 2 and dfs(slot + 1, used | b, nv):
                return True
        return False
    return dfs(0, frozenset(), frozenset())


def disjoint(sets):
    return sum(len(s) for s in sets) == len(frozenset().union(*sets))


def case_a():
    return sum(1 for ds in itertools.combinations(range(1, 32), 3)
               if disjoint([pre(0)] + [pre(d) for d in ds]))


def case_b():
    n = 0
    for d1, d2 in itertools.combinations(range(1, 32), 2):
        if not disjoint([pre(0), pre(d1), pre(d2)]):
            continue
        rest = frozenset(range(32)) - pre(0) - pre(d1) - pre(d2)
        for d3 in range(1, 32):
            if d3 not in (d1, d2) and any(match(rest, [va, d3]) for va in (0, d1, d2)):
                n += 1
    return n


def case_c():
    n = 0
    for r in range(1, 32):
        for dv in (0, r):
            if prmt_cover(frozenset(range(32)) - pre(dv), [0, r], 3):
                n += 1
    return n


def case_d():
    n = 0
    for r1, r2 in itertools.combinations(range(1, 32), 2):
        for a, b in itertools.combinations([0, r1, r2], 2):
            if disjoint([pre(a), pre(b)]) and prmt_cover(frozenset(range(32)) - pre(a) - pre(b), [0, r1, r2], 2):
                n += 1
    return n


def case_e():
    n = 0
    for rs in itertools.combinations(range(1, 32), 3):
        views = [0] + list(rs)
        for dirs in itertools.combinations(views, 3):
            D = [pre(d) for d in dirs]
            if disjoint(D) and prmt_cover(frozenset(range(32)) - frozenset().union(*D), views, 1):
                n += 1
    return n


def case_f():
    def reg_opts(vs):
        out = set()
        for choice in itertools.product(vs, repeat=8):
            if len(set(choice)) == len(vs):
                src = frozenset((s - d) % 32 for s, d in zip(sorted(S), choice))
                if len(src) == 8:
                    out.add(src)
        return out
    n = 0
    for ds in itertools.combinations(range(1, 32), 3):
        V = [0] + list(ds)
        if len({v % 8 for v in V}) < 4:  # bit 7 of every byte needs 4 distinct residues (see the docstring)
            continue
        opts = [(o, 1) for d in V for o in reg_opts([d])]
        opts += [(o, 2) for a, b in itertools.combinations(V, 2) for o in reg_opts([a, b])]

        def dfs(cov, k, two):
            if k == 4:
                return len(cov) == 32
            low = min(frozenset(range(32)) - cov)
            return any(dfs(cov | o, k + 1, two + (c == 2)) for o, c in opts
                       if low in o and not (o & cov) and two + (c == 2) <= 2)
        if dfs(frozenset(), 0, 0):
            n += 1
    return n


if __name__ == "__main__":
    cases = sys.argv[1:] or list("ABCDEF")
    for c in cases:
        print(c, globals()["case_" + c.lower()](), flush=True)
