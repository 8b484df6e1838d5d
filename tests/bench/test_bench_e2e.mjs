// test_bench_e2e.mjs - `moeserve bench` against fake_server.mjs, whose replies follow a known
// schedule (first chunk after ttftMs, then one chunk every itlMs): the reported TTFT, ITL, TPOT,
// E2E, token counts and concurrency must match that schedule, and the requests must be what
// bench_serving sends (max_tokens, ignore_eos, include_usage, id prompts).
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { startFakeServer } from './fake_server.mjs';

const BIN = process.env.MS_BIN || path.resolve('build/moeserve');
const tmp = mkdtempSync(path.join(tmpdir(), 'msbench-'));
let pass = 0, fail = 0;

function runBench(args) {
  return new Promise((resolve) => {
    const p = spawn(BIN, ['bench', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    p.stdout.on('data', (d) => (out += d));
    p.stderr.on('data', (d) => (err += d));
    const timer = setTimeout(() => p.kill('SIGKILL'), 60000);
    p.on('close', (code) => { clearTimeout(timer); resolve({ code, out, err }); });
  });
}

async function test(name, fn) {
  const errs = [];
  const check = (cond, msg) => { if (!cond) errs.push(msg); };
  try { await fn(check); } catch (e) { errs.push(`threw: ${e.stack || e}`); }
  if (errs.length) { fail++; console.error(`FAIL ${name}\n  ${errs.join('\n  ')}`); } else { pass++; console.error(`ok   ${name}`); }
}

const near = (v, want, tol) => Math.abs(v - want) <= tol;
const srv = await startFakeServer();
const base = ['--base-url', `http://127.0.0.1:${srv.port}`, '--warmup-requests', '0', '--disable-tqdm'];

await test('completions stream: ids prompt, timings and counts follow the schedule', async (check) => {
  srv.reset({ ttftMs: 100, itlMs: 20, usage: true });
  const of = path.join(tmp, 'a.json');
  const r = await runBench([...base, '--model', 'm', '--dataset-name', 'random-ids', '--vocab-size', '1000',
    '--random-input-len', '16', '--random-output-len', '8', '--random-range-ratio', '1', '--num-prompts', '4',
    '--max-concurrency', '2', '--output-file', of]);
  check(r.code === 0, `exit ${r.code}: ${r.err}`);
  const j = JSON.parse(readFileSync(of, 'utf8'));
  check(srv.requests.length === 4, `server saw ${srv.requests.length} requests`);
  for (const q of srv.requests) {
    const b = q.body;
    check(q.path === '/v1/completions', `path ${q.path}`);
    check(Array.isArray(b.prompt) && b.prompt.length === 16, 'prompt is 16 ids');
    if (Array.isArray(b.prompt)) {
      let arith = true;
      for (let k = 1; k < b.prompt.length; k++) arith &&= b.prompt[k] === (b.prompt[k - 1] + 1) % 1000;
      check(arith, `ids not an arithmetic sequence mod 1000: ${b.prompt}`);
      check(b.prompt.every((x) => x >= 0 && x < 1000), 'ids in vocab');
    }
    check(b.max_tokens === 8 && b.ignore_eos === true && b.stream === true && b.temperature === 0, `fields ${JSON.stringify(b).slice(0, 200)}`);
    check(b.stream_options && b.stream_options.include_usage === true, 'include_usage');
    check(b.model === 'm', 'model');
  }
  check(srv.maxOpen === 2, `server saw ${srv.maxOpen} concurrent requests, want 2`);
  check(j.completed === 4 && j.failed === 0, `completed ${j.completed} failed ${j.failed}`);
  check(j.total_input_tokens === 64 && j.total_output_tokens === 32, `tokens ${j.total_input_tokens}/${j.total_output_tokens}`);
  // Schedule: TTFT 100 ms, 7 ITLs of 20 ms, E2E 240 ms. The server never sends early, so the
  // schedule is a floor; a loaded machine only adds delay (and can bunch chunks), so no upper
  // bounds: the rest is checked as identities between the reported figures.
  check(j.mean_ttft_ms >= 95, `mean TTFT ${j.mean_ttft_ms}`);
  check(j.mean_e2e_latency_ms >= 235, `mean E2E ${j.mean_e2e_latency_ms}`);
  const tpots = j.requests.map((q) => (q.latency_s - q.ttft_s) / 7 * 1000);
  check(near(j.mean_tpot_ms, tpots.reduce((a, b) => a + b, 0) / tpots.length, 1e-6), `mean TPOT ${j.mean_tpot_ms}`);
  // At most two open at once (the server saw two): sum e2e / duration cannot exceed 2.
  check(j.concurrency > 0 && j.concurrency <= 2.05, `concurrency ${j.concurrency}`);
  check(near(j.request_throughput, 4 / j.duration, 1e-6), 'request throughput = completed / duration');
  check(near(j.output_throughput, 32 / j.duration, 1e-6), 'output throughput');
  check(near(j.total_throughput, 96 / j.duration, 1e-6), 'total throughput');
  check(j.requests.length === 4, 'per-request details');
  for (const q of j.requests) {
    check(q.itl_s.length === 7, `itl entries ${q.itl_s.length}`);
    check(q.output_len === 8 && q.usage_seen === true && q.prompt_len === 16, `request lens ${q.prompt_len}/${q.output_len}`);
    const gaps = q.itl_s.reduce((a, b) => a + b, 0);
    check(q.ttft_s > 0 && q.itl_s.every((x) => x >= 0) && q.ttft_s + gaps <= q.latency_s + 1e-9,
          `ttft ${q.ttft_s} + itls ${gaps} within e2e ${q.latency_s}`);
    check(q.content === 'tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 ', `content ${q.content}`);
    check(q.finish_reason === 'length', `finish ${q.finish_reason}`);
  }
  // ITL pooled: 28 samples whose mean equals the JSON's mean.
  const itls = j.requests.flatMap((q) => q.itl_s.map((x) => x * 1000));
  check(near(itls.reduce((a, b) => a + b, 0) / itls.length, j.mean_itl_ms, 1e-6), 'pooled ITL mean');
  check(/Serving Benchmark Result/.test(r.out) && /Successful requests:\s+4/.test(r.out), 'table printed');
  check(/Mean TTFT \(ms\):/.test(r.out) && /P99 ITL \(ms\):/.test(r.out) && /Concurrency:/.test(r.out), 'table rows');
});

await test('chat stream: reasoning counts for TTFT, empty role chunk does not; null content shown', async (check) => {
  srv.reset({ ttftMs: 120, itlMs: 10, reasoningChunks: 100, roleChunkFirst: true, usage: true });
  const of = path.join(tmp, 'b.json');
  const r = await runBench([...base, '--backend', 'sglang-oai-chat', '--model', 'm', '--random-input-len', '12',
    '--random-output-len', '5', '--random-range-ratio', '1', '--num-prompts', '3', '--output-file', of]);
  check(r.code === 0, `exit ${r.code}: ${r.err}`);
  const j = JSON.parse(readFileSync(of, 'utf8'));
  for (const q of srv.requests) {
    check(q.path === '/v1/chat/completions', 'chat path');
    const words = q.body.messages[0].content.split(' ');
    check(words.length === 12 && words.every((w) => /^[a-z]+$/.test(w)), `random words prompt: ${q.body.messages[0].content}`);
  }
  check(j.completed === 3 && j.empty_replies === 0, `completed ${j.completed}, empty ${j.empty_replies}`);
  // The role chunk goes out at once, the first reasoning chunk after 120 ms: a TTFT at or past the
  // floor shows the role chunk did not count.
  check(j.mean_ttft_ms >= 115, `TTFT ${j.mean_ttft_ms} (role chunk at 0 must not count)`);
  // The role chunk carried content "" and later chunks content null: the field was seen as "".
  check(j.requests.every((q) => q.content === '' && q.reasoning_content === 'tok0 tok1 tok2 tok3 tok4 '), 'channels');
  check(j.requests.every((q) => q.itl_s.length === 4), 'ITLs over reasoning chunks');
  check(/content: ""/.test(r.out) && /reasoning_content: "tok0 tok1/.test(r.out), `sample reply:\n${r.out}`);
  // Without the role chunk, content only ever came as null: reported as null, not "".
  srv.reset({ roleChunkFirst: false });
  const r2 = await runBench([...base, '--backend', 'sglang-oai-chat', '--model', 'm', '--random-input-len', '2',
    '--random-output-len', '2', '--random-range-ratio', '1', '--num-prompts', '1', '--output-file', of]);
  const j2 = JSON.parse(readFileSync(of, 'utf8'));
  check(r2.code === 0 && j2.requests[0].content === null && j2.empty_replies === 0, `null content: ${r2.out}`);
  check(/  content: null\n  reasoning_content: "tok0 tok1 "/.test(r2.out), `sample reply:\n${r2.out}`);
});

await test('no usage in the stream: output tokens counted by chunks, reported as missing', async (check) => {
  srv.reset({ ttftMs: 20, itlMs: 5, usage: false, reasoningChunks: 0, roleChunkFirst: false });
  const of = path.join(tmp, 'c.json');
  const r = await runBench([...base, '--model', 'm', '--random-input-len', '8', '--random-output-len', '6',
    '--random-range-ratio', '1', '--num-prompts', '2', '--output-file', of]);
  check(r.code === 0, `exit ${r.code}: ${r.err}`);
  const j = JSON.parse(readFileSync(of, 'utf8'));
  check(j.total_output_tokens === 12 && j.usage_missing === 2, `output ${j.total_output_tokens}, missing ${j.usage_missing}`);
  check(j.total_input_tokens === 16, `input falls back to the target length: ${j.total_input_tokens}`);
});

await test('byte-by-byte SSE writes parse the same', async (check) => {
  srv.reset({ ttftMs: 30, itlMs: 10, usage: true, byteWrites: true });
  const of = path.join(tmp, 'd.json');
  const r = await runBench([...base, '--backend', 'openai-chat', '--model', 'm', '--random-input-len', '4',
    '--random-output-len', '4', '--random-range-ratio', '1', '--num-prompts', '2', '--output-file', of]);
  check(r.code === 0, `exit ${r.code}: ${r.err}`);
  const j = JSON.parse(readFileSync(of, 'utf8'));
  check(j.completed === 2 && j.total_output_tokens === 8, `completed ${j.completed} out ${j.total_output_tokens}`);
  check(j.requests.every((q) => q.content === 'tok0 tok1 tok2 tok3 '), 'content');
});

await test('failed requests: counted, excluded, first error shown', async (check) => {
  srv.reset({ ttftMs: 10, itlMs: 5, usage: true, byteWrites: false, failEvery: 3 });
  const of = path.join(tmp, 'e.json');
  const r = await runBench([...base, '--model', 'm', '--random-input-len', '4', '--random-output-len', '3',
    '--random-range-ratio', '1', '--num-prompts', '6', '--max-concurrency', '1', '--output-file', of]);
  check(r.code === 0, `exit ${r.code}`);
  const j = JSON.parse(readFileSync(of, 'utf8'));
  check(j.completed === 4 && j.failed === 2, `completed ${j.completed} failed ${j.failed}`);
  check(j.total_output_tokens === 12, `output ${j.total_output_tokens}`);
  const bad = j.requests.filter((q) => !q.success);
  check(bad.length === 2 && bad.every((q) => q.http_status === 500 && /injected failure/.test(q.error)), JSON.stringify(bad));
  check(/First failure \(request 2\): HTTP 500/.test(r.out), `failure line:\n${r.out}`);
  check(/Failed requests:\s+2/.test(r.out), 'failed row');
});

await test('empty replies are counted and the sample shows them', async (check) => {
  srv.reset({ ttftMs: 10, itlMs: 5, failEvery: 0, emptyText: true });
  const of = path.join(tmp, 'f.json');
  const r = await runBench([...base, '--backend', 'vllm-chat', '--model', 'm', '--random-input-len', '4',
    '--random-output-len', '3', '--random-range-ratio', '1', '--num-prompts', '2', '--output-file', of]);
  check(r.code === 0, `exit ${r.code}`);
  const j = JSON.parse(readFileSync(of, 'utf8'));
  check(j.empty_replies === 2, `empty ${j.empty_replies}`);
  check(/Replies with empty content\+reasoning:\s+2/.test(r.out), 'empty row');
  check(/content: ""/.test(r.out), 'sample shows ""');
});

await test('non-streamed: TTFT equals E2E, no ITL', async (check) => {
  srv.reset({ ttftMs: 50, itlMs: 10, emptyText: false });
  const of = path.join(tmp, 'g.json');
  const r = await runBench([...base, '--model', 'm', '--disable-stream', '--random-input-len', '4',
    '--random-output-len', '4', '--random-range-ratio', '1', '--num-prompts', '2', '--output-file', of]);
  check(r.code === 0, `exit ${r.code}: ${r.err}`);
  const j = JSON.parse(readFileSync(of, 'utf8'));
  check(srv.requests.every((q) => q.body.stream === false && !q.body.stream_options), 'stream false');
  check(j.completed === 2 && j.requests.every((q) => q.ttft_s === q.latency_s && q.itl_s.length === 0), 'ttft = e2e');
  check(j.mean_e2e_latency_ms >= 45, `e2e ${j.mean_e2e_latency_ms} (schedule: 20 + 5 x 5 ms)`);
  check(j.total_output_tokens === 8, 'usage');
});

await test('model from GET /v1/models; warmup requests not counted; arrivals in order', async (check) => {
  srv.reset({ ttftMs: 5, itlMs: 2 });
  const of = path.join(tmp, 'h.json');
  const r = await runBench(['--base-url', `http://127.0.0.1:${srv.port}/`, '--disable-tqdm', '--warmup-requests', '2',
    '--random-input-len', '4', '--random-output-len', '40', '--random-range-ratio', '1', '--num-prompts', '10',
    '--request-rate', '10', '--seed', '7', '--output-file', of]);
  check(r.code === 0, `exit ${r.code}: ${r.err}`);
  const j = JSON.parse(readFileSync(of, 'utf8'));
  check(srv.modelsCalls === 1 && j.model === 'fake-model', `model ${j.model}`);
  check(srv.requests.length === 12, `server saw ${srv.requests.length}`);
  check(srv.requests.slice(0, 2).every((q) => q.body.max_tokens === 32), 'warmup capped at 32 tokens');
  check(j.completed === 10, 'warmup not counted');
  const starts = j.requests.map((q) => q.start_s);
  check(starts.every((s, i) => i === 0 || s >= starts[i - 1]), 'arrival order');
  // The seeded arrival schedule itself (spread, same seed -> same arrivals) is checked exactly in
  // test_bench_dataset.c; measured start times only add scheduling jitter, so none is compared here.
});

await test('safety: non-loopback hosts refused, bad flags rejected', async (check) => {
  const r = await runBench(['--base-url', 'http://10.1.2.3:8000', '--model', 'm', '--num-prompts', '1']);
  check(r.code !== 0 && /not loopback.*--allow-remote/.test(r.err), `remote: ${r.code} ${r.err}`);
  const r2 = await runBench(['--base-url', 'ftp://127.0.0.1/', '--model', 'm']);
  check(r2.code !== 0 && /scheme/.test(r2.err), `scheme: ${r2.err}`);
  const r3 = await runBench([...base, '--model', 'm', '--random-range-ratio', '1.5']);
  check(r3.code !== 0 && /random-range-ratio/.test(r3.err), `ratio: ${r3.err}`);
  const r4 = await runBench([...base, '--model', 'm', '--dataset-name', 'random-ids', '--num-prompts', '1']);
  check(r4.code !== 0 && /vocab-size/.test(r4.err), `ids without vocab: ${r4.err}`);
  const r5 = await runBench([...base, '--model', 'm', '--bogus']);
  check(r5.code !== 0 && /unknown flag/.test(r5.err), `unknown flag: ${r5.err}`);
});

await test('time bound: --max-duration stops a run and fails what is open', async (check) => {
  srv.reset({ ttftMs: 50, itlMs: 50, emptyText: false });
  const of = path.join(tmp, 'i.json');
  const t0 = Date.now();
  const r = await runBench([...base, '--model', 'm', '--random-input-len', '4', '--random-output-len', '100',
    '--random-range-ratio', '1', '--num-prompts', '3', '--max-concurrency', '1', '--max-duration', '0.5', '--output-file', of]);
  const took = Date.now() - t0;
  check(took < 60000, `took ${took} ms (a hang guard; the stop itself shows in the errors below)`);
  check(r.code !== 0, 'no request completed: non-zero exit');
  const j = JSON.parse(readFileSync(of, 'utf8'));
  check(j.failed === 3 && /stopped: --max-duration/.test(j.requests[0].error) && /not sent/.test(j.requests[2].error),
    JSON.stringify(j.requests.map((q) => q.error)));
});

await srv.close();
rmSync(tmp, { recursive: true, force: true });
console.log(`## tests/bench/test_bench_e2e.mjs: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
