// soak.mjs - `make soak`: many requests at high concurrency against `moeserve serve` (the demo
// model unless --model) on 127.0.0.1, to find what only shows under sustained mixed traffic: leaks,
// stuck KV pages or request-table entries, crashes, counters that drift from what clients saw.
//
// Traffic: chat and completions, streaming and not, random valid sampling parameters, ~10% invalid
// requests (must get 400), ~10% streaming clients that disconnect after their first chunk, ~1%
// prompts at the context limit (must get 200 or a 400 naming the length, never a crash).
// Pass: the server never dies; every request gets an answer (or was cut by its own client);
// resident memory after warm-up (10% of the requests) grows under 5%; at the end /metrics shows no
// running or waiting request and no KV page in use; the server's counts of finished choices (by
// finish reason) and of 2xx/4xx responses agree with the client's.
//
// Bounded: stops issuing requests after --max-seconds and fails then if not all were done.
// Usage: node scripts/soak.mjs [--bin build/moeserve] [--model DIR] [--requests N]
//        [--concurrency C] [--max-seconds S] [--max-queued N] [--max-total-tokens N] [--server-args "FLAGS"]
//        [--server-log FILE]
// Overload: a concurrency several times what the server sustains with a small --max-queued checks
// that the excess gets 503 + Retry-After while admitted requests keep a bounded time to first chunk;
// the last lines split that time as the server saw it (pre-engine, queue, prefill, delivery), e.g.
//   node scripts/soak.mjs --bin build/moeserve --requests 6000 --concurrency 640 --max-queued 64 \
//     --server-args "--max-queue-wait 1 --max-prefill-tokens 512"
// (add --log-level debug to --server-args and --server-log FILE for one line per request).
import { spawn } from "node:child_process";
import fs from "node:fs";

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  const takes = a === "--server-args" || (all[i + 1] && !all[i + 1].startsWith("--")); // server flags start with --
  if (a.startsWith("--") && (i === 0 || all[i - 1] !== "--server-args")) acc.push([a.slice(2), takes ? all[i + 1] : "1"]);
  return acc;
}, []));
const BIN = args.bin || "build/moeserve";
const N = parseInt(args.requests || "20000", 10);
const C = parseInt(args.concurrency || "128", 10);
const MAX_S = parseFloat(args["max-seconds"] || "600");
const CTX = 2048;

let seed = 12345;
const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
const pick = (a) => a[Math.floor(rnd() * a.length)];
const words = "the a cat dog sat on mat quick brown fox jumps over lazy river tree sun moon star".split(" ");
const text = (n) => Array.from({ length: n }, () => pick(words)).join(" ");

function startServer() {
  // a KV pool the warm-up fills: its pages are touched (become resident) on first use, which is
  // not growth; 16k tokens for 128 clients also exercises prefix-cache eviction and preemption
  const sargs = ["serve", "--port", "0", "--max-queued-requests", args["max-queued"] || "4096", "--context-length", String(CTX),
                 "--max-total-tokens", args["max-total-tokens"] || "16384"];
  if (args.model) sargs.push("--model-path", args.model);
  if (args["server-args"]) sargs.push(...args["server-args"].split(" ").filter(Boolean));
  const p = spawn(BIN, sargs, { stdio: ["ignore", "pipe", "pipe"] });
  let err = "";
  const errLog = args["server-log"] ? fs.createWriteStream(args["server-log"]) : null; // e.g. with --log-level debug
  p.stderr.on("data", (d) => { if (errLog) errLog.write(d); err += d; if (err.length > 1e5) err = err.slice(-5e4); });
  return new Promise((resolve, reject) => {
    let out = "";
    p.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve({ p, url: `http://127.0.0.1:${m[1]}`, err: () => err });
    });
    p.on("exit", (code, sig) => reject(new Error(`server exited (${code ?? sig}) before serving: ${err.slice(-2000)}`)));
  });
}

const rss = (pid) => {
  const m = fs.readFileSync(`/proc/${pid}/status`, "utf8").match(/VmRSS:\s+(\d+) kB/);
  return m ? parseInt(m[1], 10) * 1024 : 0;
};

async function metrics(url) {
  const t = await (await fetch(url + "/metrics")).text();
  const m = {};
  for (const line of t.split("\n")) {
    if (!line || line[0] === "#") continue;
    const i = line.lastIndexOf(" ");
    m[line.slice(0, i)] = parseFloat(line.slice(i + 1));
  }
  return m;
}

const client = { ok: 0, bad: 0, busy: 0, cut: 0, fr: {}, other: {}, errors: [], ttft: [], thdr: [] };
let metricsGets = 0;

function makeRequest(i) {
  const chat = rnd() < 0.5, stream = rnd() < 0.5;
  const kind = rnd();
  let body, expect = 200, disconnect = false;
  const sp = { max_tokens: 1 + Math.floor(rnd() * 24), temperature: pick([0, 0.7, 1.0]), top_p: pick([1, 0.9]), stream };
  if (rnd() < 0.3) sp.top_k = 1 + Math.floor(rnd() * 50);
  if (rnd() < 0.2) sp.min_tokens = Math.min(sp.max_tokens, 2);
  if (rnd() < 0.2) sp.logit_bias = { "5": -100, "7": 1.5 };
  if (rnd() < 0.2) sp.stop = ["the"];
  if (rnd() < 0.2) sp.seed = i;
  if (stream && rnd() < 0.3) sp.stream_options = { include_usage: true };
  const prompt = text(3 + Math.floor(rnd() * 40));
  if (kind < 0.10) { // invalid
    expect = 400;
    const bad = pick([{ temperature: 9 }, { n: 0 }, { top_p: 0 }, { logit_bias: { x: 1 } }, { max_tokens: -3 }, { best_of: 3 }, "raw"]);
    body = bad === "raw" ? "{\"messages\": [" : JSON.stringify(chat ? { messages: [{ role: "user", content: prompt }], ...bad }
                                                                      : { prompt, ...bad });
  } else if (kind < 0.11) { // prompt at the context limit: 200 (fits) or 400 (too long), both fine
    expect = "200|400";
    body = JSON.stringify({ prompt: text(CTX - 30), max_tokens: 4, stream });
  } else {
    if (stream && kind > 0.90) { disconnect = true; sp.max_tokens = 200; sp.ignore_eos = true; }
    body = JSON.stringify(chat ? { messages: [{ role: "user", content: prompt }], ...sp } : { prompt, ...sp });
  }
  return { path: chat ? "/v1/chat/completions" : "/v1/completions", body, stream, expect, disconnect };
}

async function one(url, i) {
  const r = makeRequest(i);
  const t0 = performance.now();
  const ac = new AbortController();
  let res;
  try {
    res = await fetch(url + r.path, { method: "POST", headers: { "Content-Type": "application/json" }, body: r.body, signal: ac.signal });
  } catch (e) {
    client.errors.push(`request ${i}: ${e.message}`);
    return;
  }
  if (res.status === 503) {
    client.busy++;
    const ra = res.headers.get("retry-after");
    if (!ra) client.errors.push(`request ${i}: 503 without Retry-After`);
    await res.text();
    await new Promise((r) => setTimeout(r, 1000 * (parseFloat(ra) || 1) * (0.5 + rnd()))); // a polite client backs off
    return;
  }
  const okStatus = String(r.expect).split("|").map(Number);
  if (!okStatus.includes(res.status)) {
    client.errors.push(`request ${i}: status ${res.status} (wanted ${r.expect}): ${(await res.text()).slice(0, 200)}`);
    return;
  }
  if (res.status === 400) { client.bad++; await res.text(); return; }
  if (!r.stream) {
    const j = await res.json();
    client.ok++;
    const fr = j.choices[0].finish_reason;
    client.fr[fr] = (client.fr[fr] || 0) + 1;
    return;
  }
  const tHdr = performance.now() - t0;
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = "", fr = null, done = false;
  try {
    while (!done) {
      const { value, done: end } = await reader.read();
      if (end) break;
      if (!buf) { client.ttft.push(performance.now() - t0); client.thdr.push(tHdr); }
      buf += dec.decode(value, { stream: true });
      if (r.disconnect && buf.includes("data: {")) { ac.abort(); client.cut++; return; }
      let k;
      while ((k = buf.indexOf("\n\n")) >= 0) {
        const ev = buf.slice(0, k); buf = buf.slice(k + 2);
        if (!ev.startsWith("data: ")) continue;
        const d = ev.slice(6);
        if (d === "[DONE]") { done = true; break; }
        const j = JSON.parse(d);
        if (j.error) throw new Error("stream error: " + JSON.stringify(j.error));
        if (j.choices && j.choices[0] && j.choices[0].finish_reason) fr = j.choices[0].finish_reason;
      }
    }
  } catch (e) {
    if (r.disconnect) { client.cut++; return; }
    client.errors.push(`request ${i}: ${e.message}`);
    return;
  }
  if (!done || !fr) { client.errors.push(`request ${i}: stream ended without finish_reason/[DONE]`); return; }
  client.ok++;
  client.fr[fr] = (client.fr[fr] || 0) + 1;
}

async function main() {
  const srv = await startServer();
  let died = null;
  srv.p.on("exit", (code, sig) => { died = `server exited (${code ?? sig})`; });
  const t0 = Date.now();
  let next = 0, finished = 0, rssWarm = 0, rssMax = 0;
  const warm = Math.max(1, Math.floor(N * 0.1));
  const tick = setInterval(() => { if (!died) rssMax = Math.max(rssMax, rss(srv.p.pid)); }, 1000);
  async function worker() {
    while (next < N && !died && (Date.now() - t0) / 1000 < MAX_S) {
      const i = next++;
      await one(srv.url, i);
      finished++;
      if (finished === warm) rssWarm = rss(srv.p.pid);
      if (finished % 2000 === 0)
        console.log(`soak: ${finished}/${N} done, ${((Date.now() - t0) / 1000).toFixed(0)} s, rss ${(rss(srv.p.pid) / 1048576).toFixed(0)} MiB`);
    }
  }
  await Promise.all(Array.from({ length: C }, worker));
  clearInterval(tick);
  const secs = (Date.now() - t0) / 1000;
  const fails = [];
  if (died) fails.push(died + ": " + srv.err().slice(-1500));
  if (finished < N) fails.push(`only ${finished} of ${N} requests done in ${MAX_S} s`);
  let m = {};
  if (!died) {
    // the engine settles (aborted requests release their pages) within a few seconds
    for (let k = 0; k < 100; k++) {
      m = await metrics(srv.url); metricsGets++;
      if (m["moeserve:num_requests_running"] === 0 && m["moeserve:num_requests_waiting"] === 0 &&
          m["moeserve:kv_pages_used"] === m["moeserve:kv_pages_cached"]) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    const rssEnd = rss(srv.p.pid);
    const growth = rssWarm ? (rssEnd - rssWarm) / rssWarm : 0;
    console.log(`soak: rss after warm-up ${(rssWarm / 1048576).toFixed(1)} MiB, at the end ${(rssEnd / 1048576).toFixed(1)} MiB (${(growth * 100).toFixed(2)}%), peak ${(rssMax / 1048576).toFixed(1)} MiB`);
    if (growth >= 0.05) fails.push(`resident memory grew ${(growth * 100).toFixed(1)}% after warm-up`);
    for (const k of ["moeserve:num_requests_running", "moeserve:num_requests_waiting"])
      if (m[k] !== 0) fails.push(`${k} is ${m[k]} at the end (want 0)`);
    // pages held only by the prefix cache are free to evict; any other page is a leak
    if (m["moeserve:kv_pages_used"] !== m["moeserve:kv_pages_cached"])
      fails.push(`${m["moeserve:kv_pages_used"] - m["moeserve:kv_pages_cached"]} KV pages held by requests at the end (want 0)`);
    const srvFr = (r) => m[`moeserve:request_success_total{finished_reason="${r}"}`] || 0;
    const srvDone = ["stop", "length", "tool_calls"].reduce((a, r) => a + srvFr(r), 0);
    const cliDone = Object.values(client.fr).reduce((a, b) => a + b, 0);
    // a client may disconnect just as its request finishes: then the server counts it finished
    if (srvDone < cliDone || srvDone > cliDone + client.cut)
      fails.push(`server finished ${srvDone} choices normally, clients saw ${cliDone} (+ up to ${client.cut} cut)`);
    if (srvDone + srvFr("abort") !== cliDone + client.cut)
      fails.push(`server finished + aborted = ${srvDone + srvFr("abort")}, clients completed + cut = ${cliDone + client.cut}`);
    const s2xx = m['moeserve:http_responses_total{code="2xx"}'] - (metricsGets - 1); /* a /metrics answer counts itself after it is written */
    const s4xx = m['moeserve:http_responses_total{code="4xx"}'];
    if (s2xx !== client.ok + client.cut) fails.push(`server sent ${s2xx} 2xx responses, clients got ${client.ok + client.cut}`);
    if (s4xx !== client.bad) fails.push(`server sent ${s4xx} 4xx responses, clients got ${client.bad}`);
    srv.p.kill("SIGTERM");
    await new Promise((r) => srv.p.on("exit", r));
  }
  if (client.errors.length) fails.push(`${client.errors.length} client errors, first: ${client.errors.slice(0, 3).join(" | ")}`);
  console.log(`soak: ${finished} requests in ${secs.toFixed(1)} s (${(finished / secs).toFixed(1)} req/s) at concurrency ${C}: ` +
    `${client.ok} completed ${JSON.stringify(client.fr)}, ${client.bad} refused (400), ${client.busy} busy (503), ` +
    `${client.cut} cut by their client; server: aborted ${m["moeserve:requests_aborted_total"]}, disconnects ${m["moeserve:client_disconnects_total"]}, ` +
    `generated ${m["moeserve:generation_tokens_total"]} tokens`);
  const tt = client.ttft.sort((a, b) => a - b), q = (p) => (tt.length ? tt[Math.min(tt.length - 1, Math.floor(p * tt.length))] : 0);
  console.log(`soak: streaming time to first chunk of admitted requests: p50 ${q(0.5).toFixed(0)} ms, p99 ${q(0.99).toFixed(0)} ms, max ${q(1).toFixed(0)} ms`);
  const th = client.thdr.sort((a, b) => a - b), qh = (p) => (th.length ? th[Math.min(th.length - 1, Math.floor(p * th.length))] : 0);
  console.log(`soak: ... of which to the response headers: p50 ${qh(0.5).toFixed(0)} ms, p99 ${qh(0.99).toFixed(0)} ms`);
  // the server's own split of the time to first token (histograms; quantiles are bucket upper bounds)
  const hq = (name, p) => {
    const bs = Object.keys(m).filter((k) => k.startsWith(name + "_bucket{le=")).map((k) => [parseFloat(k.split('"')[1]), m[k]]);
    const tot = m[name + "_count"] || 0;
    if (!tot) return NaN;
    for (const [le, c] of bs.sort((a, b) => a[0] - b[0])) if (c >= p * tot) return le;
    return Infinity;
  };
  const parts = [["ttft", "moeserve:time_to_first_token_seconds"], ["pre-engine", "moeserve:request_pre_engine_seconds"],
                 ["queue", "moeserve:request_queue_time_seconds"], ["prefill", "moeserve:request_prefill_time_seconds"],
                 ["delivery", "moeserve:first_token_delivery_seconds"]];
  console.log("soak: server-side, all admitted requests (mean / p50 / p99 bucket bound, s): " + parts.map(([lbl, n]) =>
    `${lbl} ${((m[n + "_sum"] || 0) / (m[n + "_count"] || 1)).toFixed(3)} / ${hq(n, 0.5)} / ${hq(n, 0.99)}`).join(", "));
  if (fails.length) { for (const f of fails) console.log("FAIL " + f); process.exit(1); }
  console.log("soak: ok");
}

main().catch((e) => { console.log("FAIL " + e.stack); process.exit(1); });
