// test_chat_page.mjs - the chat page at GET / in headless Chromium (playwright-core driving Debian's
// /usr/bin/chromium) against a real `moeserve serve`: the model list is loaded from /v1/models, a
// typed question streams an answer, the reasoning is shown in its own collapsible block, tokens/s is
// displayed, thinking can be switched off, a refused request shows its whole error, the demo's
// calculator tool can be offered (its calls evaluated in the page), and Stop ends a running reply.
// No outside network.
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

test("favicon: an inline icon, no request for /favicon.ico", async ({ page }) => {
  const href = await page.locator("link[rel=icon]").getAttribute("href");
  assert(href && href.startsWith("data:image/svg+xml"), "icon: " + href);
});

test("a refused request shows the whole error: status, type, param, code, message", async ({ page }) => {
  await page.route("**/v1/chat/completions", (route) => route.fulfill({ status: 400, contentType: "application/json",
    body: JSON.stringify({ error: { message: "'max_tokens' must be at least 1.", type: "invalid_request_error", param: "max_tokens", code: "invalid_value" } }) }));
  const msg = await ask(page, "Hi");
  const err = await msg.locator(".error").textContent();
  assert(/HTTP 400/.test(err) && /invalid_request_error/.test(err) && /param: max_tokens/.test(err) && /code: invalid_value/.test(err) &&
    /must be at least 1/.test(err), "error shown: " + err);
  await page.unroute("**/v1/chat/completions");
  await page.click("#clear");
});

test("calculator tool: offered when checked, its call evaluated in the page, the model answers", async ({ page, demo }) => {
  if (!demo) return;
  await page.click("#clear");
  await page.check("#calc");
  await page.fill("#input", "What is the square root of 2025?");
  await page.click("#send");
  await page.waitForFunction(() => [...document.querySelectorAll(".msg.assistant .answer")].some((a) => /45/.test(a.textContent)) &&
    !document.getElementById("send").disabled, null, { timeout: 120000 });
  const tools = await page.locator(".msg.assistant .tools").first().textContent();
  assert(/calculator\(.*2025.*\) = 45/.test(tools), "tool call and its result shown: " + tools);
  await page.uncheck("#calc");
  await page.click("#clear");
});

test("Stop aborts a running reply", async ({ page, server }) => {
  // make sure the reply is long: the request goes out with ignore_eos added
  await page.route("**/v1/chat/completions", (route) => {
    const body = JSON.parse(route.request().postData());
    route.continue({ postData: JSON.stringify({ ...body, ignore_eos: true }) });
  });
  await page.click("#clear"); // fresh conversation: the prompt stays short
  await page.fill("#maxtok", "1800");
  await page.fill("#input", "Count from 1 to 1000, one number per line.");
  // a small model streams faster than a click: throttle the page's network so the reply is still
  // arriving, and press Stop from inside the page while the stream is being read
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Network.enable");
  await cdp.send("Network.emulateNetworkConditions", { offline: false, latency: 0, downloadThroughput: 16384, uploadThroughput: -1 });
  await page.evaluate(() => {
    const orig = TextDecoder.prototype.decode;
    let n = 0;
    TextDecoder.prototype.decode = function (...args) {
      const s = orig.apply(this, args);
      if (++n === 3) {
        TextDecoder.prototype.decode = orig;
        window.__stopPressed = !document.getElementById("stop").disabled;
        document.getElementById("stop").click();
      }
      return s;
    };
  });
  await page.click("#send");
  await page.waitForFunction(() => !document.getElementById("send").disabled);
  const meta = await page.locator(".msg.assistant").last().locator(".meta").textContent();
  assert(/finish: stopped/.test(meta), "meta after stop: " + meta);
  assert(await page.evaluate(() => window.__stopPressed), "Stop was enabled while streaming");
  const n = parseInt(meta, 10);
  assert(n < 1800, "generation was cut short: " + meta);
  await page.unroute("**/v1/chat/completions");
  await cdp.send("Network.emulateNetworkConditions", { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: -1 });
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
    page.on("request", (r) => { if (!r.url().startsWith(server.url) && !r.url().startsWith("data:")) outside.push(r.url()); });
    const model = (await (await fetch(server.url + "/v1/models")).json()).data[0].id;
    return { server, browser, page, outside, model, demo: server.model ? isDemo(server.model) : false };
  },
  teardown: async ({ server, browser }) => { await browser.close(); await server.stop(); },
});
