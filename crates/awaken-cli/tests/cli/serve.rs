//! `awaken serve`: its refusals before binding, and a run over HTTP on loopback with a token,
//! ended by SIGTERM.

use super::commands::{STUCK, Stream, Watched};
use super::*;

/// A started `awaken serve` (standard error read as it arrives) and the address it printed,
/// having said it serves `agents` agents.
pub(super) fn start_serving(
    args: &[&str],
    env: &[(&str, &str)],
    agents: usize,
) -> (Watched, Stream, String) {
    serve_for(args, env, agents, STUCK)
}

/// [`start_serving`] with a server killed after `limit` rather than [`STUCK`].
pub(super) fn serve_for(
    args: &[&str],
    env: &[(&str, &str)],
    agents: usize,
    limit: Duration,
) -> (Watched, Stream, String) {
    let mut process = Watched::spawn_for(
        command()
            .arg("serve")
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        limit,
    );
    let mut stderr = Stream::new(process.child.stderr.take().expect("piped stderr"));
    let before = stderr.until(" on http://");
    assert!(
        before.ends_with(&format!("awaken: serving {agents} agent(s) on http://")),
        "{before}"
    );
    let addr = stderr.until("\n").trim_end().to_owned();
    (process, stderr, addr)
}

/// Serves the agent files `files` (memory store, a free port of 127.0.0.1), runs the Node
/// script `script` (in `tests/node`) with the server's address and `args`, then stops the server
/// with SIGTERM; checks as [`client_against_served`] does.
pub(super) fn node_against_served(
    script: &Path,
    files: &[String],
    args: &[&std::ffi::OsStr],
    env: &[(&str, &std::ffi::OsStr)],
    passed: &str,
) {
    client_against_served(
        files,
        |url| {
            let mut client = node();
            client
                .arg(script)
                .arg(url)
                .args(args)
                .envs(env.iter().copied())
                .current_dir(repo().join("tests/node"));
            client
        },
        passed,
    );
}

/// Serves the agent files `files` (memory store, a free port of 127.0.0.1), runs the client
/// `client` makes for the server's URL, then stops the server with SIGTERM; checks that the
/// client succeeded and printed `passed`, and that the server exited 0.
pub(super) fn client_against_served(
    files: &[String],
    client: impl FnOnce(&str) -> Command,
    passed: &str,
) {
    let mut serve = vec!["--store", "memory", "--listen", "127.0.0.1:0"];
    for f in files {
        serve.extend(["--agent", f.as_str()]);
    }
    let (process, mut stderr, addr) = start_serving(&serve, &[], files.len());
    let mut client = client(&format!("http://{addr}"));
    let out = client.output().expect("the client runs");
    process.signal("-TERM");
    let status = process.wait();
    let served = stderr.rest();
    assert!(
        out.status.success(),
        "{client:?} failed ({:?}):\n{}{}\nserver:\n{served}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains(passed), "{}", text(&out.stdout));
    assert_eq!(status.code(), Some(0), "server:\n{served}");
}

/// Sends one HTTP/1.1 request (`Connection: close`) to `addr` and reads the response to its
/// end; returns the status line and the body (a chunked body decoded).
pub(super) fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
) -> (String, String) {
    request_within(addr, method, path, headers, body, STUCK)
}

/// [`request`], waiting up to `wait` (rather than [`STUCK`]) for each read of the response.
pub(super) fn request_within(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &str,
    wait: Duration,
) -> (String, String) {
    let mut socket = TcpStream::connect(addr).expect("connect to the server");
    socket.set_read_timeout(Some(wait)).expect("a read timeout");
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for h in headers {
        head.push_str(&format!("{h}\r\n"));
    }
    socket
        .write_all(format!("{head}\r\n{body}").as_bytes())
        .expect("send the request");
    let mut response = Vec::new();
    socket
        .read_to_end(&mut response)
        .expect("read the response to its end");
    let response = text(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of headers in {response:?}"));
    let status = head.lines().next().unwrap_or_default().to_owned();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, body)
}

/// A chunked body's data.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, after) = rest
            .split_once("\r\n")
            .unwrap_or_else(|| panic!("no chunk size in {rest:?}"));
        let size = usize::from_str_radix(size.split(';').next().unwrap_or_default().trim(), 16)
            .unwrap_or_else(|e| panic!("chunk size {size:?}: {e}"));
        if size == 0 {
            return out;
        }
        out.push_str(&after[..size]);
        rest = after[size..]
            .strip_prefix("\r\n")
            .expect("CRLF after a chunk");
    }
}

#[test]
fn serve_refuses_an_open_address_without_a_token_and_one_agent_id_in_two_files() {
    let agent = repo().join("examples/agents/assistant.toml");
    let serving = |listen: &str, env: &[(&str, &str)]| {
        let args = ["serve", "--agent", path_str(&agent), "--store", "memory"];
        awaken_env(&[&args[..], &["--listen", listen]].concat(), env)
    };
    let out = serving("0.0.0.0:0", &[]);
    expect_code(&out, 2);
    let err = text(&out.stderr);
    assert!(
        err.starts_with("awaken: refusing to serve on 0.0.0.0:0 without authentication"),
        "{err}"
    );
    for what_to_do in ["AWAKEN_API_TOKEN", "--auth-token", "--insecure-no-auth"] {
        assert!(err.contains(what_to_do), "{err}");
    }
    // A token no bearer header can carry would refuse every client: refused at the start,
    // and not repeated.
    let spaced = serving("127.0.0.1:0", &[("AWAKEN_API_TOKEN", "tok en\n")]);
    expect_code(&spaced, 2);
    let err = text(&spaced.stderr);
    assert!(err.contains("holds whitespace"), "{err}");
    assert!(!err.contains("tok en"), "{err}");

    let dir = temp_dir("serve-same-id");
    let again = dir.join("again.toml");
    std::fs::write(
        &again,
        "[agent]\nid = \"assistant\"\nmodel = \"default\"\n\n[[script.turns]]\ntext = \"Hi.\"\n",
    )
    .expect("write the agent");
    let out = awaken(&[
        "serve",
        "--agent",
        path_str(&agent),
        "--agent",
        path_str(&again),
        "--store",
        "memory",
        "--listen",
        "127.0.0.1:0",
    ]);
    expect_code(&out, 2);
    let err = text(&out.stderr);
    assert!(
        err.contains("agent `assistant` is defined by two files")
            && err.contains(path_str(&agent))
            && err.contains(path_str(&again)),
        "{err}"
    );
    assert!(!err.contains("serving"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn serve_streams_a_run_over_http_and_stops_cleanly_on_sigterm() {
    const TOKEN: &str = "tok-3f9a1c7e";
    // Provider keys in the environment: never in an answer or a log line either.
    const KEY: &str = "sk-test-9b41d0e2";
    let agent = repo().join("examples/agents/assistant.toml");
    let (dir, store) = temp_store("serve");
    // `-v`: the information lines are on, and still never show the token.
    let (process, mut stderr, addr) = start_serving(
        &[
            "-v",
            "--agent",
            path_str(&agent),
            "--store",
            &store,
            "--listen",
            "127.0.0.1:0",
        ],
        &[
            ("AWAKEN_API_TOKEN", TOKEN),
            ("OPENAI_API_KEY", KEY),
            ("ANTHROPIC_API_KEY", KEY),
        ],
        2,
    );
    assert!(
        addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"),
        "{addr}"
    );
    // The example's plugin directory contributes a second agent; a run that names none gets
    // the file's own.
    let body = r#"{"message":"hello"}"#;
    let (status, refusal) = request(&addr, "POST", "/v1/threads/t1/runs", &[], body);
    assert!(status.starts_with("HTTP/1.1 401"), "{status}\n{refusal}");

    let bearer = format!("Authorization: Bearer {TOKEN}");
    let (status, events) = request(&addr, "POST", "/v1/threads/t1/runs", &[&bearer], body);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}\n{events}");
    for marker in [
        "event: run_start\n",
        "event: run_finish\n",
        "Awaken is a Rust runtime",
    ] {
        assert!(events.contains(marker), "no {marker:?} in:\n{events}");
    }
    let (_, agents) = request(&addr, "GET", "/v1/agents", &[&bearer], "");
    for answer in [&events, &refusal, &agents] {
        assert!(
            !answer.contains(TOKEN) && !answer.contains(KEY),
            "a secret was answered:\n{answer}"
        );
    }
    let ids = events.lines().filter(|l| l.starts_with("id: ")).count();
    let frames = events.lines().filter(|l| l.starts_with("event: ")).count();
    assert!(
        ids >= 2 && ids == frames,
        "{ids} ids, {frames} events:\n{events}"
    );

    process.signal("-TERM");
    let status = process.wait();
    let rest = stderr.rest();
    assert_eq!(status.code(), Some(0), "stderr:\n{rest}");
    assert!(rest.contains("awaken: shutting down"), "{rest}");
    // Every line, the ones before the address included.
    let all = stderr.all();
    assert!(all.contains("serving"), "{all}");
    assert!(
        !all.contains(TOKEN) && !all.contains(KEY),
        "a secret was printed:\n{all}"
    );

    // The run was kept in the store.
    let shown = awaken(&["show", "t1", "--store", &store]);
    expect_code(&shown, 0);
    let shown = text(&shown.stdout);
    assert!(
        shown.contains(" assistant · natural_end · 2 step(s)"),
        "{shown}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// An agent file appending one line through `append_file` under `dir`, then answering with
/// `second` (a TOML inline table of the second turn).
fn appender(dir: &Path, name: &str, second: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "[agent]\nid = \"scribe\"\nmodel = \"default\"\nmax_rounds = 4\n\n\
             [tools.append_file]\nroot = \"notes\"\n\n\
             [[script.turns]]\n\
             tool_calls = [{{ id = \"call_1\", name = \"append_file\", arguments = {{ path = \"todo.txt\", line = \"buy milk\" }} }}]\n\n\
             [[script.turns]]\n{second}\n"
        ),
    )
    .expect("write the agent file");
    path
}

#[test]
fn sigterm_during_a_run_leaves_it_for_the_next_start_which_finishes_it() {
    let (dir, store) = temp_store("serve-sigterm");
    // The first server's model hangs after the tool call; the second one's answers.
    let hanging = appender(&dir, "hanging.toml", "wait_for_cancel = true");
    let (process, mut stderr, mut events) = serving_a_hanging_run(&hanging, &store, "1", &[]);

    process.signal("-TERM");
    // The open stream is told, then ended; the run is left at its last checkpoint.
    events.until("event: shutdown");
    let status = process.wait();
    let rest = stderr.rest();
    assert_eq!(status.code(), Some(0), "stderr:\n{rest}");
    assert!(rest.contains("grace period over"), "{rest}");

    next_start_finishes_the_run(&dir, &store, &[]);
}

#[test]
fn a_second_signal_exits_at_once_and_the_next_start_finishes_the_run() {
    let (dir, store) = temp_store("serve-second-signal");
    let hanging = appender(&dir, "hanging.toml", "wait_for_cancel = true");
    // A short lease: the server that exits at once leaves its run's lease to expire.
    let lease = [("AWAKEN_LEASE_SECS", "1")];
    let (process, mut stderr, mut events) = serving_a_hanging_run(&hanging, &store, "60", &lease);

    process.signal("-TERM");
    events.until("event: shutdown");
    stderr.until("awaken: shutting down");
    // The grace period would last a minute; the second signal does not wait for it.
    let asked = std::time::Instant::now();
    process.signal("-TERM");
    let status = process.wait();
    assert_eq!(status.code(), Some(130), "stderr:\n{}", stderr.rest());
    assert!(
        asked.elapsed() < Duration::from_secs(30),
        "exited after {:?}",
        asked.elapsed()
    );

    std::thread::sleep(Duration::from_millis(1_100));
    next_start_finishes_the_run(&dir, &store, &lease);
}

/// `awaken serve` of the agent file `hanging` on `store` with a shutdown grace of `grace`
/// seconds, and a run on thread `todo` whose model hangs after its tool call: the server, its
/// stderr and the run's event stream, read up to the second step's start.
fn serving_a_hanging_run(
    hanging: &Path,
    store: &str,
    grace: &str,
    env: &[(&str, &str)],
) -> (Watched, Stream, Stream) {
    let (process, stderr, addr) = start_serving(
        &[
            "--agent",
            path_str(hanging),
            "--store",
            store,
            "--listen",
            "127.0.0.1:0",
            "--shutdown-grace",
            grace,
        ],
        env,
        1,
    );
    let mut socket = TcpStream::connect(&addr).expect("connect");
    let body = r#"{"message":"Remind me to buy milk"}"#;
    socket
        .write_all(
            format!(
                "POST /v1/threads/todo/runs HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .expect("send");
    let mut events = Stream::new(socket);
    events.until("event: tool_call_done");
    events.until("event: step_start");
    (process, stderr, events)
}

/// Starts `awaken serve` on `store` with an agent that answers, whose recovery finishes the
/// run on thread `todo` a server left; the append under `dir` ran once in all.
fn next_start_finishes_the_run(dir: &Path, store: &str, env: &[(&str, &str)]) {
    let answering = appender(dir, "answering.toml", "text = \"Added.\"");
    let (process, mut stderr, addr) = start_serving(
        &[
            "--agent",
            path_str(&answering),
            "--store",
            store,
            "--listen",
            "127.0.0.1:0",
        ],
        env,
        1,
    );
    let mut finished = String::new();
    for _ in 0..200 {
        let (status, body) = request(&addr, "GET", "/v1/threads/todo", &[], "");
        assert!(status.starts_with("HTTP/1.1 200"), "{status}\n{body}");
        if body.contains("\"kind\":\"natural_end\"") {
            finished = body;
            break;
        }
        // Recovery runs on its own task; the thread is read again until its run ended.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        finished.contains("Added."),
        "the recovered run did not finish: {finished}"
    );
    let lines = std::fs::read_to_string(dir.join("notes/todo.txt")).expect("the to-do file");
    assert_eq!(lines, "buy milk\n", "the append ran once");
    process.signal("-TERM");
    let status = process.wait();
    assert_eq!(status.code(), Some(0), "stderr:\n{}", stderr.rest());
    let _ = std::fs::remove_dir_all(dir);
}

/// The README's shell lines, a line ending in `\` joined with the next.
fn readme_shell_lines() -> Vec<String> {
    let mut lines = Vec::new();
    let mut pending = String::new();
    for line in readme_commands() {
        match line.strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => {
                pending.push_str(&line);
                lines.push(std::mem::take(&mut pending));
            }
        }
    }
    lines
}

/// The path and `-d` body of the README's `curl` command whose URL contains `needle`.
fn readme_curl(needle: &str) -> (String, String) {
    let line = readme_shell_lines()
        .into_iter()
        .find(|l| l.starts_with("curl ") && l.contains(needle))
        .unwrap_or_else(|| panic!("no curl command with {needle:?} in the README"));
    let words = shell_words(&line);
    let url = words
        .iter()
        .find(|w| w.starts_with("http://"))
        .expect("a URL");
    let path = url
        .strip_prefix("http://127.0.0.1:8080")
        .expect("the default address");
    let body = words
        .iter()
        .position(|w| w == "-d")
        .map(|i| words[i + 1].clone())
        .expect("a -d body");
    (path.to_owned(), body)
}

#[test]
fn the_readmes_curl_session_works_as_written() {
    // In a directory laid out like the repository, so the README's relative paths and the
    // default store land in the test's directory; the port is the one free here.
    let dir = temp_dir("readme-serve");
    std::fs::create_dir_all(dir.join("examples/agents")).expect("dirs");
    std::fs::copy(
        repo().join("examples/agents/approval.toml"),
        dir.join("examples/agents/approval.toml"),
    )
    .expect("copy the example");
    let prefix = "cargo run --release -p awaken-cli -- ";
    let serve = readme_shell_lines()
        .into_iter()
        .find(|l| l.contains(" -- serve "))
        .expect("the README's serve command");
    let words = shell_words(
        serve
            .strip_prefix(prefix)
            .expect("a cargo run of the command"),
    );
    let mut process = Watched::spawn(
        command()
            .args(&words)
            .args(["--listen", "127.0.0.1:0"])
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let mut stderr = Stream::new(process.child.stderr.take().expect("piped stderr"));
    stderr.until(" on http://");
    let addr = stderr.until("\n").trim_end().to_owned();
    // The address the README tells a reader to open.
    assert_eq!(
        stderr.until("\n").trim_end(),
        format!("awaken: chat page at http://{addr}/ (open it in a browser)")
    );

    let (path, body) = readme_curl("/runs");
    // A reader who ran the README's commands in order has the command line's thread on the
    // same store: the HTTP example starts on another one.
    let run = readme_shell_lines()
        .into_iter()
        .find(|l| l.contains(" -- run ") && l.contains("--thread"))
        .expect("the README's run command on a thread");
    let words = shell_words(&run);
    let cli_thread = words
        .iter()
        .position(|w| w == "--thread")
        .map(|i| &words[i + 1])
        .expect("a thread after `--thread`");
    assert!(
        !path.contains(&format!("/threads/{cli_thread}/")),
        "{path} is the command line's thread"
    );
    let (status, events) = request(&addr, "POST", &path, &[], &body);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}\n{events}");
    assert!(events.contains("event: tool_call_suspended\n"), "{events}");
    assert!(
        events.contains(r#""termination":{"kind":"suspended"}"#),
        "{events}"
    );

    // The decision the README shows is bound to the digest this run's call shows.
    let (path, body) = readme_curl("/decisions");
    let decision: Value = serde_json::from_str(&body).expect("a JSON body");
    let digest = decision["decisions"][0]["argument_digest"]
        .as_str()
        .expect("a digest");
    assert!(
        events.contains(digest),
        "the README's digest {digest} is not this call's"
    );
    let (status, events) = request(&addr, "POST", &path, &[], &body);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}\n{events}");
    assert!(
        events.contains(r#""termination":{"kind":"natural_end"}"#),
        "{events}"
    );
    let todo =
        std::fs::read_to_string(dir.join("examples/agents/notes/todo.txt")).expect("appended");
    assert_eq!(todo, "buy milk\n");

    process.signal("-TERM");
    let status = process.wait();
    assert_eq!(status.code(), Some(0), "stderr:\n{}", stderr.rest());
    let _ = std::fs::remove_dir_all(dir);
}
