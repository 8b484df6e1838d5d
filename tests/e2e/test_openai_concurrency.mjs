// test_openai_concurrency.mjs - 64 concurrent streaming clients (openai SDK) against one real
// server: every stream completes with [DONE] and a finish_reason, greedy results equal the
// single-client result (batching does not change greedy output), then the KV pool is empty.
import OpenAI from "openai";
import { assert, collectChatStream, eq, run, startServer, test, waitKvEmpty } from "./lib.mjs";

const N = 64;

test(`${N} concurrent streaming clients all complete`, async ({ client, model, server }) => {
  const req = { model, messages: [{ role: "user", content: "What is 7+8?" }], max_tokens: 24, temperature: 0 };
  const solo = await client.chat.completions.create(req);
  const t0 = Date.now();
  const results = await Promise.all(Array.from({ length: N }, async (_, i) => {
    const c = new OpenAI({ baseURL: server.url + "/v1", apiKey: "unused", maxRetries: 0, timeout: 300000 });
    return collectChatStream(await c.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } }));
  }));
  console.error(`  ${N} streams in ${Date.now() - t0} ms`);
  for (const [i, r] of results.entries()) {
    assert(r.finish, `stream ${i} finished`);
    assert(r.usage, `stream ${i} got usage`);
    eq(r.content, solo.choices[0].message.content ?? "", `stream ${i} content`);
    eq(r.reasoning, solo.choices[0].message.reasoning_content ?? "", `stream ${i} reasoning`);
  }
  await waitKvEmpty(server.url, 60000);
});

test("mixed streaming and non-streaming, chat and completions, at once", async ({ client, model, server }) => {
  const jobs = [];
  for (let i = 0; i < 16; i++) {
    jobs.push(client.completions.create({ model, prompt: "Once upon a time", max_tokens: 8 + i, ignore_eos: true, temperature: 0 })
      .then((r) => eq(r.usage.completion_tokens, 8 + i, "completions length")));
    jobs.push(client.chat.completions.create({ model, messages: [{ role: "user", content: "hi " + i }], max_tokens: 10, stream: true })
      .then(collectChatStream).then((r) => assert(r.finish, "chat stream finished")));
  }
  await Promise.all(jobs);
  await waitKvEmpty(server.url, 60000);
});

run(import.meta.url, {
  setup: async () => {
    const server = await startServer();
    const client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "unused", maxRetries: 0, timeout: 300000 });
    const model = (await client.models.list()).data[0].id;
    return { server, client, model };
  },
  teardown: async ({ server }) => { await server.stop(); },
});
