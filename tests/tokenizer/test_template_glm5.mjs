// test_template_glm5.mjs - the GLM-5 template (configs/templates/glm5.jinja) against expected strings
// derived by hand from the rendering rules of the GLM-5 spec (section 5.2), rendered both by the
// oracle (@huggingface/jinja) and by `moeserve template`; both must produce exactly the expected text.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ROOT, oracleRender, moeserveRender } from "../fixtures/templates/harness.mjs";

const path = join(ROOT, "configs/templates/glm5.jinja");
const src = readFileSync(path, "utf8");
const cases = JSON.parse(readFileSync(join(ROOT, "tests/fixtures/templates/glm5_spec_cases.json"), "utf8"));
const jobs = cases.map((c) => ({ messages: c.messages, tools: c.tools, add_generation_prompt: c.add_generation_prompt, kwargs: c.kwargs }));
const got = moeserveRender(["--template", path], jobs);
let pass = 0, fail = 0;
cases.forEach((c, i) => {
  const want = oracleRender(src, jobs[i], null, null);
  const okOracle = want.text === c.expected, okMs = got[i].text === c.expected;
  if (okOracle && okMs) pass++;
  else {
    fail++;
    console.error(`FAIL ${c.name}\n  expected: ${JSON.stringify(c.expected)}\n  oracle:   ${JSON.stringify(want)}\n  moeserve: ${JSON.stringify(got[i])}`);
  }
});
console.log(`## test_template_glm5: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
