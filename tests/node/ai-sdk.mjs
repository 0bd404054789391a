// Reads awaken's AI SDK edge with the `ai` package's own client: the chat machinery
// (`AbstractChat` with `DefaultChatTransport`, as `useChat` drives it) and `readUIMessageStream`.
//
//   node tests/node/ai-sdk.mjs http://127.0.0.1:PORT
//
// The server serves the scripted agents of crates/awaken-cli/tests/cli/ai_sdk.rs: `reader`
// (reasoning, text, a tool output and a tool error), `scribe` (a call that asks for approval),
// `broken` (a model error) and `slow` (text streamed slowly). Exits non-zero with a message on
// the first check that fails.

import {
  AbstractChat,
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  readUIMessageStream,
} from 'ai';

const base = process.argv[2];
if (!base) {
  console.error('usage: node ai-sdk.mjs BASE_URL');
  process.exit(2);
}
const api = `${base}/v1/ai-sdk/chat`;

/** A chat's state kept in memory (what a UI framework's binding keeps in its store). */
class MemoryState {
  constructor() {
    this.status = 'ready';
    this.error = undefined;
    this.messages = [];
  }
  pushMessage = (message) => {
    this.messages = this.messages.concat(message);
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
  };
  replaceMessage = (index, message) => {
    this.messages = [
      ...this.messages.slice(0, index),
      this.snapshot(message),
      ...this.messages.slice(index + 1),
    ];
  };
  snapshot = (thing) => structuredClone(thing);
}

/** `useChat` without a UI: the SDK's chat over its default HTTP transport. */
class Chat extends AbstractChat {
  constructor(init) {
    super({ ...init, state: new MemoryState() });
  }
}

let failures = 0;
function check(condition, what, detail) {
  if (!condition) {
    failures += 1;
    console.error(`FAIL: ${what}${detail === undefined ? '' : `\n  got: ${JSON.stringify(detail, null, 2)}`}`);
  } else {
    console.log(`ok: ${what}`);
  }
}

const transport = (agent) => new DefaultChatTransport({ api, body: { agent } });

/** A chat with `agent` whose finished responses are awaited with `next()`. */
function chat(id, agent, extra = {}) {
  const finished = [];
  const waiting = [];
  const c = new Chat({
    id,
    transport: transport(agent),
    onFinish: (event) => {
      const w = waiting.shift();
      if (w) w(event);
      else finished.push(event);
    },
    ...extra,
  });
  c.next = () =>
    finished.length > 0 ? Promise.resolve(finished.shift()) : new Promise((r) => waiting.push(r));
  return c;
}

const textOf = (message) =>
  message.parts
    .filter((p) => p.type === 'text')
    .map((p) => p.text)
    .join('');
const toolParts = (message) => message.parts.filter((p) => p.type.startsWith('tool-'));

// Text, reasoning, a tool's output and a tool's error.
{
  const c = chat('ai-sdk-reader', 'reader');
  await c.sendMessage({ text: 'What do the notes say?' });
  const { message, finishReason, isError } = await c.next();
  check(!isError && c.status === 'ready', 'reader: the response finished without error', c.error?.message);
  check(finishReason === 'stop', 'reader: finish reason stop', finishReason);
  check(
    textOf(message) === 'Reading the notes.The notes say hello.',
    'reader: the message text is the scripted text',
    textOf(message),
  );
  const reasoning = message.parts.filter((p) => p.type === 'reasoning').map((p) => p.text);
  check(
    reasoning.length === 1 && reasoning[0] === 'The user wants the notes.',
    'reader: the reasoning part',
    reasoning,
  );
  const tools = toolParts(message).map((p) => ({
    type: p.type,
    toolCallId: p.toolCallId,
    state: p.state,
    input: p.input,
    output: p.output,
    hasError: typeof p.errorText === 'string' && p.errorText.length > 0,
  }));
  check(
    tools.length === 2 &&
      tools[0].type === 'tool-read_file' &&
      tools[0].toolCallId === 'call_ok' &&
      tools[0].state === 'output-available' &&
      JSON.stringify(tools[0].input) === '{"path":"notes.md"}' &&
      JSON.stringify(tools[0].output).includes('hello from the notes') &&
      tools[1].toolCallId === 'call_missing' &&
      tools[1].state === 'output-error' &&
      tools[1].hasError,
    'reader: a tool part with its output and one with its error',
    tools,
  );
  check(
    message.metadata?.termination?.kind === 'natural_end' &&
      typeof message.metadata?.usage?.input_tokens === 'number',
    'reader: the message metadata carries the termination and usage',
    message.metadata,
  );
}

// A call that asks for approval; the approval goes back as a UI message and the run continues.
{
  const c = chat('ai-sdk-scribe', 'scribe', {
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
  });
  await c.sendMessage({ text: 'Remind me to buy milk' });
  const asked = await c.next();
  const part = toolParts(asked.message)[0];
  check(asked.finishReason === 'tool-calls', 'scribe: the suspended run finishes for tool calls', asked.finishReason);
  check(
    part?.type === 'tool-append_file' &&
      part.state === 'approval-requested' &&
      part.approval?.id === 'call_1' &&
      part.input?.line === 'buy milk',
    'scribe: the call waits for approval with its input',
    part,
  );
  await c.addToolApprovalResponse({ id: 'call_1', approved: true });
  const answered = await c.next();
  check(!answered.isError, 'scribe: the continued run finished without error', c.error?.message);
  check(c.messages.length === 2, 'scribe: the continuation is the same assistant message', c.messages.map((m) => m.role));
  const done = toolParts(answered.message)[0];
  check(
    done?.state === 'output-available' && done.toolCallId === 'call_1',
    'scribe: the approved call has its output',
    done,
  );
  check(
    textOf(answered.message) === 'I\'ll add that.Added "buy milk".',
    'scribe: the message goes on with the text after the approval',
    textOf(answered.message),
  );
}

// A model error ends the message with an error.
{
  const c = chat('ai-sdk-broken', 'broken');
  await c.sendMessage({ text: 'hi' });
  const { isError } = await c.next();
  check(
    isError && c.status === 'error' && /the scripted model fails/.test(c.error?.message ?? ''),
    'broken: the run error reaches the chat as an error',
    { status: c.status, error: c.error?.message },
  );
}

// A dropped connection, then the resume route: the whole message.
{
  const t = transport('slow');
  const abort = new AbortController();
  const stream = await t.sendMessages({
    chatId: 'ai-sdk-slow',
    messages: [{ id: 'u1', role: 'user', parts: [{ type: 'text', text: 'Count' }] }],
    trigger: 'submit-message',
    messageId: undefined,
    abortSignal: abort.signal,
  });
  let partial = '';
  try {
    for await (const message of readUIMessageStream({ stream })) {
      partial = textOf(message);
      if (partial.length > 0) {
        abort.abort();
        break;
      }
    }
  } catch (e) {
    if (e?.name !== 'AbortError') throw e;
  }
  check(partial.length > 0 && partial !== 'One two three four five.', 'slow: the first stream was dropped mid-message', partial);
  const resumed = await t.reconnectToStream({ chatId: 'ai-sdk-slow' });
  check(resumed !== null, 'slow: the resume route has the live run');
  if (resumed) {
    let last;
    for await (const message of readUIMessageStream({ stream: resumed })) last = message;
    check(textOf(last) === 'One two three four five.', 'slow: the resumed stream has the whole message', last);
  }
  const unknown = await t.reconnectToStream({ chatId: 'ai-sdk-nothing-here' });
  check(unknown === null, 'nothing to resume on a thread without a run (204)');
}

if (failures > 0) {
  console.error(`${failures} check(s) failed`);
  process.exit(1);
}
console.log('all AI SDK checks passed');
