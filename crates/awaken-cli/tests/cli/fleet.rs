//! A fleet on PostgreSQL, process by process: `awaken serve --queue` front ends and
//! `awaken worker` processes on one database. Two thousand queued runs driven exactly once, a
//! worker killed at each durable boundary and taken over, a cancel and an approval reaching a
//! run on a worker in another process, and PostgreSQL restarted under load. Each test has a
//! database of its own (the queue and its notifications are per database), and every process it
//! starts is killed when it ends, passed or failed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use awaken::event::{ToolCallState, ToolResultStatus};
use serde_json::json;

use super::commands::{Stream, Watched};
use super::serve::{request, request_within, serve_for};
use super::*;

/// The lease of the fleet's runs and jobs, in seconds: a killed worker's runs are taken over
/// this long after it died.
const LEASE_SECS: &str = "2";

/// How long a fleet process may live before its watchdog kills it: a hang guard that outlasts
/// the longest test.
const FLEET_LIMIT: Duration = Duration::from_secs(20 * 60);

/// How long a test waits for something it polls for before it fails.
const PATIENCE: Duration = Duration::from_secs(120);

/// The boundaries a worker is killed at (docs/recovery.md): around each commit of a run's
/// calls, and after a job's activation ended, before the queue was told.
const BOUNDARIES: [&str; 5] = [
    "before_requested",
    "after_requested",
    "after_executing",
    "after_result",
    "before_job_end",
];

/// The pause before each event of the slow agent's model turn, in milliseconds.
const SLOW_MS: u64 = 20_000;

/// A database of its own on the test server, dropped (its connections cut off) when the test
/// ends.
struct TestDatabase {
    /// A URL of the server's database the test server was configured with.
    server: String,
    name: String,
    /// The URL of this database.
    url: String,
}

impl TestDatabase {
    /// `awaken_fleet_<test>_<pid>` on the server of the database URL `server`.
    fn create(server: &str, test: &str) -> Self {
        let name = format!("awaken_fleet_{test}_{}", std::process::id());
        execute(
            server,
            &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        )
        .unwrap_or_else(|e| panic!("drop an earlier {name}: {e}"));
        execute(server, &format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
        Self {
            server: server.to_owned(),
            url: with_database(server, &name),
            name,
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let _ = execute(
            &self.server,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
    }
}

/// `url` naming the database `name` instead of its own.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let (server, _) = base
        .rsplit_once('/')
        .unwrap_or_else(|| panic!("no database in the URL {url}"));
    if query.is_empty() {
        format!("{server}/{name}")
    } else {
        format!("{server}/{name}?{query}")
    }
}

/// Runs `future` to its end on a runtime of its own.
fn block_on<F: Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(future)
}

/// A connection to the database at `url`, driven on the current runtime.
async fn connect(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// Runs the SQL `statements` on the database at `url`, on a connection of their own.
fn execute(url: &str, statements: &str) -> Result<(), tokio_postgres::Error> {
    block_on(async { connect(url).await?.batch_execute(statements).await })
}

/// The number the SQL `query` answers on the database at `url`.
#[track_caller]
fn count(url: &str, query: &str) -> i64 {
    block_on(async {
        let row = connect(url).await?.query_one(query, &[]).await?;
        row.try_get::<_, i64>(0)
    })
    .unwrap_or_else(|e| panic!("{query}: {e}"))
}

/// Polls `done` until it holds; fails the test, naming `what`, when `limit` passes first.
#[track_caller]
fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: still not so after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A started `awaken serve --queue` on the database `store` with the agent files `agents`, on
/// a free port of 127.0.0.1; its standard error and its address.
fn front_end(store: &str, agents: &[String]) -> (Watched, Stream, String) {
    let mut args = vec![
        "--queue",
        "--store",
        store,
        "--listen",
        "127.0.0.1:0",
        "--no-chat-page",
    ];
    for agent in agents {
        args.extend(["--agent", agent.as_str()]);
    }
    serve_for(
        &args,
        &[("AWAKEN_LEASE_SECS", LEASE_SECS)],
        agents.len(),
        FLEET_LIMIT,
    )
}

/// A started `awaken worker` on the database `store` with the agent files `agents` and the
/// environment `env`, having said it claims runs; its standard error.
fn worker(store: &str, agents: &[String], env: &[(&str, &str)]) -> (Watched, Stream) {
    let mut command = command();
    command.args(["worker", "--store", store]);
    for agent in agents {
        command.args(["--agent", agent]);
    }
    command
        .env("AWAKEN_LEASE_SECS", LEASE_SECS)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut process = Watched::spawn_for(&mut command, FLEET_LIMIT);
    let mut stderr = Stream::new(process.child.stderr.take().expect("piped stderr"));
    stderr.until("awaken: worker claiming queued runs");
    (process, stderr)
}

/// What a worker said it did when it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Report {
    completed: u64,
    retried: u64,
    dead: u64,
    released: u64,
    lost: u64,
}

impl Report {
    /// The report line `awaken: worker stopped: N run(s) completed, N retried, N
    /// dead-lettered, N given back, N taken over elsewhere`.
    fn parse(line: &str) -> Option<Self> {
        let rest = line.strip_prefix("awaken: worker stopped: ")?;
        let parts: Vec<&str> = rest.split(", ").collect();
        let names = [
            "run(s) completed",
            "retried",
            "dead-lettered",
            "given back",
            "taken over elsewhere",
        ];
        if parts.len() != names.len() {
            return None;
        }
        let mut n = [0u64; 5];
        for ((part, name), slot) in parts.iter().zip(names).zip(&mut n) {
            let (number, said) = part.split_once(' ')?;
            if said != name {
                return None;
            }
            *slot = number.parse().ok()?;
        }
        let [completed, retried, dead, released, lost] = n;
        Some(Self {
            completed,
            retried,
            dead,
            released,
            lost,
        })
    }
}

/// Stops a worker with SIGTERM; its report, which must be the last line of its standard
/// error, after a clean exit.
#[track_caller]
fn stop_worker(process: Watched, mut stderr: Stream) -> Report {
    process.signal("-TERM");
    let status = process.wait_within(PATIENCE);
    let rest = stderr.rest();
    assert_eq!(status.code(), Some(0), "the worker's stderr:\n{rest}");
    let last = rest
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    Report::parse(last).unwrap_or_else(|| {
        panic!("the worker's last line is not its report: {last:?}; stderr:\n{rest}")
    })
}

/// Stops a front end with SIGTERM; it must exit 0.
#[track_caller]
fn stop_front_end(process: Watched, mut stderr: Stream) {
    process.signal("-TERM");
    let status = process.wait_within(PATIENCE);
    assert_eq!(
        status.code(),
        Some(0),
        "the server's stderr:\n{}",
        stderr.rest()
    );
}

/// An agent (`looper`) that reads `small.txt` of `dir` in five steps, one call a step, then
/// answers: a loop-5 run, six steps in all. Its file's path.
fn looper(dir: &Path) -> String {
    std::fs::write(dir.join("small.txt"), "a small file\n").expect("write the file to read");
    let mut agent = String::from(
        "[agent]\nid = \"looper\"\nmodel = \"default\"\nmax_rounds = 10\n\n\
         [tools.read_file]\nroot = \".\"\n",
    );
    for step in 1..=5 {
        agent.push_str(&format!(
            "\n[[script.turns]]\ntool_calls = [{{ id = \"call_{step}\", name = \"read_file\", \
             arguments = {{ path = \"small.txt\" }} }}]\n"
        ));
    }
    agent.push_str("\n[[script.turns]]\ntext = \"Read it five times.\"\n");
    write_scripted_agents(dir, &[("looper.toml", &agent)]).remove(0)
}

/// Posts a run of `agent` (`None`: the server's first) on `thread` to the front end at `addr`
/// and waits up to `wait` for its outcome (`?stream=false`): the status line and the body.
fn post_run(addr: &str, thread: &str, agent: Option<&str>, wait: Duration) -> (String, String) {
    let mut body = json!({ "message": "Go on." });
    if let Some(agent) = agent {
        body["agent"] = json!(agent);
    }
    request_within(
        addr,
        "POST",
        &format!("/v1/threads/{thread}/runs?stream=false"),
        &[],
        &body.to_string(),
        wait,
    )
}

/// [`post_run`]; an error naming the thread unless the answer is its run's natural end.
fn run_to_its_end(
    addr: &str,
    thread: &str,
    agent: Option<&str>,
    wait: Duration,
) -> Result<(), String> {
    let (status, body) = post_run(addr, thread, agent, wait);
    if status.starts_with("HTTP/1.1 200")
        && body.contains(r#""termination":{"kind":"natural_end"}"#)
    {
        Ok(())
    } else {
        Err(format!("{thread}: {status}\n{body}"))
    }
}

/// [`run_to_its_end`] on a thread of its own, not joined if the test fails first (the test's
/// end kills the front end, which ends the request).
fn post_in_background(
    addr: &str,
    thread: &str,
    agent: Option<&str>,
) -> std::thread::JoinHandle<Result<(), String>> {
    let (addr, thread, agent) = (addr.to_owned(), thread.to_owned(), agent.map(str::to_owned));
    std::thread::spawn(move || run_to_its_end(&addr, &thread, agent.as_deref(), FLEET_LIMIT))
}

/// What the front end at `addr` shows of `thread`: `GET /v1/threads/{t}` and the events of
/// `GET /v1/threads/{t}/events`.
fn stored(addr: &str, thread: &str) -> (Value, Vec<AgentEvent>) {
    let (status, body) = request(addr, "GET", &format!("/v1/threads/{thread}"), &[], "");
    assert!(
        status.starts_with("HTTP/1.1 200"),
        "{thread}: {status}\n{body}"
    );
    let shown: Value = serde_json::from_str(&body).expect("the thread is JSON");
    let (status, sse) = request(
        addr,
        "GET",
        &format!("/v1/threads/{thread}/events"),
        &[],
        "",
    );
    assert!(
        status.starts_with("HTTP/1.1 200"),
        "{thread}: {status}\n{sse}"
    );
    let events = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|data| {
            serde_json::from_str(data)
                .unwrap_or_else(|e| panic!("{thread}: not an event: {data}: {e}"))
        })
        .collect();
    (shown, events)
}

/// The thread's only run; an error naming the thread when it has another number of runs.
fn only_run<'a>(thread: &str, shown: &'a Value) -> Result<&'a Value, String> {
    match shown["runs"].as_array().map(Vec::as_slice) {
        Some([run]) => Ok(run),
        _ => Err(format!("{thread}: not exactly one run: {}", shown["runs"])),
    }
}

/// How a run's stored events may be split into activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activations {
    /// One activation, from its start to its finish.
    One,
    /// Activations cut short (their worker lost the database mid-run), each followed by a
    /// resumed one that continues the run, the last one finishing it.
    Resumed,
}

/// Checks a looper's thread: one run, done, ended naturally after its six steps, its five
/// calls succeeded; its stored events split into activations as `allowed`, the last one
/// well-formed. The number of activations.
fn check_loop_thread(addr: &str, thread: &str, allowed: Activations) -> Result<usize, String> {
    let (shown, events) = stored(addr, thread);
    let run = only_run(thread, &shown)?;
    if run["status"] != "done" || run["termination"]["kind"] != "natural_end" || run["steps"] != 6 {
        return Err(format!("{thread}: not done naturally in six steps: {run}"));
    }
    let starts: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, AgentEvent::RunStart { .. }))
        .map(|(i, _)| i)
        .collect();
    let resumed = events
        .iter()
        .filter(|e| matches!(e, AgentEvent::RunStart { resumed: true, .. }))
        .count();
    let split_as_allowed = match starts.as_slice() {
        [0] => resumed == 0,
        [0, ..] => allowed == Activations::Resumed && resumed == starts.len() - 1,
        _ => false,
    };
    if !split_as_allowed {
        return Err(format!(
            "{thread}: run starts at events {starts:?}, {resumed} resumed ({allowed:?} allowed)"
        ));
    }
    let last = starts.last().copied().unwrap_or_default();
    awaken::event::check_activation(&events[last..])
        .map_err(|v| format!("{thread}: the stored events break the grammar: {v}"))?;
    for step in 1..=5 {
        let call = format!("call_{step}");
        match closure(&events, &call) {
            Some((ToolCallState::Succeeded, _)) => {}
            other => return Err(format!("{thread}: {call} closed {other:?}")),
        }
    }
    Ok(starts.len())
}

/// The errors after which [`errors_of`] takes no more items: enough to show what went wrong,
/// and a stuck fleet fails the test in one request's wait rather than in one per item.
const ENOUGH_ERRORS: usize = 10;

/// Runs `work` on each of `items` from `threads` std threads; the errors (a panic is one), in
/// no order. Stops early after [`ENOUGH_ERRORS`].
fn errors_of<T: Sync>(
    items: &[T],
    threads: usize,
    work: impl Fn(&T) -> Result<(), String> + Sync,
) -> Vec<String> {
    let next = AtomicUsize::new(0);
    let errors = Mutex::new(Vec::new());
    let enough = || errors.lock().unwrap_or_else(|e| e.into_inner()).len() >= ENOUGH_ERRORS;
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while !enough()
                    && let Some(item) = items.get(next.fetch_add(1, Ordering::Relaxed))
                {
                    let done =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(item)))
                            .unwrap_or_else(|panic| Err(panic_text(panic.as_ref())));
                    if let Err(e) = done {
                        errors.lock().unwrap_or_else(|e| e.into_inner()).push(e);
                    }
                }
            });
        }
    });
    errors.into_inner().unwrap_or_else(|e| e.into_inner())
}

/// What a panic said.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic".to_owned())
}

/// Fails the test with the first few of `errors` when there are any.
#[track_caller]
fn assert_none(what: &str, errors: &[String]) {
    assert!(
        errors.is_empty(),
        "{what}: {} failure(s), among them:\n{}",
        errors.len(),
        errors
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Notes on standard error (which the test harness leaves alone) how long a part of a test
/// took.
fn note(what: &str, took: Duration) {
    let _ = writeln!(
        std::io::stderr(),
        "fleet: {what}: {:.3} s",
        took.as_secs_f64()
    );
}

#[test]
fn three_workers_and_a_server_run_two_thousand_queued_runs_exactly_once() {
    const RUNS: usize = 2_000;
    let Some(server) = postgres_url("the fleet test of two thousand queued runs") else {
        return;
    };
    let started = Instant::now();
    let db = TestDatabase::create(&server, "exactly_once");
    let dir = temp_dir("fleet-exactly-once");
    let agents = [looper(&dir)];
    let (front, front_err, addr) = front_end(&db.url, &agents);
    let workers: Vec<_> = (0..3).map(|_| worker(&db.url, &agents, &[])).collect();

    let threads: Vec<String> = (0..RUNS).map(|i| format!("loop-{i:04}")).collect();
    let posting = Instant::now();
    let errors = errors_of(&threads, 16, |thread| {
        run_to_its_end(&addr, thread, None, PATIENCE)
    });
    assert_none("the runs posted", &errors);
    note(
        &format!("{RUNS} loop-5 runs through the fleet"),
        posting.elapsed(),
    );

    let checking = Instant::now();
    let errors = errors_of(&threads, 8, |thread| {
        check_loop_thread(&addr, thread, Activations::One).map(drop)
    });
    assert_none("the stored threads", &errors);
    note("reading back every thread", checking.elapsed());

    let reports: Vec<Report> = workers
        .into_iter()
        .map(|(process, stderr)| stop_worker(process, stderr))
        .collect();
    let completed: u64 = reports.iter().map(|r| r.completed).sum();
    assert_eq!(completed, RUNS as u64, "{reports:?}");
    assert!(
        reports.iter().all(|r| r.completed > 0 && r.dead == 0),
        "each worker drove some runs, none dead-lettered: {reports:?}"
    );
    stop_front_end(front, front_err);
    note("the two-thousand-run test", started.elapsed());
    drop(db);
    let _ = std::fs::remove_dir_all(dir);
}

/// The line the appender of thread `k` appends at step `step` (when killed at `boundary`).
fn appended_line(boundary: &str, k: usize, step: usize) -> String {
    format!("{boundary} thread {k} step {step}")
}

/// Three agent files in `dir` (`appender-1` to `appender-3`), each appending its own line to
/// `effects/effects.txt` in each of three steps, then answering.
fn appenders(dir: &Path, boundary: &str) -> Vec<String> {
    let files: Vec<(String, String)> = (1..=3)
        .map(|k| {
            let mut agent = format!(
                "[agent]\nid = \"appender-{k}\"\nmodel = \"default\"\nmax_rounds = 8\n\n\
                 [tools.append_file]\nroot = \"effects\"\n"
            );
            for step in 1..=3 {
                let line = appended_line(boundary, k, step);
                agent.push_str(&format!(
                    "\n[[script.turns]]\ntool_calls = [{{ id = \"call_{step}\", \
                     name = \"append_file\", \
                     arguments = {{ path = \"effects.txt\", line = {line:?} }} }}]\n"
                ));
            }
            agent.push_str("\n[[script.turns]]\ntext = \"Appended three lines.\"\n");
            (format!("appender-{k}.toml"), agent)
        })
        .collect();
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(name, agent)| (name.as_str(), agent.as_str()))
        .collect();
    write_scripted_agents(dir, &files)
}

/// How `call` was closed, from its last `ToolCallDone` among `events`: its state, and its
/// result when it is a success (else `null`).
fn closure(events: &[AgentEvent], call: &str) -> Option<(ToolCallState, Value)> {
    events.iter().rev().find_map(|e| match e {
        AgentEvent::ToolCallDone {
            call_id,
            result,
            state,
        } if call_id.as_str() == call => {
            let success = result.status == ToolResultStatus::Success;
            let content = success.then(|| (*result.content).clone());
            Some((*state, content.unwrap_or_default()))
        }
        _ => None,
    })
}

/// Checks appender `k`'s thread after a worker was killed at `boundary` and another took over:
/// one run, done naturally; each call closed once, succeeded (its line appended by that call
/// and present once) or outcome unknown, as its tool message says too. The number of calls
/// closed outcome unknown.
fn check_appender_thread(
    addr: &str,
    thread: &str,
    boundary: &str,
    k: usize,
    lines: &HashMap<String, usize>,
) -> Result<usize, String> {
    let (shown, events) = stored(addr, thread);
    let run = only_run(thread, &shown)?;
    if run["status"] != "done" || run["termination"]["kind"] != "natural_end" {
        return Err(format!("{thread}: not done naturally: {run}"));
    }
    let messages = shown["messages"].as_array().cloned().unwrap_or_default();
    let mut unknown = 0;
    for step in 1..=3 {
        let call = format!("call_{step}");
        let line = appended_line(boundary, k, step);
        let present = lines.get(&line).copied().unwrap_or(0);
        let answers: Vec<&Value> = messages
            .iter()
            .filter(|m| m["role"] == "tool" && m["tool_call_id"] == call.as_str())
            .collect();
        let [answer] = answers.as_slice() else {
            return Err(format!(
                "{thread}: {call} has {} tool messages",
                answers.len()
            ));
        };
        let answer = answer["content"].to_string();
        match closure(&events, &call) {
            Some((ToolCallState::Succeeded, result))
                if present == 1 && result["appended"] == true =>
            {
                if !answer.contains("\"appended\":true") {
                    return Err(format!(
                        "{thread}: {call} succeeded, its message says {answer}"
                    ));
                }
            }
            Some((ToolCallState::OutcomeUnknown, _)) if present <= 1 => {
                unknown += 1;
                if !answer.contains("outcome unknown") {
                    return Err(format!(
                        "{thread}: {call} closed outcome unknown, its message says {answer}"
                    ));
                }
            }
            other => {
                return Err(format!(
                    "{thread}: {call} closed {other:?} with its line present {present} time(s)"
                ));
            }
        }
    }
    Ok(unknown)
}

/// Kills a worker holding three appending runs at `boundary`, then has a second worker take
/// them over on the database `db`; checks every run and every line.
fn killed_at(db: &str, boundary: &str) {
    let dir = temp_dir(&format!("fleet-killed-{boundary}"));
    let agents = appenders(&dir, boundary);
    let (front, front_err, addr) = front_end(db, &agents);
    let threads: Vec<String> = (1..=3).map(|k| format!("{boundary}-{k}")).collect();
    // Queued before any worker runs, so the first worker claims all three.
    let posts: Vec<_> = threads
        .iter()
        .enumerate()
        .map(|(i, thread)| {
            let agent = format!("appender-{}", i + 1);
            post_in_background(&addr, thread, Some(&agent))
        })
        .collect();
    wait_until(&format!("{boundary}: three runs queued"), PATIENCE, || {
        count(db, "SELECT count(*) FROM run_queue") == 3
    });

    let marker = dir.join("crashed");
    let (doomed, mut doomed_err) = worker(
        db,
        &agents,
        &[
            ("AWAKEN_CRASH_AT", boundary),
            ("AWAKEN_CRASH_MARKER", path_str(&marker)),
        ],
    );
    let status = doomed.wait_within(PATIENCE);
    let said = doomed_err.rest();
    assert_eq!(
        status.code(),
        None,
        "{boundary}: the worker was not killed by its failpoint:\n{said}"
    );
    // Runs on other threads of the process may reach the boundary before the kill lands.
    let reached = std::fs::read_to_string(&marker).unwrap_or_default();
    assert!(
        reached.lines().count() >= 1 && reached.lines().all(|l| l == boundary),
        "{boundary}: the marker says {reached:?}; the worker said:\n{said}"
    );

    let taking_over = Instant::now();
    let (successor, successor_err) = worker(db, &agents, &[]);
    let errors: Vec<String> = posts
        .into_iter()
        .filter_map(|p| p.join().expect("the post's thread").err())
        .collect();
    assert_none(boundary, &errors);
    note(
        &format!("{boundary}: three runs taken over and finished"),
        taking_over.elapsed(),
    );

    let effects = std::fs::read_to_string(dir.join("effects/effects.txt")).unwrap_or_default();
    let mut lines: HashMap<String, usize> = HashMap::new();
    for line in effects.lines() {
        *lines.entry(line.to_owned()).or_default() += 1;
    }
    let expected: Vec<String> = (1..=3)
        .flat_map(|k| (1..=3).map(move |step| appended_line(boundary, k, step)))
        .collect();
    assert!(
        lines.iter().all(|(l, n)| *n == 1 && expected.contains(l)),
        "{boundary}: a line twice or a stray line:\n{effects}"
    );
    let checked: Vec<Result<usize, String>> = threads
        .iter()
        .enumerate()
        .map(|(i, thread)| check_appender_thread(&addr, thread, boundary, i + 1, &lines))
        .collect();
    let errors: Vec<String> = checked.iter().filter_map(|c| c.clone().err()).collect();
    assert_none(boundary, &errors);
    // The call whose tool ran when the worker was killed was left `Executing`.
    let unknown: usize = checked.iter().flatten().sum();
    assert!(
        boundary != "after_executing" || unknown >= 1,
        "{boundary}: no call closed outcome unknown"
    );
    let report = stop_worker(successor, successor_err);
    assert_eq!(report.dead, 0, "{boundary}: {report:?}");
    stop_front_end(front, front_err);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_worker_killed_at_each_durable_boundary_is_taken_over() {
    let Some(server) = postgres_url("the fleet takeover test") else {
        return;
    };
    let started = Instant::now();
    let db = TestDatabase::create(&server, "takeover");
    for boundary in BOUNDARIES {
        killed_at(&db.url, boundary);
    }
    note("the takeover test", started.elapsed());
}

/// An agent (`slow`) whose model pauses [`SLOW_MS`] before each event of its answer.
fn slow_agent() -> String {
    format!(
        "[agent]\nid = \"slow\"\nmodel = \"default\"\n\n\
         [[script.turns]]\ndeltas = [\"Thinking it over.\"]\ndelay_ms = {SLOW_MS}\n"
    )
}

/// Posts a run of `agent` with `message` on `thread` to the front end at `streaming`: its
/// event stream, read up to the run's start.
fn started_run(streaming: &str, thread: &str, message: &str, agent: &str) -> Stream {
    let mut socket = TcpStream::connect(streaming).expect("connect to the server");
    let body = json!({ "message": message, "agent": agent }).to_string();
    socket
        .write_all(
            format!(
                "POST /v1/threads/{thread}/runs HTTP/1.1\r\nHost: {streaming}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .expect("send the run");
    let mut events = Stream::new(socket);
    events.until("event: run_start\n");
    events
}

/// Streams a run of the slow agent on `thread` from the front end at `streaming`, cancels it
/// through the front end at `cancelling` once it started (the cancel answered with the status
/// line `answered`), and checks that the stream ends with the run cancelled before the model's
/// first pause is over.
fn cancel_slow_run(streaming: &str, cancelling: &str, thread: &str, answered: &str) {
    let mut events = started_run(streaming, thread, "Take your time.", "slow");
    let asked = Instant::now();
    let (status, answer) = request(
        cancelling,
        "POST",
        &format!("/v1/threads/{thread}/cancel"),
        &[],
        "",
    );
    assert!(status.starts_with(answered), "{status}\n{answer}");
    assert!(answer.contains(r#""cancelled":true"#), "{answer}");
    events.until("event: run_finish\n");
    let finish = events.until("\n\n");
    let took = asked.elapsed();
    assert!(
        finish.contains(r#""termination":{"kind":"cancelled"}"#),
        "{finish}"
    );
    assert!(
        took < Duration::from_millis(SLOW_MS),
        "the cancel took {took:?}: the model's pause ran out first"
    );
    note(&format!("{thread}: cancel to the run's end"), took);
}

/// How long the steered agent's model pauses before each event of its first answer: time
/// for a steering message to reach its worker.
const STEER_PAUSE_MS: u64 = 2_000;

/// An agent (`steered`) whose first answer comes slowly; its second answers the message sent
/// to the run meanwhile.
fn steered_agent() -> String {
    format!(
        "[agent]\nid = \"steered\"\nmodel = \"default\"\n\n\
         [[script.turns]]\ndeltas = [\"Working on it.\"]\ndelay_ms = {STEER_PAUSE_MS}\n\n\
         [[script.turns]]\ntext = \"Tea too.\"\n"
    )
}

/// Streams a run of the steered agent on `thread` from the front end at `streaming`, steers
/// it through the front end at `steering` once it started, and checks that the next step took
/// the message: the run went on to answer it instead of ending after its first answer.
fn steer_slow_run(streaming: &str, steering: &str, thread: &str) {
    let mut events = started_run(streaming, thread, "Make coffee.", "steered");
    let asked = Instant::now();
    let (status, answer) = request(
        steering,
        "POST",
        &format!("/v1/threads/{thread}/messages"),
        &[],
        r#"{"message": "And tea."}"#,
    );
    assert!(status.starts_with("HTTP/1.1 200"), "{status}\n{answer}");
    let answer: Value = serde_json::from_str(&answer).expect("the answer is JSON");
    assert_eq!(answer, json!({"taken": true, "step": 2}));
    note(&format!("{thread}: steering to its step"), asked.elapsed());
    events.until("event: run_finish\n");
    let finish = events.until("\n\n");
    assert!(
        finish.contains(r#""termination":{"kind":"natural_end"}"#),
        "{finish}"
    );
    let (shown, events) = stored(streaming, thread);
    if let Err(v) = awaken::event::check_activation(&events) {
        panic!("{thread}: event grammar violated: {v}");
    }
    // The message's event, stored by the worker, is between the steps.
    let added: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            AgentEvent::MessageAdded { step, message } => {
                Some(format!("{step}: {}", message.text()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(added, ["2: And tea."], "{thread}");
    let messages: Vec<(&str, &str)> = shown["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            let text = m["content"][0]["text"].as_str().unwrap_or_default();
            (m["role"].as_str().unwrap_or_default(), text)
        })
        .collect();
    assert_eq!(
        messages,
        [
            ("user", "Make coffee."),
            ("assistant", "Working on it."),
            ("user", "And tea."),
            ("assistant", "Tea too."),
        ],
        "{shown}"
    );
}

#[test]
fn a_cancel_an_approval_and_steering_reach_runs_on_a_worker_in_another_process() {
    let Some(server) = postgres_url("the fleet cancel and approval test") else {
        return;
    };
    let db = TestDatabase::create(&server, "signals");
    let dir = temp_dir("fleet-signals");
    let agents = write_scripted_agents(
        &dir,
        &[
            ("scribe.toml", SCRIBE),
            ("slow.toml", &slow_agent()),
            ("steered.toml", &steered_agent()),
        ],
    );
    let (front, front_err, addr) = front_end(&db.url, &agents);
    let (other, other_err, other_addr) = front_end(&db.url, &agents);
    let (process, stderr) = worker(&db.url, &agents, &[]);

    // An approval: the run waits on its worker; the decision continues it there.
    let body = json!({ "message": "Remind me to buy milk", "agent": "scribe" }).to_string();
    let (status, events) = request(&addr, "POST", "/v1/threads/approval/runs", &[], &body);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}\n{events}");
    assert!(events.contains("event: tool_call_suspended\n"), "{events}");
    assert!(
        events.contains(r#""termination":{"kind":"suspended"}"#),
        "{events}"
    );
    let todo = dir.join("notes/todo.txt");
    assert!(!todo.exists(), "the call ran before its approval");
    let decision = r#"{"decisions":[{"call_id":"call_1","decision":"approve"}]}"#;
    let (status, events) = request(
        &addr,
        "POST",
        "/v1/threads/approval/decisions",
        &[],
        decision,
    );
    assert!(status.starts_with("HTTP/1.1 200"), "{status}\n{events}");
    assert!(events.contains("event: tool_call_done\n"), "{events}");
    assert!(
        events.contains(r#""termination":{"kind":"natural_end"}"#),
        "{events}"
    );
    assert_eq!(
        std::fs::read_to_string(&todo).expect("the approved line"),
        "buy milk\n"
    );

    // A cancel through the front end that streams the run, and through another one.
    cancel_slow_run(&addr, &addr, "slow-here", "HTTP/1.1 200");
    cancel_slow_run(&addr, &other_addr, "slow-elsewhere", "HTTP/1.1 202");
    // A steering message through a front end that does not stream the run.
    steer_slow_run(&addr, &other_addr, "steered");

    let report = stop_worker(process, stderr);
    assert_eq!(
        (report.completed, report.dead),
        (5, 0),
        "the suspended run, its continuation, two cancelled runs and a steered one: {report:?}"
    );
    stop_front_end(front, front_err);
    stop_front_end(other, other_err);
    drop(db);
    let _ = std::fs::remove_dir_all(dir);
}

/// A PostgreSQL cluster of the test's own (`.ci/postgres.sh`), stopped and removed when the
/// test ends.
struct PrivateCluster {
    dir: String,
    url: String,
}

/// Whether `initdb` is installed (where `.ci/postgres.sh` looks for it).
fn initdb_found() -> bool {
    let packaged = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .any(|version| version.path().join("bin/initdb").is_file());
    packaged
        || std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join("initdb").is_file()))
}

/// `.ci/postgres.sh` with `args`, never pointed at the shared test server by the environment.
fn postgres_script(args: &[&str]) -> Output {
    Command::new("bash")
        .arg(repo().join(".ci/postgres.sh"))
        .args(args)
        .env_remove("AWAKEN_TEST_POSTGRES_DIR")
        .env_remove("AWAKEN_TEST_POSTGRES_URL")
        .env("AWAKEN_PG_PORT", "26500")
        .stdin(Stdio::null())
        .output()
        .expect("bash runs")
}

impl PrivateCluster {
    /// A new cluster on a free port from 26500; `None` (skipped, with a note) when `initdb` is
    /// not installed, unless `AWAKEN_REQUIRE_POSTGRES=1` (then the script installs it).
    fn start() -> Option<Self> {
        if !initdb_found() && std::env::var("AWAKEN_REQUIRE_POSTGRES").as_deref() != Ok("1") {
            let _ = writeln!(
                std::io::stderr(),
                "awaken-cli: the PostgreSQL restart test is SKIPPED (initdb is not installed)"
            );
            return None;
        }
        let out = postgres_script(&["start"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let exported = text(&out.stdout);
        let value = |name: &str| {
            exported
                .lines()
                .find_map(|l| {
                    l.strip_prefix(&format!("export {name}='"))?
                        .strip_suffix('\'')
                })
                .map(str::to_owned)
                .unwrap_or_else(|| panic!("no {name} in {exported}"))
        };
        Some(Self {
            dir: value("AWAKEN_TEST_POSTGRES_DIR"),
            url: value("AWAKEN_TEST_POSTGRES_URL"),
        })
    }

    /// A fast restart: every connection is cut off.
    fn restart(&self) {
        let out = postgres_script(&["restart", &self.dir]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = postgres_script(&["stop", &self.dir]);
    }
}

#[test]
fn postgresql_restarted_under_load_loses_nothing() {
    const RUNS: usize = 300;
    if postgres_url("the PostgreSQL restart test").is_none() {
        return;
    }
    let Some(cluster) = PrivateCluster::start() else {
        return;
    };
    let started = Instant::now();
    let dir = temp_dir("fleet-restart");
    let agents = [looper(&dir)];
    let (front, front_err, addr) = front_end(&cluster.url, &agents);
    let workers: Vec<_> = (0..2).map(|_| worker(&cluster.url, &agents, &[])).collect();

    let threads: Vec<String> = (0..RUNS).map(|i| format!("restart-{i:03}")).collect();
    let posts: Vec<_> = threads
        .iter()
        .map(|thread| post_in_background(&addr, thread, None))
        .collect();
    // Every run queued (or started), some finished: the restart cuts into the others.
    wait_until("every run queued", PATIENCE, || {
        count(
            &cluster.url,
            "SELECT count(*) FROM (SELECT thread_id FROM run_queue \
             UNION SELECT thread_id FROM runs) AS t",
        ) == RUNS as i64
    });
    let finished = "SELECT count(*) FROM runs WHERE status = 'done'";
    wait_until("some runs finished", PATIENCE, || {
        count(&cluster.url, finished) >= 10
    });
    let done = count(&cluster.url, finished);
    assert!(done < RUNS as i64, "every run finished before the restart");
    cluster.restart();
    note(
        &format!("restarted with {done} of {RUNS} runs done"),
        started.elapsed(),
    );
    let errors: Vec<String> = posts
        .into_iter()
        .filter_map(|p| p.join().expect("the post's thread").err())
        .collect();
    assert_none("the runs posted", &errors);
    // A run cut short by the restart is continued by a resumed activation.
    let cut_short = AtomicUsize::new(0);
    let errors = errors_of(&threads, 8, |thread| {
        let activations = check_loop_thread(&addr, thread, Activations::Resumed)?;
        if activations > 1 {
            cut_short.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    });
    assert_none("the stored threads", &errors);
    let cut_short = cut_short.into_inner();
    assert!(cut_short > 0, "the restart cut no run short");
    assert_eq!(
        count(
            &cluster.url,
            "SELECT (SELECT count(*) FROM run_queue) + (SELECT count(*) FROM run_queue_dead)"
        ),
        0,
        "jobs left queued or dead-lettered"
    );
    let reports: Vec<Report> = workers
        .into_iter()
        .map(|(process, stderr)| stop_worker(process, stderr))
        .collect();
    assert!(
        reports.iter().all(|r| r.dead == 0),
        "no job dead-lettered: {reports:?}"
    );
    stop_front_end(front, front_err);
    note(
        &format!("the restart test ({cut_short} runs cut short and resumed; {reports:?})"),
        started.elapsed(),
    );
    drop(cluster);
    let _ = std::fs::remove_dir_all(dir);
}
