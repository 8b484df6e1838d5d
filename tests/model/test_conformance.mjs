// test_conformance.mjs - model math against transformers: for every tests/fixtures/*/ref.json
// (written by tools/make_fixtures.py, which runs transformers in float32 on the same checkpoint)
// `moeserve logits` must reproduce the reference logits of every position (max|a-b| / max|b| per
// row <= tol) and `moeserve generate` the greedy continuation exactly, with the KV cache and with
// --no-cache. Fails when no fixture exists. MS_DEVICE=cuda runs the same against the GPU backend
// (tolerance MS_TOL, default 1e-2, greedy compared only where the reference top-2 gap allows).
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

const BIN = process.env.MS_BIN || path.resolve('build/moeserve');
const DEVICE = process.env.MS_DEVICE || 'cpu';
const FIX = path.resolve('tests/fixtures');
const tmp = mkdtempSync(path.join(tmpdir(), 'msconf-'));
let pass = 0, fail = 0;

function test(name, fn) {
  const errs = [];
  const check = (cond, msg) => { if (!cond) errs.push(msg); };
  try { fn(check); } catch (e) { errs.push(`threw: ${e.stack || e}`); }
  if (errs.length) { fail++; console.error(`FAIL ${name}\n  ${errs.join('\n  ')}`); } else { pass++; console.error(`ok   ${name}`); }
}

function run(args) {
  const r = spawnSync(BIN, args, { encoding: 'utf8', timeout: 120000 });
  return { code: r.status, out: r.stdout || '', err: r.stderr || '' };
}

const f32 = (file) => { const b = readFileSync(file); return new Float32Array(b.buffer, b.byteOffset, b.length / 4); };

const dirs = existsSync(FIX) ? readdirSync(FIX).filter((d) => existsSync(path.join(FIX, d, 'ref.json'))).sort() : [];
test('fixtures exist', (check) => check(dirs.length > 0, `no tests/fixtures/*/ref.json found (run tools/make_fixtures.py)`));

for (const name of dirs) {
  const dir = path.join(FIX, name);
  const ref = JSON.parse(readFileSync(path.join(dir, 'ref.json'), 'utf8'));
  const tol = DEVICE === 'cpu' ? ref.tol : Number(process.env.MS_TOL || 1e-2);
  test(`${name}: logits of every position within ${tol}`, (check) => {
    const out = path.join(tmp, `${name}.f32`);
    const r = run(['logits', '--model', dir, '--ids', ref.ids.join(','), '--out', out, '--device', DEVICE]);
    check(r.code === 0, `logits exited ${r.code}: ${r.err.trim()}`);
    if (r.code !== 0) return;
    const a = f32(out), b = f32(path.join(dir, ref.logits_file));
    const V = ref.vocab, n = ref.ids.length;
    check(a.length === n * V && b.length === n * V, `sizes ${a.length} / ${b.length}, want ${n * V}`);
    let worst = 0, at = -1;
    for (let i = 0; i < n; i++) {
      let md = 0, mx = 0;
      for (let j = 0; j < V; j++) {
        const d = Math.abs(a[i * V + j] - b[i * V + j]);
        md = Number.isNaN(d) ? Infinity : Math.max(md, d);
        mx = Math.max(mx, Math.abs(b[i * V + j]));
      }
      const e = md / mx;
      if (!(e <= worst)) { worst = e; at = i; }
    }
    check(worst <= tol, `worst relative error ${worst.toExponential(3)} at position ${at}`);
  });
  const gapOk = DEVICE === 'cpu' || (ref.greedy_min_gap ?? 0) > 0.05;
  if (!gapOk) continue;
  for (const extra of [[], ['--no-cache']]) {
    test(`${name}: greedy continuation ${extra.join(' ') || '(kv cache)'}`, (check) => {
      const r = run(['generate', '--model', dir, '--ids', ref.greedy_prompt.join(','), '--max-tokens',
        String(ref.greedy_ids.length), '--temperature', '0', '--ignore-eos', '--print-ids', '--device', DEVICE, ...extra]);
      check(r.code === 0, `generate exited ${r.code}: ${r.err.trim()}`);
      check(r.out.trim() === ref.greedy_ids.join(','), `got ${r.out.trim()} want ${ref.greedy_ids.join(',')}`);
    });
  }
}

test('errors: one stderr line naming the flag or file', (check) => {
  let r = run(['logits', '--model', path.join(tmp, 'nope'), '--ids', '1,2', '--out', path.join(tmp, 'x.f32')]);
  check(r.code !== 0 && r.err.includes('nope'), `missing model dir: ${r.code} ${r.err}`);
  if (dirs.length) {
    const dir = path.join(FIX, dirs[0]);
    r = run(['logits', '--model', dir, '--ids', '1,x', '--out', path.join(tmp, 'x.f32')]);
    check(r.code !== 0 && r.err.includes('--ids') && r.err.trim().split('\n').length === 1, `bad ids: ${r.err}`);
    r = run(['logits', '--model', dir, '--ids', '1,99999', '--out', path.join(tmp, 'x.f32')]);
    check(r.code !== 0 && r.err.includes('99999'), `out-of-vocab id: ${r.err}`);
    r = run(['generate', '--model', dir, '--ids', '1,2', '--max-tokens', '2', '--moe-runner-backend', 'warp9']);
    check(r.code !== 0 && r.err.includes('--moe-runner-backend') && r.err.includes('warp9'), `bad runner: ${r.err}`);
  }
});

rmSync(tmp, { recursive: true, force: true });
console.log(`## tests/model/test_conformance.mjs: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
