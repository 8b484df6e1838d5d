// bench_structured.mjs - serving throughput of N concurrent JSON-schema requests against unconstrained
// ones (output tokens per second over the wall time of each batch).
//   node tools/bench_structured.mjs [--url http://127.0.0.1:8000] [--n 64] [--rounds 3]
// Without --url it starts `moeserve serve` on the demo model (MS_BIN or build/moeserve).
//
// Two comparisons, interleaved round by round (A, B, A, B, ...) so that the noise of a shared machine
// falls on both sides alike:
//   matched: each constrained batch is followed by an unconstrained batch whose requests produce
//            exactly as many tokens as their constrained twins (max_tokens = that count,
//            ignore_eos). The batch shapes are the same, so the difference is the grammar's cost.
//   ignore_eos: unconstrained requests all run to max_tokens (the comparison of the first version of
//            this script). Constrained replies end when their JSON closes, so the batch thins out at
//            the tail. That costs throughput on a batch-bound model, whatever the grammar costs.
import { startServer } from "../tests/e2e/lib.mjs";

const arg = (k, d) => { const i = process.argv.indexOf("--" + k); return i > 0 ? process.argv[i + 1] : d; };
const N = Number(arg("n", 64)), ROUNDS = Number(arg("rounds", 3)), MAX = 256;
const server = arg("url") ? { url: arg("url"), stop: async () => {} } : await startServer();
const model = (await (await fetch(server.url + "/v1/models")).json()).data[0].id;
const schema = { type: "object", properties: {
  title: { type: "string", maxLength: 80 }, year: { type: "integer", minimum: 1900, maximum: 2100 },
  tags: { type: "array", items: { type: "string", maxLength: 20 }, maxItems: 6 },
  summary: { type: "string", maxLength: 300 } }, required: ["title", "year", "tags", "summary"] };

// mode: "json" | "free" (ignore_eos, MAX tokens) | array of per-request token counts (ignore_eos)
async function batch(mode, round) {
  const t0 = performance.now();
  const rs = await Promise.all(Array.from({ length: N }, (_, i) => fetch(server.url + "/v1/chat/completions", {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: `Describe book ${i}.` }], temperature: 1,
      seed: round * 1000 + i, chat_template_kwargs: { enable_thinking: false },
      ...(mode === "json" ? { max_tokens: MAX, response_format: { type: "json_schema", json_schema: { name: "book", schema } } }
        : { ignore_eos: true, max_tokens: mode === "free" ? MAX : mode[i] }) }),
  }).then((r) => r.json())));
  const dt = (performance.now() - t0) / 1e3;
  const lens = rs.map((r) => r.usage.completion_tokens);
  const toks = lens.reduce((a, b) => a + b, 0);
  return { dt, toks, tps: toks / dt, lens };
}

const fmt = (x) => `${x.toks} tok in ${x.dt.toFixed(2)} s = ${x.tps.toFixed(0)} tok/s`;
await batch("json", 99); // warm: the first use of the schema compiles and precomputes its grammar
await batch("free", 99);
const ratios = { matched: [], ignore_eos: [] };
for (let r = 0; r < ROUNDS; r++) {
  const j = await batch("json", r);
  const m = await batch(j.lens, r);
  const f = await batch("free", r);
  ratios.matched.push(j.tps / m.tps);
  ratios.ignore_eos.push(j.tps / f.tps);
  console.log(`round ${r}: json_schema ${fmt(j)} | matched unconstrained ${fmt(m)} (json/matched ${(j.tps / m.tps).toFixed(3)}) | ` +
              `ignore_eos unconstrained ${fmt(f)} (json/ignore_eos ${(j.tps / f.tps).toFixed(3)})`);
}
const med = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
console.log(`${N} concurrent, ${ROUNDS} rounds: json_schema / matched unconstrained: median ${med(ratios.matched).toFixed(3)} ` +
            `(${ratios.matched.map((x) => x.toFixed(3)).join(", ")}); json_schema / ignore_eos unconstrained: median ` +
            `${med(ratios.ignore_eos).toFixed(3)} (${ratios.ignore_eos.map((x) => x.toFixed(3)).join(", ")})`);
await server.stop();
