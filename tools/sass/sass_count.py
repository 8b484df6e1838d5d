#!/usr/bin/env python3
"""sass_count.py - SASS instruction counts of one kernel of an sm_90 cubin without nvdisasm (this
machine has no cuobjdump/nvdisasm): each 16-byte instruction's opcode is its low 12 bits, named from
a table this script's author built by compiling one-instruction PTX probes with nvcc 13.0, and tied
to source lines through the cubin's -lineinfo line table (binutils readelf). Prints, for the address
range spanned by instructions from the given source lines (the inner loop), counts per opcode and per
issue pipe (ncu's names, as far as the opcode's pipe is known). Evidence for bench/NOTES.md only.

usage: sass_count.py CUBIN KERNEL_SUBSTRING FIRST_LINE LAST_LINE [--all | --loop LINE]
  the range is [lowest, highest] address of instructions whose line is in [FIRST_LINE, LAST_LINE];
  --loop LINE: instead the loop closed by the first backward branch of source line LINE (the loop
  header) after the first of those instructions: from the branch's target to the branch"""
import collections, os, re, struct, subprocess, sys

NAMES = {  # opcode (low 12 bits) -> (name, pipe)
    0x202: ('MOV', 'alu'), 0x802: ('MOV', 'alu'), 0xc02: ('MOV', 'alu'),
    0x207: ('SEL', 'alu'), 0x807: ('SEL', 'alu'), 0xc07: ('SEL', 'alu'),
    0x209: ('FMNMX', 'alu'), 0x20b: ('FSETP', 'alu'), 0x80b: ('FSETP', 'alu'),
    0x20c: ('ISETP', 'alu'), 0x80c: ('ISETP', 'alu'), 0xc0c: ('ISETP', 'alu'),
    0x20f: ('IMNMX', 'alu'), 0x80f: ('IMNMX', 'alu'),
    0x210: ('IADD3', 'alu'), 0x810: ('IADD3', 'alu'), 0xc10: ('IADD3', 'alu'),
    0x211: ('LEA', 'alu'), 0x811: ('LEA', 'alu'), 0xc11: ('LEA', 'alu'),
    0x212: ('LOP3', 'alu'), 0x812: ('LOP3', 'alu'), 0xc12: ('LOP3', 'alu'),
    0x213: ('IABS', 'alu'),
    0x216: ('PRMT', 'alu'), 0x816: ('PRMT', 'alu'), 0xc16: ('PRMT', 'alu'),
    0x219: ('SHF', 'alu'), 0x819: ('SHF', 'alu'), 0xc19: ('SHF', 'alu'),
    0x81a: ('SGXT', 'alu'),
    0x220: ('FMUL', 'fma'), 0x820: ('FMUL', 'fma'), 0xc20: ('FMUL', 'fma'),
    0x221: ('FADD', 'fma'), 0x821: ('FADD', 'fma'), 0xc21: ('FADD', 'fma'),
    0x223: ('FFMA', 'fma'), 0x423: ('FFMA', 'fma'), 0x823: ('FFMA', 'fma'), 0xc23: ('FFMA', 'fma'),
    0x224: ('IMAD', 'fma'), 0x424: ('IMAD', 'fma'), 0x824: ('IMAD', 'fma'), 0xc24: ('IMAD', 'fma'),
    0xe24: ('IMAD', 'fma'),
    0x225: ('IMAD.WIDE', 'fma'), 0x825: ('IMAD.WIDE', 'fma'), 0xc25: ('IMAD.WIDE', 'fma'),
    0x227: ('IMAD.HI', 'fma'), 0x827: ('IMAD.HI', 'fma'),
    0x231: ('HFMA2', 'fp16'), 0x232: ('HMUL2', 'fp16'), 0x235: ('HFMA2.MMA', 'fma'),
    0x23c: ('HMMA', 'tensor'), 0x23e: ('F2FP', 'alu'), 0x245: ('I2F', 'xu'),
    0x305: ('F2I', 'xu'), 0x308: ('MUFU', 'xu'), 0x309: ('POPC', 'xu'),
    0x806: ('VOTE', 'alu'), 0x3c4: ('REDUX', 'adu'), 0xf89: ('SHFL', 'lsu'), 0x589: ('SHFL', 'lsu'),
    0x981: ('LDG', 'lsu'), 0x984: ('LDS', 'lsu'), 0x986: ('STG', 'lsu'), 0x388: ('STS', 'lsu'),
    0x988: ('STS', 'lsu'), 0xfae: ('LDGSTS', 'lsu'), 0xb82: ('LDC', 'lsu'), 0xab9: ('ULDC', 'uniform'),
    0x918: ('NOP', 'none'), 0x919: ('S2R', 'adu'), 0x947: ('BRA', 'cbu'), 0x94d: ('EXIT', 'cbu'),
    0x941: ('BSYNC', 'cbu'), 0x945: ('BSSY', 'cbu'), 0xb1d: ('BAR', 'adu'),
    0x836: ('VIADD?', 'fma?'), 0xc36: ('VIADD?', 'fma?'),
}

def sections(path):
    d = open(path, 'rb').read()
    e_shoff, = struct.unpack_from('<Q', d, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from('<HHH', d, 0x3a)
    sh = [struct.unpack_from('<IIQQQQ', d, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    stro = sh[e_shstrndx][4]
    out = {}
    for name, typ, flags, addr, off, size in sh:
        out[d[stro + name:d.index(b'\0', stro + name)].decode()] = d[off:off + size]
    return out

def bra_target(lo64, i):
    """Instruction index a BRA at index i jumps to. Offset in 4-byte units: bits 16..23 of the low
    word, the rest from bit 34 up (sign-extended); fitted on nvcc 13.0 sm_90a loops of known length
    (a loop 1 instruction longer moves bits 16..23 by -4; the closing 'BRA self' decodes to -16 bytes)."""
    hi = lo64 >> 34
    if hi & (1 << 29): hi -= 1 << 30
    units = hi * 256 + ((lo64 >> 16) & 0xff)
    return i + 1 + units // 4

def line_table_files(path):
    """[(address, source file's base name, line)] of the cubin's single kernel (readelf
    --debug-dump=decodedline): the file tells inlined header lines apart."""
    txt = subprocess.run(['readelf', '--debug-dump=decodedline', path], capture_output=True, text=True).stdout
    rows = []
    for l in txt.splitlines():
        m = re.match(r'^(\S+\.cuh?)\S*\s+(\d+)\s+(0x[0-9a-f]+|0)\s', l)
        if m: rows.append((int(m.group(3), 16), os.path.basename(m.group(1)), int(m.group(2))))
    return rows

def line_table(path):
    """[(address, line)] of the cubin's single kernel."""
    return [(a, n) for a, _, n in line_table_files(path)]

def compile_one(src, tmp, name):
    """Compiles source text src (one kernel instance) for sm_90a into tmp/name's cubin (nvcc -cubin -lineinfo);
    returns (registers, spill store bytes, raw 64-bit low words, opcodes, (file, line) of each instruction).
    Exits with nvcc's message when it fails."""
    one, cub = os.path.join(tmp, name), os.path.join(tmp, 'k.cubin')
    open(one, 'w').write(src)
    r = subprocess.run(['nvcc', '-std=c++17', '-O3', '-lineinfo', '-gencode=arch=compute_90a,code=sm_90a', '-Isrc',
                        '--expt-relaxed-constexpr', '-cubin', '-Xptxas', '-v', '-o', cub, one], capture_output=True, text=True)
    if r.returncode: sys.exit(r.stderr)
    regs = re.search(r'Used (\d+) registers', r.stderr).group(1)
    spill = re.search(r'(\d+) bytes spill stores', r.stderr).group(1)
    secs = sections(cub)
    code = secs[[n for n in secs if n.startswith('.text.')][0]]
    raw = [struct.unpack_from('<Q', code, i)[0] for i in range(0, len(code), 16)]
    ops = [o & 0xfff for o in raw]
    lt = sorted(line_table_files(cub))
    where, j = [], 0
    for i in range(len(ops)):
        while j + 1 < len(lt) and lt[j + 1][0] <= i * 16: j += 1
        where.append(lt[j][1:])
    return regs, spill, raw, ops, where

def main():
    path, kname, l0, l1 = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    secs = sections(path)
    texts = [n for n in secs if n.startswith('.text.') and kname in n]
    if len(texts) != 1: sys.exit('kernels matching %r: %s' % (kname, texts))
    code = secs[texts[0]]
    ops = [struct.unpack_from('<Q', code, i)[0] & 0xfff for i in range(0, len(code), 16)]
    lt = sorted(line_table(path))
    line_of = [0] * len(ops)
    j = 0
    for i in range(len(ops)):
        while j + 1 < len(lt) and lt[j + 1][0] <= i * 16: j += 1
        line_of[i] = lt[j][1] if lt and lt[j][0] <= i * 16 else 0
    hit = [i for i in range(len(ops)) if l0 <= line_of[i] <= l1]
    if not hit: sys.exit('no instruction from lines %d..%d' % (l0, l1))
    lo, hi = (0, len(ops) - 1) if '--all' in sys.argv else (min(hit), max(hit))
    if '--loop' in sys.argv:
        L = int(sys.argv[sys.argv.index('--loop') + 1])
        raw = [struct.unpack_from('<Q', code, i)[0] for i in range(0, len(code), 16)]
        ends = [i for i in range(min(hit), len(ops)) if ops[i] & 0x1ff == 0x147 and raw[i] >> 63 and line_of[i] == L]
        if not ends: sys.exit('no backward branch of line %d after line %d' % (L, l0))
        lo, hi = bra_target(raw[ends[0]], ends[0]), ends[0]
    byname, bypipe = collections.Counter(), collections.Counter()
    for i in range(lo, hi + 1):
        name, pipe = NAMES.get(ops[i], ('op%03x' % ops[i], '?'))
        if name == 'NOP': continue
        byname[name] += 1
        bypipe[pipe] += 1
    print('%s: %d instructions in all; range [%d, %d] (%d, NOPs excluded: %d)' %
          (texts[0], len(ops), lo, hi, hi - lo + 1, sum(byname.values())))
    print('  by pipe: ' + ' '.join('%s=%d' % kv for kv in sorted(bypipe.items(), key=lambda kv: -kv[1])))
    print('  by op:   ' + ' '.join('%s=%d' % kv for kv in sorted(byname.items(), key=lambda kv: -kv[1])))

if __name__ == '__main__':
    main()
