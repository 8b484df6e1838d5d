// lib.mjs - shared pieces of the end-to-end tests: start `moeserve serve` on 127.0.0.1 with a free
// port, a reference tokenizer + chat template (the npm oracles, not our code) for the same model
// directory, and a tiny test harness that prints the "## name: N passed, M failed" line.
//
// Environment:
//   MS_BIN         moeserve binary (default build/moeserve)
//   MS_TEST_MODEL  model directory (default models/demo; if absent, the first tests/fixtures model
//                  with tokenizer files)
//   MS_SERVE_ARGS  extra `moeserve serve` flags for every server the tests start, space-separated
//                  (tests/e2e/test_openai_tp2.sh runs the SDK suites with "--tp 2")
//   MS_E2E_URL     use an already running server instead of starting one (development aid: the
//                  fake server `build/tests/server/test_http --serve PORT`); tests that need the
//                  model's tokenizer are then left out (unless MS_TEST_MODEL names the model dir)
//                  and the harness says so.
import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

export function findModel() {
  if (process.env.MS_TEST_MODEL) return path.resolve(process.env.MS_TEST_MODEL);
  const demo = path.join(ROOT, "models/demo");
  if (fs.existsSync(path.join(demo, "config.json"))) return demo;
  const fx = path.join(ROOT, "tests/fixtures");
  if (fs.existsSync(fx)) {
    for (const d of fs.readdirSync(fx).sort()) {
      const p = path.join(fx, d);
      if (fs.existsSync(path.join(p, "config.json")) && fs.existsSync(path.join(p, "tokenizer.json"))) return p;
    }
  }
  return demo; // serve will fail with a sentence naming the missing model
}

export const isDemo = (dir) => path.basename(dir) === "demo";

export async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// Starts a server; resolves to { url, model, stop(), proc, log() }.
export async function startServer(extraArgs = [], { timeoutMs = 180000 } = {}) {
  if (process.env.MS_E2E_URL) {
    const url = process.env.MS_E2E_URL.replace(/\/$/, "");
    const model = process.env.MS_TEST_MODEL ? path.resolve(process.env.MS_TEST_MODEL) : null;
    return { url, model, external: true, stop: async () => {}, log: () => "" };
  }
  const bin = process.env.MS_BIN || path.join(ROOT, "build/moeserve");
  const model = findModel();
  const port = await freePort();
  const args = ["serve", "--model-path", model, "--host", "127.0.0.1", "--port", String(port),
                "--reasoning-parser", "glm45", "--tool-call-parser", "glm47",
                ...(process.env.MS_SERVE_ARGS ? process.env.MS_SERVE_ARGS.split(/\s+/).filter(Boolean) : []), ...extraArgs];
  const proc = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env } });
  let out = "";
  proc.stdout.on("data", (d) => (out += d));
  proc.stderr.on("data", (d) => (out += d));
  const exited = new Promise((r) => proc.once("exit", (code) => r(code)));
  const url = `http://127.0.0.1:${port}`;
  const t0 = Date.now();
  for (;;) {
    const code = await Promise.race([exited, new Promise((r) => setTimeout(() => r(undefined), 200))]);
    if (code !== undefined) throw new Error(`moeserve serve exited (${code}) before it was ready:\n${out.trim()}`);
    if (/ready in/.test(out)) {
      try {
        const r = await fetch(url + "/health");
        if (r.ok) break;
      } catch (_) { /* not yet */ }
    }
    if (Date.now() - t0 > timeoutMs) { proc.kill("SIGKILL"); throw new Error(`server not ready after ${timeoutMs} ms:\n${out}`); }
  }
  return {
    url, model, proc, external: false, log: () => out,
    stop: async () => {
      if (proc.exitCode !== null) return proc.exitCode;
      proc.kill("SIGTERM");
      const t = setTimeout(() => proc.kill("SIGKILL"), 15000);
      const code = await exited;
      clearTimeout(t);
      return code;
    },
  };
}

// Reference tokenizer + template for a model dir (npm oracles).
export async function referenceTokenizer(dir) {
  const { Tokenizer } = await import("@huggingface/tokenizers");
  const { Template } = await import("@huggingface/jinja");
  const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const cfgPath = path.join(dir, "tokenizer_config.json");
  const tc = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
  const tok = new Tokenizer(tj, tc);
  let src = tc.chat_template;
  const jf = path.join(dir, "chat_template.jinja");
  if (fs.existsSync(jf)) src = fs.readFileSync(jf, "utf8");
  const tmpl = src ? new Template(src) : null;
  const str = (t) => (typeof t === "string" ? t : t && t.content) || "";
  return {
    count: (text, addSpecial) => tok.encode(text, { add_special_tokens: addSpecial }).ids.length,
    encode: (text, addSpecial) => tok.encode(text, { add_special_tokens: addSpecial }).ids,
    decode: (ids) => tok.decode(ids, { skip_special_tokens: false }),
    render: (messages, extra = {}) => tmpl.render({ messages, add_generation_prompt: true, bos_token: str(tc.bos_token),
                                                    eos_token: str(tc.eos_token), ...extra }),
  };
}

// --- harness ---------------------------------------------------------------------------------
const cases = [];
export function test(name, fn) { cases.push({ name, fn }); }
export function assert(cond, msg) { if (!cond) throw new Error("assertion failed: " + msg); }
export function eq(a, b, msg) {
  const sa = JSON.stringify(a), sb = JSON.stringify(b);
  if (sa !== sb) throw new Error(`${msg}: ${sa} !== ${sb}`);
}

export async function run(file, { setup, teardown } = {}) {
  const name = path.relative(ROOT, fileURLToPath(file));
  let pass = 0, fail = 0, ctx;
  try {
    ctx = setup ? await setup() : {};
  } catch (e) {
    console.error(`setup failed: ${e.stack || e}`);
    console.log(`## ${name}: 0 passed, ${Math.max(cases.length, 1)} failed`);
    process.exit(1);
  }
  for (const c of cases) {
    if (c.needsModel && ctx.server && !ctx.server.model) { console.error(`left out (no model dir with MS_E2E_URL): ${c.name}`); continue; }
    const t0 = Date.now();
    try {
      await c.fn(ctx);
      pass++;
      console.error(`ok   ${c.name} (${Date.now() - t0} ms)`);
    } catch (e) {
      fail++;
      console.error(`FAIL ${c.name}: ${e.stack || e}`);
    }
  }
  try { if (teardown) await teardown(ctx); } catch (e) { fail++; console.error(`FAIL teardown: ${e.stack || e}`); }
  console.log(`## ${name}: ${pass} passed, ${fail} failed`);
  process.exit(fail ? 1 : 0);
}

// A case that needs the model's tokenizer files (left out with MS_E2E_URL).
export function testModel(name, fn) { cases.push({ name, fn, needsModel: true }); }

// Raw HTTP helpers.
export async function post(url, body, headers = {}) {
  const r = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json", ...headers },
                               body: typeof body === "string" || body instanceof Uint8Array ? body : JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch (_) { /* not JSON */ }
  return { status: r.status, headers: r.headers, text, json };
}

export function checkError(res, status, param, code) {
  eq(res.status, status, `status (body ${res.text.slice(0, 200)})`);
  const e = res.json && res.json.error;
  assert(e && typeof e.message === "string" && e.message.length > 0, "error.message");
  assert(typeof e.type === "string", "error.type");
  assert("param" in e && "code" in e, "error.param and error.code present");
  if (param !== undefined) eq(e.param, param, "error.param");
  if (code !== undefined) eq(e.code, code, "error.code");
}

// Parses /metrics into { name{labels}: value }.
export async function metrics(url) {
  const text = await (await fetch(url + "/metrics")).text();
  const m = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const i = line.lastIndexOf(" ");
    m[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return m;
}

// Waits until the engine is idle and holds no KV pages beyond the prefix cache.
export async function waitKvEmpty(url, timeoutMs = 20000) {
  const t0 = Date.now();
  let m;
  for (;;) {
    m = await metrics(url);
    const idle = m["moeserve:num_requests_running"] === 0 && m["moeserve:num_requests_waiting"] === 0;
    if (idle && m["moeserve:kv_pages_used"] <= m["moeserve:kv_pages_cached"]) return m;
    if (Date.now() - t0 > timeoutMs)
      throw new Error(`KV pool not back to empty: running ${m["moeserve:num_requests_running"]}, waiting ` +
                      `${m["moeserve:num_requests_waiting"]}, pages used ${m["moeserve:kv_pages_used"]}, cached ${m["moeserve:kv_pages_cached"]}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

// Collects an OpenAI SDK chat stream into the non-streaming shape.
export async function collectChatStream(stream) {
  const out = { content: "", reasoning: "", calls: [], finish: null, usage: null, chunks: 0, roleFirst: null };
  for await (const ch of stream) {
    out.chunks++;
    if (ch.usage) out.usage = ch.usage;
    for (const c of ch.choices) {
      const d = c.delta || {};
      if (out.roleFirst === null) out.roleFirst = d.role === "assistant" && d.content === "";
      if (d.content) out.content += d.content;
      if (d.reasoning_content) out.reasoning += d.reasoning_content;
      for (const tc of d.tool_calls || []) {
        const x = out.calls[tc.index] || (out.calls[tc.index] = { id: null, name: null, arguments: "" });
        if (tc.id) x.id = tc.id;
        if (tc.function?.name) x.name = tc.function.name;
        if (tc.function?.arguments) x.arguments += tc.function.arguments;
      }
      if (c.finish_reason) out.finish = c.finish_reason;
    }
  }
  return out;
}
