// test_prefix_cache.mjs - the radix prefix cache seen from a client: a second request that shares a
// 1,000-token prefix with an earlier one is served from cached KV pages (usage reports the cached
// tokens) and its time to first token is under a quarter of the first request's. Uses a 1,000-token
// prompt of random vocabulary ids sent as a token list to /v1/completions, so lengths are exact.
import OpenAI from "openai";
import { assert, run, startServer, test, waitKvEmpty } from "./lib.mjs";

async function ttft(client, model, prompt) {
  const t0 = performance.now();
  const stream = await client.completions.create({ model, prompt, max_tokens: 2, temperature: 0, ignore_eos: true,
                                                   stream: true, stream_options: { include_usage: true } });
  let first = null, usage = null;
  for await (const ch of stream) {
    if (first === null && ch.choices?.[0]?.text) first = performance.now() - t0;
    if (ch.usage) usage = ch.usage;
  }
  return { ms: first ?? performance.now() - t0, usage };
}

test("a request sharing a 1,000-token prefix reuses its pages: TTFT under a quarter of the first", async ({ client, model, server }) => {
  let s = 12345;
  const rnd = () => (s = (s * 1103515245 + 12345) >>> 0) / 4294967296;
  const prefix = Array.from({ length: 1000 }, () => 100 + Math.floor(rnd() * 600));
  const a = await ttft(client, model, [...prefix, 11, 12, 13]);
  const b = await ttft(client, model, [...prefix, 21, 22, 23, 24]);
  console.error(`  first: TTFT ${a.ms.toFixed(1)} ms, cached ${a.usage?.prompt_tokens_details?.cached_tokens}; ` +
                `second: TTFT ${b.ms.toFixed(1)} ms, cached ${b.usage?.prompt_tokens_details?.cached_tokens}`);
  assert(a.usage && b.usage, "usage reported");
  assert((b.usage.prompt_tokens_details?.cached_tokens ?? 0) >= 992, `second request cached ${b.usage.prompt_tokens_details?.cached_tokens} tokens (want >= 992: whole 16-token pages of the prefix)`);
  assert(b.ms < a.ms / 4, `TTFT ${b.ms.toFixed(1)} ms is not under a quarter of ${a.ms.toFixed(1)} ms`);
  await waitKvEmpty(server.url, 60000);
});

run(import.meta.url, {
  setup: async () => {
    const server = await startServer();
    const client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "unused", maxRetries: 0 });
    const model = (await client.models.list()).data[0].id;
    return { server, client, model };
  },
  teardown: async ({ server }) => server && server.stop(),
});
