// test_bench_model.mjs - `moeserve bench-model --json` on a fixture checkpoint: the report has one
// decode entry per (batch, ctx), plausible rates, and the routing record behind the byte count
// (batch 1 routes exactly num_experts_per_tok distinct experts per MoE layer; more tokens route to
// at least as many). Timing values are only checked for sanity: CI machines are shared.
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';

const BIN = process.env.MS_BIN || path.resolve('build/moeserve');
let pass = 0, fail = 0;
function test(name, fn) {
  const errs = [];
  const check = (cond, msg) => { if (!cond) errs.push(msg); };
  try { fn(check); } catch (e) { errs.push(`threw: ${e.stack || e}`); }
  if (errs.length) { fail++; console.error(`FAIL ${name}\n  ${errs.join('\n  ')}`); } else { pass++; console.error(`ok   ${name}`); }
}

for (const name of ['glm4_moe', 'glm_moe_dsa_nvfp4']) {
  const dir = path.resolve('tests/fixtures', name);
  test(`${name}: bench-model --json`, (check) => {
    check(existsSync(dir), `fixture ${dir} missing`);
    const cfg = JSON.parse(readFileSync(path.join(dir, 'config.json'), 'utf8'));
    const r = spawnSync(BIN, ['bench-model', '--model', dir, '--batches', '1,4', '--ctx', '8,40', '--prefill', '32',
      '--mem-mb', '32', '--json'], { encoding: 'utf8', timeout: 120000 });
    check(r.status === 0, `exit ${r.status}: ${r.stderr}`);
    const j = JSON.parse(r.stdout);
    check(j.device === 'cpu' && j.model_type === cfg.model_type, `header ${r.stdout.slice(0, 120)}`);
    check(j.weight_bytes > 0 && j.mem_bw_gbs > 0, `weights ${j.weight_bytes} bw ${j.mem_bw_gbs}`);
    check(j.decode.length === 4, `decode entries ${j.decode.length}`);
    for (const d of j.decode) {
      check(d.tok_s > 0 && d.ms_per_step > 0 && d.steps >= 10, `rates ${JSON.stringify(d)}`);
      check(d.bytes_per_step > 0 && d.achieved_gbs > 0, `bytes ${JSON.stringify(d)}`);
      if (d.batch === 1) check(Math.abs(d.experts_per_layer - cfg.num_experts_per_tok) < 1e-9, `batch 1 experts ${d.experts_per_layer}`);
      else check(d.experts_per_layer >= cfg.num_experts_per_tok && d.experts_per_layer <= cfg.n_routed_experts, `experts ${d.experts_per_layer}`);
    }
    const b1 = j.decode.filter((d) => d.batch === 1).sort((a, b) => a.ctx - b.ctx);
    check(b1[1].bytes_per_step > b1[0].bytes_per_step, 'longer context must read more KV bytes');
    check(j.prefill.tokens === 32 && j.prefill.tok_s > 0 && j.prefill.gflops > 0, `prefill ${JSON.stringify(j.prefill)}`);
    // the CPU backend records no graphs: every kind's launch counter is there and 0
    const g = j.graph_launches || {};
    check(g.decode === 0 && g.verify === 0 && g.draft === 0, `graph_launches ${JSON.stringify(j.graph_launches)}`);
  });
}
test('bench-model: bad flag value is one error line', (check) => {
  const r = spawnSync(BIN, ['bench-model', '--model', 'tests/fixtures/glm4_moe', '--batches', '1,x'], { encoding: 'utf8' });
  check(r.status !== 0 && r.stderr.includes('--batches') && r.stderr.trim().split('\n').length === 1, r.stderr);
});
console.log(`## tests/model/test_bench_model.mjs: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
