// test_spec_greedy.mjs - `moeserve serve --speculative-algorithm NEXTN` end to end through the openai
// SDK: two servers on the same checkpoint with an MTP layer (MS_TEST_MODEL: the demo model and its
// trained MTP layer, or a copy with a random one from tools/add_mtp.py --replace, as test_openai_spec.sh
// runs both), one speculating, one not. Greedy completions must be
// identical, streamed and not, many prompts at once (continuous batching: sequences accept different
// lengths in one step), with stop strings and max_tokens; the speculating server reports its draft
// counters in /metrics and the mean accept length in /get_server_info; its KV pool ends empty.
// Run alone (no MS_TEST_MODEL), it gives a temporary copy of the demo model a random MTP layer itself.
// MS_MIN_ACCEPT: the mean accept length the speculating server must reach (the trained layer's check).
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { ROOT, assert, eq, findModel, metrics, run, startServer, test, waitKvEmpty } from "./lib.mjs";

let tmpDir = null;
if (!process.env.MS_TEST_MODEL && !process.env.MS_E2E_URL) {
  tmpDir = fs.mkdtempSync(path.join(os.tmpdir(), "ms-spec-"));
  execFileSync("python3", [path.join(ROOT, "tools/add_mtp.py"), findModel(), path.join(tmpDir, "demo"), "--replace"], { stdio: "ignore" });
  process.env.MS_TEST_MODEL = path.join(tmpDir, "demo");
}

const SPEC = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
              "--speculative-num-draft-tokens", "4"];
const PROMPTS = [];
const words = ["one", "two", "three", "apple", "river", "What is", "Hello", "7+8=", "The", "sky", "42", "blue"];
for (let i = 0; i < 24; i++) PROMPTS.push(Array.from({ length: 1 + (i * 7) % 9 }, (_, j) => words[(i * 5 + j * 3) % words.length]).join(" "));

async function streamText(s) {
  let text = "", finish = null;
  for await (const ch of s) for (const c of ch.choices) { text += c.text || ""; if (c.finish_reason) finish = c.finish_reason; }
  return { text, finish };
}

async function complete(client, model, prompt, extra = {}) {
  const r = await client.completions.create({ model, prompt, max_tokens: 20, temperature: 0, ignore_eos: true, ...extra });
  return { text: r.choices[0].text, finish: r.choices[0].finish_reason, n: r.usage.completion_tokens };
}

test("greedy completions identical with and without speculation (24 prompts at once)", async ({ a, b }) => {
  const [ra, rb] = await Promise.all([Promise.all(PROMPTS.map((p) => complete(a.client, a.model, p))),
                                      Promise.all(PROMPTS.map((p) => complete(b.client, b.model, p)))]);
  for (let i = 0; i < PROMPTS.length; i++) eq(rb[i], ra[i], `prompt ${i} (${JSON.stringify(PROMPTS[i])})`);
});

test("streaming identical, several tokens per chunk allowed", async ({ a, b }) => {
  for (const p of PROMPTS.slice(0, 6)) {
    const req = { prompt: p, max_tokens: 24, temperature: 0, ignore_eos: true, stream: true };
    const sa = await streamText(await a.client.completions.create({ model: a.model, ...req }));
    const sb = await streamText(await b.client.completions.create({ model: b.model, ...req }));
    eq(sb, sa, `stream of ${JSON.stringify(p)}`);
  }
});

test("stop strings and max_tokens land the same", async ({ a, b }) => {
  for (const p of PROMPTS.slice(0, 8)) {
    const base = await complete(a.client, a.model, p, { max_tokens: 16 });
    const stop = base.text.slice(3, 5); // inside the output: ends it early on both
    if (!stop.trim()) continue;
    for (const extra of [{ stop: [stop] }, { max_tokens: 5 }, { max_tokens: 1 }]) {
      const [x, y] = await Promise.all([complete(a.client, a.model, p, { max_tokens: 16, ...extra }),
                                        complete(b.client, b.model, p, { max_tokens: 16, ...extra })]);
      eq(y, x, `${JSON.stringify(p)} with ${JSON.stringify(extra)}`);
    }
  }
});

test("logprobs of the accepted tokens are the target's", async ({ a, b }) => {
  const req = { prompt: PROMPTS[3], max_tokens: 10, temperature: 0, ignore_eos: true, logprobs: 2 };
  const x = await a.client.completions.create({ model: a.model, ...req });
  const y = await b.client.completions.create({ model: b.model, ...req });
  eq(y.choices[0].logprobs.tokens, x.choices[0].logprobs.tokens, "tokens");
  const lx = x.choices[0].logprobs.token_logprobs, ly = y.choices[0].logprobs.token_logprobs;
  for (let i = 0; i < lx.length; i++) assert(Math.abs(lx[i] - ly[i]) < 1e-4, `logprob ${i}: ${ly[i]} vs ${lx[i]}`);
});

test("seeded sampling identical with and without speculation", async ({ a, b }) => {
  for (const p of PROMPTS.slice(0, 4)) {
    const req = { prompt: p, max_tokens: 16, temperature: 0.9, seed: 1234, ignore_eos: true };
    const x = await a.client.completions.create({ model: a.model, ...req });
    const y = await b.client.completions.create({ model: b.model, ...req });
    eq(y.choices[0].text, x.choices[0].text, `sampled ${JSON.stringify(p)}`);
  }
});

// The trained layer (MS_MIN_ACCEPT set): 200 chat questions of the demo's domain (arithmetic of each
// kind, thinking on and off, questions outside its skill), 16 at a time: greedy replies identical with
// and without speculation, and the mean accept length over these requests (from the counters' deltas)
// at least MS_MIN_ACCEPT.
const MIN_ACCEPT = +(process.env.MS_MIN_ACCEPT || 0);
if (MIN_ACCEPT > 0) test("trained MTP layer: 200 chat questions identical, accept length", async ({ a, b }) => {
  const qs = [];
  for (let i = 0; i < 200; i++) {
    const x = (i * 37 + 11) % 1000, y = (i * 53 + 7) % 1000, u = 10 + (i * 7) % 90, v = 10 + (i * 13) % 90;
    const q = [`What is ${x} + ${y}?`, `What is ${x} - ${y}?`, `What is ${u} * ${v}?`, `What is ${u} times ${i % 9 + 1}?`,
               `What is ${x * 997} * ${y + 100}?`, "Tell me about the moon.", `Compute ${y} - ${x}.`, "Hello!"][i % 8];
    qs.push({ q, think: i % 3 !== 0 });
  }
  const before = await metrics(b.server.url);
  const ask = (c, q) => c.client.chat.completions.create({ model: c.model, temperature: 0, max_tokens: 300,
    messages: [{ role: "user", content: q.q }], ...(q.think ? {} : { chat_template_kwargs: { enable_thinking: false } }) });
  const run = async (c) => { const out = new Array(qs.length); let next = 0;
    await Promise.all(Array.from({ length: 16 }, async () => { while (next < qs.length) { const i = next++; out[i] = await ask(c, qs[i]); } }));
    return out; };
  const [ra, rb] = await Promise.all([run(a), run(b)]);
  for (let i = 0; i < qs.length; i++) {
    const x = ra[i].choices[0], y = rb[i].choices[0];
    eq([y.message.content, y.message.reasoning_content ?? null, y.finish_reason],
       [x.message.content, x.message.reasoning_content ?? null, x.finish_reason], `question ${i} ${JSON.stringify(qs[i])}`);
  }
  const after = await metrics(b.server.url);
  const dv = after["moeserve:spec_verifications_total"] - before["moeserve:spec_verifications_total"];
  const da = after["moeserve:spec_accepted_tokens_total"] - before["moeserve:spec_accepted_tokens_total"];
  const al = 1 + da / Math.max(1, dv);
  console.log(`     trained MTP layer: accept length ${al.toFixed(2)} over ${dv} verifications of the 200 questions`);
  assert(dv > 0 && al >= MIN_ACCEPT, `accept length ${al} below MS_MIN_ACCEPT ${MIN_ACCEPT}`);
});

test("draft counters in /metrics, accept length in /get_server_info, KV pool empty", async ({ a, b }) => {
  const m = await waitKvEmpty(b.server.url);
  assert(m["moeserve:spec_verifications_total"] > 0, "verifications " + m["moeserve:spec_verifications_total"]);
  assert(m["moeserve:spec_draft_tokens_total"] >= m["moeserve:spec_accepted_tokens_total"], "drafts >= accepted");
  assert(m["moeserve:spec_draft_steps_total"] > 0, "draft steps");
  assert(m["moeserve:spec_accept_length"] >= 1, "accept length gauge");
  const info = await (await fetch(b.server.url + "/get_server_info")).json();
  const al = info.internal_states[0].avg_spec_accept_length;
  assert(al >= 1 && al <= 4, "avg_spec_accept_length " + al);
  const ma = await metrics(a.server.url);
  eq(ma["moeserve:spec_verifications_total"], 0, "no verifications without the flag");
});

await run(import.meta.url, {
  setup: async () => {
    const sa = await startServer([]), sb = await startServer(SPEC);
    const mk = (s) => ({ server: s, client: new OpenAI({ baseURL: s.url + "/v1", apiKey: "x" }) });
    const a = mk(sa), b = mk(sb);
    a.model = (await a.client.models.list()).data[0].id;
    b.model = (await b.client.models.list()).data[0].id;
    assert(/MTP draft layer/.test(sb.log()), "the speculating server loaded the MTP layer:\n" + sb.log());
    return { a, b };
  },
  teardown: async ({ a, b }) => {
    await a.server.stop();
    await b.server.stop();
    if (tmpDir) fs.rmSync(tmpDir, { recursive: true, force: true });
  },
});
