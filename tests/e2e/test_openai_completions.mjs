// test_openai_completions.mjs - /v1/completions through the openai SDK against a real server:
// shapes, streaming == non-streaming, token-id prompts, usage == reference tokenizer counts,
// stop strings (matched across token boundaries, excluded from the text, both endpoints, streamed
// and not), logprobs in completions format.
import OpenAI from "openai";
import { assert, collectChatStream, eq, referenceTokenizer, run, startServer, test, testModel, waitKvEmpty } from "./lib.mjs";

const PROMPT = "The quick brown fox";

async function streamText(s) {
  let text = "", finish = null, usage = null;
  for await (const ch of s) {
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      text += c.text || "";
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, usage };
}

test("non-streaming shape", async ({ client, model }) => {
  const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 12, temperature: 0 });
  assert(/^cmpl-[0-9a-f]{24}$/.test(r.id), "id " + r.id);
  eq(r.object, "text_completion", "object");
  eq(r.choices[0].index, 0, "index");
  assert(typeof r.choices[0].text === "string", "text");
  assert(["stop", "length"].includes(r.choices[0].finish_reason), "finish_reason");
  eq(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens, "total");
});

test("streaming == non-streaming (greedy), with usage chunk", async ({ client, model }) => {
  const req = { model, prompt: PROMPT, max_tokens: 20, temperature: 0, ignore_eos: true };
  const full = await client.completions.create(req);
  const s = await streamText(await client.completions.create({ ...req, stream: true, stream_options: { include_usage: true } }));
  eq(s.text, full.choices[0].text, "text");
  eq(s.finish, "length", "finish");
  eq(s.usage.completion_tokens, 20, "usage.completion_tokens");
});

testModel("usage.prompt_tokens == reference tokenizer count; token-id prompts give the same text", async ({ client, model, ref }) => {
  const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 6, temperature: 0, ignore_eos: true });
  eq(r.usage.prompt_tokens, ref.count(PROMPT, true), "prompt_tokens");
  const ids = ref.encode(PROMPT, true);
  const r2 = await client.completions.create({ model, prompt: ids, max_tokens: 6, temperature: 0, ignore_eos: true });
  eq(r2.choices[0].text, r.choices[0].text, "same text from ids");
  eq(r2.usage.prompt_tokens, ids.length, "prompt_tokens from ids");
});

test("several prompts x n", async ({ client, model }) => {
  const r = await client.completions.create({ model, prompt: ["a", "b"], n: 2, max_tokens: 3, temperature: 0, ignore_eos: true });
  eq(r.choices.map((c) => c.index), [0, 1, 2, 3], "indices");
  eq(r.choices[0].text, r.choices[1].text, "greedy n copies agree");
  eq(r.usage.completion_tokens, 12, "completion tokens");
});

test("stop strings: cut at the first match, excluded, finish stop (completions)", async ({ client, model }) => {
  const base = await client.completions.create({ model, prompt: PROMPT, max_tokens: 40, temperature: 0, ignore_eos: true });
  const T = base.choices[0].text;
  assert(T.length >= 12, "need some text, got " + JSON.stringify(T));
  // a stop string spanning the middle of the text (likely across a token boundary)
  let at = Math.floor(T.length / 2), stop = T.slice(at, at + 3);
  at = T.indexOf(stop);
  const want = T.slice(0, at);
  const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 40, temperature: 0, ignore_eos: true, stop: ["@@never@@", stop] });
  eq(r.choices[0].text, want, "text before the stop string");
  eq(r.choices[0].finish_reason, "stop", "finish_reason");
  assert(r.usage.completion_tokens < 40, "generation ended early");
  const s = await streamText(await client.completions.create({ model, prompt: PROMPT, max_tokens: 40, temperature: 0, ignore_eos: true, stop, stream: true }));
  eq(s.text, want, "streamed text before the stop string");
  eq(s.finish, "stop", "streamed finish_reason");
});

test("stop strings in chat (streamed and not)", async ({ client, model }) => {
  const req = { model, messages: [{ role: "user", content: "Hello" }], max_tokens: 40, temperature: 0, ignore_eos: true,
                separate_reasoning: false };
  const T = (await client.chat.completions.create(req)).choices[0].message.content ?? "";
  assert(T.length >= 8, "need some text");
  let at = Math.floor(T.length / 2);
  const stop = T.slice(at, at + 2);
  at = T.indexOf(stop);
  const r = await client.chat.completions.create({ ...req, stop });
  eq(r.choices[0].message.content ?? "", T.slice(0, at), "content");
  eq(r.choices[0].finish_reason, "stop", "finish_reason");
  const s = await collectChatStream(await client.chat.completions.create({ ...req, stop, stream: true }));
  eq(s.content, T.slice(0, at), "streamed content");
  eq(s.finish, "stop", "streamed finish_reason");
});

test("logprobs in completions format", async ({ client, model }) => {
  const r = await client.completions.create({ model, prompt: PROMPT, max_tokens: 4, temperature: 0, logprobs: 2, ignore_eos: true });
  const lp = r.choices[0].logprobs;
  eq(lp.tokens.length, 4, "tokens");
  eq(lp.token_logprobs.length, 4, "token_logprobs");
  eq(lp.top_logprobs.length, 4, "top_logprobs");
  eq(lp.text_offset[0], 0, "first offset");
  eq(lp.tokens.join(""), r.choices[0].text, "tokens join to the text");
  for (const t of lp.top_logprobs) eq(Object.keys(t).length <= 2, true, "at most 2 alternatives");
});

test("KV pool returns to empty", async ({ server }) => {
  await waitKvEmpty(server.url);
});

run(import.meta.url, {
  setup: async () => {
    const server = await startServer();
    const client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "unused", maxRetries: 0, timeout: 120000 });
    const model = (await client.models.list()).data[0].id;
    const ref = server.model ? await referenceTokenizer(server.model) : null;
    return { server, client, model, ref };
  },
  teardown: async ({ server }) => {
    const code = await server.stop();
    if (!server.external && code !== 0) throw new Error(`server exited with ${code}`);
  },
});
