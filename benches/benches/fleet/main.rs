//! The fleet benchmark: loop-5 runs queued in PostgreSQL and driven by two
//! `awaken_server::Worker`s, the rate of one-row transactions the database itself reaches on
//! this machine, how soon a worker continues the run of one that died, and one step's commit
//! on the PostgreSQL store beside SQLite's (what each figure measures and its target:
//! `docs/performance.md`).
//!
//! Needs `AWAKEN_TEST_POSTGRES_URL` (`eval "$(bash .ci/postgres.sh start)"`); without it the
//! program prints that its figures are skipped and writes none, unless
//! `AWAKEN_REQUIRE_POSTGRES=1` makes that a failure. It works in a database of its own,
//! `awaken_bench_fleet` (created, and dropped at the end; the URL's own database when it may
//! not create one), so that the transactions the server counts there are the workloads' own,
//! and runs each workload in a schema of its own, dropped afterwards (`db.rs`: that database,
//! its connections told apart, the counts and CPU time read from the server).
//!
//! Writes a JSON array of `{"name", "value", "unit"}` to `$AWAKEN_BENCH_EXTRA_DIR/fleet.json`
//! (and prints it). `AWAKEN_BENCH_QUICK=1` runs every workload briefly;
//! `AWAKEN_BENCH_ONLY=<prefix>` only the workloads of the figures whose names start with it.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a benchmark program reports on stdout

mod db;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use awaken_benches::step_commit::{COMMITS_PER_THREAD, StepState, nth_step_commit};
use awaken_benches::{LoopModel, agent_builder, loop_runtime, loop_spec, nearest_rank};
use awaken_event::{Message, Role, ThreadId};
use awaken_llm::{InferenceRequest, LlmEventStream, LlmExecutor};
use awaken_server::{Worker, WorkerConfig, WorkerReport};
use awaken_store::{
    Enqueued, NewJob, PostgresConfig, PostgresStore, RunQueue, RunStatus, SqliteConfig,
    SqliteStore, ThreadCommit, ThreadStore, Timestamp,
};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio_postgres::Client;

use crate::db::{BenchDb, connect, cpu_since, own_cpu_ns, pg_error, postgres_url};

/// The longest any phase of the program may take; past it the program fails instead of hanging.
const GUARD: Duration = Duration::from_secs(300);

/// Workers in the queued workload.
const WORKERS: usize = 2;

/// Jobs each worker drives at once, and the connections of its store's pool (`awaken worker`'s
/// default concurrency, and the pool it sizes for it).
const CONCURRENCY: usize = 16;

/// The queued workload's lease (`awaken worker`'s default).
const LEASE: Duration = Duration::from_secs(15);

/// The takeover workload's lease.
const TAKEOVER_LEASE: Duration = Duration::from_secs(2);

/// Steps of a queued run (the loop-5 agent).
const STEPS: usize = 5;

fn main() {
    let quick = std::env::var("AWAKEN_BENCH_QUICK").is_ok_and(|v| v == "1");
    let scale = |full: usize, small: usize| if quick { small } else { full };
    let only = std::env::var("AWAKEN_BENCH_ONLY").unwrap_or_default();
    let want = |name: &str| name.starts_with(only.as_str());
    let Some(url) = postgres_url() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut figures: Vec<Value> = Vec::new();
    let mut add = |name: &str, value: f64, unit: &str| {
        println!("{name:<44} {value:>12.2} {unit}");
        figures.push(json!({"name": name, "value": value, "unit": unit}));
    };
    let db = rt.block_on(guarded(
        "opening the benchmark's database",
        BenchDb::open(&url),
    ));

    let mut limit = None;
    if want("fleet/pg_commits_per_s_limit") || want("fleet/queued_runs_per_s_of_limit") {
        let period = Duration::from_secs(if quick { 1 } else { 5 });
        let connections = WORKERS * CONCURRENCY;
        let rate = rt.block_on(guarded(
            "the commit limit",
            commit_limit(&db, connections, period),
        ));
        add("fleet/pg_commits_per_s_limit", rate, "commits/s");
        limit = Some(rate);
    }

    let queued_figures = [
        "fleet/queued_runs_per_s",
        "fleet/transactions_per_run",
        "fleet/queued_runs_per_s_of_limit",
        "fleet/claim_to_start_p99_ms",
    ];
    if queued_figures.iter().any(|n| want(n)) {
        let queued = rt.block_on(guarded(
            "the queued runs",
            queued_runs(&db, scale(2000, 200)),
        ));
        add("fleet/queued_runs_per_s", queued.runs_per_s, "runs/s");
        add(
            "fleet/transactions_per_run",
            queued.transactions_per_run,
            "transactions",
        );
        if let Some(limit) = limit {
            let used = queued.runs_per_s * queued.transactions_per_run;
            add("fleet/queued_runs_per_s_of_limit", used / limit, "ratio");
            println!(
                "  (the limit allows {:.0} runs/s at {:.1} transactions per run)",
                limit / queued.transactions_per_run,
                queued.transactions_per_run
            );
        }
        add(
            "fleet/claim_to_start_p99_ms",
            percentile(&queued.claim_to_start_ms, 0.99),
            "ms",
        );
    }

    if want("fleet/takeover_after_lease_s") {
        let mut secs = rt.block_on(guarded("the takeovers", takeovers(&db, scale(7, 3))));
        secs.sort_by(f64::total_cmp);
        add("fleet/takeover_after_lease_s", secs[secs.len() / 2], "s");
    }

    if want("store/postgres_commit_step_us") || want("store/sqlite_commit_step_us") {
        let (postgres, sqlite) = commit_steps(&rt, &db, scale(3000, 300));
        add("store/postgres_commit_step_us", postgres, "us");
        add("store/sqlite_commit_step_us", sqlite, "us");
    }

    rt.block_on(guarded("dropping the benchmark's database", db.close()));
    if let Some(dir) = std::env::var_os("AWAKEN_BENCH_EXTRA_DIR") {
        let path = std::path::Path::new(&dir).join("fleet.json");
        std::fs::write(
            &path,
            serde_json::to_vec_pretty(&figures).unwrap_or_default(),
        )
        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}

// ---- the workloads ----

/// One-row transactions per second from `connections` connections at once, each inserting one
/// small row per autocommitted statement, over `period`.
async fn commit_limit(db: &BenchDb, connections: usize, period: Duration) -> f64 {
    const SCHEMA: &str = "fleet_limit";
    db.exec(&format!(
        "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}; \
         CREATE TABLE {SCHEMA}.one_row (id BIGSERIAL PRIMARY KEY, conn INTEGER NOT NULL, \
             n BIGINT NOT NULL)"
    ))
    .await;
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections {
        let client = connect(&db.url).await;
        let insert = client
            .prepare(&format!(
                "INSERT INTO {SCHEMA}.one_row (conn, n) VALUES ($1, $2)"
            ))
            .await
            .unwrap_or_else(|e| panic!("preparing the insert: {}", pg_error(&e)));
        clients.push((client, insert));
    }
    let cpu_before = db.server_cpu_ns().await;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, (client, insert))| {
            let stop = stop.clone();
            let conn = i32::try_from(i).unwrap_or(i32::MAX);
            tokio::spawn(async move {
                let mut n = 0i64;
                while !stop.load(Ordering::Relaxed) {
                    client
                        .execute(&insert, &[&conn, &n])
                        .await
                        .unwrap_or_else(|e| panic!("one-row insert: {}", pg_error(&e)));
                    n += 1;
                }
                (client, n)
            })
        })
        .collect();
    tokio::time::sleep(period).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0i64;
    // The connections are kept open until their server processes' CPU time is read.
    let mut open = Vec::with_capacity(connections);
    for task in tasks {
        let (client, n) = task.await.unwrap_or_else(|e| panic!("{e}"));
        total += n;
        open.push(client);
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!("  ({connections} connections: {total} one-row commits in {elapsed:.2} s)");
    let cpu_after = db.server_cpu_ns().await;
    drop(open);
    if !cpu_after.is_empty() {
        let ns = cpu_since(&cpu_before, &cpu_after);
        println!(
            "  (the server processes spent {:.0} us of CPU per one-row commit)",
            ns as f64 / 1e3 / total.max(1) as f64
        );
    }
    db.exec(&format!("DROP SCHEMA {SCHEMA} CASCADE")).await;
    total as f64 / elapsed
}

/// What [`queued_runs`] measured.
struct Queued {
    runs_per_s: f64,
    /// Transactions the database committed for the workers, per run.
    transactions_per_run: f64,
    /// Both workers' claim-to-start latencies, sorted.
    claim_to_start_ms: Vec<u32>,
}

/// `runs` loop-5 runs queued up front, then driven by [`WORKERS`] workers, each with its own
/// runtime, worker id and store pool on one schema; runs per second from the workers' start to
/// the queue found empty, and the transactions the database committed meanwhile.
async fn queued_runs(db: &BenchDb, runs: usize) -> Queued {
    const SCHEMA: &str = "fleet_queue";
    db.exec(&format!("DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        .await;
    let store_config = || {
        PostgresConfig::new(db.url.clone())
            .with_schema(SCHEMA)
            .with_max_connections(CONCURRENCY)
    };
    let thread = |i: usize| ThreadId::new(format!("q{i}")).unwrap_or_else(|e| panic!("{e}"));

    // A front end's part, on connections closed before the count begins: run ids from a
    // runtime's id source, every job queued before the workers start.
    let enqueue_started = Instant::now();
    {
        let front = connect_store(store_config().with_max_connections(4)).await;
        let queue = front.queue();
        let ids = loop_runtime(STEPS);
        let jobs: Vec<NewJob> = (0..runs)
            .map(|i| NewJob::new(thread(i), ids.next_run_id(), "bench", run_payload()))
            .collect();
        futures_util::stream::iter(jobs.iter().map(|job| enqueue(&queue, job)))
            .buffer_unordered(4)
            .collect::<Vec<()>>()
            .await;
    }
    let enqueued = enqueue_started.elapsed().as_secs_f64();
    db.settle().await;
    let before = db.commits().await;

    let finals = Arc::new(Finals {
        asked: AtomicUsize::new(0),
        target: runs,
        all: Notify::new(),
    });
    let mut workers = Vec::with_capacity(WORKERS);
    for w in 0..WORKERS {
        let store = connect_store(store_config()).await;
        // The pool's connections opened and prepared before the clock starts, as the worker
        // does before its first claim.
        store
            .queue()
            .warm_up(CONCURRENCY)
            .await
            .unwrap_or_else(|e| panic!("opening worker {w}'s connections: {e}"));
        let model = CountFinals {
            model: LoopModel { n: STEPS },
            finals: finals.clone(),
        };
        let runtime = agent_builder(Arc::new(model))
            .with_agent_spec(loop_spec(STEPS))
            .with_store(Arc::new(store.clone()))
            .with_worker(format!("fleet-w{w}"), LEASE)
            .build()
            .unwrap_or_else(|e| panic!("worker runtime: {e}"));
        let config = WorkerConfig {
            concurrency: CONCURRENCY,
            ..WorkerConfig::default()
        };
        let worker = Worker::new(runtime, store.queue(), config)
            .unwrap_or_else(|e| panic!("worker {w}: {e}"));
        workers.push(Arc::new(worker));
    }
    let opening = u64::try_from(WORKERS * CONCURRENCY).unwrap_or(0);
    let reader = connect(&db.url).await;

    let cpu_before = (db.server_cpu_ns().await, own_cpu_ns());
    let (stop, stopped) = watch::channel(false);
    let started = Instant::now();
    let tasks: Vec<_> = workers
        .iter()
        .map(|worker| {
            let (worker, mut stopped) = (worker.clone(), stopped.clone());
            tokio::spawn(async move {
                worker
                    .run(async move {
                        let _ = stopped.wait_for(|s| *s).await;
                    })
                    .await
            })
        })
        .collect();
    // Every run has asked for its answer; the queue is empty once their last commits and the
    // jobs' ends are in.
    finals.all.notified().await;
    let mut polls = 0u64;
    loop {
        polls += 1;
        let row = reader
            .query_one(&format!("SELECT count(*) FROM {SCHEMA}.run_queue"), &[])
            .await
            .unwrap_or_else(|e| panic!("reading the queue: {}", pg_error(&e)));
        let left: i64 = row.try_get(0).unwrap_or_else(|e| panic!("{e}"));
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_after = (db.server_cpu_ns().await, own_cpu_ns());
    let _ = stop.send(true);
    let mut total = WorkerReport::default();
    for task in tasks {
        let report = task.await.unwrap_or_else(|e| panic!("{e}"));
        total.completed += report.completed;
        total.retried += report.retried;
        total.dead += report.dead;
        total.released += report.released;
        total.lost += report.lost;
    }
    let mut claim_to_start_ms: Vec<u32> =
        workers.iter().flat_map(|w| w.claim_to_start_ms()).collect();
    claim_to_start_ms.sort_unstable();
    drop((workers, reader));
    db.settle().await;
    let after = db.commits().await;
    let counted = after.saturating_sub(before);
    let transactions = counted.saturating_sub(polls + opening);

    let expected = WorkerReport {
        completed: runs as u64,
        ..WorkerReport::default()
    };
    assert_eq!(total, expected, "the workers' reports over {runs} jobs");
    assert_eq!(
        claim_to_start_ms.len(),
        runs,
        "claim-to-start samples, one per run"
    );
    check_runs(store_config(), runs, thread).await;
    db.exec(&format!("DROP SCHEMA {SCHEMA} CASCADE")).await;

    println!(
        "  ({runs} jobs queued in {enqueued:.2} s; {WORKERS} workers drove them in {elapsed:.2} s)"
    );
    println!(
        "  ({counted} transactions committed, less {polls} reads of the queue's length and \
         {opening} statements setting the pools' connections up: {transactions})"
    );
    let server_cpu = cpu_since(&cpu_before.0, &cpu_after.0) as f64 / 1e9;
    let own_cpu = cpu_after.1.saturating_sub(cpu_before.1) as f64 / 1e9;
    if cpu_after.0.is_empty() {
        println!("  (the server's CPU time cannot be read here: it runs on another machine)");
    } else {
        println!(
            "  (CPU in those {elapsed:.2} s: the workers' server processes {server_cpu:.2} s, \
             {:.2} ms per run, {:.0} us per transaction; this program {own_cpu:.2} s)",
            server_cpu * 1e3 / runs as f64,
            server_cpu * 1e6 / transactions.max(1) as f64
        );
    }
    println!(
        "  (claim to start: p50 {} ms, p90 {} ms, max {} ms)",
        percentile(&claim_to_start_ms, 0.5),
        percentile(&claim_to_start_ms, 0.9),
        percentile(&claim_to_start_ms, 1.0)
    );
    Queued {
        runs_per_s: runs as f64 / elapsed,
        transactions_per_run: transactions as f64 / runs as f64,
        claim_to_start_ms,
    }
}

/// Checks, on a store of its own, that the queue is empty and every thread's one run is done
/// after all its steps.
async fn check_runs(config: PostgresConfig, runs: usize, thread: impl Fn(usize) -> ThreadId) {
    let store = connect_store(config.with_max_connections(4)).await;
    let depth = store
        .queue()
        .depth(Timestamp::now())
        .await
        .unwrap_or_else(|e| panic!("the queue's depth: {e}"));
    assert_eq!(
        (depth.queued, depth.claimed, depth.dead),
        (0, 0, 0),
        "jobs left"
    );
    let store = &store;
    futures_util::stream::iter((0..runs).map(thread))
        .map(|thread| async move {
            let runs = store
                .list_runs(&thread)
                .await
                .unwrap_or_else(|e| panic!("the runs of {thread}: {e}"));
            let ended: Vec<(RunStatus, u32)> = runs.iter().map(|r| (r.status, r.steps)).collect();
            let steps = u32::try_from(STEPS).unwrap_or(u32::MAX);
            assert_eq!(ended, [(RunStatus::Done, steps)], "the runs of {thread}");
        })
        .buffer_unordered(4)
        .collect::<Vec<()>>()
        .await;
}

/// The seconds from killing a worker that holds a run to the run's next step on another
/// worker, once per repetition.
async fn takeovers(db: &BenchDb, repetitions: usize) -> Vec<f64> {
    const SCHEMA: &str = "fleet_takeover";
    db.exec(&format!("DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        .await;
    let config = PostgresConfig::new(db.url.clone())
        .with_schema(SCHEMA)
        .with_max_connections(4);
    // W2's store, through which the jobs are queued as well.
    let store = connect_store(config.clone()).await;
    let reader = connect(&db.url).await;
    let mut secs = Vec::with_capacity(repetitions);
    for rep in 0..repetitions {
        secs.push(takeover(&config, &store, &reader, rep, SCHEMA).await);
    }
    drop((store, reader));
    db.exec(&format!("DROP SCHEMA {SCHEMA} CASCADE")).await;
    secs
}

/// One takeover: worker W1, on a tokio runtime of its own, claims a job and waits in its run's
/// model; W2 starts; W1's runtime is shut down, which drops every task on it (the worker's
/// loop, the run, the heartbeats of the job's and the run's leases, its connections) without
/// running them to an end. The seconds until W2's model is asked for the run's next step.
async fn takeover(
    config: &PostgresConfig,
    store: &PostgresStore,
    reader: &Client,
    rep: usize,
    schema: &str,
) -> f64 {
    let thread = ThreadId::new(format!("k{rep}")).unwrap_or_else(|e| panic!("{e}"));
    let w1_id = format!("fleet-w1-{rep}");
    let w1_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("fleet-w1")
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let (held, mut holding) = mpsc::unbounded_channel();
    let (w1_config, w1_worker) = (config.clone(), w1_id.clone());
    w1_rt.spawn(async move {
        let store = connect_store(w1_config).await;
        let runtime = agent_builder(Arc::new(HeldModel { held }))
            .with_agent_spec(loop_spec(1))
            .with_store(Arc::new(store.clone()))
            .with_worker(w1_worker, TAKEOVER_LEASE)
            .build()
            .unwrap_or_else(|e| panic!("W1's runtime: {e}"));
        let worker = Worker::new(runtime, store.queue(), WorkerConfig::default())
            .unwrap_or_else(|e| panic!("W1: {e}"));
        worker.run(std::future::pending()).await
    });

    let (stamp, mut stamps) = mpsc::unbounded_channel();
    let w2_id = format!("fleet-w2-{rep}");
    let w2_runtime = agent_builder(Arc::new(Stamped {
        model: LoopModel { n: 1 },
        stamps: stamp,
    }))
    .with_agent_spec(loop_spec(1))
    .with_store(Arc::new(store.clone()))
    .with_worker(w2_id.clone(), TAKEOVER_LEASE)
    .build()
    .unwrap_or_else(|e| panic!("W2's runtime: {e}"));
    let run_id = w2_runtime.next_run_id();
    let job = NewJob::new(thread.clone(), run_id.clone(), "bench", run_payload());
    enqueue(&store.queue(), &job).await;
    guarded("W1's claim", holding.recv())
        .await
        .unwrap_or_else(|| panic!("W1 stopped before its model was asked"));

    let w2 = Arc::new(
        Worker::new(w2_runtime, store.queue(), WorkerConfig::default())
            .unwrap_or_else(|e| panic!("W2: {e}")),
    );
    let (stop, stopped) = oneshot::channel::<()>();
    let w2_task = {
        let w2 = w2.clone();
        tokio::spawn(async move {
            w2.run(async move {
                let _ = stopped.await;
            })
            .await
        })
    };

    let killed = Instant::now();
    let killed_ms = Timestamp::now().as_unix_millis();
    w1_rt.shutdown_background();
    let job_lease = lease(reader, schema, "run_queue", "thread_id", thread.as_str()).await;
    let run_lease = lease(reader, schema, "runs", "run_id", run_id.as_str()).await;
    for (what, (owner, _)) in [("job", &job_lease), ("run", &run_lease)] {
        assert_eq!(
            owner.as_deref(),
            Some(w1_id.as_str()),
            "the {what}'s lease at W1's kill"
        );
    }
    // Were the leases still renewed, W2 would never step the run.
    let patience = TAKEOVER_LEASE * 10;
    let (stepped, stepped_ms) = tokio::time::timeout(patience, stamps.recv())
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("W2 did not continue the run within {patience:?} of W1's kill"));
    let expired = job_lease.1.max(run_lease.1);
    assert!(
        stepped_ms >= expired,
        "W2 stepped the run at {stepped_ms} ms, before the leases W1 held at its kill expired \
         ({expired} ms): they were given up, not left to expire"
    );
    let _ = stop.send(());
    let report = w2_task.await.unwrap_or_else(|e| panic!("{e}"));
    let expected = WorkerReport {
        completed: 1,
        ..WorkerReport::default()
    };
    assert_eq!(report, expected, "W2's report");
    let runs = store
        .list_runs(&thread)
        .await
        .unwrap_or_else(|e| panic!("the runs of {thread}: {e}"));
    let ended: Vec<RunStatus> = runs.iter().map(|r| r.status).collect();
    assert_eq!(ended, [RunStatus::Done], "the runs of {thread}");

    let secs = (stepped - killed).as_secs_f64();
    println!(
        "  (takeover {rep}: {secs:.3} s; the leases had {:.3} s left at the kill; W2's claim to start {:?} ms)",
        (expired - killed_ms) as f64 / 1e3,
        w2.claim_to_start_ms()
    );
    secs
}

/// A lease's holder and expiry (ms) read from `table`'s row whose `key` is `value`.
async fn lease(
    reader: &Client,
    schema: &str,
    table: &str,
    key: &str,
    value: &str,
) -> (Option<String>, i64) {
    let row = reader
        .query_one(
            &format!("SELECT lease_owner, lease_expires_at FROM {schema}.{table} WHERE {key} = $1"),
            &[&value],
        )
        .await
        .unwrap_or_else(|e| panic!("the lease in {table}: {}", pg_error(&e)));
    let owner: Option<String> = row.try_get(0).unwrap_or_else(|e| panic!("{e}"));
    let expires: Option<i64> = row.try_get(1).unwrap_or_else(|e| panic!("{e}"));
    (owner, expires.unwrap_or(0))
}

/// µs per step commit on the PostgreSQL store and on a SQLite file, measured the same way one
/// after the other on a current-thread runtime: the median of five windows.
fn commit_steps(rt: &tokio::runtime::Runtime, db: &BenchDb, commits: usize) -> (f64, f64) {
    const SCHEMA: &str = "fleet_commit";
    rt.block_on(db.exec(&format!("DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")));
    let local = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let state = StepState::typed();
    let postgres = local.block_on(connect_store(
        PostgresConfig::new(db.url.clone())
            .with_schema(SCHEMA)
            .with_max_connections(1),
    ));
    let cpu_before = rt.block_on(db.server_cpu_ns());
    let postgres_us = local.block_on(guarded(
        "the PostgreSQL commits",
        commit_windows(&postgres, "postgres", commits, &state),
    ));
    let cpu_after = rt.block_on(db.server_cpu_ns());
    if !cpu_after.is_empty() {
        let ns = cpu_since(&cpu_before, &cpu_after);
        let all = commits / 5 * 5 + COMMITS_PER_THREAD as usize;
        println!(
            "  (the server process spent {:.0} us of CPU per PostgreSQL commit)",
            ns as f64 / 1e3 / all as f64
        );
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let sqlite = local
        .block_on(SqliteStore::open(SqliteConfig::file(
            dir.path().join("step.db"),
        )))
        .unwrap_or_else(|e| panic!("open sqlite: {e}"));
    let sqlite_us = local.block_on(guarded(
        "the SQLite commits",
        commit_windows(&sqlite, "sqlite", commits, &state),
    ));
    drop((postgres, sqlite, local));
    rt.block_on(db.exec(&format!("DROP SCHEMA {SCHEMA} CASCADE")));
    (postgres_us, sqlite_us)
}

/// After one thread's commits to warm up, `commits` step commits in five windows, each built
/// before its window's clock starts and dropped inside it (as a runtime lets go of what it
/// committed); the median window's µs per commit.
async fn commit_windows(
    store: &impl ThreadStore,
    prefix: &str,
    commits: usize,
    state: &StepState,
) -> f64 {
    let mut i = 0u64;
    for _ in 0..COMMITS_PER_THREAD {
        store
            .commit(&nth_step_commit(prefix, i, state))
            .await
            .unwrap_or_else(|e| panic!("{prefix} commit: {e}"));
        i += 1;
    }
    let per_window = (commits / 5).max(1);
    let mut windows = Vec::with_capacity(5);
    for _ in 0..5 {
        let batch: Vec<ThreadCommit> = (0..per_window as u64)
            .map(|k| nth_step_commit(prefix, i + k, state))
            .collect();
        i += per_window as u64;
        let started = Instant::now();
        for commit in batch {
            store
                .commit(&commit)
                .await
                .unwrap_or_else(|e| panic!("{prefix} commit: {e}"));
        }
        windows.push(started.elapsed().as_secs_f64() * 1e6 / per_window as f64);
    }
    let shown: Vec<String> = windows.iter().map(|w| format!("{w:.1}")).collect();
    println!("  ({prefix} commit step windows: {} us)", shown.join(", "));
    windows.sort_by(f64::total_cmp);
    windows[2]
}

// ---- the models ----

/// Counts the runs that asked for their last answer; wakes `all` when every one has.
struct Finals {
    asked: AtomicUsize,
    target: usize,
    all: Notify,
}

/// The loop model, counting each run's request for its last answer in [`Finals`].
struct CountFinals {
    model: LoopModel,
    finals: Arc<Finals>,
}

impl LlmExecutor for CountFinals {
    fn name(&self) -> &str {
        self.model.name()
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        let results = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .count();
        if results + 1 >= self.model.n {
            let asked = self.finals.asked.fetch_add(1, Ordering::AcqRel) + 1;
            if asked == self.finals.target {
                self.finals.all.notify_one();
            }
        }
        self.model.execute_stream(request)
    }
}

/// A model that never answers: it says on `held` that it was asked, then waits for good.
struct HeldModel {
    held: mpsc::UnboundedSender<()>,
}

impl LlmExecutor for HeldModel {
    fn name(&self) -> &str {
        "loop-model"
    }

    fn execute_stream(&self, _request: InferenceRequest) -> LlmEventStream {
        let _ = self.held.send(());
        Box::pin(futures_util::stream::pending())
    }
}

/// The loop model, sending the time of every request on `stamps` (monotonic, and wall-clock
/// milliseconds as leases are written).
struct Stamped {
    model: LoopModel,
    stamps: mpsc::UnboundedSender<(Instant, i64)>,
}

impl LlmExecutor for Stamped {
    fn name(&self) -> &str {
        self.model.name()
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        let _ = self
            .stamps
            .send((Instant::now(), Timestamp::now().as_unix_millis()));
        self.model.execute_stream(request)
    }
}

async fn connect_store(config: PostgresConfig) -> PostgresStore {
    PostgresStore::connect(config)
        .await
        .unwrap_or_else(|e| panic!("the PostgreSQL store: {e}"))
}

/// Queues `job`, which must be its thread's only one.
async fn enqueue(queue: &RunQueue, job: &NewJob) {
    match queue.enqueue(job, Timestamp::now()).await {
        Ok(Enqueued::Queued { .. }) => {}
        other => panic!("queueing the job of {}: {other:?}", job.thread_id),
    }
}

/// A queued job's payload for a new run with the message `go` (the form front ends write).
fn run_payload() -> Value {
    json!({"kind": "run", "messages": [Message::user("go")]})
}

/// The `p` quantile of `sorted` (not empty).
fn percentile(sorted: &[u32], p: f64) -> f64 {
    f64::from(nearest_rank(sorted, p).expect("not empty"))
}

/// Awaits `f`, failing the program with `what` when it takes longer than [`GUARD`].
async fn guarded<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(GUARD, f)
        .await
        .unwrap_or_else(|_| panic!("{what} took longer than {GUARD:?}"))
}
