// openai_client.mjs drives a questrt serve endpoint with the official
// openai npm client: a completion, the same completion streamed (with
// the usage chunk), the same prompt as a chat (the server's template
// passes the message through) and streamed, n = 2, vLLM's extra
// fields, the model list, and errors. It prints one JSON
// object on stdout. TestOpenAINodeClient copies it next to the
// node_modules holding openai and runs it with:
//
//	QUESTRT_BASE_URL  the API's base URL (http://host:port/v1)
//	QUESTRT_MODEL     the model id
//	QUESTRT_PROMPT    the prompt
//	QUESTRT_STOP_TOKEN a token id for stop_token_ids
//	QUESTRT_TRUNCATE  a count for truncate_prompt_tokens
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';

const { QUESTRT_BASE_URL: baseURL, QUESTRT_MODEL: model, QUESTRT_PROMPT: prompt } = process.env;
const client = new OpenAI({ baseURL, apiKey: 'questrt-test', maxRetries: 0, timeout: 120000 });
const pkg = JSON.parse(readFileSync(new URL('./node_modules/openai/package.json', import.meta.url)));
const out = { version: pkg.version };

const c = await client.completions.create({ model, prompt, max_tokens: 5, temperature: 0 });
out.object = c.object;
out.text = c.choices[0].text;
out.finish = c.choices[0].finish_reason;
out.usage = c.usage;

const stream = await client.completions.create({
  model, prompt, max_tokens: 5, temperature: 0, stream: true, stream_options: { include_usage: true },
});
out.streamed = '';
out.chunks = 0;
for await (const chunk of stream) {
  out.chunks++;
  if (chunk.usage) out.streamUsage = chunk.usage;
  for (const ch of chunk.choices) {
    out.streamed += ch.text;
    if (ch.finish_reason) out.streamFinish = ch.finish_reason;
  }
}

const ch = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: prompt }], max_completion_tokens: 5, temperature: 0,
  logprobs: true, top_logprobs: 2,
});
out.chatLogprobs = ch.choices[0].logprobs.content.length;
out.chatTopLogprobs = ch.choices[0].logprobs.content.map((c) => c.top_logprobs.length);
out.chatLogprobTokens = ch.choices[0].logprobs.content.map((c) => c.token).join('');
out.chatObject = ch.object;
out.chatRole = ch.choices[0].message.role;
out.chatText = ch.choices[0].message.content;
out.chatFinish = ch.choices[0].finish_reason;
out.chatUsage = ch.usage;

const chStream = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: prompt }], max_tokens: 5, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
out.chatStreamed = '';
out.chatChunks = 0;
for await (const chunk of chStream) {
  out.chatChunks++;
  if (chunk.usage) out.chatStreamUsage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta.role) out.chatStreamRole = c.delta.role;
    out.chatStreamed += c.delta.content || '';
    if (c.finish_reason) out.chatStreamFinish = c.finish_reason;
  }
}

// n = 2, seeded: two choices, each equal to its solo request with seed
// + index; and streamed, chunks by index.
const two = await client.completions.create({ model, prompt: 'The pass key is', max_tokens: 5, temperature: 1.5, seed: 11, n: 2 });
out.twoIndexes = two.choices.map((c) => c.index);
out.twoTexts = two.choices.map((c) => c.text);
out.twoUsage = two.usage;
out.soloTexts = [];
for (const seed of [11, 12]) {
  const one = await client.completions.create({ model, prompt: 'The pass key is', max_tokens: 5, temperature: 1.5, seed });
  out.soloTexts.push(one.choices[0].text);
}
const twoStream = await client.completions.create({ model, prompt: 'The pass key is', max_tokens: 5, temperature: 1.5, seed: 11, n: 2, stream: true });
out.twoStreamed = ['', ''];
for await (const chunk of twoStream) {
  for (const c of chunk.choices) out.twoStreamed[c.index] += c.text;
}
const chatTwo = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: prompt }], max_tokens: 5, temperature: 0, n: 2,
});
out.chatTwoTexts = chatTwo.choices.map((c) => c.message.content);

// vLLM's sampling extras, which the client passes through: top_k
// (greedy: no change), the neutral repetition_penalty, and OpenAI's
// frequency_penalty and presence_penalty, which change the greedy
// picks; nothing is ignored. The logprobs (the model's) let the test
// check every pick against the penalties.
const extra = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: prompt }], max_tokens: 24, temperature: 0,
  top_k: 40, repetition_penalty: 1, frequency_penalty: 1.5, presence_penalty: 0.5,
  logprobs: true, top_logprobs: 5,
}).withResponse();
out.extraText = extra.data.choices[0].message.content;
out.extraIgnored = extra.response.headers.get('x-questrt-ignored-fields');
out.extraTokens = extra.data.choices[0].logprobs.content.map((c) => c.token);
out.extraLogprobs = extra.data.choices[0].logprobs.content.map((c) => c.logprob);
out.extraTop = extra.data.choices[0].logprobs.content.map((c) => Object.fromEntries(c.top_logprobs.map((a) => [a.token, a.logprob])));

// Chat echo: the last message, the assistant's, comes first.
const echoed = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: prompt }, { role: 'assistant', content: 'Sure: ' }], max_tokens: 3, temperature: 0, echo: true,
});
out.echoText = echoed.choices[0].message.content;

// vLLM's stop_token_ids (a chat stopped at the token QUESTRT_STOP_TOKEN
// of the greedy answer) and truncate_prompt_tokens (the prompt's last
// QUESTRT_TRUNCATE tokens), which the client passes through.
const stopped = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: prompt }], max_tokens: 5, temperature: 0,
  stop_token_ids: [Number(process.env.QUESTRT_STOP_TOKEN)],
}).withResponse();
out.stopText = stopped.data.choices[0].message.content;
out.stopFinish = stopped.data.choices[0].finish_reason;
out.stopIgnored = stopped.response.headers.get('x-questrt-ignored-fields');
const truncated = await client.completions.create({
  model, prompt: 'Some words before the prompt. ' + prompt, max_tokens: 5, temperature: 0,
  truncate_prompt_tokens: Number(process.env.QUESTRT_TRUNCATE),
});
out.truncatedPromptTokens = truncated.usage.prompt_tokens;

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

const failure = async (params) => {
  try {
    await client.completions.create(params);
    return null;
  } catch (e) {
    return { status: e.status, type: e.type, param: e.param, code: e.code, name: e.constructor.name };
  }
};
out.unknownModel = await failure({ model: 'no-such-model', prompt: 'x' });
out.badMaxTokens = await failure({ model, prompt: 'x', max_tokens: -1 });
out.badTemperature = await failure({ model, prompt: 'x', top_k: 40, temperature: 'hot' });

console.log(JSON.stringify(out));
