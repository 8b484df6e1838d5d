// test_decisions.mjs - record/replay of a step's discrete choices (`moeserve logits
// --record-decisions / --replay-decisions`), the tool the GPU conformance and `compare` use to
// check kernels op for op across backends: replaying a run's own choices reproduces its logits;
// replaying altered choices changes exactly the affected logits; router margins are recorded.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

const BIN = process.env.MS_BIN || path.resolve('build/moeserve');
const tmp = mkdtempSync(path.join(tmpdir(), 'msdec-'));
let pass = 0, fail = 0;
function test(name, fn) {
  const errs = []; const check = (c, m) => { if (!c) errs.push(m); };
  try { fn(check); } catch (e) { errs.push(String(e.stack || e)); }
  if (errs.length) { fail++; console.error(`FAIL ${name}\n  ${errs.join('\n  ')}`); } else { pass++; console.error(`ok   ${name}`); }
}
const run = (args) => { const r = spawnSync(BIN, args, { encoding: 'utf8' }); return { code: r.status, err: r.stderr }; };
const f32 = (f) => { const b = readFileSync(f); return new Float32Array(b.buffer, b.byteOffset, b.length / 4); };
function readSt(file) {
  const b = readFileSync(file); const n = Number(b.readBigUInt64LE(0));
  const hdr = JSON.parse(b.subarray(8, 8 + n).toString()); const base = 8 + n; const out = {};
  for (const [k, v] of Object.entries(hdr)) {
    if (k === '__metadata__') continue;
    const [s, e] = v.data_offsets; const buf = b.subarray(base + s, base + e);
    const arr = v.dtype === 'I32' ? new Int32Array(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length))
      : new Float32Array(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.length));
    out[k] = { shape: v.shape, data: arr, off: base + s };
  }
  return { buf: b, t: out };
}
const maxDiff = (a, b, from = 0, to = a.length) => { let m = 0; for (let i = from; i < to; i++) m = Math.max(m, Math.abs(a[i] - b[i])); return m; };

for (const fx of ['glm4_moe', 'glm_moe_dsa_legacy']) {
  const dir = path.resolve('tests/fixtures', fx);
  const ref = JSON.parse(readFileSync(path.join(dir, 'ref.json'), 'utf8'));
  const ids = ref.ids.join(','), V = ref.vocab;
  const A = path.join(tmp, `${fx}.a.f32`), B = path.join(tmp, `${fx}.b.f32`), C = path.join(tmp, `${fx}.c.f32`);
  const D = path.join(tmp, `${fx}.st`), D2 = path.join(tmp, `${fx}.alt.st`);
  test(`${fx}: replaying its own choices reproduces the logits`, (check) => {
    let r = run(['logits', '--model', dir, '--ids', ids, '--out', A, '--record-decisions', D]);
    check(r.code === 0, r.err);
    r = run(['logits', '--model', dir, '--ids', ids, '--out', B, '--replay-decisions', D]);
    check(r.code === 0, r.err);
    if (r.code === 0) check(maxDiff(f32(A), f32(B)) < 1e-4, `max diff ${maxDiff(f32(A), f32(B))}`);
  });
  test(`${fx}: recorded choices hold experts, finite margins and key selections`, (check) => {
    const { t } = readSt(D);
    const [L, T, k] = t.expert_ids.shape;
    check(L === (fx.startsWith('glm4') ? 3 : 4) && T === ref.ids.length && k === 3, `shape ${t.expert_ids.shape}`);
    let moeRows = 0, finite = 0;
    for (let i = 0; i < L * T; i++) {
      const row = Array.from(t.expert_ids.data.subarray(i * k, i * k + k));
      if (row[0] >= 0) { moeRows++; check(new Set(row).size === k && row.every((e) => e < 8), `row ${row}`); if (Number.isFinite(t.expert_margin.data[i]) && t.expert_margin.data[i] >= 0) finite++; }
    }
    check(moeRows > 0 && finite === moeRows, `${finite} finite margins of ${moeRows} MoE rows`);
    if (fx.includes('dsa')) {
      const K = t.index_sel.shape[2]; let sparse = 0;
      for (let i = 0; i < L * T; i++) if (t.index_sel.data[i * K] >= 0) sparse++;
      check(sparse > 0, 'no key selection recorded');
    }
  });
  test(`${fx}: replaying altered choices changes the logits from that token on, not before`, (check) => {
    const { buf, t } = readSt(D);
    const [L, T, k] = t.expert_ids.shape;
    const tok = 12;                                   // alter the last MoE layer's choice for token 12
    const row = ((L - 1) * T + tok) * k;
    const used = new Set(Array.from(t.expert_ids.data.subarray(row, row + k)));
    const alt = [...Array(8).keys()].find((e) => !used.has(e));
    const patched = Buffer.from(buf); patched.writeInt32LE(alt, t.expert_ids.off + row * 4);
    writeFileSync(D2, patched);
    const r = run(['logits', '--model', dir, '--ids', ids, '--out', C, '--replay-decisions', D2]);
    check(r.code === 0, r.err);
    if (r.code !== 0) return;
    const a = f32(A), c = f32(C);
    check(maxDiff(a, c, 0, tok * V) < 1e-4, `positions before ${tok} changed`);
    check(maxDiff(a, c, tok * V, (tok + 1) * V) > 1e-3, `position ${tok} did not change`);
  });
}
test('replay with a token count that does not match fails with one line', (check) => {
  const dir = path.resolve('tests/fixtures/glm4_moe');
  const r = run(['logits', '--model', dir, '--ids', '1,2,3', '--out', path.join(tmp, 'x.f32'), '--replay-decisions', path.join(tmp, 'glm4_moe.st')]);
  check(r.code !== 0 && r.err.trim().split('\n').length === 1 && /replay-decisions/.test(r.err), r.err);
});
console.log(`## test_decisions: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
