// Reads awaken's AG-UI edge with `@ag-ui/client`'s own `HttpAgent`: its run pipeline parses the
// SSE stream, enforces the 1.0 schemas, runs `verifyEvents` and applies the events to the
// agent's messages. The raw events of each run are also checked again with `verifyEvents` and
// the core schemas, and any field the client had to strip counts as a failure.
//
//   node tests/node/agui.mjs http://127.0.0.1:PORT
//
// The server serves the scripted agents of crates/awaken-cli/tests/cli/agui.rs: `reader`
// (reasoning, text and a `read_file` call, then the answer), `scribe` (an `append_file` call that
// waits for approval, then the answer once approved), `broken` (a model error) and `barista` (a
// slow answer, then one to the message sent to the run meanwhile through the native API). Exits
// non-zero with a message on the first check that fails.

import { HttpAgent, verifyEvents } from '@ag-ui/client';
import { EventSchemas } from '@ag-ui/core/schemas';
import { from, lastValueFrom, tap, toArray } from 'rxjs';

const base = process.argv[2];
if (!base) {
  console.error('usage: node agui.mjs BASE_URL');
  process.exit(2);
}
const url = (agent) => `${base}/v1/ag-ui/agents/${agent}/run`;

// The client reports material it strips (fields the protocol does not describe) as warnings.
const stripped = [];
const warn = console.warn;
console.warn = (...args) => {
  if (String(args[0]).includes('[ag-ui]')) stripped.push(args.join(' '));
  warn(...args);
};

function fail(message, detail) {
  console.error(`agui: ${message}`);
  if (detail !== undefined) console.error(JSON.stringify(detail, null, 2));
  process.exit(1);
}

function check(ok, message, detail) {
  if (!ok) fail(message, detail);
}

/** An `HttpAgent` that also keeps each run's events as they came off the wire. */
class TappedAgent extends HttpAgent {
  raw = [];
  run(input) {
    this.raw = [];
    return super.run(input).pipe(tap((event) => this.raw.push(event)));
  }
}

/** Runs `agent` and returns its raw events, checked by the library's verifier and schemas. */
async function runChecked(agent, parameters, what) {
  const seen = [];
  let result;
  try {
    result = await agent.runAgent(parameters, { onEvent: ({ event }) => seen.push(event) });
  } catch (error) {
    fail(`${what}: the client's run pipeline failed: ${error?.message ?? error}`, agent.raw);
  }
  const raw = agent.raw;
  for (const event of raw) {
    const parsed = EventSchemas.safeParse(event);
    check(parsed.success, `${what}: an event fails the 1.0 schema`, { event, issues: parsed.error?.issues });
  }
  try {
    await lastValueFrom(from(raw).pipe(verifyEvents(), toArray()));
  } catch (error) {
    fail(`${what}: verifyEvents refused the stream: ${error?.message ?? error}`, raw);
  }
  check(stripped.length === 0, `${what}: the client stripped unknown material`, stripped);
  check(seen.length === raw.length, `${what}: the pipeline applied ${seen.length} of ${raw.length} events`, raw);
  return { raw, result };
}

const types = (events) => events.map((e) => e.type);

// 1. Reasoning, text and a tool call that runs, then the answer.
{
  const agent = new TappedAgent({ url: url('reader'), threadId: 'agui-text' });
  agent.addMessage({ id: 'u1', role: 'user', content: 'What does the note say?' });
  const { raw, result } = await runChecked(agent, {}, 'the text run');
  const seen = types(raw);
  for (const t of ['RUN_STARTED', 'REASONING_MESSAGE_CONTENT', 'TEXT_MESSAGE_CONTENT', 'TOOL_CALL_START',
    'TOOL_CALL_ARGS', 'TOOL_CALL_END', 'TOOL_CALL_RESULT', 'RUN_FINISHED']) {
    check(seen.includes(t), `the text run has no ${t}`, seen);
  }
  const finished = raw.at(-1);
  check(finished.type === 'RUN_FINISHED' && finished.outcome?.type === 'success',
    'the text run does not finish with success', finished);
  check(result.result === 'The note says: hello.', 'the run result is not the answer', result);
  const call = agent.messages.flatMap((m) => m.toolCalls ?? []).find((c) => c.id === 'call_read');
  check(call?.function?.name === 'read_file' && JSON.parse(call.function.arguments).path === 'note.txt',
    'the client holds no read_file call with its arguments', agent.messages);
  const answer = agent.messages.find((m) => m.role === 'tool' && m.toolCallId === 'call_read');
  check(answer?.content?.includes('hello from the note'), 'the client holds no result of the call', agent.messages);
  const last = agent.messages.at(-1);
  check(last.role === 'assistant' && last.content === 'The note says: hello.',
    'the client does not end with the answer', agent.messages);
}

// 2. A call that waits for approval ends the run with an interrupt; the resume approves it.
{
  const agent = new TappedAgent({ url: url('scribe'), threadId: 'agui-approval' });
  agent.addMessage({ id: 'u1', role: 'user', content: 'Remind me to buy milk' });
  const first = await runChecked(agent, {}, 'the interrupted run');
  const finished = first.raw.at(-1);
  check(finished.outcome?.type === 'interrupt', 'the run does not end with an interrupt', finished);
  const [interrupt] = finished.outcome.interrupts;
  check(interrupt.id === 'call_1' && interrupt.toolCallId === 'call_1' && interrupt.reason === 'tool_approval',
    'the interrupt does not name the waiting call', interrupt);
  check(interrupt.metadata?.toolName === 'append_file' && interrupt.metadata?.arguments?.line === 'buy milk'
    && typeof interrupt.metadata?.argumentDigest === 'string',
  'the interrupt does not show the tool, its arguments and their digest', interrupt);
  check(agent.pendingInterrupts.length === 1, 'the client holds no pending interrupt', agent.pendingInterrupts);

  const resume = [{
    interruptId: interrupt.id,
    status: 'resolved',
    payload: { approved: true },
    metadata: { argumentDigest: interrupt.metadata.argumentDigest },
  }];
  const second = await runChecked(agent, { resume }, 'the resumed run');
  const seen = types(second.raw);
  check(seen[1] === 'MESSAGES_SNAPSHOT', 'the resumed run does not open with the thread\'s messages', seen);
  const done = second.raw.find((e) => e.type === 'TOOL_CALL_RESULT');
  check(done?.toolCallId === 'call_1', 'the resumed run has no result of the approved call', second.raw);
  check(second.raw.at(-1).outcome?.type === 'success', 'the resumed run does not succeed', second.raw.at(-1));
  check(agent.pendingInterrupts.length === 0, 'the client still holds the interrupt', agent.pendingInterrupts);
  check(second.result.result === 'Added "buy milk".', 'the resumed run\'s result is not the answer', second.result);
  const call = agent.messages.flatMap((m) => m.toolCalls ?? []).filter((c) => c.id === 'call_1');
  check(call.length === 1 && JSON.parse(call[0].function.arguments).line === 'buy milk',
    'the client does not hold the approved call once, with its arguments', agent.messages);
  check(agent.messages.some((m) => m.role === 'tool' && m.toolCallId === 'call_1'),
    'the client holds no result of the approved call', agent.messages);
  check(agent.messages.some((m) => m.role === 'user' && m.content === 'Remind me to buy milk'),
    'the client lost the user\'s message', agent.messages);
}

// 3. A model that fails: the run ends with RUN_ERROR.
{
  const agent = new TappedAgent({ url: url('broken'), threadId: 'agui-error' });
  agent.addMessage({ id: 'u1', role: 'user', content: 'Fail, please' });
  const errors = [];
  agent.subscribe({ onRunErrorEvent: ({ event }) => { errors.push(event); } });
  const { raw } = await runChecked(agent, {}, 'the failing run');
  const last = raw.at(-1);
  check(last.type === 'RUN_ERROR' && last.code === 'run_failed' && last.message.includes('the scripted model fails'),
    'the failing run does not end with RUN_ERROR naming the failure', raw);
  check(errors.length === 1, 'the client did not report the run error to its subscriber', errors);
}

// 4. A message sent to the run in flight (native `POST …/messages`) streams as a user's text
// message between the steps, and the client holds it between the two answers.
{
  const thread = 'agui-steered';
  const agent = new TappedAgent({ url: url('barista'), threadId: thread });
  agent.addMessage({ id: 'u1', role: 'user', content: 'Make coffee.' });
  let steered;
  agent.subscribe({
    onTextMessageContentEvent: () => {
      steered ??= fetch(`${base}/v1/threads/${thread}/messages`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ message: 'And tea.' }),
      }).then(async (res) => ({ status: res.status, body: await res.json() }));
    },
  });
  const { raw, result } = await runChecked(agent, {}, 'the steered run');
  check(steered !== undefined, 'no text came to send the message on', raw);
  const answer = await steered;
  check(answer.status === 200 && answer.body.taken === true && answer.body.step === 2,
    'the message was not taken at the second step', answer);
  const start = raw.find((e) => e.type === 'TEXT_MESSAGE_START' && e.role === 'user');
  check(start !== undefined, 'the message is not streamed as a user text message', raw);
  const content = raw.find((e) => e.type === 'TEXT_MESSAGE_CONTENT' && e.messageId === start.messageId);
  check(content?.delta === 'And tea.', 'the user text message does not carry the message', raw);
  const at = (pred) => raw.findIndex(pred);
  check(at((e) => e.type === 'STEP_FINISHED') < at((e) => e === start)
    && at((e) => e === start) < at((e) => e.type === 'STEP_STARTED' && e.stepName === 'step-2'),
  'the message is not between the steps', types(raw));
  const said = agent.messages.map((m) => `${m.role}: ${m.content ?? ''}`);
  check(JSON.stringify(said) === JSON.stringify([
    'user: Make coffee.', 'assistant: Making coffee.', 'user: And tea.', 'assistant: Tea too.',
  ]), 'the client does not hold the message between the two answers', said);
  check(result.result === 'Tea too.', 'the run result is not the answer to the message', result);
}

console.log('agui: all checks passed');
