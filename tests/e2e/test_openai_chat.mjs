// test_openai_chat.mjs - /v1/chat/completions through the official openai SDK against a real
// `moeserve serve`: response shapes, streaming == non-streaming (greedy), the glm45 reasoning split
// checked against the raw text (spec 5.3), thinking off, usage == the reference tokenizer's count
// of the reference template's rendering, seed reproducibility, n > 1, logprobs.
import OpenAI from "openai";
import { assert, collectChatStream, eq, isDemo, referenceTokenizer, run, startServer, test, testModel, waitKvEmpty } from "./lib.mjs";

const Q = [{ role: "user", content: "What is 12+34?" }];

test("non-streaming response shape", async ({ client, model }) => {
  const r = await client.chat.completions.create({ model, messages: Q, max_tokens: 48, temperature: 0 });
  assert(/^chatcmpl-[0-9a-f]{24}$/.test(r.id), "id " + r.id);
  eq(r.object, "chat.completion", "object");
  assert(Number.isInteger(r.created) && Math.abs(r.created - Date.now() / 1000) < 600, "created");
  eq(r.model, model, "model");
  eq(r.choices.length, 1, "choices");
  eq(r.choices[0].index, 0, "index");
  eq(r.choices[0].message.role, "assistant", "role");
  assert(["stop", "length", "tool_calls"].includes(r.choices[0].finish_reason), "finish_reason " + r.choices[0].finish_reason);
  const u = r.usage;
  assert(u.prompt_tokens > 0 && u.completion_tokens > 0 && u.total_tokens === u.prompt_tokens + u.completion_tokens, "usage");
  assert(u.completion_tokens <= 48, "completion_tokens <= max_tokens");
  assert(Number.isInteger(u.prompt_tokens_details.cached_tokens), "cached_tokens");
});

test("streaming deltas concatenate to the non-streaming result (greedy)", async ({ client, model }) => {
  const req = { model, messages: Q, max_tokens: 40, temperature: 0 };
  const full = await client.chat.completions.create(req);
  const s = await collectChatStream(await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } }));
  assert(s.roleFirst, "first chunk delta {role: assistant, content: ''}");
  const m = full.choices[0].message;
  eq(s.content, m.content ?? "", "content");
  eq(s.reasoning, m.reasoning_content ?? "", "reasoning_content");
  eq(s.finish, full.choices[0].finish_reason, "finish_reason");
  assert(s.usage, "usage chunk with include_usage");
  eq(s.usage.completion_tokens, full.usage.completion_tokens, "completion_tokens");
  eq(s.usage.prompt_tokens, full.usage.prompt_tokens, "prompt_tokens");
});

test("reasoning split follows the glm45 rules on the raw text", async ({ client, model }) => {
  const req = { model, messages: Q, max_tokens: 64, temperature: 0 };
  const raw = (await client.chat.completions.create({ ...req, separate_reasoning: false })).choices[0].message;
  const split = (await client.chat.completions.create(req)).choices[0].message;
  const text = raw.content ?? "";
  assert(raw.reasoning_content == null, "separate_reasoning false: no reasoning_content");
  // thinking is on by default: generation starts inside the reasoning block (spec 5.3)
  let t = text;
  while (t.startsWith("<think>")) t = t.slice(7);
  let reasoning, content;
  const e = t.indexOf("</think>");
  if (e < 0) {
    const k = t.indexOf("<tool_call>");
    [reasoning, content] = k < 0 ? [t, ""] : [t.slice(0, k), t.slice(k)];
  } else {
    [reasoning, content] = [t.slice(0, e), t.slice(e + 8)];
  }
  eq(split.reasoning_content, reasoning || null, "reasoning_content");
  eq(split.content, content || null, "content");
});

test("thinking off: reasoning_content is null", async ({ client, model, demo }) => {
  const r = await client.chat.completions.create({ model, messages: Q, max_tokens: 32, temperature: 0,
                                                   chat_template_kwargs: { enable_thinking: false } });
  eq(r.choices[0].message.reasoning_content, null, "reasoning_content");
  if (demo) assert(/46/.test(r.choices[0].message.content || ""), "demo answers 46: " + r.choices[0].message.content);
});

test("demo model or fixture: thinking on gives reasoning", async ({ client, model, demo }) => {
  const r = await client.chat.completions.create({ model, messages: Q, max_tokens: 200, temperature: 0 });
  const m = r.choices[0].message;
  assert(m.reasoning_content && m.reasoning_content.length > 0, "reasoning_content present");
  if (demo) {
    eq(r.choices[0].finish_reason, "stop", "finish_reason");
    assert(/46/.test(m.content || ""), "answer contains 46: " + m.content);
  }
});

testModel("usage.prompt_tokens equals the reference tokenizer's count of the rendered template", async ({ client, model, ref }) => {
  for (const [messages, kw] of [[Q, {}], [[{ role: "system", content: "Answer briefly." }, ...Q], {}],
                                [Q, { enable_thinking: false }]]) {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 3, temperature: 0, chat_template_kwargs: kw });
    const want = ref.count(ref.render(messages, kw), false);
    eq(r.usage.prompt_tokens, want, "prompt_tokens for " + JSON.stringify(messages));
  }
});

test("ignore_eos + max_tokens: exactly max_tokens tokens, finish length", async ({ client, model }) => {
  const r = await client.chat.completions.create({ model, messages: Q, max_tokens: 17, temperature: 0, ignore_eos: true });
  eq(r.usage.completion_tokens, 17, "completion_tokens");
  eq(r.choices[0].finish_reason, "length", "finish_reason");
});

test("seed: same seed, same sampled output", async ({ client, model }) => {
  const req = { model, messages: Q, max_tokens: 24, temperature: 1.0, top_p: 1, seed: 1234, ignore_eos: true,
                separate_reasoning: false };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  eq(a.choices[0].message.content, b.choices[0].message.content, "same seed");
  const c = await client.chat.completions.create({ ...req, stream: true });
  eq((await collectChatStream(c)).content, a.choices[0].message.content, "same seed streamed");
});

test("n = 3 gives three choices, indexed 0..2", async ({ client, model }) => {
  const r = await client.chat.completions.create({ model, messages: Q, max_tokens: 8, temperature: 0.8, n: 3, seed: 5 });
  eq(r.choices.map((c) => c.index), [0, 1, 2], "indices");
  assert(r.usage.completion_tokens <= 24, "usage sums the choices");
  const s = await client.chat.completions.create({ model, messages: Q, max_tokens: 8, n: 2, stream: true });
  const seen = new Set();
  for await (const ch of s) for (const c of ch.choices) if (c.finish_reason) seen.add(c.index);
  eq([...seen].sort(), [0, 1], "both streamed choices finish");
});

test("logprobs in chat format", async ({ client, model }) => {
  const r = await client.chat.completions.create({ model, messages: Q, max_tokens: 5, temperature: 0, logprobs: true,
                                                   top_logprobs: 3, ignore_eos: true });
  const lp = r.choices[0].logprobs.content;
  eq(lp.length, 5, "one entry per token");
  for (const t of lp) {
    assert(typeof t.token === "string" && t.logprob <= 0 && Array.isArray(t.bytes), "entry shape");
    eq(t.top_logprobs.length, 3, "top_logprobs");
    // greedy: the sampled token is the most likely one
    assert(t.logprob >= t.top_logprobs[0].logprob - 1e-4, "greedy token is the top-1");
  }
});

test("KV pool returns to empty", async ({ server }) => {
  await waitKvEmpty(server.url);
});

run(import.meta.url, {
  setup: async () => {
    const server = await startServer();
    const client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "unused", maxRetries: 0, timeout: 120000 });
    const models = await client.models.list();
    const model = models.data[0].id;
    const ref = server.model ? await referenceTokenizer(server.model) : null;
    return { server, client, model, ref, demo: server.model ? isDemo(server.model) : false };
  },
  teardown: async ({ server }) => {
    const code = await server.stop();
    if (!server.external && code !== 0) throw new Error(`server exited with ${code}:\n${server.log()}`);
  },
});
