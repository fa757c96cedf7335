// Drives the official Anthropic TypeScript SDK against Sandgate's base-URL route and cancels a
// streamed message once its first text arrives, as an agent does when its user stops it:
// breaking out of the stream's iteration aborts its request. Prints one JSON line with what
// the SDK saw, then exits.
const Anthropic = require('@anthropic-ai/sdk');
(async () => {
  const client = new Anthropic({ baseURL: process.env.BASE_URL, apiKey: 'sk-placeholder', maxRetries: 0 });
  const stream = await client.messages.create({
    model: 'claude-haiku-4-5', max_tokens: 256, stream: true, messages: [{ role: 'user', content: 'a long answer' }],
  });
  let text = '';
  for await (const ev of stream) {
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') {
      text += ev.delta.text;
      break; // the SDK aborts the request: stream.controller.abort()
    }
  }
  console.log(JSON.stringify({ text, aborted: stream.controller.signal.aborted }));
  process.exit(0);
})().catch((e) => { console.error(e); process.exit(1); });
