// The chat page: talks to the server's /v1 API with fetch and reads run streams as
// Server-Sent Events from a streamed body (a POST's stream cannot use EventSource). A dropped
// stream is resumed from the id of the last event received. A message sent while a run streams
// goes to that run, which takes it at its next step.

const $ = (id) => document.getElementById(id);

const ui = {
  agent: $("agent"),
  tokenBox: $("token-box"),
  tokenForm: $("token-form"),
  token: $("token"),
  newThread: $("new-thread"),
  threadList: $("thread-list"),
  threadTitle: $("thread-title"),
  error: $("error"),
  transcript: $("transcript"),
  composer: $("composer"),
  message: $("message"),
  send: $("send"),
  cancel: $("cancel"),
  status: $("status"),
};

const TOKEN_KEY = "awaken.token";
const AGENT_KEY = "awaken.agent";
const RECONNECTS = 5;
const LIVE_STATUS = "The agent is running… a message sent now reaches it at its next step.";

const state = {
  token: localStorage.getItem(TOKEN_KEY) ?? "",
  thread: null,
  // Thread ids the server lists.
  known: new Set(),
  // The stream being followed: { thread, controller }.
  stream: null,
};

// What the transcript shows of the current assistant turn.
const view = {
  block: null,
  part: null,
  calls: new Map(),
  // The current run's last answer (a run's end goes under it) and how the run ended.
  answer: null,
  termination: null,
};

// ---- the API ----

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(method, path, body, signal) {
  const headers = { accept: "application/json, text/event-stream" };
  if (state.token) headers.authorization = `Bearer ${state.token}`;
  const init = { method, headers, signal };
  if (body !== undefined) {
    headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  if (!res.ok) {
    let message = `${res.status} ${res.statusText}`;
    try {
      const j = await res.json();
      message = j?.error?.message ?? j?.message ?? message;
    } catch {
      // A body that is not JSON: the status says enough.
    }
    if (res.status === 401) message += " (enter the server's token under Token)";
    throw new ApiError(res.status, message);
  }
  return res;
}

const threadPath = (thread) => `/v1/threads/${encodeURIComponent(thread)}`;

// The frames of an SSE body: { id, event, data } (comments skipped).
async function* sseFrames(res) {
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let frame = { id: null, event: "message", data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n")) >= 0) {
      let line = buffer.slice(0, end);
      buffer = buffer.slice(end + 1);
      if (line.endsWith("\r")) line = line.slice(0, -1);
      if (line === "") {
        if (frame.data.length) {
          yield { id: frame.id, event: frame.event, data: frame.data.join("\n") };
        }
        frame = { id: null, event: "message", data: [] };
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let text = colon < 0 ? "" : line.slice(colon + 1);
      if (text.startsWith(" ")) text = text.slice(1);
      if (field === "data") frame.data.push(text);
      else if (field === "event") frame.event = text;
      else if (field === "id") frame.id = text;
    }
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Follows a run's stream opened by `open(signal)` until its activation finishes; a stream that
// drops or ends early is resumed with `GET …/events?after=` the last id received.
async function follow(thread, open, from) {
  stopFollowing();
  const controller = new AbortController();
  let ended;
  const stream = { thread, controller, done: new Promise((resolve) => (ended = resolve)) };
  state.stream = stream;
  setLive(true);
  let lastId = from ?? null;
  let request = open;
  let attempts = 0;
  try {
    for (;;) {
      let finished = false;
      let stopped = false;
      try {
        const res = await request(controller.signal);
        for await (const f of sseFrames(res)) {
          if (f.id) lastId = f.id;
          attempts = 0;
          const outcome = onFrame(f);
          if (outcome === "start") finished = false;
          if (outcome === "finish") {
            finished = true;
            stream.termination = view.termination;
          }
          if (outcome === "stop") stopped = true;
        }
      } catch (e) {
        if (controller.signal.aborted) return;
        if (e instanceof ApiError) {
          showError(e.message);
          return;
        }
      }
      if (finished || stopped || controller.signal.aborted) return;
      // Ended before the activation did: resume while the thread still has a live run (a
      // request that failed before its first event may not have started one: the thread as
      // stored says).
      if (lastId === null) {
        await refreshThreads();
        await showThread(thread);
        return;
      }
      const res = await api("GET", threadPath(thread), undefined, controller.signal);
      const info = await res.json();
      if (!info.live) {
        await showThread(thread);
        return;
      }
      attempts += 1;
      if (attempts > RECONNECTS) {
        showError("The run's stream was lost; reload the page to see where it stands.");
        return;
      }
      await sleep(250 * attempts);
      const after = lastId;
      request = (signal) =>
        api("GET", `${threadPath(thread)}/events?after=${encodeURIComponent(after)}`, undefined, signal);
    }
  } catch (e) {
    if (!controller.signal.aborted) showError(e.message);
  } finally {
    if (state.stream === stream) {
      state.stream = null;
      setLive(false);
      refreshThreads();
    }
    ended(stream.termination);
  }
}

function stopFollowing() {
  if (state.stream) {
    state.stream.controller.abort();
    state.stream = null;
    setLive(false);
  }
}

// Renders one frame; says whether it started or finished an activation, or ends the stream.
function onFrame(f) {
  if (f.event === "lagged") return null;
  if (f.event === "shutdown" || f.event === "error") {
    let message = f.data;
    try {
      message = JSON.parse(f.data).message ?? f.data;
    } catch {
      // Plain text.
    }
    showError(message);
    return f.event === "shutdown" ? "stop" : null;
  }
  let event;
  try {
    event = JSON.parse(f.data);
  } catch {
    return null;
  }
  onEvent(event);
  if (event.type === "run_start") return "start";
  if (event.type === "run_finish") return "finish";
  return null;
}

// ---- rendering ----

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// JSON as shown: a flat object on one line when it is short, else indented.
function pretty(value) {
  if (typeof value === "string") return value;
  if (value && typeof value === "object" && !Array.isArray(value)) {
    const entries = Object.entries(value);
    if (entries.every(([, v]) => v === null || typeof v !== "object")) {
      const line = `{${entries.map(([k, v]) => `${JSON.stringify(k)}: ${JSON.stringify(v)}`).join(", ")}}`;
      if (line.length <= 72) return line;
    }
  }
  return JSON.stringify(value, null, 2);
}

function clearTranscript() {
  ui.transcript.replaceChildren();
  view.block = null;
  view.answer = null;
  view.part = null;
  view.calls = new Map();
}

function scrollDown() {
  ui.transcript.scrollTop = ui.transcript.scrollHeight;
}

// A user's message; `steered` when it was sent to a run in flight.
function userBlock(text, steered) {
  const block = el("article", steered ? "turn user steered" : "turn user");
  block.append(el("h3", "who", steered ? "You, while the agent worked" : "You"), el("p", "text", text));
  ui.transcript.append(block);
  view.block = null;
  view.part = null;
  scrollDown();
  return block;
}

function assistantBlock() {
  if (!view.block) {
    const block = el("article", "turn assistant");
    block.append(el("h3", "who", "Agent"), el("div", "parts"));
    ui.transcript.append(block);
    view.block = block;
    view.answer = block;
    view.part = null;
    // Call ids are the model's: unique within a run's answer, not within a thread.
    view.calls = new Map();
  }
  return view.block;
}

function parts() {
  return assistantBlock().querySelector(".parts");
}

function textPart() {
  if (view.part?.kind !== "text") {
    const node = el("p", "text");
    parts().append(node);
    view.part = { kind: "text", node };
  }
  return view.part.node;
}

function reasoningPart() {
  if (view.part?.kind !== "reasoning") {
    const details = el("details", "reasoning");
    const body = el("div", "reasoning-text");
    details.append(el("summary", null, "Reasoning"), body);
    parts().append(details);
    view.part = { kind: "reasoning", node: body };
  }
  return view.part.node;
}

function note(className, text) {
  parts().append(el("p", `note ${className}`, text));
  view.part = null;
}

// A tool call's card: its name, state, arguments, question and result.
function toolCard(callId, name) {
  let card = view.calls.get(callId);
  if (card) return card;
  const node = el("section", "tool");
  node.dataset.callId = callId;
  const head = el("div", "tool-head");
  const title = el("span", "tool-name", name ?? "tool");
  const stateLabel = el("span", "tool-state", "called");
  head.append(el("span", "tool-kind", "Tool call"), title, stateLabel);
  const args = el("pre", "tool-args");
  const ask = el("div", "tool-ask");
  ask.hidden = true;
  const result = el("pre", "tool-result");
  const resultLabel = el("div", "tool-label", "Result");
  resultLabel.hidden = true;
  result.hidden = true;
  node.append(head, el("div", "tool-label", "Arguments"), args, ask, resultLabel, result);
  parts().append(node);
  view.part = null;
  card = { node, title, stateLabel, args, ask, result, resultLabel, rawArgs: "" };
  view.calls.set(callId, card);
  return card;
}

function setCardState(card, text, kind) {
  card.stateLabel.textContent = text;
  card.node.dataset.state = kind;
}

function setResult(card, content, isError) {
  card.resultLabel.hidden = false;
  card.resultLabel.textContent = isError ? "Error" : "Result";
  card.result.hidden = false;
  card.result.textContent = pretty(content);
  card.result.classList.toggle("is-error", isError);
}

// A suspended call: what is asked, its arguments, and the buttons that decide it.
function askCard(ticket) {
  const call = ticket.call;
  const card = toolCard(call.call_id, call.tool_name);
  card.args.textContent = pretty(call.arguments);
  setCardState(card, "waiting for approval", "suspended");
  const buttons = el("div", "ask-buttons");
  const approve = el("button", "approve", "Approve");
  const deny = el("button", "deny secondary", "Deny");
  approve.type = deny.type = "button";
  const decide = async (decision) => {
    approve.disabled = deny.disabled = true;
    hideError();
    const thread = state.thread;
    const body = {
      decisions: [{ call_id: call.call_id, decision, argument_digest: call.argument_digest }],
    };
    await follow(thread, (signal) => api("POST", `${threadPath(thread)}/decisions`, body, signal));
    if (!card.ask.hidden && card.node.dataset.state === "suspended") {
      approve.disabled = deny.disabled = false;
    }
  };
  approve.addEventListener("click", () => decide("approve"));
  deny.addEventListener("click", () => decide("deny"));
  buttons.append(approve, deny);
  card.ask.replaceChildren(el("p", "ask-message", ticket.message || "This call needs your approval."), buttons);
  card.ask.hidden = false;
  scrollDown();
  return card;
}

function terminationText(t) {
  switch (t?.kind) {
    case "stopped":
      return `stopped (${t.code}): ${t.detail}`;
    case "error":
      return `error: ${t.message}`;
    case "suspended":
      return "suspended: waiting for a decision";
    default:
      return t?.kind ?? "ended";
  }
}

function footer(termination, usage) {
  // Under the run's last answer, also when a message of the user's came after it.
  const block = view.block ?? view.answer ?? assistantBlock();
  block.querySelector(".run-end")?.remove();
  const end = el("p", "run-end");
  end.dataset.termination = termination?.kind ?? "";
  const input = usage?.input_tokens ?? 0;
  const output = usage?.output_tokens ?? 0;
  end.append(
    el("span", "termination", terminationText(termination)),
    el("span", "usage", `${input} input · ${output} output tokens`),
  );
  block.append(end);
}

function onEvent(e) {
  switch (e.type) {
    case "run_start":
      if (!e.resumed) {
        view.block = null;
        view.answer = null;
      }
      assistantBlock().querySelector(".run-end")?.remove();
      view.part = null;
      break;
    case "step_start":
      view.part = null;
      break;
    case "text_delta":
      textPart().append(e.delta);
      break;
    case "reasoning_delta":
      reasoningPart().append(e.delta);
      break;
    case "tool_call_start":
      setCardState(toolCard(e.call_id, e.name), "called", "called");
      break;
    case "tool_call_args_delta": {
      const card = toolCard(e.call_id);
      card.rawArgs += e.delta;
      card.args.textContent = card.rawArgs;
      break;
    }
    case "tool_call_ready": {
      const card = toolCard(e.call_id, e.name);
      card.title.textContent = e.name;
      card.args.textContent = pretty(e.arguments);
      setCardState(card, "running", "running");
      break;
    }
    case "tool_call_suspended":
      askCard(e.ticket);
      break;
    case "tool_call_resumed": {
      const card = toolCard(e.call_id);
      card.ask.hidden = true;
      setCardState(card, e.decision === "approve" ? "approved" : "denied", "resumed");
      break;
    }
    case "tool_call_done": {
      const card = toolCard(e.call_id);
      card.ask.hidden = true;
      const failed = e.result?.status === "error";
      setResult(card, e.result?.content, failed);
      setCardState(card, e.state.replace(/_/g, " "), failed ? "failed" : e.state);
      break;
    }
    case "run_finish":
      view.termination = e.termination?.kind ?? null;
      footer(e.termination, e.usage);
      view.part = null;
      break;
    case "error":
      note("is-error", e.message);
      break;
    case "warning":
      note("warning", `${e.kind.replace(/_/g, " ")}: ${e.detail}`);
      break;
    case "message_added":
      if (e.message?.role === "user") userBlock(messageText(e.message), true);
      break;
    default:
      break;
  }
  scrollDown();
}

// A tool message's content as shown, and whether it reads as an error (a tool message does not
// carry its result's status: an error has the form `error: …` or `{"error": …}`).
function toolContent(message) {
  const blocks = message.content ?? [];
  const values = blocks.map((b) => (b.type === "json" ? b.value : b.text ?? ""));
  const value = values.length === 1 ? values[0] : values;
  const isError =
    blocks.length === 1 &&
    ((blocks[0].type === "text" && (blocks[0].text ?? "").startsWith("error: ")) ||
      (blocks[0].type === "json" && blocks[0].value && typeof blocks[0].value === "object" && "error" in blocks[0].value));
  return { value, isError };
}

function messageText(message) {
  return (message.content ?? []).map((b) => b.text ?? "").join("");
}

// Renders a stored thread: its messages, each run's end, and the calls waiting for a decision.
// `steered` holds the positions, among the user's messages, of those sent to a run in flight.
function renderThread(info, steered = new Set()) {
  clearTranscript();
  const ends = [];
  let users = 0;
  for (const message of info.messages ?? []) {
    if (message.role === "user") {
      const isSteered = steered.has(users);
      users += 1;
      userBlock(messageText(message), isSteered);
      // A message sent to a run in flight belongs to that run's turn.
      if (!isSteered) ends.push(null);
      continue;
    }
    if (message.role === "assistant") {
      assistantBlock();
      if (ends.length) ends[ends.length - 1] = view.block;
      view.part = null;
      for (const b of message.content ?? []) {
        if (b.type === "text") textPart().append(b.text);
        else if (b.type === "reasoning") reasoningPart().append(b.text);
        else if (b.type === "incomplete") note("warning", "(the answer was cut off)");
      }
      for (const call of message.tool_calls ?? []) {
        const card = toolCard(call.id, call.name);
        card.args.textContent = call.invalid_arguments ?? pretty(call.arguments);
        setCardState(card, "called", "called");
      }
      view.part = null;
      continue;
    }
    if (message.role === "tool" && message.tool_call_id) {
      const card = toolCard(message.tool_call_id);
      const { value, isError } = toolContent(message);
      setResult(card, value, isError);
      setCardState(card, isError ? "failed" : "succeeded", isError ? "failed" : "succeeded");
    }
  }
  // Runs and user turns go together in order; a run's end is shown under its turn's answer.
  const runs = [...(info.runs ?? [])].filter((r) => !r.parent_run_id);
  runs.sort((a, b) => String(a.created_at).localeCompare(String(b.created_at)));
  if (runs.length === ends.length) {
    runs.forEach((run, i) => {
      if (ends[i] && run.termination && !(info.live && i === runs.length - 1)) {
        view.block = ends[i];
        footer(run.termination, run.usage);
      }
    });
  }
  // A live run's next events go on the last answer, unless a message of the user's follows it.
  const last = ui.transcript.lastElementChild;
  view.block = last?.classList.contains("assistant") ? last : null;
  view.part = null;
  for (const ticket of info.waiting ?? []) askCard(ticket);
  const agent = runs.at(-1)?.agent_id;
  if (agent && [...ui.agent.options].some((o) => o.value === agent)) ui.agent.value = agent;
  scrollDown();
}

// ---- the page's state ----

function showError(message) {
  ui.error.textContent = message;
  ui.error.hidden = false;
}

function hideError() {
  ui.error.hidden = true;
  ui.error.textContent = "";
}

function setLive(live) {
  ui.cancel.hidden = !live;
  ui.cancel.disabled = false;
  ui.send.textContent = live ? "Send to the agent" : "Send";
  ui.transcript.setAttribute("aria-busy", live ? "true" : "false");
  ui.status.textContent = live ? LIVE_STATUS : "";
  document.body.classList.toggle("live", live);
}

function newThreadId() {
  const bytes = crypto.getRandomValues(new Uint8Array(6));
  return `chat-${[...bytes].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
}

function threadFromHash() {
  const raw = location.hash.slice(1);
  if (!raw) return null;
  try {
    return decodeURIComponent(raw);
  } catch {
    return null;
  }
}

async function loadAgents() {
  const res = await api("GET", "/v1/agents");
  const { agents } = await res.json();
  const remembered = localStorage.getItem(AGENT_KEY);
  ui.agent.replaceChildren(
    ...agents.map((a) => {
      const option = el("option", null, a.description ? `${a.id} — ${a.description}` : a.id);
      option.value = a.id;
      return option;
    }),
  );
  if (agents.some((a) => a.id === remembered)) ui.agent.value = remembered;
}

async function refreshThreads() {
  try {
    const res = await api("GET", "/v1/threads");
    const { threads } = await res.json();
    state.known = new Set(threads.map((t) => t.thread_id));
    threads.sort((a, b) => String(b.updated_at).localeCompare(String(a.updated_at)));
    const items = threads.map((t) => threadItem(t.thread_id, `${t.message_count} messages${t.live ? " · running" : ""}`));
    if (state.thread && !state.known.has(state.thread)) items.unshift(threadItem(state.thread, "new"));
    ui.threadList.replaceChildren(...items);
  } catch (e) {
    showError(e.message);
  }
}

function threadItem(id, detail) {
  const li = el("li");
  const button = el("button", "thread");
  button.type = "button";
  button.append(el("span", "thread-id", id), el("span", "thread-detail", detail));
  if (id === state.thread) button.setAttribute("aria-current", "true");
  button.addEventListener("click", () => {
    location.hash = encodeURIComponent(id);
  });
  li.append(button);
  return li;
}

// Shows `thread`: its stored messages and, when it has a live run, that run's events as they come.
async function showThread(thread) {
  stopFollowing();
  state.thread = thread;
  ui.threadTitle.textContent = `Thread ${thread}`;
  for (const b of ui.threadList.querySelectorAll("button.thread")) {
    const current = b.querySelector(".thread-id").textContent === thread;
    if (current) b.setAttribute("aria-current", "true");
    else b.removeAttribute("aria-current");
  }
  if (!state.known.has(thread)) {
    clearTranscript();
    ui.transcript.append(el("p", "empty", "A new thread: send a message to start it."));
    return;
  }
  const res = await api("GET", threadPath(thread));
  const info = await res.json();
  const steered = await steeredMessages(thread, info);
  if (state.thread !== thread) return;
  renderThread(info, steered);
  if (info.live) {
    const after = String(info.last_event_seq ?? 0);
    follow(
      thread,
      (signal) => api("GET", `${threadPath(thread)}/events?after=${after}`, undefined, signal),
      after,
    );
  }
}

// The positions, among the thread's user messages, of those sent to a run in flight, read from
// the thread's stored events when it has more user messages than runs (none otherwise): each
// run's start brings one message, each `message_added` of the user's one more.
async function steeredMessages(thread, info) {
  const steered = new Set();
  const users = (info.messages ?? []).filter((m) => m.role === "user").length;
  const runs = (info.runs ?? []).filter((r) => !r.parent_run_id).length;
  const last = Number(info.last_event_seq ?? 0);
  if (users <= runs || last === 0) return steered;
  const controller = new AbortController();
  try {
    const res = await api("GET", `${threadPath(thread)}/events?after=0`, undefined, controller.signal);
    let seen = 0;
    for await (const f of sseFrames(res)) {
      let event;
      try {
        event = JSON.parse(f.data);
      } catch {
        continue;
      }
      if (event.type === "run_start" && !event.resumed && !event.parent_run_id) seen += 1;
      if (event.type === "message_added" && event.message?.role === "user") {
        steered.add(seen);
        seen += 1;
      }
      // The stored events end at `last`; a live run's follow.
      if (f.id && parseInt(f.id, 10) >= last) break;
    }
  } catch {
    // Shown without the runs' ends.
    return new Set();
  } finally {
    controller.abort();
  }
  return steered;
}

async function openFromHash() {
  let thread = threadFromHash();
  if (!thread) {
    thread = newThreadId();
    history.replaceState(null, "", `#${encodeURIComponent(thread)}`);
  }
  hideError();
  try {
    await refreshThreads();
    await showThread(thread);
  } catch (e) {
    showError(e.message);
  }
}

// Sends the composer's message: to the run in flight, else as the start of the thread's next run.
async function send() {
  const message = ui.message.value;
  if (!message.trim()) return;
  if (state.stream) await steer(state.stream, message);
  else await startRun(message);
}

async function startRun(message) {
  const thread = state.thread;
  hideError();
  ui.transcript.querySelector(".empty")?.remove();
  const block = userBlock(message);
  if (ui.message.value === message) ui.message.value = "";
  const body = { message };
  if (ui.agent.value) body.agent = ui.agent.value;
  let failed = false;
  await follow(thread, async (signal) => {
    try {
      return await api("POST", `${threadPath(thread)}/runs`, body, signal);
    } catch (e) {
      failed = true;
      throw e;
    }
  });
  if (failed) {
    block.remove();
    if (!ui.message.value) ui.message.value = message;
  }
}

// Sends `message` to the run `stream` follows. The message shows when the run takes it (its
// `message_added` event); a run that ends first leaves it to start the thread's next run.
async function steer(stream, message) {
  hideError();
  ui.message.value = "";
  ui.status.textContent = "Sent: the agent reads it at its next step…";
  try {
    await api("POST", `${threadPath(stream.thread)}/messages`, { message });
    if (state.stream === stream) ui.status.textContent = LIVE_STATUS;
  } catch (e) {
    const status = e instanceof ApiError ? e.status : 0;
    if (status !== 409) {
      showError(e.message);
      // A refusal took nothing: the message goes back to the box. Otherwise (the server shutting
      // down, the connection lost) the run may still take it, and sending it again could add it
      // twice.
      if (status >= 400 && status < 500 && !ui.message.value) ui.message.value = message;
      return;
    }
    // Not taken: the run ended first. A finished run leaves it to start the next one.
    const ended = await stream.done;
    if (state.thread === stream.thread && !state.stream && (ended === "natural_end" || ended === "stopped")) {
      await startRun(message);
      return;
    }
    if (!ui.message.value) ui.message.value = message;
    const how = ended ? ended.replace(/_/g, " ") : "ended";
    ui.status.textContent = `The run ended (${how}) before it took your message; it is back in the box.`;
  }
}

async function start() {
  ui.token.value = state.token;
  ui.tokenForm.addEventListener("submit", async (e) => {
    e.preventDefault();
    state.token = ui.token.value.trim();
    if (state.token) localStorage.setItem(TOKEN_KEY, state.token);
    else localStorage.removeItem(TOKEN_KEY);
    ui.tokenBox.open = false;
    hideError();
    try {
      await loadAgents();
    } catch (err) {
      showError(err.message);
      return;
    }
    openFromHash();
  });
  ui.agent.addEventListener("change", () => localStorage.setItem(AGENT_KEY, ui.agent.value));
  ui.newThread.addEventListener("click", () => {
    location.hash = encodeURIComponent(newThreadId());
    ui.message.focus();
  });
  window.addEventListener("hashchange", openFromHash);
  ui.composer.addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  ui.message.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  ui.cancel.addEventListener("click", async () => {
    ui.cancel.disabled = true;
    try {
      await api("POST", `${threadPath(state.thread)}/cancel`);
    } catch (e) {
      showError(e.message);
      ui.cancel.disabled = false;
    }
  });
  setLive(false);
  try {
    await loadAgents();
  } catch (e) {
    showError(e.message);
    if (e.status === 401) ui.tokenBox.open = true;
    return;
  }
  await openFromHash();
  ui.message.focus();
}

start();
