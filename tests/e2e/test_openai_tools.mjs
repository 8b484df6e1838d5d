// test_openai_tools.mjs - tool calls through the openai SDK (glm47 parser, spec 5.4): with the demo
// model (trained to call `calculator` for square roots) the call, its arguments and finish_reason
// are checked exactly, streamed and not; with any model the tool-call protocol invariants hold
// (ids, JSON arguments, streamed == non-streamed), and a tool result round-trips through the template.
import OpenAI from "openai";
import { assert, collectChatStream, eq, isDemo, run, startServer, test, waitKvEmpty } from "./lib.mjs";

const CALC = { type: "function", function: { name: "calculator", description: "Evaluate an arithmetic expression exactly.",
  parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] } } };
const Q = [{ role: "user", content: "What is the square root of 2025?" }];

function checkCalls(calls) {
  for (const c of calls) {
    assert(/^call_[0-9a-f]{24}$/.test(c.id), "id " + c.id);
    eq(c.type, "function", "type");
    eq(c.function.name, "calculator", "only offered tools are returned");
    const args = JSON.parse(c.function.arguments);
    assert(args && typeof args === "object" && !Array.isArray(args), "arguments is a JSON object");
  }
}

test("tool call, non-streaming", async ({ client, model, demo }) => {
  const r = await client.chat.completions.create({ model, messages: Q, tools: [CALC], max_tokens: 200, temperature: 0 });
  const m = r.choices[0].message;
  checkCalls(m.tool_calls || []);
  if (demo) {
    assert(m.tool_calls && m.tool_calls.length === 1, "one call");
    eq(r.choices[0].finish_reason, "tool_calls", "finish_reason");
    const args = JSON.parse(m.tool_calls[0].function.arguments);
    assert(typeof args.expression === "string" && /2025/.test(args.expression), "expression " + args.expression);
    eq(m.content, null, "content null when the reply is reasoning + tool call");
  } else if (m.tool_calls) {
    eq(r.choices[0].finish_reason, "tool_calls", "finish_reason with calls");
  }
});

test("tool call, streaming == non-streaming", async ({ client, model }) => {
  const req = { model, messages: Q, tools: [CALC], max_tokens: 200, temperature: 0 };
  const full = await client.chat.completions.create(req);
  const s = await collectChatStream(await client.chat.completions.create({ ...req, stream: true }));
  const m = full.choices[0].message;
  eq(s.reasoning, m.reasoning_content ?? "", "reasoning");
  eq(s.calls.map((c) => [c.name, c.arguments]), (m.tool_calls || []).map((c) => [c.function.name, c.function.arguments]), "calls");
  for (const c of s.calls) assert(/^call_[0-9a-f]{24}$/.test(c.id), "streamed id");
  eq(s.finish, full.choices[0].finish_reason, "finish_reason");
  eq(s.content.trim(), (m.content ?? "").trim(), "content");
});

test("tool result round trip", async ({ client, model, demo }) => {
  const messages = [...Q,
    { role: "assistant", content: null, tool_calls: [{ id: "call_0", type: "function", function: { name: "calculator", arguments: "{\"expression\": \"sqrt(2025)\"}" } }] },
    { role: "tool", tool_call_id: "call_0", content: "45" }];
  const r = await client.chat.completions.create({ model, messages, tools: [CALC], max_tokens: 120, temperature: 0 });
  eq(r.choices[0].message.role, "assistant", "role");
  if (demo) assert(/45/.test(r.choices[0].message.content || ""), "states the result: " + r.choices[0].message.content);
});

test("tool_choice none: no tool parsing", async ({ client, model }) => {
  const r = await client.chat.completions.create({ model, messages: Q, tools: [CALC], tool_choice: "none", max_tokens: 60, temperature: 0 });
  eq(r.choices[0].message.tool_calls, undefined, "no tool_calls");
  assert(r.choices[0].finish_reason !== "tool_calls", "finish_reason");
});

test("KV pool returns to empty", async ({ server }) => {
  await waitKvEmpty(server.url);
});

run(import.meta.url, {
  setup: async () => {
    const server = await startServer();
    const client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "unused", maxRetries: 0, timeout: 120000 });
    const model = (await client.models.list()).data[0].id;
    return { server, client, model, demo: server.model ? isDemo(server.model) : false };
  },
  teardown: async ({ server }) => { await server.stop(); },
});
