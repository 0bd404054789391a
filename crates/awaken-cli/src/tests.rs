//! Unit tests of the command line and the built-in tools.

use std::path::{Path, PathBuf};

use anyhow::Result;
use awaken::event::{Message, RunId, ThreadId, ToolCallId};
use awaken::state::{KeyRegistry, StateStore};
use awaken::tool::{Tool, ToolCallContext};
use serde_json::{Value, json};

use crate::args::{Args, parse_args};
use crate::tools::{AppendFile, ReadFile};

fn parse(words: &[&str]) -> Result<Args> {
    parse_args(words.iter().map(|w| (*w).to_owned()).collect())
}

#[test]
fn decisions_keep_their_order_and_answers() {
    let args = parse(&[
        "resume",
        "t1",
        "--approve",
        "c1",
        "--deny",
        "c2",
        "--answer",
        "\"not that file\"",
        "--approve",
        "c3",
        "--answer",
        "{\"n\":1}",
    ])
    .expect("parses");
    assert_eq!(args.positional, ["t1"]);
    let shown: Vec<String> = args
        .decisions
        .iter()
        .map(|d| format!("{} {} {:?}", d.approve, d.call, d.answer))
        .collect();
    assert_eq!(
        shown,
        [
            "true c1 None",
            "false c2 Some(String(\"not that file\"))",
            "true c3 Some(Object {\"n\": Number(1)})",
        ]
    );
}

#[test]
fn misplaced_or_foreign_flags_are_refused() {
    let err = |words: &[&str]| parse(words).expect_err("refused").to_string();
    assert!(err(&["resume", "t", "--answer", "1"]).contains("must follow"));
    assert!(err(&["resume", "t", "--approve", "c", "--answer", "yes"]).contains("not JSON"));
    assert!(
        err(&[
            "resume", "t", "--deny", "c", "--answer", "1", "--answer", "2"
        ])
        .contains("two --answer")
    );
    assert!(err(&["run", "--approve", "c"]).contains("does not take --approve"));
    assert!(err(&["threads", "--supersede"]).contains("does not take --supersede"));
    assert!(err(&["run", "--supersede", "hi"]).contains("needs --thread"));
    assert!(err(&["resume"]).contains("takes one THREAD"));
    assert!(err(&["show", "a", "b"]).contains("takes one THREAD"));
    assert!(err(&["frobnicate"]).contains("unknown command"));
    assert!(err(&["run", "--frob"]).contains("unknown option --frob"));
}

fn ctx(call: &str) -> ToolCallContext {
    ToolCallContext::new(
        ThreadId::new("t1").expect("thread"),
        RunId::new("r1").expect("run"),
        ToolCallId::new(call).expect("call"),
        StateStore::new(KeyRegistry::new()).snapshot(),
    )
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("awaken-cli-unit-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

async fn call(tool: &dyn Tool, args: Value, call: &str) -> String {
    match tool.execute(&args, &ctx(call)).await {
        Ok(out) => format!("ok {}", out.result.content),
        Err(e) => format!("error {e}"),
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .expect("read")
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn append_file_appends_once_per_call_and_tags_the_line() {
    let dir = temp_dir("append");
    let tool = AppendFile {
        root: dir.join("notes"),
    };
    let args = json!({"path": "todo.txt", "line": "buy milk"});
    assert_eq!(
        call(&tool, args.clone(), "c1").await,
        r#"ok {"appended":true,"line":"buy milk","path":"todo.txt"}"#
    );
    // The same call again (a replay): nothing is written.
    assert!(
        call(&tool, args.clone(), "c1")
            .await
            .contains("\"appended\":false")
    );
    // Another call appends its own line, also after a line some other writer left open.
    std::fs::write(
        dir.join("notes/todo.txt"),
        format!("{}\nwritten by hand", lines(&dir.join("notes/todo.txt"))[0]),
    )
    .expect("write");
    assert!(
        call(&tool, args.clone(), "c2")
            .await
            .contains("\"appended\":true")
    );
    assert!(call(&tool, args, "c1").await.contains("\"appended\":false"));
    let tag = |c: &str| crate::tools::tag(ctx(c).idempotency_key().as_str());
    assert_eq!(
        lines(&dir.join("notes/todo.txt")),
        [
            format!("buy milk {}", tag("c1")),
            "written by hand".to_owned(),
            format!("buy milk {}", tag("c2")),
        ]
    );
    assert_eq!(tag("c1").len(), "#awk1-".len() + 16);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "current_thread")]
async fn file_tools_stay_inside_their_root() {
    let dir = temp_dir("confine");
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("sub")).expect("dirs");
    std::fs::write(dir.join("secret.txt"), "secret").expect("write");
    std::fs::write(root.join("sub/ok.txt"), "fine").expect("write");
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(dir.join("secret.txt"), root.join("link.txt")).expect("link");
        std::os::unix::fs::symlink(&dir, root.join("out")).expect("link");
    }
    let read = ReadFile { root: root.clone() };
    let append = AppendFile { root: root.clone() };
    let secret = dir.join("secret.txt").display().to_string();
    let mut escapes = vec!["../secret.txt", "sub/../../secret.txt", secret.as_str()];
    if cfg!(unix) {
        escapes.extend(["link.txt", "out/secret.txt"]);
    }
    for path in escapes {
        let outside = format!("error `{path}` is outside the allowed directory");
        assert_eq!(call(&read, json!({"path": path}), "c").await, outside);
        assert_eq!(
            call(&append, json!({"path": path, "line": "x"}), "c").await,
            outside
        );
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("secret.txt")).expect("read"),
        "secret"
    );
    assert!(
        call(&read, json!({"path": "sub/ok.txt"}), "c")
            .await
            .contains("fine")
    );
    assert!(
        call(&append, json!({"path": "missing/x.txt", "line": "x"}), "c")
            .await
            .contains("does not exist under the allowed directory")
    );
    assert!(
        call(&append, json!({"path": "sub", "line": "x"}), "c")
            .await
            .contains("is a directory")
    );
    assert!(
        call(&append, json!({"path": "sub/ok.txt", "line": "a\nb"}), "c")
            .await
            .contains("single line")
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn allowed_hosts_match_exactly_or_as_subdomains() {
    let allow = [
        "127.0.0.1".to_owned(),
        "*.example.com".to_owned(),
        "::1".to_owned(),
    ];
    let allowed = |h: &str| crate::tools::host_allowed(&allow, h);
    assert!(allowed("127.0.0.1"));
    assert!(allowed("api.example.com"));
    assert!(allowed("A.B.Example.COM."));
    assert!(allowed("[::1]"));
    assert!(!allowed("example.com"));
    assert!(!allowed("evilexample.com"));
    assert!(!allowed("127.0.0.2"));
    assert!(!allowed("localhost"));
}

#[test]
fn the_script_goes_on_after_the_turns_of_the_current_prompt() {
    let call = || {
        Message::assistant_with_calls(
            "",
            vec![awaken::event::ToolCall::new(
                ToolCallId::new("c1").expect("id"),
                "t",
                json!({}),
            )],
        )
    };
    let offset = crate::script::script_offset;
    assert_eq!(offset(&[]), 0);
    assert_eq!(offset(&[Message::user("hi")]), 0);
    assert_eq!(offset(&[Message::user("hi"), call()]), 1);
    assert_eq!(
        offset(&[
            Message::user("hi"),
            call(),
            Message::assistant("done"),
            Message::user("again"),
            call()
        ]),
        1
    );
}
