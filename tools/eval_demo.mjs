#!/usr/bin/env node
// eval_demo.mjs - accuracy of the built-in demo model through a running `moeserve serve`, driven by
// the official openai SDK at temperature 0. Questions are generated here with a seed the trainer
// never used (held out), with thinking on and off: arithmetic (sums and differences up to 999,
// differences that are negative, products up to 99 x 99: without thinking the content of a negative
// difference shows the reversal and that of a product of two 2-digit numbers the split, as
// tools/train_demo.py teaches them), questions outside the skill
// with no tool offered (large operands, square roots: one polite sentence saying what the model can
// do, no tool call) and other topics (the same kind of sentence); and calculator tool prompts (the
// tool call must parse into tool_calls with valid JSON arguments; after the tool result the answer
// must state it). Prints a report and a JSON summary line; exits non-zero when a target is missed.
//
// Usage: node tools/eval_demo.mjs --base-url http://127.0.0.1:PORT/v1 [--n 300] [--seed 4242]
//        [--concurrency 8] [--min-exact 0.95] [--min-mode 0.93] [--min-category 0.85] [--min-tool 0.95]
//        [--json FILE]
// Targets: --min-exact over all questions (issue 16's target), --min-mode over thinking on and over
// thinking off alone, --min-category for each category alone (regression floors: the weakest
// category, differences with borrows computed without thinking, measures 86-91% on the v2 demo),
// --min-tool for parsed tool calls; reasoning always in reasoning_content.
import OpenAI from 'openai';
import { writeFileSync } from 'node:fs';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : '1']);
  return acc;
}, []));
const N = +(args.n || 300), SEED = +(args.seed || 4242), CONC = +(args.concurrency || 8);
const client = new OpenAI({ baseURL: args['base-url'] || 'http://127.0.0.1:8000/v1', apiKey: args['api-key'] || 'none' });

// mulberry32: small seeded generator (held-out questions differ from training's Python RNG stream)
let s = SEED >>> 0;
const rnd = () => { s = (s + 0x6D2B79F5) >>> 0; let t = s; t = Math.imul(t ^ (t >>> 15), t | 1); t ^= t + Math.imul(t ^ (t >>> 7), t | 61); return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };
const ri = (a, b) => a + Math.floor(rnd() * (b - a + 1));
const pick = (xs) => xs[Math.floor(rnd() * xs.length)];
const fmt = (t, v) => t.replace(/\{(\w+)\}/g, (_, k) => String(v[k]));

const ADD_Q = ['What is {a}+{b}?', 'What is {a} + {b}?', 'What is {a} plus {b}?', 'Compute {a} + {b}.', 'Calculate {a} + {b}',
  'How much is {a} plus {b}?', 'Add {a} and {b}.', '{a} + {b} = ?', "What's {a} plus {b}?", 'Please add {a} and {b}.'];
const SUB_Q = ['What is {a}-{b}?', 'What is {a} - {b}?', 'What is {a} minus {b}?', 'Compute {a} - {b}.', 'Subtract {b} from {a}.',
  'How much is {a} minus {b}?', "What's {a} minus {b}?", 'What is the difference between {a} and {b}?'];
const MUL_Q = ['What is {a}*{b}?', 'What is {a} * {b}?', 'What is {a} times {b}?', 'Compute {a} × {b}.', 'Multiply {a} by {b}.',
  'How much is {a} times {b}?', 'What is the product of {a} and {b}?'];
const num = () => pick([ri(0, 9), ri(10, 99), ri(100, 999), ri(100, 999)]);

// the content a product's answer must have (tools/train_demo.py mul_content)
function mulWant(a, b, think) {
  if (think || a < 10 || b < 10) return `${a} × ${b} = ${a * b}`;
  const bt = Math.floor(b / 10), bo = b % 10;
  return `${a} × ${b} = ${a} × ${bt * 10} + ${a} × ${bo} = ${a * bt * 10} + ${a * bo} = ${a * b}`;
}
const LIMIT_A = "I can't compute that reliably: I add and subtract whole numbers up to 999 and multiply numbers " +
  'up to 99. Offer me a calculator tool and I will use it.';
const TOPIC_A = "Sorry, I can't help with that: I am a small demo model that can add, subtract and multiply " +
  'numbers, and use a calculator tool for harder sums.';
const TOPIC_Q = ['What is the capital of Italy?', 'Tell me a story.', 'Write a haiku about autumn.', 'Who painted the Mona Lisa?',
  'How do I fix my bike?', 'What is the weather in Paris?', 'Explain photosynthesis.', 'Write a SQL query for me.',
  'Tell me a joke.', 'What is the capital of France?', 'Can you help me write an email?'];

// one held-out question of category cat (think: whether thinking is on, for the expected content)
function question(cat, think) {
  if (cat === 'add') { const a = num(), b = num(); return { q: fmt(pick(ADD_Q), { a, b }), want: `${a} + ${b} = ${a + b}` }; }
  if (cat === 'sub') { let a = num(), b = num(); if (a < b) [a, b] = [b, a]; return { q: fmt(pick(SUB_Q), { a, b }), want: `${a} - ${b} = ${a - b}` }; }
  if (cat === 'negative') {
    const a = pick([ri(0, 9), ri(10, 99), ri(100, 998)]), b = ri(a + 1, 999);
    return { q: fmt(pick(SUB_Q), { a, b }), want: think ? `${a} - ${b} = ${a - b}` : `${a} - ${b} = -(${b} - ${a}) = ${a - b}` };
  }
  if (cat === 'mul') { let a = pick([ri(2, 9), ri(10, 99)]), b = ri(2, 9); if (rnd() < 0.3) [a, b] = [b, a]; return { q: fmt(pick(MUL_Q), { a, b }), want: mulWant(a, b, think) }; }
  if (cat === 'mul2x2') { const a = ri(10, 99), b = ri(10, 99); return { q: fmt(pick(MUL_Q), { a, b }), want: mulWant(a, b, think) }; }
  if (cat === 'limit') return { q: toolCase().q, want: LIMIT_A, noTool: true };
  return { q: pick(TOPIC_Q), want: TOPIC_A, noTool: true };
}
const CATS = ['add', 'sub', 'negative', 'mul', 'mul2x2', 'limit', 'topic'];

const CALC = { type: 'function', function: { name: 'calculator', description: 'Evaluate an arithmetic expression exactly and return the result.',
  parameters: { type: 'object', properties: { expression: { type: 'string', description: 'The expression, e.g. sqrt(2025) or 4821 * 937' } }, required: ['expression'] } } };
const fmtNum = (x) => Math.abs(x - Math.round(x)) < 1e-9 ? String(Math.round(x)) : x.toFixed(4).replace(/0+$/, '').replace(/\.$/, '');
function toolCase() {
  if (rnd() < 0.5) { const n = pick([ri(2, 99) ** 2, ri(10, 99999)]); return { q: pick(['What is the square root of {n}?', 'Compute sqrt({n}).', 'Find the square root of {n}.']).replace('{n}', n), expr: `sqrt(${n})`, val: fmtNum(Math.sqrt(n)) }; }
  const a = ri(100, 99999), b = ri(100, 9999);
  return { q: fmt(pick(['What is {a} * {b}?', 'What is {a} times {b}?', 'Multiply {a} by {b}.']), { a, b }), expr: `${a} * ${b}`, val: String(a * b) };
}

async function pool(items, fn) {
  const out = new Array(items.length); let next = 0;
  await Promise.all(Array.from({ length: CONC }, async () => { while (next < items.length) { const i = next++; out[i] = await fn(items[i], i); } }));
  return out;
}

const model = (await client.models.list()).data[0].id;
// N questions: each category in turn, thinking on and off alternating within it
const cases = Array.from({ length: N }, (_, i) => {
  const cat = CATS[i % CATS.length], think = Math.floor(i / CATS.length) % 2 === 0;
  return { ...question(cat, think), cat, think };
});
const tools = Array.from({ length: Math.max(20, Math.round(N / 5)) }, toolCase);
const t0 = Date.now();
let outTokens = 0; // completion tokens over every request (usage), for tokens per second
const res = await pool(cases, async (c) => {
  const r = await client.chat.completions.create({ model, temperature: 0, max_tokens: 300,
    messages: [{ role: 'user', content: c.q }], ...(c.think ? {} : { chat_template_kwargs: { enable_thinking: false } }) });
  const m = r.choices[0].message;
  outTokens += r.usage?.completion_tokens ?? 0;
  const noCall = !(m.tool_calls && m.tool_calls.length) && r.choices[0].finish_reason === 'stop';
  return { ...c, content: m.content, reasoning: m.reasoning_content ?? null, ok: (m.content ?? '').trim() === c.want && noCall,
    reasoningOk: c.think ? !!(m.reasoning_content && m.reasoning_content.length > 0) : (m.reasoning_content == null) };
});
const tres = await pool(tools, async (c) => {
  const msgs = [{ role: 'user', content: c.q }];
  const r = await client.chat.completions.create({ model, temperature: 0, max_tokens: 300, messages: msgs, tools: [CALC] });
  const m = r.choices[0].message, tc = m.tool_calls?.[0];
  outTokens += r.usage?.completion_tokens ?? 0;
  let args = null; try { args = tc ? JSON.parse(tc.function.arguments) : null; } catch { args = null; }
  const callOk = !!(tc && tc.function.name === 'calculator' && args && typeof args.expression === 'string' && r.choices[0].finish_reason === 'tool_calls');
  let answerOk = false, answer = null;
  if (callOk) {
    const r2 = await client.chat.completions.create({ model, temperature: 0, max_tokens: 300, tools: [CALC],
      messages: [...msgs, { role: 'assistant', content: m.content, reasoning_content: m.reasoning_content, tool_calls: m.tool_calls }, { role: 'tool', tool_call_id: tc.id, content: c.val }] });
    answer = r2.choices[0].message.content;
    outTokens += r2.usage?.completion_tokens ?? 0;
    answerOk = !!answer && answer.includes(c.val);
  }
  return { ...c, callOk, exprOk: callOk && args.expression === c.expr, answerOk, answer, raw: { content: m.content, tool_calls: m.tool_calls } };
});
const secs = (Date.now() - t0) / 1000;
const rate = (xs, f) => xs.length ? xs.filter(f).length / xs.length : 0;
const th = res.filter((r) => r.think), nt = res.filter((r) => !r.think);
const summary = {
  model, n_arith: res.length, n_tool: tres.length, seconds: secs, completion_tokens: outTokens,
  output_tokens_per_s: outTokens / secs,
  exact_all: rate(res, (r) => r.ok), exact_thinking: rate(th, (r) => r.ok), exact_no_thinking: rate(nt, (r) => r.ok),
  exact_by_category: Object.fromEntries(CATS.map((k) => [k, rate(res.filter((r) => r.cat === k), (r) => r.ok)])),
  reasoning_channel_ok: rate(res, (r) => r.reasoningOk), tool_call_ok: rate(tres, (r) => r.callOk),
  tool_expr_exact: rate(tres, (r) => r.exprOk), tool_answer_ok: rate(tres, (r) => r.answerOk),
};
const pct = (x) => (100 * x).toFixed(1) + '%';
console.log(`demo eval of ${model}: ${res.length} arithmetic + ${tres.length} tool prompts in ${secs.toFixed(1)} s ` +
  `(${outTokens} completion tokens, ${(outTokens / secs).toFixed(1)} tok/s at concurrency ${CONC})`);
console.log(`  exact content: all ${pct(summary.exact_all)}, thinking ${pct(summary.exact_thinking)}, no thinking ${pct(summary.exact_no_thinking)}`);
console.log(`  by category: ${CATS.map((k) => `${k} ${pct(summary.exact_by_category[k])}`).join(', ')}`);
console.log(`  reasoning in reasoning_content (and null when off): ${pct(summary.reasoning_channel_ok)}`);
console.log(`  tool calls parsed with valid JSON arguments: ${pct(summary.tool_call_ok)} (expression exact ${pct(summary.tool_expr_exact)}), answer after tool result: ${pct(summary.tool_answer_ok)}`);
for (const r of res.filter((x) => !x.ok).slice(0, 8)) console.log(`  miss: [${r.cat}] ${JSON.stringify(r.q)} think=${r.think} want ${JSON.stringify(r.want)} got ${JSON.stringify(r.content)}`);
for (const r of tres.filter((x) => !x.callOk).slice(0, 3)) console.log(`  tool miss: ${JSON.stringify(r.q)} got ${JSON.stringify(r.raw)}`);
console.log('JSON ' + JSON.stringify(summary));
if (args.json) writeFileSync(args.json, JSON.stringify(summary, null, 1));
const minExact = +(args['min-exact'] || 0.95), minTool = +(args['min-tool'] || 0.95);
const minMode = +(args['min-mode'] || 0.93), minCat = +(args['min-category'] || 0.85);
const fail = summary.exact_all < minExact || summary.exact_thinking < minMode || summary.exact_no_thinking < minMode ||
  CATS.some((k) => summary.exact_by_category[k] < minCat) || summary.tool_call_ok < minTool || summary.reasoning_channel_ok < 1;
process.exit(fail ? 1 : 0);
