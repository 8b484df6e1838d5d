// test_chat_page.mjs - the chat page at GET / in headless Chromium (playwright-core driving Debian's
// /usr/bin/chromium) against a real `moeserve serve`: the model list is loaded from /v1/models, a
// typed question streams an answer, the reasoning is shown in its own collapsible block, tokens/s is
// displayed, thinking can be switched off, and Stop ends a running reply. No outside network.
import { chromium } from "playwright-core";
import { assert, eq, isDemo, run, startServer, test, waitKvEmpty } from "./lib.mjs";

const CHROMIUM = process.env.MS_CHROMIUM || "/usr/bin/chromium";

async function ask(page, text) {
  const before = await page.locator(".msg.assistant").count();
  await page.fill("#input", text);
  await page.click("#send");
  await page.waitForFunction((n) => document.querySelectorAll(".msg.assistant").length > n, before);
  // done when Send is enabled again
  await page.waitForFunction(() => !document.getElementById("send").disabled, null, { timeout: 120000 });
  return page.locator(".msg.assistant").last();
}

test("page loads, lists the served model, makes no outside requests", async ({ page, server, outside, model }) => {
  await page.goto(server.url + "/");
  await page.waitForFunction(() => document.querySelectorAll("#model option").length > 0);
  eq(await page.locator("#model").inputValue(), model, "selected model");
  eq(outside.length, 0, "outside requests: " + outside.join(", "));
});

test("question -> streamed answer with a separate reasoning block and tokens/s", async ({ page, demo }) => {
  const msg = await ask(page, demo ? "What is 12+34?" : "Hello");
  const reasoning = msg.locator("details.reasoning");
  eq(await reasoning.count(), 1, "reasoning block exists");
  assert(await reasoning.isVisible(), "reasoning block shown (thinking is on)");
  const rtext = await reasoning.locator("div").textContent();
  assert(rtext.length > 0, "reasoning text");
  const answer = await msg.locator(".answer").textContent();
  if (demo) assert(/46/.test(answer), "answer streamed: " + answer);
  else assert(answer.length > 0 || rtext.length > 0, "some streamed text");
  assert(!answer.includes("</think>") && !rtext.includes("</think>"), "tags not shown");
  const meta = await msg.locator(".meta").textContent();
  assert(/tokens\/s/.test(meta), "tokens/s shown: " + meta);
  assert(/\d+ tokens/.test(await page.locator("#stats").textContent()), "stats line");
});

test("thinking off: no reasoning block content", async ({ page, demo }) => {
  await page.uncheck("#thinking");
  const msg = await ask(page, demo ? "What is 5+6?" : "Hi");
  assert(await msg.locator("details.reasoning").isHidden(), "reasoning hidden with thinking off");
  const answer = await msg.locator(".answer").textContent();
  if (demo) assert(/11/.test(answer), "answer " + answer);
  await page.check("#thinking");
});

test("Stop aborts a running reply", async ({ page, server }) => {
  // make sure the reply is long: the request goes out with ignore_eos added
  await page.route("**/v1/chat/completions", (route) => {
    const body = JSON.parse(route.request().postData());
    route.continue({ postData: JSON.stringify({ ...body, ignore_eos: true }) });
  });
  await page.fill("#maxtok", "1500");
  await page.fill("#input", "Count from 1 to 1000, one number per line.");
  await page.click("#send");
  await page.waitForFunction(() => !document.getElementById("stop").disabled);
  await page.waitForFunction(() => { const m = [...document.querySelectorAll(".msg.assistant")].pop(); return m && m.textContent.length > 20; }, null, { timeout: 60000 });
  await page.click("#stop");
  await page.waitForFunction(() => !document.getElementById("send").disabled);
  const meta = await page.locator(".msg.assistant").last().locator(".meta").textContent();
  assert(/finish: stopped/.test(meta), "meta after stop: " + meta);
  await page.unroute("**/v1/chat/completions");
  await waitKvEmpty(server.url, 30000);
});

run(import.meta.url, {
  setup: async () => {
    const server = await startServer();
    const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true,
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--no-first-run"] });
    const page = await browser.newPage();
    const outside = [];
    page.on("request", (r) => { if (!r.url().startsWith(server.url)) outside.push(r.url()); });
    const model = (await (await fetch(server.url + "/v1/models")).json()).data[0].id;
    return { server, browser, page, outside, model, demo: server.model ? isDemo(server.model) : false };
  },
  teardown: async ({ server, browser }) => { await browser.close(); await server.stop(); },
});
