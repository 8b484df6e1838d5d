// test_prefix_cache.mjs - the radix prefix cache seen from a client: a second request that shares a
// 1,000-token prefix with an earlier one is served from cached KV pages, so the engine computes
// only the tokens past the cached pages. Asserted through counters, not timings (a loaded machine
// makes any TTFT ratio flaky): usage.cached_tokens, and the engine's /metrics counters of prompt,
// cached and prefix-hit tokens, whose difference is the prefill work actually done. Uses a
// 1,000-token prompt of random vocabulary ids sent as a token list to /v1/completions, so lengths
// are exact.
import OpenAI from "openai";
import { assert, metrics, run, startServer, test, waitKvEmpty } from "./lib.mjs";

async function complete(client, model, prompt) {
  const stream = await client.completions.create({ model, prompt, max_tokens: 2, temperature: 0, ignore_eos: true,
                                                   stream: true, stream_options: { include_usage: true } });
  let usage = null;
  for await (const ch of stream) if (ch.usage) usage = ch.usage;
  return usage;
}

// Prefill work of one request, from the engine counters around it.
async function prefillWork(url, fn) {
  const before = await waitKvEmpty(url, 60000);
  const usage = await fn();
  const after = await waitKvEmpty(url, 60000);
  const d = (k) => after[`moeserve:${k}`] - before[`moeserve:${k}`];
  return { usage, prompt: d("prompt_tokens_total"), cached: d("cached_tokens_total"), hit: d("prefix_cache_hit_tokens_total") };
}

test("a request sharing a 1,000-token prefix reuses its pages: only the tokens past them are computed", async ({ client, model, server }) => {
  let s = 12345;
  const rnd = () => (s = (s * 1103515245 + 12345) >>> 0) / 4294967296;
  const prefix = Array.from({ length: 1000 }, () => 100 + Math.floor(rnd() * 600));
  const a = await prefillWork(server.url, () => complete(client, model, [...prefix, 11, 12, 13]));
  const b = await prefillWork(server.url, () => complete(client, model, [...prefix, 21, 22, 23, 24]));
  console.error(`  first: prompt ${a.prompt}, cached ${a.cached}; second: prompt ${b.prompt}, cached ${b.cached}, hit ${b.hit}`);
  assert(a.usage && b.usage, "usage reported");
  assert((a.usage.prompt_tokens_details?.cached_tokens ?? 0) === 0, "the first request found nothing cached");
  assert(a.prompt === 1003 && a.cached === 0, `first request: engine counted ${a.prompt} prompt tokens, ${a.cached} cached`);
  const cached = b.usage.prompt_tokens_details?.cached_tokens ?? 0;
  assert(cached >= 992, `second request cached ${cached} tokens (want >= 992: whole 16-token pages of the prefix)`);
  assert(b.prompt === 1004 && b.cached === cached && b.hit >= 992,
         `engine counters for the second request: prompt ${b.prompt}, cached ${b.cached}, hit ${b.hit} (usage says ${cached})`);
  assert(b.prompt - b.cached <= 12, `the second request computed ${b.prompt - b.cached} prompt tokens (want <= 12)`);
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
