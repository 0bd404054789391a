//! Unit tests of the command line and the built-in tools.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use awaken::event::{
    Message, RunId, TerminationReason, ThreadId, ToolCall, ToolCallId, ToolResult,
};
use awaken::state::{KeyRegistry, StateStore};
use awaken::tool::{Tool, ToolCallContext};
use awaken_store::{RunRecord, RunStatus, ThreadSummary, Timestamp};
use expect_test::expect;
use serde_json::{Value, json};

use crate::agent_file::AgentFile;
use crate::args::{Args, LogFormat, Parsed, parse_args};
use crate::inspect::{ThreadRow, age, render_threads, render_transcript, utc};
use crate::output::{chat_command, clip, resume_command, waiting_text};
use crate::run::{continue_command, not_started, recover_command};
use crate::setup::{Purpose, runtime_of_files};
use crate::tools::{AppendFile, ReadFile};

fn parsed(words: &[&str]) -> Result<Parsed> {
    parse_args(words.iter().map(|w| (*w).to_owned()).collect())
}

fn parse(words: &[&str]) -> Result<Args> {
    match parsed(words)? {
        Parsed::Command(args) => Ok(*args),
        other => anyhow::bail!("not a command: {other:?}"),
    }
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

#[test]
fn global_options_go_anywhere_and_each_command_has_its_help() {
    let args = parse(&[
        "-vv",
        "run",
        "--agent",
        "a.toml",
        "-q",
        "hi",
        "--log-format",
        "json",
    ])
    .expect("parses");
    assert_eq!(
        (args.verbose, args.quiet, args.log_format, args.positional),
        (2, true, LogFormat::Json, vec!["hi".to_owned()])
    );
    let help = |words: &[&str]| match parsed(words).expect("parses") {
        Parsed::Help(text) => text.lines().next().unwrap_or_default().to_owned(),
        other => panic!("not help: {other:?}"),
    };
    assert_eq!(help(&[]), "usage: awaken COMMAND [OPTIONS]");
    assert_eq!(help(&["--help"]), "usage: awaken COMMAND [OPTIONS]");
    assert!(help(&["run", "--help"]).starts_with("usage: awaken run --agent FILE"));
    assert!(help(&["help", "chat"]).starts_with("usage: awaken chat --agent FILE"));
    assert!(help(&["threads", "prune", "-h"]).starts_with("usage: awaken threads [--json]"));
    assert!(help(&["help", "serve"]).starts_with("usage: awaken serve --agent FILE"));
    assert!(matches!(parsed(&["-V"]), Ok(Parsed::Version)));
    assert!(matches!(
        parsed(&["show", "--version"]),
        Ok(Parsed::Version)
    ));
    let err = |words: &[&str]| parsed(words).expect_err("refused").to_string();
    assert!(err(&["help", "frob"]).contains("unknown command `frob`"));
    assert!(err(&["run", "--log-format", "xml"]).contains("expected pretty or json"));
    assert!(err(&["run", "-q", "--json"]).contains("exclude each other"));
    // A usage error shows the command's own usage, not the overview.
    assert!(err(&["show", "--frob"]).contains("usage: awaken show THREAD"));
}

#[test]
fn serve_takes_several_agents_and_its_own_flags_and_never_shows_the_token() {
    let args = parse(&[
        "serve",
        "--agent",
        "a.toml",
        "--agent",
        "b.toml",
        "--listen",
        "[::1]:0",
        "--auth-token",
        "s3cret-value",
        "--cors",
        "https://app.example.com:8443",
        "--cors",
        "*",
        "--max-runs",
        "8",
        "--insecure-no-auth",
        "--no-chat-page",
    ])
    .expect("parses");
    assert_eq!(
        (
            args.agents,
            args.listen.map(|a| a.to_string()),
            args.cors,
            args.max_runs,
            args.insecure_no_auth && args.no_chat_page
        ),
        (
            vec![PathBuf::from("a.toml"), PathBuf::from("b.toml")],
            Some("[::1]:0".to_owned()),
            vec!["https://app.example.com:8443".to_owned(), "*".to_owned()],
            Some(8),
            true
        )
    );
    assert_eq!(
        args.auth_token.as_ref().map(|t| t.expose()),
        Some("s3cret-value")
    );
    let shown = format!("{:?}", parse(&["serve", "--auth-token", "s3cret-value"]));
    assert!(!shown.contains("s3cret"), "{shown}");
    let err = |words: &[&str]| parse(words).expect_err("refused").to_string();
    assert!(err(&["serve", "--listen", "localhost"]).contains("expected IP:PORT"));
    assert!(err(&["serve", "--max-runs", "0"]).contains("at least 1"));
    assert!(err(&["serve", "--auth-token", " "]).contains("--auth-token is empty"));
    for origin in [
        "app.example.com",
        "https://",
        "https://a.example/path",
        "ftp://a",
    ] {
        assert!(
            err(&["serve", "--cors", origin]).contains("expected an origin"),
            "{origin}"
        );
    }
    assert!(err(&["serve", "--json"]).contains("does not take --json"));
    assert!(err(&["run", "--listen", "127.0.0.1:1"]).contains("does not take --listen"));
}

#[test]
fn threads_subcommands_take_their_own_words() {
    let rm = parse(&["threads", "rm", "a", "b"]).expect("parses");
    assert_eq!(
        (rm.command.as_str(), rm.positional),
        ("threads rm", vec!["a".to_owned(), "b".to_owned()])
    );
    let prune = parse(&["threads", "prune", "--older-than", "30d", "--dry-run"]).expect("parses");
    assert_eq!(
        (prune.command.as_str(), prune.older_than, prune.dry_run),
        (
            "threads prune",
            Some(Duration::from_secs(30 * 86_400)),
            true
        )
    );
    let ages = ["12h", "90m", "45s", "250ms"].map(|a| {
        parse(&["threads", "prune", "--older-than", a])
            .expect("parses")
            .older_than
    });
    assert_eq!(
        ages,
        [43_200_000, 5_400_000, 45_000, 250].map(|ms| Some(Duration::from_millis(ms)))
    );
    let err = |words: &[&str]| parse(words).expect_err("refused").to_string();
    assert!(err(&["threads", "rm"]).contains("one or more THREADs"));
    assert!(err(&["threads", "prune"]).contains("needs --older-than"));
    assert!(err(&["threads", "prune", "--older-than", "soon"]).contains("expected an age"));
    assert!(err(&["threads", "rm", "a", "--json"]).contains("does not take --json"));
    assert!(err(&["init", "a", "b"]).contains("at most one DIR"));
}

#[test]
fn times_and_ages_read_for_a_person() {
    assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
    assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
    assert_eq!(utc(1_796_172_765_123), "2026-12-02 00:52:45 UTC");
    assert_eq!(utc(-1), "1969-12-31 23:59:59 UTC");
    let ages = [
        0,
        999,
        1_000,
        119_999,
        120_000,
        7_199_999,
        7_200_000,
        172_800_000,
        -5,
    ]
    .map(age);
    assert_eq!(
        ages,
        [
            "0 ms", "999 ms", "1s", "119s", "2m", "119m", "2h", "2d", "0 ms"
        ]
    );
    assert_eq!(
        waiting_text(Duration::from_millis(3_400)),
        "… waiting for the model (3s)"
    );
    assert_eq!(clip("héllo", 3), "hél…");
    assert_eq!(clip("hé", 3), "hé");
}

fn record(run: &str, agent: &str, at: i64) -> RunRecord {
    RunRecord::new(
        RunId::new(run).expect("run"),
        agent,
        Timestamp::from_unix_millis(at),
    )
}

#[test]
fn the_threads_table_and_the_transcript_read_as_pinned() {
    let mut done = record("r1", "scribe", 1_796_172_000_000);
    done.status = RunStatus::Done;
    done.termination = Some(TerminationReason::NaturalEnd);
    done.steps = 2;
    done.updated_at = Timestamp::from_unix_millis(1_796_172_001_500);
    let mut waiting = record("r2", "assistant", 1_796_100_000_000);
    waiting.status = RunStatus::Waiting;
    let summary = |id: &str, messages: u64, at: i64, run: &RunRecord| ThreadSummary {
        thread_id: ThreadId::new(id).expect("thread"),
        message_count: messages,
        latest_run_id: Some(run.run_id.clone()),
        created_at: Timestamp::from_unix_millis(at),
        updated_at: Timestamp::from_unix_millis(at),
    };
    let rows = [
        ThreadRow {
            summary: summary("todo", 4, 1_796_172_001_500, &done),
            latest: Some(done.clone()),
        },
        ThreadRow {
            summary: summary("a-much-longer-thread", 1, 1_796_100_000_000, &waiting),
            latest: Some(waiting),
        },
    ];
    expect![[r#"
        THREAD                AGENT      STATUS       LAST ACTIVITY                      MESSAGES
        todo                  scribe     natural_end  2026-12-02 00:40:01 UTC (2m ago)   4
        a-much-longer-thread  assistant  waiting      2026-12-01 04:40:00 UTC (20h ago)  1
    "#]]
    .assert_eq(&render_threads(&rows, 1_796_172_121_500));
    expect![[r#"
        no threads in this store
    "#]]
    .assert_eq(&render_threads(&[], 0));

    let call = ToolCall::new(
        ToolCallId::new("call_1").expect("call"),
        "append_file",
        json!({"path": "todo.txt", "line": "buy milk"}),
    );
    let messages = [
        Message::user("Remind me to buy milk"),
        Message::assistant_with_calls("I'll add that.", vec![call]),
        Message::tool(
            ToolCallId::new("call_1").expect("call"),
            &ToolResult::success(json!({"appended": true})),
        ),
        Message::assistant("Added it.\nAnything else?"),
        Message::user("Tell me a long story"),
        Message::incomplete_assistant("Once upon"),
    ];
    expect![[r#"
        thread todo · 6 message(s) · 1 run(s)

        runs
          r1  scribe · natural_end · 2 step(s) · 0 tokens · started 2026-12-02 00:40:00 UTC · last 2026-12-02 00:40:01 UTC (1s)

        transcript
          user       Remind me to buy milk
          assistant  I'll add that.
                     → append_file {"line":"buy milk","path":"todo.txt"}  (call_1)
          tool       call_1 ← {"appended":true}
          assistant  Added it.
                     Anything else?
          user       Tell me a long story
          assistant  Once upon (interrupted)
    "#]]
    .assert_eq(&render_transcript(
        &ThreadId::new("todo").expect("thread"),
        &messages,
        &[done],
    ));
}

#[test]
fn the_agent_file_names_the_provider_and_the_environment_does_not() {
    let dir = temp_dir("provider-kind");
    let write = |name: &str, body: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("[agent]\nid = \"a\"\nmodel = \"m\"\n{body}"))
            .expect("write");
        path
    };
    let kind = |name: &str, body: &str| {
        AgentFile::load(&write(name, body))
            .map(|f| f.provider_kind().expect("kind").name())
            .map_err(|e| e.to_string())
    };
    assert_eq!(kind("bare.toml", ""), Ok("scripted"));
    assert_eq!(
        kind(
            "model.toml",
            "[model]\nid = \"m\"\nprovider = \"openai\"\nupstream_model = \"x\"\n"
        ),
        Ok("openai")
    );
    assert_eq!(
        kind("section.toml", "[provider]\nkind = \"openai\"\n"),
        Ok("openai")
    );
    let clash = kind(
        "clash.toml",
        "[provider]\nkind = \"openai\"\n[model]\nid = \"m\"\nprovider = \"scripted\"\nupstream_model = \"x\"\n",
    )
    .expect_err("refused");
    assert!(clash.contains("name one provider"), "{clash}");
    let twice = kind(
        "twice.toml",
        "[agent.sections.retry]\nmax_retries = 1\n[provider]\nkind = \"openai\"\n[provider.retry]\nmax_retries = 2\n",
    )
    .expect_err("refused");
    assert!(twice.contains("retry is configured twice"), "{twice}");
    let bad_retry = kind(
        "bad-retry.toml",
        "[provider]\nkind = \"openai\"\n[provider.retry]\nmultiplier = 0.5\n",
    )
    .expect_err("refused");
    assert!(bad_retry.contains("retry.multiplier"), "{bad_retry}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_anthropic_agent_file_names_its_provider_and_refuses_openai_settings() {
    let dir = temp_dir("provider-anthropic");
    let write = |name: &str, body: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("[agent]\nid = \"a\"\nmodel = \"m\"\n{body}"))
            .expect("write");
        path
    };
    let load =
        |name: &str, body: &str| AgentFile::load(&write(name, body)).map_err(|e| e.to_string());
    let kind =
        |name: &str, body: &str| load(name, body).map(|f| f.provider_kind().expect("kind").name());
    let section = "[provider]\nkind = \"anthropic\"\nmodel = \"claude-x\"\n\
                   base_url = \"https://api.anthropic.com\"\n\
                   api_key_env = \"AWAKEN_UNIT_TEST_UNSET_ANTHROPIC_KEY\"\n";
    assert_eq!(kind("section.toml", section), Ok("anthropic"));
    assert_eq!(
        kind(
            "model.toml",
            "[model]\nid = \"m\"\nprovider = \"anthropic\"\nupstream_model = \"claude-x\"\n"
        ),
        Ok("anthropic")
    );
    let unknown = kind(
        "unknown.toml",
        "[model]\nid = \"m\"\nprovider = \"gemini\"\nupstream_model = \"x\"\n",
    )
    .expect_err("refused");
    assert!(
        unknown.contains(r#"the command runs "scripted", "openai" or "anthropic""#),
        "{unknown}"
    );
    let unknown_kind =
        kind("unknown-kind.toml", "[provider]\nkind = \"gemini\"\n").expect_err("refused");
    assert!(unknown_kind.contains("anthropic"), "{unknown_kind}");
    for key in [
        "include_usage = false",
        "stream = true",
        "max_tokens_field = \"max_tokens\"",
    ] {
        let refused = kind("openai-only.toml", &format!("{section}{key}\n")).expect_err("refused");
        let name = key.split(' ').next().unwrap_or_default();
        assert!(
            refused.contains(&format!(
                "[provider] {name} applies to kind = \"openai\" only"
            )),
            "{refused}"
        );
    }

    // Checking the file needs no key; running it against Anthropic's own API does, and the
    // error names the variable before anything is sent.
    let file = load("section.toml", section).expect("loads");
    let store = || -> std::sync::Arc<dyn awaken_store::ThreadStore> {
        std::sync::Arc::new(awaken_store::MemoryStore::new())
    };
    assert!(
        runtime_of_files(
            std::slice::from_ref(&file),
            &Args::default(),
            store(),
            Purpose::Validate,
            &[]
        )
        .is_ok()
    );
    let error = runtime_of_files(&[file], &Args::default(), store(), Purpose::Run, &[])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        error.contains(
            "the provider at https://api.anthropic.com needs an API key: set AWAKEN_UNIT_TEST_UNSET_ANTHROPIC_KEY"
        ),
        "{error}"
    );
    let _ = std::fs::remove_dir_all(dir);
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
async fn append_file_appends_once_per_call_and_leaves_only_the_line() {
    let dir = temp_dir("append");
    let tool = AppendFile {
        root: dir.join("notes"),
    };
    let todo = dir.join("notes/todo.txt");
    let append = |line: &str| json!({"path": "todo.txt", "line": line});
    assert_eq!(
        call(&tool, append("buy milk"), "c1").await,
        r#"ok {"appended":true,"line":"buy milk","path":"todo.txt"}"#
    );
    // The same call again (a replay): nothing is written.
    assert_eq!(
        call(&tool, append("buy milk"), "c1").await,
        r#"ok {"appended":false,"line":"buy milk","note":"this call already appended its line; nothing was written","path":"todo.txt"}"#
    );
    // Another call appends its own line, after a newline when another writer left a line open.
    std::fs::write(&todo, "buy milk\nwritten by hand").expect("write");
    let mut outcomes = vec![
        call(&tool, append("buy milk"), "c2").await,
        call(&tool, append("buy milk"), "c1").await,
    ];
    // The process stops after the journal's entry, before the append: the replay appends,
    // once.
    let key = |c: &str| ctx(c).idempotency_key().as_str().to_owned();
    tool.stop_before_the_append("todo.txt", &key("c3"), "call mom")
        .expect("journal entry");
    outcomes.push(call(&tool, append("call mom"), "c3").await);
    outcomes.push(call(&tool, append("call mom"), "c3").await);
    // The process stops after the append, before the journal says it is done: the replay finds
    // the line and writes nothing.
    tool.stop_before_the_append("todo.txt", &key("c4"), "pay rent")
        .expect("journal entry");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&todo)
        .expect("open");
    std::io::Write::write_all(&mut file, b"pay rent\n").expect("append");
    outcomes.push(call(&tool, append("pay rent"), "c4").await);
    // While c5 is stopped after its journal entry, c6 appends the same line: that line is c6's,
    // so c5's replay still appends its own.
    tool.stop_before_the_append("todo.txt", &key("c5"), "water plants")
        .expect("journal entry");
    outcomes.push(call(&tool, append("water plants"), "c6").await);
    outcomes.push(call(&tool, append("water plants"), "c5").await);
    outcomes.push(call(&tool, append("water plants"), "c5").await);
    let appended: Vec<&str> = outcomes
        .iter()
        .map(|o| {
            if o.contains("\"appended\":true") {
                "appended"
            } else if o.contains("\"appended\":false") {
                "not appended"
            } else {
                o.as_str()
            }
        })
        .collect();
    assert_eq!(
        appended,
        [
            "appended",     // c2
            "not appended", // c1
            "appended",     // c3, stopped before its append
            "not appended", // c3
            "not appended", // c4, stopped after its append
            "appended",     // c6
            "appended",     // c5, stopped before its append, same line as c6
            "not appended", // c5
        ]
    );
    assert_eq!(
        lines(&todo),
        [
            "buy milk",
            "written by hand",
            "buy milk",
            "call mom",
            "pay rent",
            "water plants",
            "water plants",
        ]
    );
    // The journal is a hidden file beside the user's, and not a file to append to.
    let mut names: Vec<String> = std::fs::read_dir(dir.join("notes"))
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [".awaken-append-journal", "todo.txt"]);
    assert!(
        call(
            &tool,
            json!({"path": ".awaken-append-journal", "line": "x"}),
            "c7"
        )
        .await
        .contains("append_file's own journal")
    );
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

#[tokio::test(flavor = "current_thread")]
async fn http_get_settings_are_checked_and_the_tool_refuses_ranges_the_file_does_not_allow() {
    let dir = temp_dir("http-get-settings");
    let load = |name: &str, settings: &str| {
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!("[agent]\nid = \"a\"\nmodel = \"m\"\n[tools.http_get]\n{settings}"),
        )
        .expect("write");
        AgentFile::load(&path).map_err(|e| e.to_string())
    };
    let bad_range = load(
        "bad-range.toml",
        "allow_hosts = [\"a.test\"]\nallow_ranges = [\"127.0.0.1\", \"10.0.0.1/8\"]\n",
    )
    .expect_err("refused");
    assert!(
        bad_range.ends_with(
            "tools.http_get.allow_ranges[1]: `10.0.0.1/8` has bits set after its prefix; the range it falls in is 10.0.0.0/8"
        ),
        "{bad_range}"
    );
    let bad_host =
        load("bad-host.toml", "allow_hosts = [\"http://a.test\"]\n").expect_err("refused");
    assert!(
        bad_host.contains("tools.http_get.allow_hosts[0]: expected a host name"),
        "{bad_host}"
    );

    let file = load(
        "good.toml",
        "allow_hosts = [\"127.0.0.1\", \"10.1.2.3\", \"::1\"]\nallow_ranges = [\"10.0.0.0/8\"]\n",
    )
    .expect("loads");
    let settings = file.tools.http_get.expect("http_get settings");
    let tool =
        crate::tools::HttpGet::new(settings.allow_hosts, settings.ranges, 1024).expect("the tool");
    let fetch = |url: &str| call(&tool, json!({ "url": url }), "c");
    expect![[r#"
        error refused 127.0.0.1 for host `127.0.0.1`: 127.0.0.0/8 (loopback) is reached only when an allowed range contains it
        error refused ::1 for host `[::1]`: ::1/128 (loopback) is reached only when an allowed range contains it
        error host `0xa.1.2.3` is an IPv4 address in a non-standard spelling (read as 10.1.2.3); write it as 10.1.2.3
        error host `169.254.169.254` is not allowed (allowed: 127.0.0.1, 10.1.2.3, ::1)"#]]
    .assert_eq(
        &[
            fetch("http://127.0.0.1:9/").await,
            fetch("http://[::1]:9/").await,
            fetch("http://0xa.1.2.3:9/").await,
            fetch("http://169.254.169.254/").await,
        ]
        .join("\n"),
    );
    let _ = std::fs::remove_dir_all(dir);
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

#[test]
fn the_script_goes_on_past_a_message_sent_to_the_run_in_flight() {
    use awaken::runtime::RunStatsKey;
    use awaken::state::StateKey;
    use awaken_store::Checkpoint;
    // The run answered, took a message sent while it ran, and asks again: its statistics
    // count one inference, though a user message follows its answer.
    let mut run = RunRecord::new(
        RunId::new("r1").expect("id"),
        "a",
        Timestamp::from_unix_millis(1_796_172_000_000),
    );
    let mut checkpoint = Checkpoint {
        thread_id: ThreadId::new("t1").expect("id"),
        messages: vec![
            Message::user("count"),
            Message::assistant("one, two"),
            Message::user("and back"),
        ],
        thread_state: Default::default(),
        run: Some(run.clone()),
        run_state: Default::default(),
        profile: None,
        batch: None,
        last_event_seq: 0,
    };
    checkpoint.run_state.values.insert(
        RunStatsKey::KEY.into(),
        json!({"inferences": 1, "steps": 1}),
    );
    assert_eq!(crate::script::played(&checkpoint), 1);
    // A new prompt's run has played nothing yet.
    checkpoint.run_state = Default::default();
    assert_eq!(crate::script::played(&checkpoint), 0);
    // A thread whose last run ended: the answers after the last user message.
    run.status = RunStatus::Done;
    checkpoint.run = Some(run);
    checkpoint.messages.push(Message::assistant("three"));
    assert_eq!(crate::script::played(&checkpoint), 1);
}

/// An activation that did not start because the thread changed under it (another process wrote
/// to it, or holds its run) exits 3 and says the command can be run again; a failure of the
/// store exits 1 with the store's own message, and a run whose end was not written exits 1
/// saying how to continue it.
#[test]
fn a_thread_changed_under_a_starting_run_exits_3_and_a_store_failure_1() {
    use awaken::runtime::RunError;
    use awaken_store::{CommitError, StoreError};
    let commit = |source: CommitError| RunError::Commit {
        thread_id: ThreadId::new("t1").expect("id"),
        source,
    };
    let exits: Vec<String> = [
        commit(CommitError::VersionConflict {
            expected: 2,
            actual: 4,
        }),
        commit(CommitError::LeaseLost {
            run_id: RunId::new("r1").expect("id"),
        }),
        RunError::TakenOver {
            thread_id: ThreadId::new("t1").expect("id"),
            run_id: RunId::new("r1").expect("id"),
        },
        commit(
            StoreError::Task {
                detail: "the disk went away".into(),
            }
            .into(),
        ),
        RunError::Store(StoreError::Task {
            detail: "the disk went away".into(),
        }),
        RunError::EndNotWritten {
            thread_id: ThreadId::new("t1").expect("id"),
            outcome: Box::new(awaken::runtime::RunOutcome {
                run_id: RunId::new("r1").expect("id"),
                termination: TerminationReason::NaturalEnd,
                response: Some("Hello.".into()),
                steps: 1,
                usage: Default::default(),
            }),
            source: awaken::runtime::CheckpointError::Commit(
                StoreError::Task {
                    detail: "the disk went away".into(),
                }
                .into(),
            ),
        },
    ]
    .into_iter()
    .map(|e| {
        let exit = not_started(e, &Args::default());
        format!("{} {:#}", exit.code, exit.error)
    })
    .collect();
    expect![[r#"
        3 the first commit of a run on thread `t1` was not written: stale message guard: the commit expected 2 messages, the thread holds 4
        the thread changed while this run started (another process wrote to it or holds its run); nothing of the run was written: run the command again
        3 the first commit of a run on thread `t1` was not written: the lease on run r1 was lost
        the thread changed while this run started (another process wrote to it or holds its run); nothing of the run was written: run the command again
        3 run `r1` of thread `t1` is held by another worker
        another process holds the run and goes on with it (`awaken threads` shows how it ends)
        1 the first commit of a run on thread `t1` was not written: the store's blocking task failed: the disk went away
        the store failed; nothing of the run was written
        1 the thread store failed: the store's blocking task failed: the disk went away
        1 run `r1` of thread `t1` ended (natural_end) but the store holds it unfinished at its last checkpoint: the commit was not written: the store's blocking task failed: the disk went away
        continue it from there with
          awaken recover"#]].assert_eq(&exits.join("\n"));
}

/// The commands suggested to go on with a thread keep the model the run was given, so the
/// continuation does not ask another one.
#[test]
fn suggested_commands_keep_the_model_and_script_of_the_run() {
    let args = parse(&[
        "run",
        "--agent",
        "my agent.toml",
        "--store",
        "sqlite:a.db",
        "--model",
        "openai:gpt-4o-mini",
        "--script",
        "replies.json",
        "--thread",
        "t1",
        "hi",
    ])
    .expect("parsed");
    let thread = ThreadId::new("t1").expect("id");
    let commands = [
        recover_command(&args),
        resume_command(&args, &thread),
        continue_command(&args, &thread, true),
        chat_command(&args, &thread),
    ];
    expect![[r#"
        awaken recover --agent 'my agent.toml' --store sqlite:a.db --model openai:gpt-4o-mini --script replies.json
        awaken resume t1 --agent 'my agent.toml' --store sqlite:a.db --model openai:gpt-4o-mini --script replies.json
        awaken run --agent 'my agent.toml' --thread t1 --store sqlite:a.db --model openai:gpt-4o-mini --script replies.json --supersede
        awaken chat --agent 'my agent.toml' --thread t1 --store sqlite:a.db --model openai:gpt-4o-mini --script replies.json"#]]
    .assert_eq(&commands.join("\n"));
}

/// An agent file in `dir` whose scripted model answers `reply`, with `extra` TOML after it.
fn scripted_file(dir: &Path, agent: &str, reply: &str, extra: &str) -> AgentFile {
    let path = dir.join(format!("{agent}.toml"));
    std::fs::write(
        &path,
        format!(
            "[agent]\nid = \"{agent}\"\nmodel = \"default\"\n\n[[script.turns]]\ntext = {reply:?}\n{extra}"
        ),
    )
    .expect("write the agent");
    AgentFile::load(&path).expect("loads")
}

/// The runtime of `files` on a fresh memory store.
fn runtime_of(files: &[AgentFile]) -> Result<awaken::runtime::AgentRuntime> {
    runtime_of_files(
        files,
        &Args::default(),
        std::sync::Arc::new(awaken_store::MemoryStore::new()),
        Purpose::Run,
        &[],
    )
}

#[tokio::test(flavor = "current_thread")]
async fn several_agent_files_share_a_runtime_each_with_its_own_script_model_and_tools() {
    let dir = temp_dir("many-files");
    let files = [
        scripted_file(
            &dir,
            "reader",
            "From the reader.",
            "[tools.read_file]\nroot = \".\"\n",
        ),
        scripted_file(
            &dir,
            "writer",
            "From the writer.",
            "[tools.append_file]\nroot = \"notes\"\n",
        ),
        // The same read_file settings, named another way: one shared tool.
        scripted_file(
            &dir,
            "second-reader",
            "From the second reader.",
            &format!(
                "[tools.read_file]\nroot = {:?}\n",
                dir.display().to_string()
            ),
        ),
    ];
    let runtime = runtime_of(&files).expect("one runtime");
    let mut shown = String::new();
    for file in &files {
        let agent = &file.agent.id;
        let resolved = runtime.resolver().resolve(agent).expect("resolves");
        let tools: Vec<String> = resolved
            .tools
            .iter()
            .map(|t| t.tool.descriptor().id.clone())
            .collect();
        let thread = ThreadId::new(format!("t-{agent}")).expect("thread");
        let outcome = runtime
            .run(
                awaken::runtime::RunActivation::new(thread, agent.clone()).with_user_message("hi"),
                &awaken::event::NullSink,
            )
            .await
            .expect("runs");
        shown.push_str(&format!(
            "{agent}: model {} on {}, tools [{}], answers {:?}\n",
            resolved.model.id,
            resolved.model.provider,
            tools.join(", "),
            outcome.response.unwrap_or_default()
        ));
    }
    expect![[r#"
        reader: model default on scripted:reader, tools [read_file], answers "From the reader."
        writer: model default:writer on scripted:writer, tools [append_file], answers "From the writer."
        second-reader: model default:second-reader on scripted:second-reader, tools [read_file], answers "From the second reader."
    "#]].assert_eq(&shown);

    // A one-file runtime names its provider and model as `run` does.
    let one = runtime_of(&files[..1]).expect("one file");
    let resolved = one.resolver().resolve("reader").expect("resolves");
    assert_eq!(
        (resolved.model.id.as_str(), resolved.model.provider.as_str()),
        ("default", "scripted")
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn agent_files_that_cannot_share_a_runtime_are_refused_naming_both() {
    let dir = temp_dir("many-files-refused");
    let a = scripted_file(&dir, "a", "A.", "[tools.read_file]\nroot = \".\"\n");
    let b = scripted_file(&dir, "b", "B.", "[tools.read_file]\nroot = \"elsewhere\"\n");
    let err = runtime_of(&[a.clone(), b])
        .expect_err("refused")
        .to_string();
    // The shared root is named by its canonical path.
    let canonical = std::fs::canonicalize(&dir).expect("canonical");
    let err = err
        .replace(&canonical.display().to_string(), "<dir>")
        .replace(&dir.display().to_string(), "<dir>");
    expect!["<dir>/a.toml and <dir>/b.toml configure [tools.read_file] differently (root = <dir> and root = <dir>/elsewhere): the agents of one server share one read_file tool, so give it the same settings in both"].assert_eq(&err);
    let other = dir.join("other");
    std::fs::create_dir_all(&other).expect("dir");
    let again = scripted_file(&other, "a", "Another A.", "");
    let err = runtime_of(&[a, again]).expect_err("refused").to_string();
    let err = err.replace(&dir.display().to_string(), "<dir>");
    expect!["agent `a` is defined by two files, <dir>/a.toml and <dir>/other/a.toml: the agents of one server need distinct ids"].assert_eq(&err);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn model_entries_and_pools_are_checked_naming_the_field() {
    let dir = temp_dir("pool-fields");
    let path = dir.join("a.toml");
    let check = |body: &str| -> String {
        std::fs::write(
            &path,
            format!("[agent]\nid = \"a\"\nmodel = \"smart\"\n{body}"),
        )
        .expect("write");
        match AgentFile::load(&path) {
            Ok(_) => "ok".to_owned(),
            Err(e) => e.to_string().replace(&path.display().to_string(), "<file>"),
        }
    };
    let two = "[[models]]\nid = \"x\"\n[[models]]\nid = \"y\"\n";
    let pool = |members: &str| format!("[[model_pools]]\nid = \"smart\"\nmembers = [{members}]\n");
    let lines = [
        check(&format!(
            "{two}{}",
            pool("{ model = \"x\" }, { model = \"y\", fallback_only = true }")
        )),
        check(&format!(
            "{two}{}",
            pool("{ model = \"x\" }, { model = \"ghost\" }")
        )),
        check(&format!(
            "{two}{}[[model_pools]]\nid = \"other\"\nmembers = [{{ model = \"smart\" }}]\n",
            pool("{ model = \"x\" }")
        )),
        check(&format!("{two}{}", pool("{ model = \"x\", weight = 0 }"))),
        check(&format!("{two}{}", pool(""))),
        check(&format!(
            "{two}[[model_pools]]\nid = \"y\"\nmembers = [{{ model = \"x\" }}]\n"
        )),
        check("[[models]]\nid = \"x\"\n[[models]]\nid = \"x\"\n"),
        check("[[models]]\nid = \"x\"\n[models.provider]\nkind = \"openai\"\n"),
        check(
            "[[models]]\nid = \"x\"\nupstream_model = \"u\"\n[models.provider]\nkind = \"openai\"\nmodel = \"u\"\n",
        ),
        check("[[models]]\nid = \"x\"\ncontext_window = 0\n"),
        check(&format!(
            "[[models]]\nid = \"x\"\nupstream_model = \"u\"\n[models.provider]\nkind = \"openai\"\n[models.provider.retry]\nmax_retries = 1\n{}",
            pool("{ model = \"x\" }")
        )),
        check(&format!(
            "[[models]]\nid = \"x\"\nupstream_model = \"u\"\n[models.provider]\nkind = \"anthropic\"\nstream = false\n{}",
            pool("{ model = \"x\" }")
        )),
        check("[[models]]\nid = \"x\"\ncontext = 8\n"),
        // The single-model form's model (the agent's model id) may be a member of another pool.
        check(
            "[[models]]\nid = \"x\"\n[[model_pools]]\nid = \"spare\"\nmembers = [{ model = \"smart\" }, { model = \"x\" }]\n",
        ),
    ];
    expect![[r#"
        ok
        <file>: model_pools[0].members[1].model: `ghost` is not a model of this file (its models: `x`, `y`)
        <file>: model_pools[1].members[0].model: `smart` is a model pool; a pool's members are models
        <file>: model_pools[0].members[0].weight: must be at least 1
        <file>: model_pools[0].members: must list at least one member
        <file>: model_pools[0].id: `y` is declared twice (models[1] and model_pools[0]); model and pool ids share one namespace
        <file>: models[1].id: model `x` is declared twice (models[0] and models[1])
        <file>: models[0].upstream_model: required for kind = "openai" (the model's name at the provider)
        <file>: models[0].provider.model: a model entry names its provider-side model with models[0].upstream_model
        <file>: models[0].context_window: must be at least 1
        <file>: models[0].provider.retry: model `x` is a member of model pool `smart`, and a member's retries would delay the pool's failover; retry the pool with [agent.sections.retry]
        <file>: models[0].provider.stream applies to kind = "openai" only (the anthropic provider always streams and reports usage)
        <file>:6: invalid TOML at line 6, column 1: TOML parse error at line 6, column 1
          |
        6 | context = 8
          | ^^^^^^^
        unknown field `context`, expected one of `id`, `upstream_model`, `context_window`, `max_output_tokens`, `provider`

        ok"#]].assert_eq(&lines.join("\n"));
    let _ = std::fs::remove_dir_all(dir);
}

/// An agent file in `dir` whose agent `agent` runs on the pool `smart` of two scripted models
/// `a` and `b`, answering `reply`.
fn pooled_file(dir: &Path, agent: &str, reply: &str) -> AgentFile {
    let path = dir.join(format!("{agent}.toml"));
    std::fs::write(
        &path,
        format!(
            "[agent]\nid = \"{agent}\"\nmodel = \"smart\"\n\n[[script.turns]]\ntext = {reply:?}\n\n\
             [[models]]\nid = \"a\"\n[[models]]\nid = \"b\"\n\n\
             [[model_pools]]\nid = \"smart\"\nmembers = [{{ model = \"a\" }}, {{ model = \"b\" }}]\n"
        ),
    )
    .expect("write the agent");
    AgentFile::load(&path).expect("loads")
}

#[tokio::test(flavor = "current_thread")]
async fn agent_files_with_the_same_pool_and_model_ids_share_a_runtime() {
    let dir = temp_dir("many-pools");
    let files = [
        pooled_file(&dir, "one", "From one."),
        pooled_file(&dir, "two", "From two."),
    ];
    let runtime = runtime_of(&files).expect("one runtime");
    let mut shown = String::new();
    for file in &files {
        let agent = &file.agent.id;
        let resolved = runtime.resolver().resolve(agent).expect("resolves");
        let pool = resolved.pool.as_deref().expect("a pool");
        let members: Vec<&str> = pool.members.iter().map(|m| m.model.as_str()).collect();
        let outcome = runtime
            .run(
                awaken::runtime::RunActivation::new(
                    ThreadId::new(format!("t-{agent}")).expect("thread"),
                    agent.clone(),
                )
                .with_user_message("hi"),
                &awaken::event::NullSink,
            )
            .await
            .expect("runs");
        shown.push_str(&format!(
            "{agent}: pool {} of [{}], retry section {}, answers {:?}\n",
            resolved.model.id,
            members.join(", "),
            resolved
                .spec
                .sections
                .get("retry")
                .expect("the default retry"),
            outcome.response.unwrap_or_default()
        ));
    }
    expect![[r#"
        one: pool smart of [a, b], retry section {"max_retries":3}, answers "From one."
        two: pool smart:two of [a:two, b:two], retry section {"max_retries":3}, answers "From two."
    "#]]
    .assert_eq(&shown);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_agent_may_name_a_model_entry_and_then_the_main_model_is_not_registered() {
    let dir = temp_dir("model-entry");
    let path = dir.join("entry.toml");
    std::fs::write(
        &path,
        "[agent]\nid = \"a\"\nmodel = \"x\"\n\n[[script.turns]]\ntext = \"From x.\"\n\n\
         [[models]]\nid = \"x\"\ncontext_window = 4096\n",
    )
    .expect("write the agent");
    let file = AgentFile::load(&path).expect("loads");
    assert!(!file.has_main_model());
    let runtime = runtime_of(&[file]).expect("runtime");
    let resolved = runtime.resolver().resolve("a").expect("resolves");
    assert_eq!(
        (
            resolved.model.id.as_str(),
            resolved.model.provider.as_str(),
            resolved.model.upstream_model.as_str(),
            resolved.model.context_window
        ),
        ("x", "model:x", "scripted", Some(4096))
    );
    assert!(resolved.pool.is_none());
    let registries = runtime.resolver().registries();
    assert!(
        registries.model("default").is_none() && registries.provider("scripted").is_none(),
        "the main model and its provider are not registered"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_remote_agent_file_names_its_endpoint_and_nothing_that_runs_here() {
    let dir = temp_dir("remote-agent");
    let load = |name: &str, extra: &str| {
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!(
                "{extra}\n[agent]\nid = \"far\"\ndescription = \"Elsewhere\"\n\n\
                 [agent.endpoint]\nurl = \"http://127.0.0.1:9/a2a/far\"\nprotocol = \"a2a\"\n"
            ),
        )
        .expect("write");
        AgentFile::load(&path).map_err(|e| e.to_string())
    };
    let file = load("plain.toml", "").expect("a remote agent's file loads");
    assert!(!file.has_main_model(), "a remote agent has no model here");
    for (name, extra, section) in [
        (
            "model.toml",
            "[model]\nid = \"m\"\nprovider = \"scripted\"\nupstream_model = \"s\"\n",
            "[model]",
        ),
        (
            "provider.toml",
            "[provider]\nkind = \"openai\"\n",
            "[provider]",
        ),
        ("tools.toml", "[tools.read_file]\nroot = \".\"\n", "[tools]"),
        ("plugins.toml", "[plugins]\ndirs = [\"p\"]\n", "[plugins]"),
    ] {
        let error = load(name, extra).expect_err(name);
        assert!(
            error.contains(&format!(
                "agent `far` runs at its endpoint: {section} has no use in its file"
            )) && error.contains(name),
            "{error}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_worker_id_names_the_process_and_is_its_own() {
    let id = crate::setup::worker_id();
    assert_eq!(id, crate::setup::worker_id(), "one identity per process");
    let random = id
        .strip_prefix(&format!("awaken-cli-{}-", std::process::id()))
        .unwrap_or_else(|| panic!("{id}"));
    assert!(
        random.len() == 8 && random.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
}
