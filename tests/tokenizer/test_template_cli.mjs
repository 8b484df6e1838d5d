// test_template_cli.mjs - the `moeserve template` command line as DESIGN.md specifies it: exact
// rendering on stdout with no added newline (checked against the oracle, @huggingface/jinja), both
// FILE shapes (array of messages; object with messages and tools), --kwargs, --add-generation-prompt,
// chat_template.jinja taking precedence over tokenizer_config.json, and one-line errors with a
// non-zero exit code that name the flag or file at fault.
import { spawnSync } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BIN, oracleRender, lenmlTemplates } from "../fixtures/templates/harness.mjs";

let pass = 0, fail = 0;
const check = (name, ok, detail) => {
  if (ok) pass++;
  else { fail++; console.error(`FAIL ${name}: ${detail}`); }
};
const run = (args) => spawnSync(BIN, ["template", ...args], { encoding: "utf8" });

const dir = mkdtempSync(join(tmpdir(), "ms-template-cli-"));
try {
  const qwen = lenmlTemplates().find((t) => t.name === "qwen3");
  const messages = [
    { role: "system", content: "Be brief. ünï 😀" },
    { role: "user", content: "What's 2+2?" },
    { role: "assistant", content: "<think>add</think>4" },
    { role: "user", content: "And 3+3?" },
  ];
  const tools = [{ type: "function", function: { name: "calc", description: "Évalue", parameters: { type: "object", properties: { x: { type: "number" } } } } }];
  const arrFile = join(dir, "a.json"), objFile = join(dir, "o.json");
  writeFileSync(arrFile, JSON.stringify(messages));
  writeFileSync(objFile, JSON.stringify({ messages, tools }));

  for (const [name, file, job, extra] of [
    ["array file, generation prompt, kwargs", arrFile, { messages, add_generation_prompt: true, kwargs: { enable_thinking: false } },
      ["--add-generation-prompt", "--kwargs", '{"enable_thinking": false}']],
    ["array file, no generation prompt", arrFile, { messages }, []],
    ["object file with tools", objFile, { messages, tools, add_generation_prompt: true }, ["--add-generation-prompt"]],
  ]) {
    const r = run(["--model", qwen.dir, "--messages", file, ...extra]);
    const want = oracleRender(qwen.src, job, qwen.bos, qwen.eos);
    check(name, r.status === 0 && r.stdout === want.text, `rc=${r.status} stderr=${r.stderr} got=${JSON.stringify(r.stdout.slice(-80))} want=${JSON.stringify(want.text?.slice(-80))}`);
  }

  // a model directory with chat_template.jinja (preferred) and a tokenizer_config.json with token objects
  const mdir = join(dir, "model");
  spawnSync("mkdir", ["-p", mdir]);
  writeFileSync(join(mdir, "tokenizer_config.json"), JSON.stringify({ bos_token: { content: "<B>" }, eos_token: "<E>", chat_template: "CONFIG" }));
  writeFileSync(join(mdir, "chat_template.jinja"), "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{{ eos_token }}\n");
  let r = run(["--model", mdir, "--messages", arrFile]);
  check("chat_template.jinja precedence, token objects", r.status === 0 && r.stdout === `<B>[system]${messages[0].content}[user]${messages[1].content}[assistant]${messages[2].content}[user]${messages[3].content}<E>`,
    `rc=${r.status} out=${JSON.stringify(r.stdout)} err=${r.stderr}`);

  const errCase = (name, args, needle) => {
    const e = run(args);
    const lines = e.stderr.trim().split("\n");
    check(name, e.status !== 0 && e.stdout === "" && lines.length === 1 && lines[0].includes(needle), `rc=${e.status} stderr=${JSON.stringify(e.stderr)}`);
  };
  errCase("missing --model", ["--messages", arrFile], "--model");
  errCase("missing messages file", ["--model", qwen.dir, "--messages", join(dir, "nope.json")], "nope.json");
  errCase("bad --kwargs", ["--model", qwen.dir, "--messages", arrFile, "--kwargs", "[1]"], "--kwargs");
  writeFileSync(join(dir, "bad.json"), '{"messages": 3}');
  errCase("messages not an array", ["--model", qwen.dir, "--messages", join(dir, "bad.json")], "messages");
  writeFileSync(join(mdir, "chat_template.jinja"), "ok\n{% if x %}\n{{ 1 + }}\n");
  errCase("template syntax error names the line", ["--model", mdir, "--messages", arrFile], "line 3");
  writeFileSync(join(mdir, "chat_template.jinja"), "{{ raise_exception('no system role') }}");
  errCase("raise_exception fails the command", ["--model", mdir, "--messages", arrFile], "no system role");
} finally {
  rmSync(dir, { recursive: true, force: true });
}
console.log(`## test_template_cli: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
