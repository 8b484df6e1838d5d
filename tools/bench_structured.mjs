// bench_structured.mjs - serving throughput of N concurrent JSON-schema requests against the same
// requests unconstrained (output tokens per second over the wall time of each batch).
//   node tools/bench_structured.mjs [--url http://127.0.0.1:8000] [--n 64] [--rounds 3]
// Without --url it starts `moeserve serve` on the demo model (MS_BIN or build/moeserve).
import { startServer } from "../tests/e2e/lib.mjs";

const arg = (k, d) => { const i = process.argv.indexOf("--" + k); return i > 0 ? process.argv[i + 1] : d; };
const N = Number(arg("n", 64)), ROUNDS = Number(arg("rounds", 3));
const server = arg("url") ? { url: arg("url"), stop: async () => {} } : await startServer();
const model = (await (await fetch(server.url + "/v1/models")).json()).data[0].id;
const schema = { type: "object", properties: {
  title: { type: "string", maxLength: 80 }, year: { type: "integer", minimum: 1900, maximum: 2100 },
  tags: { type: "array", items: { type: "string", maxLength: 20 }, maxItems: 6 },
  summary: { type: "string", maxLength: 300 } }, required: ["title", "year", "tags", "summary"] };

async function batch(constrained, round) {
  const t0 = performance.now();
  const rs = await Promise.all(Array.from({ length: N }, (_, i) => fetch(server.url + "/v1/chat/completions", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: `Describe book ${i}.` }], max_tokens: 256, temperature: 1,
      seed: round * 1000 + i, chat_template_kwargs: { enable_thinking: false },
      ...(constrained ? { response_format: { type: "json_schema", json_schema: { name: "book", schema } } } : { ignore_eos: true }) }),
  }).then((r) => r.json())));
  const dt = (performance.now() - t0) / 1e3;
  const toks = rs.reduce((a, r) => a + r.usage.completion_tokens, 0);
  return { dt, toks, tps: toks / dt };
}

await batch(true, 99); // warm: the grammar's token cache fills on first use
for (const constrained of [false, true]) {
  const res = [];
  for (let r = 0; r < ROUNDS; r++) res.push(await batch(constrained, r));
  const tps = res.map((x) => x.tps).sort((a, b) => a - b)[Math.floor(res.length / 2)];
  console.log(`${constrained ? "json_schema " : "unconstrained"}: ${N} concurrent, median ${tps.toFixed(0)} output tok/s ` +
              `(${res.map((x) => `${x.toks} tok in ${x.dt.toFixed(2)} s`).join(", ")})`);
}
await server.stop();
