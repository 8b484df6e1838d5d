// examples/chat.mjs - the official openai SDK against moeserve: one reply with reasoning, then streaming.
import OpenAI from 'openai';
const client = new OpenAI({ baseURL: 'http://127.0.0.1:8000/v1', apiKey: 'none' });
const r = await client.chat.completions.create({
  model: 'demo', temperature: 0, messages: [{ role: 'user', content: 'What is 47 times 6?' }] });
console.log('reasoning_content:', JSON.stringify(r.choices[0].message.reasoning_content));
console.log('content:', JSON.stringify(r.choices[0].message.content));
const stream = await client.chat.completions.create({
  model: 'demo', temperature: 0, stream: true, chat_template_kwargs: { enable_thinking: false },
  messages: [{ role: 'user', content: 'Add 250 and 199.' }] });
let text = '';
for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
console.log('streamed, thinking off:', JSON.stringify(text));
