// Drives the chat page of `awaken serve` in headless Chromium: a turn whose tool call waits for
// approval, approved from the page; a reload that keeps the thread; a second such turn denied in a
// new thread; a slow answer in a new thread, a message sent to the agent while it streams and a
// reload while the answer to that streams; back to the first thread. Any console error, page
// error or failed request fails the run.
//
//   node page.mjs http://127.0.0.1:PORT SCREENSHOT.png
//
// The server's agent (written by the Rust test that runs this) is scripted: turn 1 calls
// `append_file` (the permission plugin asks) and turn 2 answers, for agent `scribe`; agent
// `counter` streams its two answers slowly.

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import puppeteer from "puppeteer-core";

const [base, screenshot] = process.argv.slice(2);
if (!base || !screenshot) {
  console.error("usage: node page.mjs URL SCREENSHOT");
  process.exit(2);
}
const chromium = process.env.AWAKEN_CHROMIUM || "/usr/bin/chromium";

// What the scripted agent says (the Rust test writes the same words into the agent file).
const FIRST = "I'll add that to your list.";
const SECOND = 'Added "buy milk" to todo.txt.';
const REFUSED = "I did not add it: the append was refused.";
const SLOW = "Counting slowly: one, two, three, four, five, six, seven, eight.";
const STEER = "Then count back down";
const BACK = "Back down: seven, six, five, four, three, two, one.";
const STEERED_USAGE = "90 input · 17 output tokens";
const USAGE = "30 input · 12 output tokens";

const problems = [];
let step = "starting";

function fail(message) {
  throw new Error(`${step}: ${message}`);
}

async function check(what, condition) {
  if (!(await condition)) fail(what);
}

const dir = mkdtempSync(join(tmpdir(), "awaken-page-"));
let browser;
let page;
let status = 0;
try {
  browser = await puppeteer.launch({
    executablePath: chromium,
    headless: true,
    userDataDir: dir,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--no-first-run",
    ],
  });
  page = await browser.newPage();
  page.setDefaultTimeout(20000);
  page.on("console", (m) => {
    if (m.type() === "error") problems.push(`console error: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  // A stream the page had open when it was reloaded is aborted by the browser: not a failure.
  const streams = /\/v1\/threads\/[^/]+\/(runs|events|decisions)/;
  page.on("requestfailed", (r) => {
    const why = r.failure()?.errorText ?? "failed";
    if (!(why === "net::ERR_ABORTED" && streams.test(r.url()))) {
      problems.push(`request failed: ${r.method()} ${r.url()}: ${why}`);
    }
  });
  page.on("response", (r) => {
    if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.request().method()} ${r.url()}`);
  });

  const text = (selector) => page.$eval(selector, (n) => n.innerText).catch(() => "");
  const texts = (selector) => page.$$eval(selector, (ns) => ns.map((n) => n.innerText));
  const lastAnswer = () => text(".turn.assistant:last-of-type .parts");

  step = "loading the page";
  await page.goto(base, { waitUntil: "domcontentloaded" });
  await page.waitForSelector("#agent option");
  await page.waitForFunction(() => location.hash.length > 1);
  const thread = decodeURIComponent(await page.evaluate(() => location.hash.slice(1)));
  await check(`the thread title names ${thread}`, text("#thread-title").then((t) => t.includes(thread)));

  step = "sending the first message";
  await page.select("#agent", "scribe");
  await page.focus("#message");
  await page.keyboard.type("Remind me to buy milk");
  await page.keyboard.press("Enter");
  await page.waitForSelector(".turn.user");

  step = "waiting for the approval prompt";
  await page.waitForSelector(".tool-ask:not([hidden]) button.approve");
  const args = await text(".tool .tool-args");
  await check(`the arguments are shown (got ${JSON.stringify(args)})`, args.includes('"line": "buy milk"') && args.includes('"path": "todo.txt"'));
  const name = await text(".tool .tool-name");
  if (name !== "append_file") fail(`the tool's name is shown (got ${JSON.stringify(name)})`);
  const asked = await text(".tool-ask .ask-message");
  if (!asked.trim()) fail("the question is shown");
  await check("the first answer's text is shown", lastAnswer().then((t) => t.includes(FIRST)));
  await check(
    "the suspension is shown",
    text(".run-end .termination").then((t) => t.includes("suspended")),
  );

  step = "reloading while the call waits";
  await page.reload({ waitUntil: "domcontentloaded" });
  await page.waitForSelector(".tool-ask:not([hidden]) button.approve");
  const waitingArgs = await text(".tool .tool-args");
  if (!waitingArgs.includes('"line": "buy milk"')) fail(`the waiting call's arguments are shown again (got ${JSON.stringify(waitingArgs)})`);
  await check("the first answer's text is shown again", lastAnswer().then((t) => t.includes(FIRST)));

  step = "approving the call";
  await page.click(".tool-ask button.approve");
  await page.waitForSelector('.run-end[data-termination="natural_end"]');
  const answer = await lastAnswer();
  for (const want of [FIRST, SECOND, '"line": "buy milk"', '"appended": true', "succeeded"]) {
    if (!answer.includes(want)) fail(`the answer shows ${JSON.stringify(want)}; it shows:\n${answer}`);
  }
  const end = await text(".run-end");
  if (!end.includes("natural_end") || !end.includes(USAGE)) fail(`the run's end shows its termination and tokens; it shows ${JSON.stringify(end)}`);
  await check("the approval prompt is gone", page.$(".tool-ask:not([hidden])").then((n) => n === null));
  await check("the Cancel button is hidden after the run", page.$eval("#cancel", (b) => b.hidden));

  step = "reloading the finished thread";
  await page.reload({ waitUntil: "domcontentloaded" });
  await page.waitForSelector(".turn.user");
  await page.waitForSelector(".tool .tool-result");
  const hash = decodeURIComponent(await page.evaluate(() => location.hash.slice(1)));
  if (hash !== thread) fail(`the thread is kept in the address (got ${hash})`);
  const users = await texts(".turn.user .text");
  if (users.join("|") !== "Remind me to buy milk") fail(`the user's message is back: ${JSON.stringify(users)}`);
  const reloaded = await lastAnswer();
  for (const want of [FIRST, SECOND, "append_file", '"line": "buy milk"', '"appended": true']) {
    if (!reloaded.includes(want)) fail(`the reloaded thread shows ${JSON.stringify(want)}; it shows:\n${reloaded}`);
  }
  await check(
    "the reloaded thread shows the run's end",
    text(".run-end").then((t) => t.includes("natural_end") && t.includes(USAGE)),
  );
  await check(
    "the thread list has the thread, marked current",
    page.$$eval("button.thread[aria-current] .thread-id", (ns) => ns.map((n) => n.textContent)).then(
      (ids) => ids.length === 1 && ids[0] === thread,
    ),
  );

  step = "denying a call in a new thread";
  await page.click("#new-thread");
  await page.waitForFunction((old) => decodeURIComponent(location.hash.slice(1)) !== old, {}, thread);
  await page.waitForSelector("#transcript .empty");
  await page.focus("#message");
  await page.keyboard.type("Remind me to buy eggs");
  await page.keyboard.press("Enter");
  await page.waitForSelector(".tool-ask:not([hidden]) button.deny");
  await page.click(".tool-ask button.deny");
  await page.waitForSelector('.turn.assistant:last-of-type .run-end[data-termination="natural_end"]');
  const refused = await lastAnswer();
  for (const want of [REFUSED, "denied"]) {
    if (!refused.includes(want)) fail(`the denied call's thread shows ${JSON.stringify(want)}; it shows:\n${refused}`);
  }
  if (refused.includes(SECOND)) fail(`a denied call's thread does not show the approved answer:\n${refused}`);
  await check("the approval prompt is gone", page.$(".tool-ask:not([hidden])").then((n) => n === null));

  step = "starting a new thread with the counter agent";
  await page.click("#new-thread");
  await page.waitForFunction((old) => decodeURIComponent(location.hash.slice(1)) !== old, {}, thread);
  const counting = decodeURIComponent(await page.evaluate(() => location.hash.slice(1)));
  await page.waitForSelector("#transcript .empty");
  await page.select("#agent", "counter");
  await page.focus("#message");
  await page.keyboard.type("Count slowly");
  await page.keyboard.press("Enter");
  await page.waitForFunction(
    (first) => document.querySelector(".turn.assistant:last-of-type .parts")?.innerText.includes(first),
    {},
    SLOW.split(" ")[0],
  );
  await check("the Cancel button shows while the run is live", page.$eval("#cancel", (b) => !b.hidden));

  step = "sending a message to the running agent";
  await page.focus("#message");
  await page.keyboard.type(STEER);
  await page.keyboard.press("Enter");
  await check("the composer is emptied", page.$eval("#message", (m) => m.value === ""));
  // Shown once the run took it, at its next step: between the two answers.
  await page.waitForFunction(
    (want) => [...document.querySelectorAll(".turn.user.steered .text")].some((n) => n.innerText === want),
    {},
    STEER,
  );
  await page.waitForFunction(
    (first) => document.querySelector(".turn.assistant:last-of-type .parts")?.innerText.includes(first),
    {},
    BACK.split(":")[0],
  );
  const turns = await page.$$eval("#transcript .turn", (ns) => ns.map((n) => (n.classList.contains("user") ? "user" : "agent")));
  if (turns.join(" ") !== "user agent user agent") fail(`the message shows between the answers: ${turns.join(" ")}`);
  const firstAnswer = await text(".turn.assistant .parts");
  if (!firstAnswer.includes(SLOW)) fail(`the first answer is whole above the message; it shows:\n${firstAnswer}`);

  step = "reloading during the live run";
  await page.reload({ waitUntil: "domcontentloaded" });
  await page.waitForSelector("body.live");
  await check("the reloaded page shows the Cancel button", page.$eval("#cancel", (b) => !b.hidden));
  const midway = await lastAnswer();
  if (midway.includes(BACK)) fail(`the run was still streaming after the reload; the whole answer was already there:\n${midway}`);
  const again = decodeURIComponent(await page.evaluate(() => location.hash.slice(1)));
  if (again !== counting) fail(`the thread is kept in the address (got ${again}, not ${counting})`);
  await page.waitForSelector('.turn.assistant:last-of-type .run-end[data-termination="natural_end"]', { timeout: 30000 });
  const slow = await lastAnswer();
  if (!slow.includes(BACK)) fail(`the slow answer streams to its end after the reload; it shows:\n${slow}`);
  const slowEnd = await text(".run-end");
  if (!slowEnd.includes(STEERED_USAGE)) fail(`the slow run's tokens are shown; it shows ${JSON.stringify(slowEnd)}`);
  const slowUsers = await texts(".turn.user .text");
  if (slowUsers.join("|") !== `Count slowly|${STEER}`) fail(`each message is shown once: ${JSON.stringify(slowUsers)}`);
  const marked = await texts(".turn.user.steered .text");
  if (marked.join("|") !== STEER) fail(`the message sent to the running agent is marked as such: ${JSON.stringify(marked)}`);

  step = "reloading the thread with the message sent to the running agent";
  await page.reload({ waitUntil: "domcontentloaded" });
  await page.waitForSelector('.turn.assistant:last-of-type .run-end[data-termination="natural_end"]');
  const ends = await texts(".run-end");
  if (ends.length !== 1 || !ends[0].includes(STEERED_USAGE)) fail(`the run's end shows once, under its last answer: ${JSON.stringify(ends)}`);
  const reloadedUsers = await texts(".turn.user.steered .text");
  if (reloadedUsers.join("|") !== STEER) fail(`the reloaded thread marks the message sent to the running agent: ${JSON.stringify(reloadedUsers)}`);
  await check("the agent of the thread is selected", page.$eval("#agent", (s) => s.value === "counter"));
  await check("the Cancel button is hidden after the run", page.$eval("#cancel", (b) => b.hidden));

  step = "going back to the first thread";
  const listed = await page.$$eval("button.thread .thread-id", (ns) => ns.map((n) => n.textContent));
  if (!listed.includes(thread) || !listed.includes(counting)) fail(`both threads are listed: ${JSON.stringify(listed)}`);
  const buttons = await page.$$("button.thread");
  await buttons[listed.indexOf(thread)].click();
  await page.waitForFunction(
    (want) => document.querySelector(".turn.user .text")?.innerText === want,
    {},
    "Remind me to buy milk",
  );
  await page.waitForSelector('.run-end[data-termination="natural_end"]');
  await check("the first thread's answer is back", lastAnswer().then((t) => t.includes(SECOND)));
  await check("no error is shown", page.$eval("#error", (n) => n.hidden));

  step = "taking the screenshot";
  await page.evaluate(() => {
    document.activeElement?.blur();
    const t = document.querySelector("#transcript");
    t.scrollTop = 0;
  });
  await page.screenshot({ path: screenshot });
  if (problems.length) {
    step = "checking the console and requests";
    fail(problems.join("\n"));
  }
  console.log(`ok: the chat page works (thread ${thread})`);
} catch (e) {
  console.error(`the chat page test failed: ${e.message.startsWith(step) ? e.message : `${step}: ${e.message}`}`);
  if (problems.length) console.error(`console and requests:\n${problems.join("\n")}`);
  // What the page showed when it failed.
  const shown = await page
    ?.evaluate(() => `${document.querySelector("#error")?.innerText ?? ""}\n${document.querySelector("#transcript")?.innerText ?? ""}`)
    .catch(() => null);
  if (shown) console.error(`the page showed:\n${shown.trim()}`);
  status = 1;
} finally {
  await browser?.close().catch(() => {});
  rmSync(dir, { recursive: true, force: true });
}
process.exit(status);
