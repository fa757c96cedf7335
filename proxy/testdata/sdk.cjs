// Drives the official Anthropic TypeScript SDK against Sandgate's base-URL route: one normal and
// one streaming message. Prints one JSON line with what the SDK saw.
const Anthropic = require('@anthropic-ai/sdk');
(async () => {
  const client = new Anthropic({ baseURL: process.env.BASE_URL, apiKey: 'sk-placeholder', maxRetries: 0 });
  const msg = await client.messages.create({
    model: 'claude-haiku-4-5', max_tokens: 256, messages: [{ role: 'user', content: 'hello' }],
  });
  const stream = await client.messages.create({
    model: 'claude-haiku-4-5', max_tokens: 256, stream: true, messages: [{ role: 'user', content: 'stream please' }],
  });
  let text = '';
  let outputTokens = 0;
  for await (const ev of stream) {
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
    if (ev.type === 'message_delta') outputTokens = ev.usage.output_tokens;
  }
  let denied = '';
  try {
    await client.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 10, messages: [{ role: 'user', content: 'x' }] });
  } catch (e) {
    denied = String(e.status);
  }
  console.log(JSON.stringify({ text: msg.content[0].text, usage: msg.usage, streamText: text, streamOutputTokens: outputTokens, denied }));
})().catch((e) => { console.error(e); process.exit(1); });
