//! The file tools under permission rules, through a real runtime: a path in any spelling —
//! `./`, trailing `/` or `/.`, `//`, `..`, a symbolic link inside the root — is the canonical
//! path the rule, the approval and the tool see, so a rule on it cannot be sidestepped. Each
//! refusal is proved by a witness outside the tool (a file's contents, a count of runs).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use awaken::event::{AgentEvent, ThreadId, ToolCallResume, ToolDescriptor, VecSink};
use awaken::llm::{ScriptToolCall, ScriptTurn, ScriptedExecutor};
use awaken::runtime::{AgentRuntime, PERMISSION_PLUGIN, Resume, RunActivation};
use awaken::spec::{AgentSpec, ModelSpec};
use awaken::tool::{Tool, ToolCallContext, ToolError, ToolOutput, argument_digest};
use serde_json::{Value, json};

use super::{AppendFile, ReadFile};

/// A folder of one test, removed when dropped (also when the test fails).
struct TestDir(PathBuf);

impl TestDir {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("awaken-cli-tools-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A root holding `.env` (the file the rules protect), `notes.txt`, the folders `a` and `sub`,
/// and links inside it: `link` and `abs-link` to `.env` (relative and absolute), `sub/up` to
/// the root, `later` to the missing `later.env`, `notes-link` to `notes.txt`; beside the root,
/// `outside.txt`, and `out` linking to the folder that holds it.
fn root(dir: &TestDir) -> PathBuf {
    let root = dir.0.join("root");
    std::fs::create_dir_all(root.join("a")).expect("a");
    std::fs::create_dir_all(root.join("sub")).expect("sub");
    std::fs::write(root.join(".env"), "SECRET=1\n").expect(".env");
    std::fs::write(root.join("notes.txt"), "").expect("notes");
    std::fs::write(dir.0.join("outside.txt"), "outside\n").expect("outside");
    let link = |target: &Path, at: &str| {
        std::os::unix::fs::symlink(target, root.join(at)).expect("link");
    };
    link(Path::new(".env"), "link");
    link(&root.join(".env"), "abs-link");
    link(Path::new(".."), "sub/up");
    link(Path::new("later.env"), "later");
    link(Path::new("notes.txt"), "notes-link");
    link(&dir.0, "out");
    root
}

/// `read_file` counting its runs in a counter the tool does not own.
struct Counted {
    inner: ReadFile,
    runs: Arc<AtomicUsize>,
}

#[async_trait]
impl Tool for Counted {
    fn descriptor(&self) -> ToolDescriptor {
        self.inner.descriptor()
    }
    fn normalize_arguments(&self, args: &Value) -> Result<Option<Value>, ToolError> {
        self.inner.normalize_arguments(args)
    }
    async fn execute(&self, args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.inner.execute(args, ctx).await
    }
}

/// A run of one call `c1` of `tool` with `args` by an agent with the permission `rules`:
/// the runtime and the line saying how the call closed or that it waits.
async fn one_call(tool: Arc<dyn Tool>, rules: Value, args: Value) -> (AgentRuntime, String) {
    let name = tool.descriptor().name;
    let executor = Arc::new(
        ScriptedExecutor::from_turns(vec![
            ScriptTurn::text("").with_tool_call(ScriptToolCall::new(name, args).with_id("c1")),
            ScriptTurn::text("done"),
        ])
        .expect("script"),
    );
    let runtime = AgentRuntime::builder()
        .with_model(ModelSpec::new("model", "scripted", "up"))
        .with_provider("scripted", executor)
        .with_tool(tool)
        .with_agent_spec(
            AgentSpec::new("agent", "model")
                .with_plugin(PERMISSION_PLUGIN)
                .with_section("permission", rules),
        )
        .build()
        .expect("runtime");
    let sink = VecSink::new();
    runtime
        .run(
            RunActivation::new(ThreadId::new("thread").expect("id"), "agent")
                .with_user_message("go"),
            &sink,
        )
        .await
        .expect("the run starts");
    (runtime, closing(&sink.events()))
}

/// How call `c1` closed (its state and result) or why it waits (its question).
fn closing(events: &[AgentEvent]) -> String {
    events
        .iter()
        .find_map(|e| match e {
            AgentEvent::ToolCallDone { result, state, .. } => {
                Some(format!("{state} {}", result.content))
            }
            AgentEvent::ToolCallSuspended { ticket, .. } => {
                Some(format!("waits {}", ticket.message))
            }
            _ => None,
        })
        .unwrap_or_else(|| "no closing event".into())
}

#[tokio::test(flavor = "current_thread")]
async fn a_matches_rule_on_a_path_holds_in_every_spelling_of_it() {
    let dir = TestDir::new("append-matches");
    let root = root(&dir);
    let rules = json!({
        "rules": [{"tool": "append_file", "args": [{"pointer": "/path", "matches": "*.env"}], "decision": "deny"}],
        "default": "allow"
    });
    let denied = "blocked \"`append_file` is not permitted for this agent\"";
    let outside = |p: &str| {
        format!(
            "blocked \"invalid arguments for tool `append_file`: at /path: `{p}` is outside the allowed directory\""
        )
    };
    let appended = "succeeded {\"appended\":true,\"line\":\"x\",\"path\":\"notes.txt\"}";
    let outside_rows =
        ["../outside.txt", "sub/up/../outside.txt", "out/outside.txt"].map(|p| (p, outside(p)));
    let mut rows: Vec<(&str, &str)> = vec![
        (".env", denied),
        ("./.env", denied),
        (".env/", denied),
        (".env/.", denied),
        (".env//", denied),
        ("./.env/", denied),
        ("a/../.env", denied),
        ("missing/../.env", denied),
        ("link", denied),
        ("./link/", denied),
        ("abs-link", denied),
        ("sub/up/.env", denied),
        ("sub/up/link", denied),
        ("later", denied),
        // Allowed calls still run, on the file they name.
        ("notes.txt", appended),
        ("./notes.txt", appended),
        ("notes.txt/", appended),
        ("sub/../notes.txt", appended),
        ("notes-link", appended),
    ];
    rows.extend(outside_rows.iter().map(|(p, e)| (*p, e.as_str())));
    let mut wrong = Vec::new();
    for (path, expected) in rows {
        let tool = Arc::new(AppendFile { root: root.clone() });
        let (_, closed) = one_call(tool, rules.clone(), json!({"path": path, "line": "x"})).await;
        if closed != expected {
            wrong.push(format!("{path:?}: {closed}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // The witnesses: the protected files are as they were, and the allowed appends all landed.
    assert_eq!(
        std::fs::read_to_string(root.join(".env")).expect("read"),
        "SECRET=1\n"
    );
    assert!(
        !root.join("later.env").exists(),
        "later.env was never created"
    );
    assert_eq!(
        std::fs::read_to_string(dir.0.join("outside.txt")).expect("read"),
        "outside\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("notes.txt")).expect("read"),
        "x\n".repeat(5)
    );
}

#[tokio::test(flavor = "current_thread")]
async fn an_equals_rule_on_a_path_holds_in_every_spelling_of_it() {
    let dir = TestDir::new("read-equals");
    let root = root(&dir);
    std::fs::write(root.join("notes.txt"), "hello\n").expect("notes");
    let rules = json!({
        "rules": [{"tool": "read_file", "args": [{"pointer": "/path", "equals": ".env"}], "decision": "deny"}],
        "default": "allow"
    });
    let denied = "blocked \"`read_file` is not permitted for this agent\"";
    let read = "succeeded {\"content\":\"hello\\n\",\"path\":\"notes.txt\"}";
    let rows = [
        (".env", denied),
        ("./.env", denied),
        (".env/", denied),
        (".env/.", denied),
        (".env//", denied),
        ("./.env/", denied),
        ("a/../.env", denied),
        ("link", denied),
        ("abs-link", denied),
        ("sub/up/.env", denied),
        ("./sub//up/./link/", denied),
        ("notes.txt", read),
        ("./notes.txt/", read),
        ("notes-link", read),
    ];
    let runs = Arc::new(AtomicUsize::new(0));
    let mut wrong = Vec::new();
    for (path, expected) in rows {
        let before = runs.load(Ordering::SeqCst);
        let tool = Arc::new(Counted {
            inner: ReadFile { root: root.clone() },
            runs: runs.clone(),
        });
        let (_, closed) = one_call(tool, rules.clone(), json!({ "path": path })).await;
        let ran = runs.load(Ordering::SeqCst) - before;
        // A refused call never reached the tool; an allowed one ran once.
        let expected_runs = usize::from(expected == read);
        if closed != expected || ran != expected_runs {
            wrong.push(format!("{path:?}: {closed} (the tool ran {ran} times)"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert_eq!(runs.load(Ordering::SeqCst), 3, "only the allowed calls ran");
}

#[tokio::test(flavor = "current_thread")]
async fn a_human_approves_the_canonical_path_and_the_tool_appends_there() {
    let dir = TestDir::new("append-ask");
    let root = root(&dir);
    let rules = json!({
        "rules": [{"tool": "append_file", "args": [{"pointer": "/path", "matches": "notes*"}], "decision": "ask"}],
        "default": "deny"
    });
    let tool = Arc::new(AppendFile { root: root.clone() });
    let (runtime, closed) = one_call(
        tool,
        rules,
        json!({"path": "./sub/up/notes-link/", "line": "buy milk"}),
    )
    .await;
    assert_eq!(
        closed,
        r#"waits Allow `append_file` with arguments {"line":"buy milk","path":"notes.txt"}?"#
    );
    let thread = ThreadId::new("thread").expect("id");
    let tickets = runtime.waiting_calls(&thread).await.expect("read");
    let canonical = json!({"line": "buy milk", "path": "notes.txt"});
    assert_eq!(tickets[0].call.arguments, canonical);
    assert_eq!(tickets[0].call.argument_digest, argument_digest(&canonical));
    let sink = VecSink::new();
    runtime
        .resume(
            Resume::new(thread).with_decision(ToolCallResume::approve(&tickets[0].call)),
            &sink,
        )
        .await
        .expect("resumed");
    assert_eq!(
        closing(&sink.events()),
        "succeeded {\"appended\":true,\"line\":\"buy milk\",\"path\":\"notes.txt\"}"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("notes.txt")).expect("read"),
        "buy milk\n"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_tool_refuses_a_path_that_is_not_canonical_when_it_runs() {
    let dir = TestDir::new("not-canonical");
    let root = root(&dir);
    let ctx = ToolCallContext::new(
        ThreadId::new("t").expect("id"),
        awaken::event::RunId::new("r").expect("id"),
        awaken::event::ToolCallId::new("c").expect("id"),
        awaken::state::StateStore::new(awaken::state::KeyRegistry::new()).snapshot(),
    );
    let append = AppendFile { root: root.clone() };
    let read = ReadFile { root: root.clone() };
    // As after the gates looked at `notes.txt`, a link took its place: the tool acts on nothing.
    for (path, spelled) in [("link", ".env"), ("./notes.txt", "notes.txt")] {
        let refused = Err(ToolError::execution(format!(
            "`{path}` is not the canonical spelling of the path it names (`{spelled}`): a file \
             tool acts only on the spelling its call was checked with, and nothing was done"
        )));
        let appended = append
            .execute(&json!({"path": path, "line": "x"}), &ctx)
            .await
            .map(|o| o.result.content.to_string());
        assert_eq!(appended, refused);
        let read = read
            .execute(&json!({ "path": path }), &ctx)
            .await
            .map(|o| o.result.content.to_string());
        assert_eq!(read, refused);
    }
    assert_eq!(
        std::fs::read_to_string(root.join(".env")).expect("read"),
        "SECRET=1\n"
    );
    // A loop of links, and the root itself, have no canonical spelling.
    std::os::unix::fs::symlink("loop-b", root.join("loop-a")).expect("link");
    std::os::unix::fs::symlink("loop-a", root.join("loop-b")).expect("link");
    let normalized = |path: &str| {
        append
            .normalize_arguments(&json!({"path": path, "line": "x"}))
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        normalized("loop-a"),
        Err(
            "invalid arguments for tool `append_file`: at /path: `loop-a` passes through more than 40 symbolic links (a loop?)"
                .into()
        )
    );
    assert_eq!(
        normalized("a/.."),
        Err(
            "invalid arguments for tool `append_file`: at /path: `a/..` names the allowed directory itself, not a file in it"
                .into()
        )
    );
    assert_eq!(normalized("notes.txt"), Ok(None));
}

/// A loopback HTTP server answering every request `200 ok`, counting the requests it got.
fn counting_server() -> (u16, Arc<AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let port = listener.local_addr().expect("address").port();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = [0u8; 4096];
            if stream.read(&mut head).unwrap_or(0) > 0 {
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                );
            }
        }
    });
    (port, requests)
}

#[tokio::test(flavor = "current_thread")]
async fn a_rule_on_a_url_holds_in_every_spelling_of_it() {
    let (port, requests) = counting_server();
    let base = format!("http://127.0.0.1:{port}");
    let rules = json!({
        "rules": [{"tool": "http_get", "args": [{"pointer": "/url", "matches": format!("{base}/secret*")}], "decision": "deny"}],
        "default": "allow"
    });
    let denied = "blocked \"`http_get` is not permitted for this agent\"";
    let rows = [
        format!("{base}/secret"),
        format!("HTTP://127.0.0.1:{port}/secret"),
        format!("{base}/./secret"),
        format!("{base}/a/../secret"),
        format!("{base}/%73ecret"),
        format!("{base}/%2e/secret"),
        format!("{base}/%2E%2e/secret"),
        format!("{base}/public/..%2Fsecret/../../secret"),
    ];
    let mut wrong = Vec::new();
    for url in &rows {
        let tool = super::HttpGet::new(
            vec!["127.0.0.1".into()],
            vec!["127.0.0.0/8".parse().expect("range")],
            1024,
        )
        .expect("the tool");
        let (_, closed) = one_call(Arc::new(tool), rules.clone(), json!({ "url": url })).await;
        if closed != denied {
            wrong.push(format!("{url}: {closed}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert_eq!(
        requests.load(Ordering::SeqCst),
        0,
        "no refused URL was fetched"
    );

    // An allowed URL still runs, in its canonical spelling; a spelling the guard refuses
    // never reaches a gate.
    let tool = || {
        Arc::new(
            super::HttpGet::new(
                vec!["127.0.0.1".into()],
                vec!["127.0.0.0/8".parse().expect("range")],
                1024,
            )
            .expect("the tool"),
        )
    };
    let (_, closed) = one_call(
        tool(),
        rules.clone(),
        json!({"url": format!("{base}/%70ublic/./")}),
    )
    .await;
    assert!(
        closed.starts_with("succeeded") && closed.contains(&format!("{base}/public/")),
        "{closed}"
    );
    assert_eq!(requests.load(Ordering::SeqCst), 1);
    let (_, closed) = one_call(
        tool(),
        rules,
        json!({"url": format!("http://0x7f.0.0.1:{port}/secret")}),
    )
    .await;
    assert!(
        closed.starts_with("blocked") && closed.contains("non-standard spelling"),
        "{closed}"
    );
    assert_eq!(requests.load(Ordering::SeqCst), 1);
}

#[test]
fn escapes_of_unreserved_characters_are_decoded_and_others_put_in_upper_case() {
    let uniform = super::http_get::uniform_escapes;
    assert_eq!(uniform("http://h/%61%2d%5F%7e%30"), "http://h/a-_~0");
    assert_eq!(uniform("http://h/%2f%3a%c3%a9"), "http://h/%2F%3A%C3%A9");
    assert_eq!(uniform("http://h/%zz%+1%4"), "http://h/%zz%+1%4");
    assert_eq!(uniform("http://h/é%"), "http://h/é%");
}

#[tokio::test(flavor = "current_thread")]
async fn a_rule_on_a_url_holds_with_a_fragment_credentials_or_a_fully_qualified_host() {
    let (port, requests) = counting_server();
    let rules = json!({
        "rules": [
            {"tool": "http_get", "args": [{"pointer": "/url", "equals": format!("http://127.0.0.1:{port}/secret")}], "decision": "deny"},
            {"tool": "http_get", "args": [{"pointer": "/url", "matches": format!("http://localhost:{port}/secret*")}], "decision": "deny"}
        ],
        "default": "allow"
    });
    let tool = || {
        Arc::new(
            super::HttpGet::new(
                vec!["127.0.0.1".into(), "localhost".into()],
                vec!["127.0.0.0/8".parse().expect("range")],
                1024,
            )
            .expect("the tool"),
        )
    };
    let denied = "blocked \"`http_get` is not permitted for this agent\"";
    // The fragment never reaches the server; a name with its root's dot is the same host.
    for url in [
        format!("http://127.0.0.1:{port}/secret#top"),
        format!("http://127.0.0.1:{port}/secret#"),
        format!("http://localhost.:{port}/secret"),
    ] {
        let (_, closed) = one_call(tool(), rules.clone(), json!({ "url": url })).await;
        assert_eq!(closed, denied, "{url}");
    }
    // Credentials in a URL are refused before any gate, whatever host they come with.
    for url in [
        format!("http://user@127.0.0.1:{port}/secret"),
        format!("http://user:pass@127.0.0.1:{port}/public"),
        format!("http://:pass@localhost:{port}/public"),
    ] {
        let (_, closed) = one_call(tool(), rules.clone(), json!({ "url": url })).await;
        assert_eq!(
            closed,
            format!(
                "blocked \"invalid arguments for tool `http_get`: at /url: `{url}` carries a user name or password; a URL with credentials is not fetched\""
            ),
            "{url}"
        );
    }
    assert_eq!(
        requests.load(Ordering::SeqCst),
        0,
        "no refused URL was fetched"
    );
    let canonical = |url: String| {
        tool()
            .normalize_arguments(&json!({ "url": url }))
            .map(|n| n.map(|v| v["url"].clone()))
            .map_err(|e| e.to_string())
    };
    assert_eq!(
        canonical(format!("http://LocalHost..:{port}/a#b")),
        Ok(Some(json!(format!("http://localhost:{port}/a"))))
    );
    assert_eq!(canonical(format!("http://localhost:{port}/a")), Ok(None));
}
