// fake_server.mjs - a tiny OpenAI-compatible SSE server with known timings, the oracle for the
// `moeserve bench` end-to-end test: every reply streams max_tokens one-token chunks, the first after
// ttftMs and the rest itlMs apart, so the metrics bench reports can be checked against the schedule.
// Usable as a module (startFakeServer) or by hand: node tests/bench/fake_server.mjs [port].
import http from 'node:http';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// opts (all changeable later through server.opts):
//   ttftMs, itlMs        timing of the text chunks
//   usage                send a final usage chunk (stream_options.include_usage honoured only if true)
//   reasoningChunks      chat: the first N chunks carry delta.reasoning_content, the rest content
//   emptyText            every chunk carries "" (a reply with no text at all)
//   roleChunkFirst       chat: send {"role":"assistant","content":""} immediately (must not count as TTFT)
//   failEvery            requests with index % failEvery == failEvery-1 get HTTP 500
//   byteWrites           write every SSE byte with its own write() call
export function startFakeServer(opts = {}) {
  const state = {
    opts: { ttftMs: 100, itlMs: 20, usage: true, reasoningChunks: 0, emptyText: false, roleChunkFirst: false,
            failEvery: 0, byteWrites: false, ...opts },
    requests: [], // {path, body, t}
    open: 0, maxOpen: 0, modelsCalls: 0,
  };
  const server = http.createServer(async (req, res) => {
    if (req.method === 'GET' && req.url === '/v1/models') {
      state.modelsCalls++;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ object: 'list', data: [{ id: 'fake-model', object: 'model' }] }));
      return;
    }
    let raw = '';
    for await (const c of req) raw += c;
    let body;
    try { body = JSON.parse(raw); } catch { res.writeHead(400); res.end('{"error":{"message":"bad json"}}'); return; }
    const idx = state.requests.length;
    state.requests.push({ path: req.url, body, t: performance.now() });
    const o = state.opts;
    if (o.failEvery && idx % o.failEvery === o.failEvery - 1) {
      res.writeHead(500, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: `injected failure ${idx}` } }));
      return;
    }
    const chat = req.url === '/v1/chat/completions';
    const n = body.max_tokens;
    const promptTokens = Array.isArray(body.prompt) ? body.prompt.length
      : (chat ? body.messages[0].content : body.prompt).split(' ').length;
    state.open++;
    state.maxOpen = Math.max(state.maxOpen, state.open);
    const piece = (k) => (o.emptyText ? '' : `tok${k} `);
    const chunk = (k) => {
      if (!chat) return { id: 'x', object: 'text_completion', choices: [{ index: 0, text: piece(k), finish_reason: k === n - 1 ? 'length' : null }] };
      const delta = k < o.reasoningChunks ? { reasoning_content: piece(k), content: null } : { content: piece(k) };
      return { id: 'x', object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: k === n - 1 ? 'length' : null }] };
    };
    if (!body.stream) {
      await sleep(o.ttftMs + (n - 1) * o.itlMs);
      let text = '', reasoning = '';
      for (let k = 0; k < n; k++) (chat && k < o.reasoningChunks ? (reasoning += piece(k)) : (text += piece(k)));
      const choice = chat ? { index: 0, message: { role: 'assistant', content: text, reasoning_content: reasoning || null }, finish_reason: 'length' }
        : { index: 0, text, finish_reason: 'length' };
      const reply = { id: 'x', choices: [choice] };
      if (o.usage) reply.usage = { prompt_tokens: promptTokens, completion_tokens: n, total_tokens: promptTokens + n };
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(reply));
      state.open--;
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    const send = (s) => {
      if (!o.byteWrites) { res.write(s); return; }
      for (const b of Buffer.from(s)) res.write(Buffer.from([b]));
    };
    if (chat && o.roleChunkFirst) send(`data: ${JSON.stringify({ choices: [{ index: 0, delta: { role: 'assistant', content: '' } }] })}\n\n`);
    const t0 = performance.now();
    for (let k = 0; k < n; k++) {
      const due = t0 + o.ttftMs + k * o.itlMs;
      const wait = due - performance.now();
      if (wait > 0) await sleep(wait);
      send(`data: ${JSON.stringify(chunk(k))}\n\n`);
    }
    if (o.usage && body.stream_options && body.stream_options.include_usage)
      send(`data: ${JSON.stringify({ id: 'x', choices: [], usage: { prompt_tokens: promptTokens, completion_tokens: n, total_tokens: promptTokens + n } })}\n\n`);
    send('data: [DONE]\n\n');
    res.end();
    state.open--;
  });
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      state.port = server.address().port;
      state.close = () => new Promise((r) => server.close(r));
      state.reset = (o2 = {}) => {
        state.requests = []; state.open = 0; state.maxOpen = 0; state.modelsCalls = 0;
        state.opts = { ...state.opts, ...o2 };
      };
      resolve(state);
    });
  });
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const s = await startFakeServer();
  console.log(`fake OpenAI server on http://127.0.0.1:${s.port}`);
}
