#!/usr/bin/env node
// screenshot_chat.mjs - asks the chat page of a running server one question in headless Chromium and
// saves a screenshot (for the README). Usage: node tools/screenshot_chat.mjs URL OUT.png [question]
import { chromium } from 'playwright-core';
const [url = 'http://127.0.0.1:8000/', out = 'docs/chat-page.png', q = 'What is 347 + 285?'] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath: process.env.MS_CHROMIUM || '/usr/bin/chromium', headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'] });
const page = await browser.newPage({ viewport: { width: 1000, height: 700 } });
await page.goto(url);
await page.waitForFunction(() => document.querySelectorAll('#model option').length > 0);
await page.fill('#input', q);
await page.click('#send');
await page.waitForFunction(() => !document.getElementById('send').disabled && document.querySelectorAll('.msg.assistant').length > 0, null, { timeout: 60000 });
const det = page.locator('.msg.assistant details.reasoning').last();
if (await det.count()) await det.evaluate((d) => { d.open = true; });
await page.screenshot({ path: out });
await browser.close();
console.log(`saved ${out}`);
