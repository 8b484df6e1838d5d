// test_schema_corpus.mjs - structured outputs over a corpus of JSON Schemas (tests/e2e/schema_corpus.mjs:
// hand-written tool schemas, their strict variants, and seeded generated ones): every reply of the
// demo model at temperature 0 and 1 that finishes must be valid under ajv (JSON Schema 2020-12 with
// ajv-formats: an oracle we did not write), and the schemas the server cannot enforce exactly must be
// refused with a 400 naming the keyword.
//
// Requests go out concurrently (CONC at a time) against one server. `make test` runs a fixed subset
// (200 schemas x 2 samples, T=0 and T=1); MS_CORPUS=full (`make test-structured`) runs every schema
// with 3 samples (T=0, T=1 twice).
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import fs from "node:fs";
import { assert, post, run, startServer, test, waitKvEmpty } from "./lib.mjs";
import { corpus } from "./schema_corpus.mjs";

const FULL = process.env.MS_CORPUS === "full";
const CONC = Number(process.env.MS_CORPUS_CONC || 32);
const MAX_TOKENS = FULL ? 300 : 160;
const SAMPLES = FULL ? [[0, 0], [1, 1], [1, 2]] : [[0, 0], [1, 1]];

const all = corpus({ seed: Number(process.env.MS_CORPUS_SEED || 20), n: 500 }); // (MS_CORPUS_SEED: another generated set)
// the subset: every hand-written schema and refusal, then generated ones up to 200
const hand = all.filter((c) => !c.name.startsWith("gen") && !c.name.endsWith("/strict"));
const SCHEMAS = FULL ? all : hand.concat(all.filter((c) => c.name.startsWith("gen")).slice(0, 200 - hand.length));

const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);

const stats = { replies: 0, validated: 0, length: 0, refused_ok: 0, failures: [] };
// MS_CORPUS_DUMP=FILE: the validated replies as JSON lines {"name","schema","doc"} (input for
// `moeserve bench-grammar --cases FILE`, which times masks over them with a real 150k vocabulary)
const dump = process.env.MS_CORPUS_DUMP ? [] : null;
const fail = (msg) => { stats.failures.push(msg); };

async function one(server, model, c, temperature, seed) {
  const r = await post(server.url + "/v1/chat/completions", {
    model, messages: [{ role: "user", content: `Reply with JSON for ${c.name}.` }], max_tokens: MAX_TOKENS, temperature, seed,
    chat_template_kwargs: { enable_thinking: false }, // (the grammar after </think>: test_structured_outputs.mjs)
    response_format: { type: "json_schema", json_schema: { name: "s", schema: c.schema, strict: true } } });
  if (c.expect) {
    const kw = c.expect.slice("refuse:".length);
    if (r.status !== 400) return fail(`${c.name}: status ${r.status}, want a 400 naming '${kw}'`);
    if (!r.json.error.message.includes(kw)) return fail(`${c.name}: the 400 does not name '${kw}': ${r.json.error.message}`);
    stats.refused_ok++;
    return;
  }
  if (r.status !== 200) return fail(`${c.name}: status ${r.status}: ${r.text.slice(0, 300)}`);
  const ch = r.json.choices[0];
  stats.replies++;
  if (ch.finish_reason === "length") { stats.length++; return; }
  if (ch.finish_reason !== "stop") return fail(`${c.name} T=${temperature}: finish_reason ${ch.finish_reason}`);
  let v;
  try { v = JSON.parse(ch.message.content); } catch (e) { return fail(`${c.name} T=${temperature}: not JSON: ${ch.message.content}`); }
  const validate = ajv.compile(c.schema);
  if (!validate(v)) return fail(`${c.name} T=${temperature}: ajv rejects ${ch.message.content}: ${ajv.errorsText(validate.errors)}`);
  stats.validated++;
  if (dump) dump.push(JSON.stringify({ name: c.name, schema: c.schema, doc: ch.message.content }));
}

test(`corpus (${SCHEMAS.length} schemas x ${SAMPLES.length} samples, max_tokens ${MAX_TOKENS}): every finished reply valid under ajv, every refusal a 400 naming its keyword`, async ({ server, model }) => {
  const jobs = [];
  for (const c of SCHEMAS) for (const [t, s] of c.expect ? [[0, 0]] : SAMPLES) jobs.push([c, t, s]);
  let next = 0;
  const worker = async () => { while (next < jobs.length) { const [c, t, s] = jobs[next++]; await one(server, model, c, t, s); } };
  const t0 = Date.now();
  await Promise.all(Array.from({ length: CONC }, worker));
  console.error(`corpus: ${SCHEMAS.length} schemas, ${jobs.length} requests in ${((Date.now() - t0) / 1e3).toFixed(1)} s: ` +
                `${stats.validated} replies valid under ajv, ${stats.length} cut by max_tokens, ${stats.refused_ok} refusals as expected, ` +
                `${stats.failures.length} failures`);
  for (const f of stats.failures.slice(0, 15)) console.error("  " + f);
  if (dump) fs.writeFileSync(process.env.MS_CORPUS_DUMP, dump.join("\n") + "\n");
  assert(stats.failures.length === 0, `${stats.failures.length} failures (first: ${stats.failures[0]})`);
});

test("most replies finish within max_tokens (the validation covers them)", async () => {
  assert(stats.validated >= 0.75 * stats.replies, `${stats.validated} of ${stats.replies} replies finished and were validated`);
});

test("KV pool returns to empty", async ({ server }) => { await waitKvEmpty(server.url); });

run(import.meta.url, {
  setup: async () => {
    const server = await startServer();
    const model = (await (await fetch(server.url + "/v1/models")).json()).data[0].id;
    return { server, model };
  },
  teardown: async ({ server }) => { await server.stop(); },
});
