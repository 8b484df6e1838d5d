// test_openai_errors.mjs - malformed and hostile input over raw HTTP against a real server: each
// gets the OpenAI error object with the right status and the server keeps serving; API key (401,
// constant-time compare), body limit (413), unknown model (404), client disconnect mid-stream
// (engine request aborted, KV pages freed), and at the end the KV pool is back to empty.
import { assert, checkError, eq, metrics, post, run, startServer, test, waitKvEmpty } from "./lib.mjs";

const M = [{ role: "user", content: "hi" }];
const chat = (o) => ({ messages: M, max_tokens: 4, ...o });

const BAD = [
  ["not JSON", "{nope", 400],
  ["not an object", "[1]", 400],
  ["invalid UTF-8", new Uint8Array([...Buffer.from('{"messages":[{"role":"user","content":"'), 0xff, 0xfe, ...Buffer.from('"}]}')]), 400],
  ["messages missing", {}, 400, "messages"],
  ["messages empty", { messages: [] }, 400, "messages"],
  ["bad role", { messages: [{ role: "robot", content: "x" }] }, 400, "messages[0].role"],
  ["content wrong type", { messages: [{ role: "user", content: 3 }] }, 400, "messages[0].content"],
  ["temperature wrong type", chat({ temperature: "warm" }), 400, "temperature"],
  ["temperature < 0", chat({ temperature: -1 }), 400, "temperature"],
  ["top_p 0", chat({ top_p: 0 }), 400, "top_p"],
  ["top_p > 1", chat({ top_p: 1.01 }), 400, "top_p"],
  ["negative max_tokens", chat({ max_tokens: -1 }), 400, "max_tokens"],
  ["absurd max_tokens", chat({ max_tokens: 1e12 }), 400, "max_tokens"],
  ["n too large", chat({ n: 100 }), 400, "n"],
  ["too many stop strings", chat({ stop: Array.from({ length: 17 }, (_, i) => "s" + i) }), 400, "stop"],
  ["stop string too long", chat({ stop: "s".repeat(2000) }), 400, "stop"],
  ["too many messages", { messages: Array.from({ length: 5000 }, () => M[0]), max_tokens: 1 }, 400, "messages"],
  ["stop wrong type", chat({ stop: 5 }), 400, "stop"],
  ["stream wrong type", chat({ stream: "yes" }), 400, "stream"],
  ["tools wrong type", chat({ tools: "calc" }), 400, "tools"],
  ["named tool not offered", chat({ tool_choice: { type: "function", function: { name: "nope" } } }), 400, "tool_choice"],
  ["unknown model", chat({ model: "no-such-model" }), 404, "model", "model_not_found"],
];

for (const [name, body, status, param, code] of BAD) {
  test("bad input: " + name, async ({ server }) => {
    checkError(await post(server.url + "/v1/chat/completions", body), status, param, code);
  });
}

// the server below runs with --max-messages 8 --max-tools 4 --max-stop-strings 6 --max-stop-length 32 --max-n 3:
// at each limit the request is served, one beyond it gets a 400 naming the field, the limit and the flag
test("configured request limits", async ({ server }) => {
  if (server.external) return;
  const info = await (await fetch(server.url + "/get_server_info")).json();
  eq(info.flags.max_messages, 8, "max_messages in server info");
  eq(info.flags.max_stop_length, 32, "max_stop_length in server info");
  const msgs = (k) => Array.from({ length: k }, (_, i) => ({ role: i % 2 ? "assistant" : "user", content: "m" + i }));
  const tools = (k) => Array.from({ length: k }, (_, i) => ({ type: "function", function: { name: "f" + i, parameters: { type: "object" } } }));
  const stops = (k, len) => Array.from({ length: k }, (_, i) => String.fromCharCode(97 + i) + "z".repeat(len - 1));
  const ok = { messages: msgs(7), tools: tools(4), stop: stops(6, 32), n: 3, max_tokens: 2 };
  const r = await post(server.url + "/v1/chat/completions", ok);
  eq(r.status, 200, "at every limit: " + r.text);
  const cases = [
    [{ messages: msgs(9) }, "messages", 8, "--max-messages"],
    [{ tools: tools(5) }, "tools", 4, "--max-tools"],
    [{ stop: stops(7, 2) }, "stop", 6, "--max-stop-strings"],
    [{ stop: ["ok", "y".repeat(33)] }, "stop[1]", 32, "--max-stop-length"],
    [{ n: 4 }, "n", 3, "--max-n"],
  ];
  for (const [o, param, limit, flag] of cases) {
    const e = await post(server.url + "/v1/chat/completions", { ...ok, ...o });
    checkError(e, 400, param);
    const msg = e.json?.error?.message || "";
    assert(msg.includes(`at most ${limit}`) && msg.includes(flag), `${param}: message '${msg}'`);
  }
  const big = await post(server.url + "/v1/completions", { prompt: "x", max_tokens: info.context_length + 1 });
  checkError(big, 400, "max_tokens");
  // --max-header-bytes 8192: a 12 KB header is refused with 431, a 2 KB one served
  eq((await fetch(server.url + "/health", { headers: { "X-Big": "h".repeat(12000) } })).status, 431, "12 KB header");
  eq((await fetch(server.url + "/health", { headers: { "X-Big": "h".repeat(2000) } })).status, 200, "2 KB header");
});

test("completions bad input", async ({ server }) => {
  checkError(await post(server.url + "/v1/completions", {}), 400, "prompt");
  checkError(await post(server.url + "/v1/completions", { prompt: [1, -5] }), 400, "prompt");
  checkError(await post(server.url + "/v1/completions", { prompt: "x", max_tokens: 0 }), 400, "max_tokens");
});

test("prompt longer than the context", async ({ server }) => {
  const info = await (await fetch(server.url + "/get_server_info")).json();
  const ctx = info.context_length;
  assert(ctx > 0, "context_length in server info");
  const prompt = "hello ".repeat(ctx + 10);
  const r = await post(server.url + "/v1/completions", { prompt, max_tokens: 1 });
  checkError(r, 400, "prompt", "context_length_exceeded");
});

test("body over the limit: 413", async ({ server }) => {
  const big = JSON.stringify({ prompt: "x".repeat(300 * 1024) }); // server started with --max-request-bytes 262144
  checkError(await post(server.url + "/v1/completions", big), 413, null, "request_too_large");
});

test("unknown route 404, wrong method 405", async ({ server }) => {
  const r = await fetch(server.url + "/v2/whatever");
  eq(r.status, 404, "status");
  assert((await r.json()).error, "error object");
  const g = await fetch(server.url + "/v1/chat/completions");
  eq(g.status, 405, "GET on a POST route");
});

test("server keeps serving after all that", async ({ server }) => {
  const r = await post(server.url + "/v1/chat/completions", chat({}));
  eq(r.status, 200, "status");
  eq(r.json.object, "chat.completion", "object");
  eq((await fetch(server.url + "/health")).status, 200, "health");
});

test("client disconnect mid-stream aborts the request and frees its pages", async ({ server }) => {
  const before = await metrics(server.url);
  const ac = new AbortController();
  const r = await fetch(server.url + "/v1/completions", { method: "POST", headers: { "Content-Type": "application/json" }, signal: ac.signal,
    body: JSON.stringify({ prompt: "Count:", max_tokens: 400, ignore_eos: true, stream: true }) });
  const reader = r.body.getReader();
  let got = 0;
  while (got < 3) { const { value, done } = await reader.read(); if (done) break; got += new TextDecoder().decode(value).split("data:").length - 1; }
  ac.abort();
  await reader.cancel().catch(() => {});
  const m = await waitKvEmpty(server.url);
  assert(m["moeserve:requests_aborted_total"] > before["moeserve:requests_aborted_total"], "engine counted an aborted request");
  assert(m["moeserve:generation_tokens_total"] - before["moeserve:generation_tokens_total"] < 400, "generation stopped early");
});

test("API key: 401 without or with a wrong key, 200 with it", async ({ keyed }) => {
  const url = keyed.url + "/v1/chat/completions";
  checkError(await post(url, chat({})), 401, null, "invalid_api_key");
  checkError(await post(url, chat({}), { Authorization: "Bearer wrong-key-0" }), 401, null, "invalid_api_key");
  checkError(await post(url, chat({}), { Authorization: "Bearer sk-test-key" + "x" }), 401, null, "invalid_api_key");
  checkError(await post(url, chat({}), { Authorization: "sk-test-key" }), 401, null, "invalid_api_key");
  const ok = await post(url, chat({}), { Authorization: "Bearer sk-test-key" });
  eq(ok.status, 200, "with the key");
  eq((await fetch(keyed.url + "/health")).status, 200, "health stays open");
});

test("metrics exposition and KV pool back to empty", async ({ server }) => {
  const text = await (await fetch(server.url + "/metrics")).text();
  for (const name of ["moeserve:num_requests_running", "moeserve:num_requests_waiting", "moeserve:prompt_tokens_total",
                      "moeserve:generation_tokens_total", "moeserve:time_to_first_token_seconds", "moeserve:inter_token_latency_seconds",
                      "moeserve:e2e_request_latency_seconds", "moeserve:kv_cache_usage_ratio", "moeserve:prefix_cache_hit_rate",
                      "moeserve:num_preemptions_total", "moeserve:request_queue_time_seconds", "moeserve:request_prefill_time_seconds",
                      "moeserve:request_pre_engine_seconds", "moeserve:first_token_delivery_seconds", "moeserve:queue_admit_rate",
                      "moeserve:queue_wait_estimate_seconds"])
    assert(text.includes("# TYPE " + name + " "), "TYPE line for " + name);
  const m = await waitKvEmpty(server.url);
  assert(m["moeserve:e2e_request_latency_seconds_count"] >= 1, "requests observed");
  // every request with a first token is split into its parts, which add up to its time to first token
  const n = m["moeserve:time_to_first_token_seconds_count"];
  assert(n >= 1 && m["moeserve:request_queue_time_seconds_count"] === n && m["moeserve:request_prefill_time_seconds_count"] === n,
         "queue / prefill histograms count every first token");
  const parts = m["moeserve:request_pre_engine_seconds_sum"] + m["moeserve:request_queue_time_seconds_sum"] +
                m["moeserve:request_prefill_time_seconds_sum"];
  assert(Math.abs(parts - m["moeserve:time_to_first_token_seconds_sum"]) < 1e-3 * n + 1e-6, "parts add up to the ttft sum");
});

run(import.meta.url, {
  setup: async () => {
    const server = await startServer(["--max-request-bytes", "262144", "--max-messages", "8", "--max-tools", "4",
                                      "--max-stop-strings", "6", "--max-stop-length", "32", "--max-n", "3",
                                      "--max-header-bytes", "8192"]);
    const keyed = server.external ? server : await startServer(["--api-key", "sk-test-key"]);
    return { server, keyed };
  },
  teardown: async ({ server, keyed }) => { await server.stop(); if (keyed !== server) await keyed.stop(); },
});
