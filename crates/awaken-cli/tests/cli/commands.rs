//! The commands as a user meets them: readable `threads` and `show`, a closed pipe, `chat`,
//! `init`, thread removal, and the small refusals (an empty prompt, a missing store, ...).

use std::process::{Child, ChildStdin, ExitStatus};
use std::thread::JoinHandle;

use expect_test::expect;

use super::*;

/// How long a test waits on a child before it calls it stuck and kills it.
pub(super) const STUCK: Duration = Duration::from_secs(60);

/// `text` with what changes from one invocation to the next replaced: timestamps
/// (`YYYY-MM-DD HH:MM:SS UTC`) by `<time>`, ages in parentheses (`(12 ms ago)`, `(3s)`) by
/// `(<age>)` and run ids (`run-...`) by `<run>`.
fn normalise(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let rest = &chars[i..];
        let word_start = i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '-');
        if has_shape(rest, "9999-99-99 99:99:99 UTC") {
            out.push_str("<time>");
            i += "9999-99-99 99:99:99 UTC".len();
        } else if let Some(n) = age_len(rest) {
            out.push_str("(<age>)");
            i += n;
        } else if let Some(n) = run_id_len(rest).filter(|_| word_start) {
            out.push_str("<run>");
            i += n;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// Whether `text` starts with `shape`, where `9` stands for any ASCII digit.
fn has_shape(text: &[char], shape: &str) -> bool {
    shape.chars().count() <= text.len()
        && shape.chars().zip(text).all(|(s, &c)| match s {
            '9' => c.is_ascii_digit(),
            s => s == c,
        })
}

/// The length of the age in parentheses `text` starts with: `(` digits, a unit (` ms`, `s`,
/// `m`, `h`, `d`), an optional ` ago`, `)`.
fn age_len(text: &[char]) -> Option<usize> {
    if text.first() != Some(&'(') {
        return None;
    }
    let digits = text[1..].iter().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let mut at = 1 + digits;
    let unit = [" ms", "s", "m", "h", "d"]
        .into_iter()
        .find(|u| has_shape(&text[at..], u))?;
    at += unit.len();
    if has_shape(&text[at..], " ago") {
        at += " ago".len();
    }
    (text.get(at) == Some(&')')).then_some(at + 1)
}

/// The length of the run id `text` starts with: `run-` and lowercase letters, digits and dashes.
fn run_id_len(text: &[char]) -> Option<usize> {
    if !has_shape(text, "run-") {
        return None;
    }
    let id = text[4..]
        .iter()
        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || **c == '-')
        .count();
    (id > 0).then_some(4 + id)
}

/// `text` with each run of spaces cut to two (a table's padding follows its widest cell).
fn squeeze(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut spaces = 0;
    for c in text.chars() {
        if c == ' ' {
            spaces += 1;
            if spaces <= 2 {
                out.push(c);
            }
        } else {
            spaces = 0;
            out.push(c);
        }
    }
    out
}

/// `awaken threads` on `store`, normalised and squeezed.
fn threads_table(store: &str) -> String {
    let out = awaken(&["threads", "--store", store]);
    expect_code(&out, 0);
    squeeze(&normalise(&text(&out.stdout)))
}

/// An agent file in `dir` whose model answers every prompt with one line of text.
fn echo_agent(dir: &Path) -> PathBuf {
    let agent = dir.join("echo.toml");
    std::fs::write(
        &agent,
        "[agent]\nid = \"echo\"\nmodel = \"default\"\n\n[[script.turns]]\ntext = \"Noted.\"\n",
    )
    .expect("write the agent");
    agent
}

/// A spawned `awaken`, killed when the test has been stuck on it for [`STUCK`] (so a hang
/// fails the test instead of blocking it) or when the test panics first.
pub(super) struct Watched {
    pub(super) child: Child,
    done: Option<mpsc::Sender<()>>,
    watchdog: Option<JoinHandle<()>>,
}

impl Watched {
    pub(super) fn spawn(command: &mut Command) -> Self {
        Self::spawn_for(command, STUCK)
    }

    /// Like [`Watched::spawn`], killed after `limit` instead of [`STUCK`] (a process that
    /// serves a long test).
    pub(super) fn spawn_for(command: &mut Command, limit: Duration) -> Self {
        let child = command.spawn().expect("start awaken");
        let pid = child.id().to_string();
        let (done, guard) = mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = guard.recv_timeout(limit) {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            }
        });
        Self {
            child,
            done: Some(done),
            watchdog: Some(watchdog),
        }
    }

    /// Sends `signal` (such as `-INT`) to the process.
    pub(super) fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill {signal} failed");
    }

    /// Waits for the process to end (a kill by the watchdog shows as no exit code).
    pub(super) fn wait(mut self) -> ExitStatus {
        let status = self.child.wait().expect("wait for awaken");
        self.stop_watching();
        status
    }

    /// Its exit status once it ended within `limit`; panics (and the drop kills it) when it is
    /// still running then.
    #[track_caller]
    pub(super) fn wait_within(mut self, limit: Duration) -> ExitStatus {
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for awaken") {
                self.stop_watching();
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "awaken (pid {}) still runs after {limit:?}",
                self.child.id()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop_watching(&mut self) {
        self.done.take();
        if let Some(watchdog) = self.watchdog.take() {
            let _ = watchdog.join();
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if self.watchdog.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.stop_watching();
        }
    }
}

/// A child's output, read on a thread as it arrives, so a test can wait for a marker that does
/// not end a line (a question waiting for its answer).
pub(super) struct Stream {
    chunks: mpsc::Receiver<Vec<u8>>,
    seen: Vec<u8>,
    /// Where the next [`Stream::until`] starts looking.
    read: usize,
}

impl Stream {
    pub(super) fn new(mut from: impl Read + Send + 'static) -> Self {
        let (tx, chunks) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Self {
            chunks,
            seen: Vec::new(),
            read: 0,
        }
    }

    /// The output from the end of the last marker found through the next `marker`; panics when
    /// the output ends (or stays silent for [`STUCK`]) without it.
    #[track_caller]
    pub(super) fn until(&mut self, marker: &str) -> String {
        loop {
            if let Some(at) = self.seen[self.read..]
                .windows(marker.len())
                .position(|w| w == marker.as_bytes())
            {
                let end = self.read + at + marker.len();
                let found = text(&self.seen[self.read..end]);
                self.read = end;
                return found;
            }
            match self.chunks.recv_timeout(STUCK) {
                Ok(chunk) => self.seen.extend_from_slice(&chunk),
                Err(e) => panic!(
                    "no {marker:?} in the output ({e}); after the last marker:\n{}",
                    text(&self.seen[self.read..])
                ),
            }
        }
    }

    /// The whole output, from its start to its end.
    pub(super) fn all(&mut self) -> String {
        self.rest();
        text(&self.seen)
    }

    /// The rest of the output, up to its end.
    pub(super) fn rest(&mut self) -> String {
        while let Ok(chunk) = self.chunks.recv_timeout(STUCK) {
            self.seen.extend_from_slice(&chunk);
        }
        let rest = text(&self.seen[self.read..]);
        self.read = self.seen.len();
        rest
    }
}

/// An `awaken chat` with its standard streams piped.
struct Chat {
    process: Watched,
    stdin: Option<ChildStdin>,
    stdout: Stream,
    stderr: Stream,
}

impl Chat {
    fn start(args: &[&str]) -> Self {
        let mut process = Watched::spawn(
            command()
                .arg("chat")
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        );
        let stdin = process.child.stdin.take();
        let stdout = Stream::new(process.child.stdout.take().expect("piped stdout"));
        let stderr = Stream::new(process.child.stderr.take().expect("piped stderr"));
        Self {
            process,
            stdin,
            stdout,
            stderr,
        }
    }

    /// Types `line` (a newline follows).
    fn type_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("standard input is open");
        writeln!(stdin, "{line}").expect("write to chat");
        stdin.flush().expect("flush");
    }

    /// Ends the input (Ctrl-D) and waits for the chat to leave; returns its status and the
    /// rest of standard error.
    fn end_input(mut self) -> (ExitStatus, String) {
        self.stdin.take();
        let rest = self.stderr.rest();
        let _ = self.stdout.rest();
        (self.process.wait(), rest)
    }
}

/// Runs `awaken args` with standard output a pipe whose reading end is closed before the
/// process starts, so its first write finds the pipe closed; returns the exit status and
/// standard error.
fn with_stdout_closed(args: &[&str]) -> (ExitStatus, String) {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let mut process = Watched::spawn(command().args(args).stdout(writer).stderr(Stdio::piped()));
    let mut stderr = String::new();
    process
        .child
        .stderr
        .take()
        .expect("piped stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    (process.wait(), stderr)
}

#[test]
fn the_normaliser_replaces_times_ages_and_run_ids_only() {
    let line = "  run-1hvaakr217w3v-0  a · started 2026-12-02 01:11:08 UTC (32 ms) (3s ago) \
                (5m) (run-x) rerun-1 run- (12 ms later) 2026-12-02";
    assert_eq!(
        normalise(line),
        "  <run>  a · started <time> (<age>) (<age>) (<age>) (<run>) rerun-1 run- (12 ms later) \
         2026-12-02"
    );
    assert_eq!(squeeze("a     b  c d   "), "a  b  c d  ");
}

#[test]
fn threads_and_show_read_as_a_table_and_a_transcript() {
    let dir = temp_dir("table");
    let approval = copy_example("approval.toml", &dir);
    let approval = path_str(&approval);
    let assistant = repo().join("examples/agents/assistant.toml");
    let store = format!("sqlite:{}", dir.join("awaken.db").display());

    let empty = awaken(&["threads", "--store", "memory"]);
    expect_code(&empty, 0);
    assert_eq!(text(&empty.stdout), "no threads in this store\n");

    expect_code(
        &awaken(&[
            "run",
            "--agent",
            approval,
            "--store",
            &store,
            "--thread",
            "todo",
            "Remind me to buy milk",
        ]),
        3,
    );
    expect![[r#"
        THREAD  AGENT  STATUS  LAST ACTIVITY  MESSAGES
        todo  scribe  waiting  <time> (<age>)  2
    "#]]
    .assert_eq(&threads_table(&store));
    // A waiting thread's transcript ends with the call and the commands that answer it (the
    // agent file is not stored with the thread, so it is left for the reader to fill in).
    let waiting = text(&awaken(&["show", "todo", "--store", &store]).stdout);
    assert!(
        waiting.ends_with(&format!(
            "\nwaiting: call_1 append_file {{\"line\":\"buy milk\",\"path\":\"todo.txt\"}}: Allow \
             `append_file` with arguments {{\"line\":\"buy milk\",\"path\":\"todo.txt\"}}?\n  \
             answer: awaken resume todo --agent AGENT_FILE --store {store} --approve call_1\n      \
             or: awaken resume todo --agent AGENT_FILE --store {store} --deny call_1\n"
        )),
        "{waiting}"
    );

    expect_code(
        &awaken(&[
            "resume",
            "todo",
            "--agent",
            approval,
            "--store",
            &store,
            "--approve",
            "call_1",
        ]),
        0,
    );
    expect_code(
        &awaken(&[
            "run",
            "--agent",
            path_str(&assistant),
            "--store",
            &store,
            "--thread",
            "a1",
            "What is Awaken?",
        ]),
        0,
    );

    expect![[r#"
        THREAD  AGENT  STATUS  LAST ACTIVITY  MESSAGES
        a1  assistant  natural_end  <time> (<age>)  4
        todo  scribe  natural_end  <time> (<age>)  4
    "#]]
    .assert_eq(&threads_table(&store));

    let shown = awaken(&["show", "todo", "--store", &store]);
    expect_code(&shown, 0);
    expect![[r#"
        thread todo · 4 message(s) · 1 run(s)

        runs
          <run>  scribe · natural_end · 3 step(s) · 0 tokens · started <time> · last <time> (<age>)

        transcript
          user       Remind me to buy milk
          assistant  I'll add that to your list.
                     → append_file {"line":"buy milk","path":"todo.txt"}  (call_1)
          tool       call_1 ← {"appended":true,"line":"buy milk","path":"todo.txt"}
          assistant  Added "buy milk" to todo.txt.
    "#]]
    .assert_eq(&normalise(&text(&shown.stdout)));

    // One JSON object per thread and line, newest first.
    let listed = awaken(&["threads", "--json", "--store", &store]);
    expect_code(&listed, 0);
    let rows: Vec<Value> = text(&listed.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (row, (thread, agent)) in rows.iter().zip([("a1", "assistant"), ("todo", "scribe")]) {
        assert_eq!(row["thread_id"], thread, "{row}");
        assert_eq!(row["agent"], agent, "{row}");
        assert_eq!(row["status"], "done", "{row}");
        assert_eq!(row["messages"], 4, "{row}");
        let updated = row["updated_at"].as_str().expect("updated_at is text");
        assert_eq!(normalise(updated), "<time>", "{row}");
    }

    // The stored records as one JSON object.
    let record = awaken(&["show", "todo", "--json", "--store", &store]);
    expect_code(&record, 0);
    let stdout = text(&record.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let record: Value = serde_json::from_str(&stdout).expect("one JSON object");
    assert_eq!(record["thread_id"], "todo");
    assert_eq!(record["messages"].as_array().map(Vec::len), Some(4));
    let runs = record["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1, "{record}");
    let events = record["events"].as_array().expect("events");
    assert_eq!(events[0]["event"]["type"], "run_start", "{record}");
    assert_eq!(events[0]["run_id"], runs[0]["run_id"], "{record}");
    assert!(
        events
            .iter()
            .any(|e| e["event"]["type"] == "tool_call_resumed"),
        "the resumed part of the run is stored with it: {record}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    let dir = temp_dir("closed-pipe");
    let store = format!("sqlite:{}", dir.join("awaken.db").display());
    let assistant = repo().join("examples/agents/assistant.toml");
    expect_code(
        &awaken(&[
            "run",
            "--agent",
            path_str(&assistant),
            "--store",
            &store,
            "--thread",
            "p",
            "What is Awaken?",
        ]),
        0,
    );
    let s = store.as_str();
    for args in [
        &["show", "p", "--store", s][..],
        &["show", "p", "--json", "--store", s],
        &["threads", "--store", s],
        &["threads", "--json", "--store", s],
    ] {
        let (status, stderr) = with_stdout_closed(args);
        assert_eq!(status.code(), Some(0), "{args:?}: {stderr}");
        assert_eq!(stderr, "", "{args:?} says nothing more");
    }

    // A run whose reader went away is cancelled instead of waiting on its model forever.
    let agent = waiting_agent(&dir);
    let (status, stderr) = with_stdout_closed(&[
        "run",
        "--agent",
        path_str(&agent),
        "--store",
        &store,
        "--thread",
        "w",
        "Wait",
    ]);
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert_eq!(stderr, "", "a run whose reader went away says nothing more");
    let shown = text(&awaken(&["show", "w", "--store", &store]).stdout);
    assert!(shown.contains(" waiter · cancelled · 0 step(s)"), "{shown}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn chat_streams_answers_asks_approvals_inline_and_survives_ctrl_c() {
    let dir = temp_dir("chat");
    let approval = copy_example("approval.toml", &dir);
    let store = format!("sqlite:{}", dir.join("awaken.db").display());
    let todo = dir.join("notes/todo.txt");

    let mut chat = Chat::start(&[
        "--agent",
        path_str(&approval),
        "--store",
        &store,
        "--thread",
        "c",
    ]);
    let greeting = chat.stderr.until("\n");
    assert!(
        greeting.starts_with("chat with agent scribe on thread c · "),
        "{greeting}"
    );

    // Approved inline: the append happens and the run goes on to its answer.
    chat.type_line("Remind me to buy milk");
    let asked = chat.stderr.until("allow it? [y/n] ");
    assert!(asked.contains("— suspended · thread c · "), "{asked}");
    assert!(
        asked.contains("⏸ append_file {\"line\":\"buy milk\",\"path\":\"todo.txt\"} — Allow"),
        "the question shows the call and its arguments: {asked}"
    );
    assert!(!todo.exists(), "nothing is appended before the answer");
    chat.type_line("y");
    chat.stderr.until("— natural_end · thread c · ");
    chat.stderr.until(" ms\n");
    let answer = chat.stdout.until("Added \"buy milk\" to todo.txt.");
    assert!(answer.contains("✓ call_1 approved"), "{answer}");
    assert_eq!(
        std::fs::read_to_string(&todo).expect("the approved append happened"),
        "buy milk\n"
    );

    // Denied inline (after an answer that is neither): the refusal's answer follows.
    chat.type_line("Remind me again");
    chat.stderr.until("allow it? [y/n] ");
    chat.type_line("maybe");
    let again = chat.stderr.until("allow it? [y/n] ");
    assert!(again.starts_with("answer y or n\n"), "{again}");
    chat.type_line("n");
    chat.stderr.until("— natural_end · thread c · ");
    chat.stderr.until(" ms\n");
    let answer = chat
        .stdout
        .until("I did not add it: the append was refused.");
    assert!(answer.contains("✗ call_1 denied"), "{answer}");
    assert!(!answer.contains("Added"), "{answer}");
    assert_eq!(
        std::fs::read_to_string(&todo).expect("read"),
        "buy milk\n",
        "the denied append did not happen"
    );

    let (status, rest) = chat.end_input();
    assert_eq!(status.code(), Some(0), "{rest}");
    assert_eq!(rest, "", "end of input leaves without a word");

    let shown = text(&awaken(&["show", "c", "--store", &store]).stdout);
    assert!(
        shown.starts_with("thread c · 8 message(s) · 2 run(s)"),
        "{shown}"
    );
    assert_eq!(
        shown.matches(" scribe · natural_end · ").count(),
        2,
        "{shown}"
    );

    // Ctrl-C cancels the run, and the conversation takes the next prompt.
    let waiter = waiting_agent(&dir);
    let mut chat = Chat::start(&[
        "--agent",
        path_str(&waiter),
        "--store",
        &store,
        "--thread",
        "k",
    ]);
    for prompt in ["Wait", "Wait again"] {
        chat.type_line(prompt);
        let streamed = chat.stdout.until("Thinking");
        assert!(streamed.contains("▶ started run "), "{streamed}");
        chat.process.signal("-INT");
        let said = chat.stderr.until("— cancelled · thread k · ");
        assert!(said.contains("cancelling the run"), "{said}");
    }
    let (status, rest) = chat.end_input();
    assert_eq!(status.code(), Some(0), "{rest}");
    let shown = text(&awaken(&["show", "k", "--store", &store]).stdout);
    assert!(shown.contains(" · 2 run(s)"), "{shown}");
    assert_eq!(
        shown.matches(" waiter · cancelled · ").count(),
        2,
        "{shown}"
    );
    assert_eq!(
        shown
            .matches("  assistant  Thinking (interrupted)\n")
            .count(),
        2,
        "{shown}"
    );

    // No input at all: the chat leaves at once, with nothing run.
    let (empty_dir, empty) = temp_store("chat-empty");
    let out = awaken(&["chat", "--agent", path_str(&approval), "--store", &empty]);
    expect_code(&out, 0);
    assert_eq!(text(&out.stdout), "");
    assert_eq!(
        text(&awaken(&["threads", "--store", &empty]).stdout),
        "no threads in this store\n"
    );
    let _ = std::fs::remove_dir_all(empty_dir);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn init_writes_a_starter_that_runs() {
    let dir = temp_dir("init");
    let starter = dir.join("starter");
    let out = awaken(&["init", path_str(&starter)]);
    expect_code(&out, 0);
    let files = [
        "agent.toml",
        "openai.toml",
        "plugins/style.toml",
        "notes.md",
    ];
    for file in files {
        assert!(starter.join(file).is_file(), "{file} was written");
        assert!(
            text(&out.stdout).contains(&format!("wrote {}\n", starter.join(file).display())),
            "{}",
            text(&out.stdout)
        );
    }

    let store = format!("sqlite:{}", dir.join("awaken.db").display());
    let agent = starter.join("agent.toml");
    let run = awaken(&[
        "run",
        "--agent",
        path_str(&agent),
        "--store",
        &store,
        "What is in notes.md?",
    ]);
    expect_code(&run, 0);
    let stdout = text(&run.stdout);
    assert!(
        stdout.contains("→ read_file {\"path\":\"notes.md\"}\n← succeeded: {\"content\":\"# Notes"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "The notes say what this starter contains: an agent, a plugin and a notes file."
        ),
        "{stdout}"
    );
    let stderr = text(&run.stderr);
    assert!(
        !stdout.contains("warning") && !stderr.contains("WARN"),
        "the starter resolves cleanly: {stdout}{stderr}"
    );

    let validated = awaken(&["validate", "--agent", path_str(&agent)]);
    expect_code(&validated, 0);
    assert!(
        text(&validated.stdout)
            .starts_with("agent `starter` resolves: 2 tool(s), plugins awaken.permission,style,"),
        "{}",
        text(&validated.stdout)
    );
    let openai = awaken(&[
        "validate",
        "--agent",
        path_str(&starter.join("openai.toml")),
    ]);
    expect_code(&openai, 0);
    assert!(
        text(&openai.stdout).starts_with("agent `starter-openai` resolves: 1 tool(s)"),
        "{}",
        text(&openai.stdout)
    );
    let plugins = awaken(&["plugins", "--dir", path_str(&starter.join("plugins"))]);
    expect_code(&plugins, 0);
    let listed = text(&plugins.stdout);
    assert!(listed.starts_with("style 1.0.0 · enabled · "), "{listed}");
    assert!(listed.contains("ok: 1 plugin(s) load together"), "{listed}");

    // Over an existing starter: nothing is written, not even the file that is missing.
    std::fs::write(starter.join("notes.md"), "my notes\n").expect("edit the notes");
    std::fs::remove_file(starter.join("openai.toml")).expect("remove a file");
    let again = awaken(&["init", path_str(&starter)]);
    expect_code(&again, 2);
    assert!(
        text(&again.stderr).contains("not overwriting"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(starter.join("notes.md")).expect("read"),
        "my notes\n"
    );
    assert!(!starter.join("openai.toml").exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn threads_rm_and_prune_delete_what_they_name() {
    let dir = temp_dir("prune");
    let agent = echo_agent(&dir);
    let store = format!("sqlite:{}", dir.join("awaken.db").display());
    let run_on = |thread: &str| {
        expect_code(
            &awaken(&[
                "run",
                "--agent",
                path_str(&agent),
                "--store",
                &store,
                "--thread",
                thread,
                "Note this",
            ]),
            0,
        );
    };
    for thread in ["a", "b", "c"] {
        run_on(thread);
    }
    let listed = || -> Vec<String> {
        let out = awaken(&["threads", "--json", "--store", &store]);
        expect_code(&out, 0);
        text(&out.stdout)
            .lines()
            .map(|l| {
                let row: Value = serde_json::from_str(l).expect("JSON");
                row["thread_id"].as_str().expect("an id").to_owned()
            })
            .collect()
    };
    assert_eq!(listed(), ["c", "b", "a"]);

    let removed = awaken(&["threads", "rm", "a", "b", "--store", &store]);
    expect_code(&removed, 0);
    assert_eq!(
        text(&removed.stderr),
        "deleted thread a\ndeleted thread b\n"
    );
    let gone = awaken(&["show", "a", "--store", &store]);
    expect_code(&gone, 2);
    assert!(
        text(&gone.stderr).contains("no thread `a`"),
        "{}",
        text(&gone.stderr)
    );
    assert_eq!(listed(), ["c"]);
    let missing = awaken(&["threads", "rm", "nosuch", "--store", &store]);
    expect_code(&missing, 2);
    assert!(
        text(&missing.stderr).contains("no such thread(s): nosuch"),
        "{}",
        text(&missing.stderr)
    );

    run_on("d");
    let kept = awaken(&["threads", "prune", "--older-than", "30d", "--store", &store]);
    expect_code(&kept, 0);
    assert!(
        text(&kept.stderr).starts_with("deleted 0 thread(s) last active more than 30d ago"),
        "{}",
        text(&kept.stderr)
    );
    assert_eq!(listed(), ["d", "c"]);

    let dry = awaken(&[
        "threads",
        "prune",
        "--older-than",
        "0s",
        "--dry-run",
        "--store",
        &store,
    ]);
    expect_code(&dry, 0);
    assert_eq!(text(&dry.stdout), "d\nc\n");
    assert!(
        text(&dry.stderr).starts_with("would delete 2 thread(s)"),
        "{}",
        text(&dry.stderr)
    );
    assert_eq!(listed(), ["d", "c"], "a dry run deletes nothing");

    // Every thread was last active before this command started: all are older than 0s.
    let pruned = awaken(&["threads", "prune", "--older-than", "0s", "--store", &store]);
    expect_code(&pruned, 0);
    assert!(
        text(&pruned.stderr).starts_with("deleted 2 thread(s)"),
        "{}",
        text(&pruned.stderr)
    );
    assert_eq!(listed(), Vec::<String>::new());

    let no_age = awaken(&["threads", "prune", "--store", &store]);
    expect_code(&no_age, 2);
    assert!(
        text(&no_age.stderr).contains("needs --older-than AGE"),
        "{}",
        text(&no_age.stderr)
    );
    let bad_age = awaken(&[
        "threads",
        "prune",
        "--older-than",
        "soon",
        "--store",
        &store,
    ]);
    expect_code(&bad_age, 2);
    assert!(
        text(&bad_age.stderr).contains("expected an age such as 30d"),
        "{}",
        text(&bad_age.stderr)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn small_refusals_and_helps() {
    let dir = temp_dir("refusals");
    let echo = echo_agent(&dir);
    let echo = path_str(&echo);

    // An empty prompt on standard input, whether /dev/null or a pipe closed at once.
    let null = awaken(&["run", "--agent", echo, "--store", "memory"]);
    expect_code(&null, 2);
    assert!(
        text(&null.stderr).contains("the prompt on standard input is empty"),
        "{}",
        text(&null.stderr)
    );
    let mut piped = command()
        .args(["run", "--agent", echo, "--store", "memory"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start awaken");
    drop(piped.stdin.take());
    let piped = piped.wait_with_output().expect("wait");
    expect_code(&piped, 2);
    assert!(
        text(&piped.stderr).contains("the prompt on standard input is empty"),
        "{}",
        text(&piped.stderr)
    );
    let blank = awaken(&["run", "--agent", echo, "--store", "memory", "  "]);
    expect_code(&blank, 2);
    assert!(
        text(&blank.stderr).contains("the prompt is empty"),
        "{}",
        text(&blank.stderr)
    );

    // A store that does not exist is not created by a command that only reads.
    let missing = dir.join("no/such/dir/x.db");
    let out = awaken(&[
        "threads",
        "--store",
        &format!("sqlite:{}", missing.display()),
    ]);
    expect_code(&out, 2);
    assert!(
        text(&out.stderr).contains(&format!("no store at {}", missing.display())),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.join("no").exists(), "the directory was not created");

    // A run that waits on the memory store says it cannot be resumed, not how to resume it.
    let approval = copy_example("approval.toml", &dir);
    let approval = path_str(&approval);
    let out = awaken(&[
        "run", "--agent", approval, "--store", "memory", "--thread", "m", "hi",
    ]);
    expect_code(&out, 3);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--store memory keeps nothing past this process"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("awaken resume m") && !stderr.contains("--approve"),
        "{stderr}"
    );

    // Versions and helps, each on standard output with exit 0.
    for flag in ["--version", "-V"] {
        let out = awaken(&[flag]);
        expect_code(&out, 0);
        assert_eq!(
            text(&out.stdout),
            format!("awaken {}\n", env!("CARGO_PKG_VERSION"))
        );
    }
    let general = awaken(&["--help"]);
    expect_code(&general, 0);
    let general = text(&general.stdout);
    assert!(general.starts_with("usage: awaken COMMAND"), "{general}");
    let run_help = awaken(&["run", "--help"]);
    expect_code(&run_help, 0);
    let run_help = text(&run_help.stdout);
    assert!(
        run_help.starts_with("usage: awaken run --agent FILE [PROMPT]"),
        "{run_help}"
    );
    assert_ne!(run_help, general);
    let show_help = awaken(&["help", "show"]);
    expect_code(&show_help, 0);
    let show_help = text(&show_help.stdout);
    assert!(
        show_help.starts_with("usage: awaken show THREAD [--json] [--store SPEC]\n"),
        "{show_help}"
    );
    assert_eq!(
        text(&awaken(&["show", "-h"]).stdout),
        show_help,
        "`show -h` and `help show` agree"
    );
    let unknown = awaken(&["help", "frobnicate"]);
    expect_code(&unknown, 2);
    assert!(
        text(&unknown.stderr).contains("unknown command `frobnicate`"),
        "{}",
        text(&unknown.stderr)
    );

    // A flag the command does not know: that command's usage, exit 2.
    let bad = awaken(&["show", "t", "--frob"]);
    expect_code(&bad, 2);
    let stderr = text(&bad.stderr);
    assert!(stderr.contains("unknown option --frob"), "{stderr}");
    assert!(stderr.contains(&show_help), "{stderr}");
    assert!(!stderr.contains("commands:"), "only show's usage: {stderr}");
    let foreign = awaken(&["threads", "--agent", echo]);
    expect_code(&foreign, 2);
    assert!(
        text(&foreign.stderr).contains("`awaken threads` does not take --agent"),
        "{}",
        text(&foreign.stderr)
    );

    // Quiet prints the answer only.
    let quiet = awaken(&["-q", "run", "--agent", echo, "--store", "memory", "hi"]);
    expect_code(&quiet, 0);
    assert_eq!(text(&quiet.stdout), "Noted.\n");
    assert_eq!(text(&quiet.stderr), "");

    // A denial plays the script's refusal answer.
    let store = format!("sqlite:{}", dir.join("awaken.db").display());
    expect_code(
        &awaken(&[
            "run", "--agent", approval, "--store", &store, "--thread", "t", "hi",
        ]),
        3,
    );
    let denied = awaken(&[
        "resume", "t", "--agent", approval, "--store", &store, "--deny", "call_1",
    ]);
    expect_code(&denied, 0);
    let stdout = text(&denied.stdout);
    assert!(
        stdout.contains("I did not add it: the append was refused."),
        "{stdout}"
    );
    assert!(!stdout.contains("Added"), "{stdout}");
    assert!(!dir.join("notes/todo.txt").exists());
    let _ = std::fs::remove_dir_all(dir);
}
