// test_structured_outputs.mjs - structured outputs end to end with the demo model: response_format
// json_schema / json_object, SGLang's regex and ebnf, forced tool calls. Replies are judged by
// oracles we did not write: the openai SDK's parse helper (JSON syntax, strict tool arguments) and
// ajv with ajv-formats (JSON Schema 2020-12 validity, formats included).
//
// Every reply that ends with finish_reason "stop" must be valid; schemas here bound their strings
// and arrays where the tiny demo model would otherwise loop, so nearly every reply finishes.
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import OpenAI from "openai";
import { assert, checkError, eq, post, run, startServer, test, waitKvEmpty } from "./lib.mjs";

// ajv's JSON Schema 2020-12 validator with the standard formats (date, time, uuid, email, ipv4, ...)
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);
let n_validated = 0;

function validate(schema, value, what) {
  const v = ajv.compile(schema);
  assert(v(value), `${what}: ajv rejects ${JSON.stringify(value)}: ${ajv.errorsText(v.errors)}`);
  n_validated++;
}

const S = (maxLength = 24) => ({ type: "string", maxLength });
// Real tool schemas, nested objects, enums, arrays, anyOf, $ref, bounds, formats.
const SCHEMAS = [
  { type: "object", properties: { location: S(), unit: { type: "string", enum: ["celsius", "fahrenheit"] } }, required: ["location", "unit"], additionalProperties: false },
  { type: "object", properties: { expression: S(30) }, required: ["expression"] },
  { type: "object", properties: { query: S(), max_results: { type: "integer", minimum: 1, maximum: 50 }, safe: { type: "boolean" } }, required: ["query"] },
  { type: "object", properties: { name: S(), age: { type: "integer", minimum: 0, maximum: 130 }, email: { type: "string", format: "email" } }, required: ["name", "age", "email"] },
  { type: "object", properties: { id: { type: "string", format: "uuid" }, created: { type: "string", format: "date" }, at: { type: "string", format: "date-time" } }, required: ["id", "created", "at"] },
  { type: "array", items: { type: "integer", minimum: -10, maximum: 10 }, minItems: 1, maxItems: 5 },
  { type: "array", items: { enum: ["red", "green", "blue", 7, null] }, maxItems: 4 },
  { anyOf: [{ type: "integer" }, { type: "boolean" }, { type: "null" }] },
  { type: "object", properties: { point: { type: "object", properties: { x: { type: "number" }, y: { type: "number" } }, required: ["x", "y"] }, label: S(12) }, required: ["point"] },
  { type: "object", properties: { status: { const: "ok" }, code: { type: "integer", exclusiveMinimum: 99, exclusiveMaximum: 600 } }, required: ["status", "code"] },
  { $defs: { node: { type: "object", properties: { v: { type: "integer", minimum: 0, maximum: 9 }, kids: { type: "array", items: { $ref: "#/$defs/node" }, maxItems: 2 } }, required: ["v"] } }, $ref: "#/$defs/node" },
  { type: "object", properties: { tags: { type: "array", items: S(10), maxItems: 3 }, score: { type: "number", minimum: 0, maximum: 100 } }, required: ["tags", "score"] },
  { type: "object", properties: { sku: { type: "string", pattern: "^[A-Z]{2}-[0-9]{3}$" }, qty: { type: "integer", minimum: 1, maximum: 99 } }, required: ["sku", "qty"] },
  { type: "object", properties: { note: { type: ["string", "null"], maxLength: 16 }, ok: { type: "boolean" } }, required: ["note", "ok"] },
  { type: "object", additionalProperties: { type: "integer", minimum: 0, maximum: 9 }, maxProperties: undefined },
  { type: "object", properties: { kind: { enum: ["a", "b"] }, data: { oneOf: [{ type: "object", properties: { n: { type: "integer", minimum: 0, maximum: 5 } }, required: ["n"] }, { type: "array", items: { type: "boolean" }, maxItems: 3 }] } }, required: ["kind", "data"] },
];
for (const s of SCHEMAS) for (const k of Object.keys(s)) if (s[k] === undefined) delete s[k];

const MSG = [{ role: "user", content: "Reply with the requested JSON." }];
let stopped = 0, total = 0;

for (const [i, schema] of SCHEMAS.entries()) {
  test(`json_schema #${i}: valid at temperature 0 and 1 (x3)`, async ({ client, model }) => {
    for (const [temperature, seed] of [[0, 0], [1, 1], [1, 2], [1, 3]]) {
      const req = { model, messages: MSG, max_tokens: 400, temperature, seed,
                    response_format: { type: "json_schema", json_schema: { name: `s${i}`, schema, strict: true } } };
      const r = await client.chat.completions.create(req);
      const ch = r.choices[0];
      total++;
      assert(ch.finish_reason === "stop" || ch.finish_reason === "length", `finish_reason ${ch.finish_reason}`);
      if (ch.finish_reason !== "stop") continue;
      stopped++;
      // the SDK's own parse helper on the same reply
      const parsed = await client.chat.completions.parse(req);
      if (parsed.choices[0].finish_reason === "stop") validate(schema, parsed.choices[0].message.parsed, `schema #${i} T=${temperature} (sdk)`);
      validate(schema, JSON.parse(ch.message.content), `schema #${i} T=${temperature}`);
    }
  });
}

test("nearly every schema reply finishes (not cut by max_tokens)", async () => {
  assert(stopped >= 0.9 * total, `${stopped} of ${total} replies finished with stop`);
});

test("json_object: any JSON object, chat and completions", async ({ client, model, server }) => {
  for (const temperature of [0, 1]) {
    const r = await client.chat.completions.create({ model, messages: MSG, max_tokens: 300, temperature, seed: 5, response_format: { type: "json_object" } });
    if (r.choices[0].finish_reason === "stop") {
      const v = JSON.parse(r.choices[0].message.content);
      assert(v && typeof v === "object" && !Array.isArray(v), "an object");
    }
  }
  const c = await post(server.url + "/v1/completions", { model, prompt: "JSON:", max_tokens: 200, temperature: 0,
    response_format: { type: "json_schema", json_schema: { name: "x", schema: SCHEMAS[0] } } });
  eq(c.status, 200, "completions status " + c.text);
  if (c.json.choices[0].finish_reason === "stop") validate(SCHEMAS[0], JSON.parse(c.json.choices[0].text), "completions");
});

test("streamed == non-streamed under a schema", async ({ client, model }) => {
  const req = { model, messages: MSG, max_tokens: 300, temperature: 0, response_format: { type: "json_schema", json_schema: { name: "p", schema: SCHEMAS[3] } } };
  const full = await client.chat.completions.create(req);
  let text = "", finish = null;
  for await (const ch of await client.chat.completions.create({ ...req, stream: true })) {
    const c = ch.choices[0];
    if (!c) continue;
    if (c.delta && c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  eq(text, full.choices[0].message.content, "content");
  eq(finish, full.choices[0].finish_reason, "finish_reason");
});

test("regex and ebnf (SGLang fields)", async ({ server, model }) => {
  const rx = "(yes|no), [0-9]{3}(\\.[0-9])?";
  for (const temperature of [0, 1]) {
    const r = await post(server.url + "/v1/chat/completions", { model, messages: MSG, max_tokens: 60, temperature, seed: 9, regex: rx });
    eq(r.status, 200, r.text);
    const ch = r.json.choices[0];
    eq(ch.finish_reason, "stop", "finish_reason");
    assert(new RegExp(`^(?:${rx})$`).test(ch.message.content), "regex match: " + ch.message.content);
    const c = await post(server.url + "/v1/completions", { model, prompt: "Answer:", max_tokens: 60, temperature, seed: 9,
      ebnf: 'root ::= "The answer is " num "."\nnum ::= [1-9] [0-9]{0,2}\n' });
    eq(c.status, 200, c.text);
    assert(/^The answer is [1-9][0-9]{0,2}\.$/.test(c.json.choices[0].text), "ebnf match: " + c.json.choices[0].text);
    eq(c.json.choices[0].finish_reason, "stop", "ebnf finish_reason");
  }
});

const WEATHER = { type: "function", function: { name: "get_weather", strict: true, description: "Weather for a city.",
  parameters: { type: "object", properties: { city: S(20), unit: { type: "string", enum: ["c", "f"] }, days: { type: "integer", minimum: 1, maximum: 7 } },
                required: ["city", "unit", "days"], additionalProperties: false } } };
const CALC = { type: "function", function: { name: "calculator", strict: true, description: "Evaluate an arithmetic expression exactly.",
  parameters: { type: "object", properties: { expression: S(40) }, required: ["expression"], additionalProperties: false } } };
const ASK = [{ role: "user", content: "What is the square root of 2025?" }];

test("tool_choice naming a function: a valid call of that function (SDK parse)", async ({ client, model }) => {
  for (const [temperature, seed] of [[0, 0], [1, 1], [1, 2]]) {
    const r = await client.chat.completions.parse({ model, messages: ASK, tools: [CALC, WEATHER], max_tokens: 300, temperature, seed,
      tool_choice: { type: "function", function: { name: "get_weather" } } });
    const ch = r.choices[0];
    eq(ch.finish_reason, "tool_calls", "finish_reason");
    eq(ch.message.tool_calls.length, 1, "one call");
    const tc = ch.message.tool_calls[0];
    eq(tc.function.name, "get_weather", "the named function");
    validate(WEATHER.function.parameters, tc.function.parsed_arguments, "weather arguments");
    validate(WEATHER.function.parameters, JSON.parse(tc.function.arguments), "weather arguments (raw)");
  }
});

test("tool_choice required: at least one valid call (SDK parse)", async ({ client, model }) => {
  for (const [temperature, seed] of [[0, 0], [1, 4]]) {
    const r = await client.chat.completions.parse({ model, messages: ASK, tools: [CALC, WEATHER], max_tokens: 400, temperature, seed, tool_choice: "required" });
    const ch = r.choices[0];
    eq(ch.finish_reason, "tool_calls", "finish_reason");
    assert(ch.message.tool_calls.length >= 1, "a call");
    for (const tc of ch.message.tool_calls) {
      const t = [CALC, WEATHER].find((x) => x.function.name === tc.function.name);
      assert(t, "an offered tool: " + tc.function.name);
      validate(t.function.parameters, tc.function.parsed_arguments, tc.function.name + " arguments");
    }
  }
});

test("tool_choice none: no tool-call tags in content", async ({ client, model }) => {
  for (const [temperature, seed] of [[0, 0], [1, 1], [1, 2]]) {
    const r = await client.chat.completions.create({ model, messages: ASK, tools: [CALC], tool_choice: "none", max_tokens: 120, temperature, seed });
    const m = r.choices[0].message;
    eq(m.tool_calls, undefined, "no tool_calls");
    assert(!(m.content || "").includes("<tool_call>"), "no <tool_call> in content: " + m.content);
  }
});

test("a schema that cannot be enforced: 400 naming the keyword", async ({ server, model }) => {
  const bad = [[{ type: "array", uniqueItems: true }, "uniqueItems"], [{ not: { type: "string" } }, "not"],
               [{ type: "string", format: "hostname" }, "format"], [{ $ref: "#/$defs/nope" }, "$ref"],
               [{ type: "number", multipleOf: 0.5 }, "multipleOf"]];
  for (const [schema, kw] of bad) {
    const r = await post(server.url + "/v1/chat/completions", { model, messages: MSG, response_format: { type: "json_schema", json_schema: { name: "b", schema } } });
    checkError(r, 400, "response_format.json_schema.schema");
    assert(r.json.error.message.includes(kw), `message names '${kw}': ${r.json.error.message}`);
  }
  checkError(await post(server.url + "/v1/chat/completions", { model, messages: MSG, regex: "(a" }), 400, "regex");
  checkError(await post(server.url + "/v1/chat/completions", { model, messages: MSG, ebnf: "root ::= foo" }), 400, "ebnf");
  checkError(await post(server.url + "/v1/chat/completions", { model, messages: MSG, regex: "a", ebnf: 'root ::= "a"' }), 400);
  checkError(await post(server.url + "/v1/chat/completions", { model, messages: MSG, response_format: { type: "xml" } }), 400, "response_format.type");
});

test("a grammar no token can continue ends with finish_reason grammar_unsatisfiable", async ({ server, model }) => {
  // an empty character class matches nothing: after "a" no token can follow
  const r = await post(server.url + "/v1/completions", { model, prompt: "x", max_tokens: 20, temperature: 0, ebnf: 'root ::= "a" []\n' });
  eq(r.status, 200, r.text);
  eq(r.json.choices[0].finish_reason, "grammar_unsatisfiable", "finish_reason");
  eq(r.json.choices[0].text, "a", "the text so far");
});

test("replies were validated by ajv", async () => {
  assert(n_validated > 50, `${n_validated} replies validated`);
  console.error(`ajv: ${n_validated} replies valid`);
});

test("KV pool returns to empty", async ({ server }) => {
  await waitKvEmpty(server.url);
});

run(import.meta.url, {
  setup: async () => {
    const server = await startServer();
    const client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "unused", maxRetries: 0, timeout: 120000 });
    const model = (await client.models.list()).data[0].id;
    return { server, client, model };
  },
  teardown: async ({ server }) => { await server.stop(); },
});
