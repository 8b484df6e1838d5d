// bench_ref.mjs - the reference side of `scripts/bench-tokenizer.sh`: encodes a corpus file
// single-threaded with @huggingface/tokenizers (the JavaScript port) and, when installed, the
// `tokenizers` npm package (Hugging Face's Rust library behind a Node binding), and prints MB/s in
// the same form as `moeserve bench-tokenizer`. Usage: node bench_ref.mjs MODEL_DIR CORPUS_FILE
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { Tokenizer } from "@huggingface/tokenizers";

const [dir, corpusPath] = process.argv.slice(2);
if (!dir || !corpusPath) {
  console.error("usage: node bench_ref.mjs MODEL_DIR CORPUS_FILE");
  process.exit(2);
}
const bytes = fs.readFileSync(corpusPath);
const text = bytes.toString("utf8");
const mb = bytes.length / 1e6;
const cfgPath = path.join(dir, "tokenizer_config.json");
const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const tc = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};

let t0 = performance.now();
const js = new Tokenizer(tj, tc);
const jsLoad = performance.now() - t0;
t0 = performance.now();
const n = js.encode(text, { add_special_tokens: false }).ids.length;
const dt = (performance.now() - t0) / 1000;
console.log(`bench-tokenizer: @huggingface/tokenizers (JS): ${mb.toFixed(2)} MB, ${n} tokens, ${dt.toFixed(3)} s, ${(mb / dt).toFixed(1)} MB/s (load ${jsLoad.toFixed(0)} ms)`);

try {
  const require = createRequire(import.meta.url);
  const R = require("tokenizers");
  t0 = performance.now();
  const r = R.Tokenizer.fromFile(path.join(dir, "tokenizer.json"));
  const rLoad = performance.now() - t0;
  t0 = performance.now();
  const e = await r.encode(text, null, { addSpecialTokens: false });
  const rdt = (performance.now() - t0) / 1000;
  console.log(`bench-tokenizer: tokenizers (Rust, npm binding): ${mb.toFixed(2)} MB, ${e.getIds().length} tokens, ${rdt.toFixed(3)} s, ${(mb / rdt).toFixed(1)} MB/s (load ${rLoad.toFixed(0)} ms)`);
} catch (err) {
  console.log(`bench-tokenizer: tokenizers (Rust) not available: ${err.message}`);
}
