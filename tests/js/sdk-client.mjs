// SPDX-License-Identifier: MIT
//
// The official OpenAI Node SDK against the gateway (issue 18, item 9), run by test-gateway's
// sdk_across_kill: node sdk-client.mjs PORT MODEL. It makes, all in flight at once, the calls an
// agent loop makes (a completions stream with a text prompt and with token ids, both with
// stream_options.include_usage; a chat stream with logprobs, through the SDK's own stream
// runner that accumulates the final message; a chat stream iterated chunk by chunk; a non-stream
// chat), after models.retrieve. Any SDK exception fails (exit 1), so does a response that is not
// one of a failure-free engine (one id throughout, the role chunk first and once, non-empty
// text, finish_reason, usage counting every token). stdout: what the client got, without ids and
// clocks, one JSON document: the test compares it with a failure-free run's.
import OpenAI from 'openai';

const [port, model] = process.argv.slice(2);
if (!port || !model) {
	console.error('usage: node sdk-client.mjs PORT MODEL');
	process.exit(2);
}
// No retries: a request the gateway failed must fail here, not be sent again by the SDK.
const client = new OpenAI({
	baseURL: `http://127.0.0.1:${port}/v1`,
	apiKey: 'belayer-test',
	maxRetries: 0,
	timeout: 120_000,
});
const MAX = 40;
const messages = [
	{ role: 'system', content: 'You are a terse belay partner.' },
	{ role: 'user', content: 'Is the rope clipped? Answer in full: \u00e9' },
];

function check(cond, what) {
	if (!cond) throw new Error(`check failed: ${what}`);
}

// One id (and created) across every chunk of a stream.
function sameId(chunks, what) {
	const ids = new Set(chunks.map((c) => c.id));
	check(ids.size === 1, `${what}: one id, got ${[...ids].join(' ')}`);
}

function usageOf(chunks, what) {
	const last = chunks[chunks.length - 1];
	check(last.choices.length === 0 && last.usage, `${what}: the last chunk is the usage chunk`);
	const u = last.usage;
	check(u.completion_tokens === MAX, `${what}: usage counts ${MAX} tokens`);
	check(u.total_tokens === u.prompt_tokens + u.completion_tokens, `${what}: usage adds up`);
	return { prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens };
}

// Every chunk of a stream, checked for one id; and those with a choice.
async function collect(stream, name) {
	const chunks = [];
	for await (const c of stream) chunks.push(c);
	sameId(chunks, name);
	return [chunks, chunks.filter((c) => c.choices.length)];
}

async function completionStream(name, prompt) {
	const [chunks, body] = await collect(
		await client.completions.create({
			model,
			prompt,
			max_tokens: MAX,
			temperature: 0,
			stream: true,
			stream_options: { include_usage: true },
			return_token_ids: true,
		}),
		name,
	);
	const text = body.map((c) => c.choices[0].text).join('');
	check(text.length > 0, `${name}: text`);
	return {
		name,
		text,
		token_ids: body.flatMap((c) => c.choices[0].token_ids ?? []),
		finish_reason: body[body.length - 1].choices[0].finish_reason,
		usage: usageOf(chunks, name),
	};
}

async function chatStream(name) {
	const [chunks, body] = await collect(
		await client.chat.completions.create({
			model,
			messages,
			max_completion_tokens: MAX,
			temperature: 0,
			stream: true,
			stream_options: { include_usage: true },
			return_token_ids: true,
		}),
		name,
	);
	check(body[0].choices[0].delta.role === 'assistant', `${name}: the role chunk first`);
	check(body.filter((c) => c.choices[0].delta.role).length === 1, `${name}: one role chunk`);
	check(Array.isArray(body[0].prompt_token_ids), `${name}: prompt_token_ids first`);
	const content = body.map((c) => c.choices[0].delta.content ?? '').join('');
	check(content.length > 0, `${name}: content`);
	return {
		name,
		content,
		prompt_token_ids: body[0].prompt_token_ids,
		token_ids: body.flatMap((c) => c.choices[0].token_ids ?? []),
		finish_reason: body[body.length - 1].choices[0].finish_reason,
		usage: usageOf(chunks, name),
	};
}

// The SDK's stream runner: it accumulates chunks into the final ChatCompletion itself.
async function chatRunner(name) {
	const runner = client.chat.completions.stream({
		model,
		messages,
		max_completion_tokens: MAX,
		temperature: 0,
		logprobs: true,
		stream_options: { include_usage: true },
	});
	const ids = new Set();
	runner.on('chunk', (c) => ids.add(c.id));
	const done = await runner.finalChatCompletion();
	check(ids.size === 1, `${name}: one id`);
	const choice = done.choices[0];
	check(choice.message.role === 'assistant', `${name}: role`);
	check(choice.message.content.length > 0, `${name}: content`);
	check(choice.logprobs.content.length === MAX, `${name}: a logprob per token`);
	return {
		name,
		content: choice.message.content,
		logprobs: choice.logprobs.content.map((l) => [l.token, l.logprob]),
		finish_reason: choice.finish_reason,
		usage: { prompt_tokens: done.usage.prompt_tokens, completion_tokens: done.usage.completion_tokens },
	};
}

async function chatOnce(name) {
	const r = await client.chat.completions.create({
		model,
		messages,
		max_completion_tokens: MAX,
		temperature: 0,
		return_token_ids: true,
	});
	check(r.object === 'chat.completion', `${name}: object`);
	check(r.choices[0].message.content.length > 0, `${name}: content`);
	return {
		name,
		content: r.choices[0].message.content,
		prompt_token_ids: r.prompt_token_ids,
		token_ids: r.choices[0].token_ids,
		finish_reason: r.choices[0].finish_reason,
		usage: { prompt_tokens: r.usage.prompt_tokens, completion_tokens: r.usage.completion_tokens },
	};
}

const card = await client.models.retrieve(model);
check(card.id === model && card.object === 'model', 'models.retrieve');
let missing = null;
try {
	await client.models.retrieve('no-such-model');
} catch (e) {
	missing = e;
}
check(missing instanceof OpenAI.NotFoundError, 'models.retrieve of another id is a NotFoundError');

const results = await Promise.all([
	completionStream('completions text stream', 'On belay? \u00e9'),
	completionStream('completions ids stream', [17, 23, 99, 300, 4, 42, 8, 15, 16]),
	chatRunner('chat stream runner'),
	chatStream('chat stream'),
	chatOnce('chat'),
]);
process.stdout.write(JSON.stringify({ model: card.id, results }) + '\n');
