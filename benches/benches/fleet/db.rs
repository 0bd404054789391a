//! The benchmark's database: created for the program (or the URL's own), the connections of
//! its workloads told apart by their application name, the transactions and CPU time the server
//! spends on them.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_postgres::{Client, NoTls};

/// The database the program creates for its workloads.
const DATABASE: &str = "awaken_bench_fleet";

/// The `application_name` of every connection a workload opens (the control connection has
/// none): how the program knows when they have all closed.
const APP: &str = "awaken_bench_fleet";

/// The database the workloads run in, and a control connection outside it.
pub(crate) struct BenchDb {
    /// On the URL's own database: creates and drops the benchmark's, reads its statistics and
    /// its connections.
    ctl: Client,
    /// The benchmark's database.
    name: String,
    /// Whether the program created it (and drops it at the end).
    own: bool,
    /// The workloads' connection string: the benchmark's database, application [`APP`].
    pub(crate) url: String,
}

impl BenchDb {
    /// Creates the benchmark's database (dropping one an interrupted run left), or falls back
    /// to the URL's own when that is not allowed.
    pub(crate) async fn open(url: &str) -> Self {
        let ctl = connect(url).await;
        // Two statements: neither may run inside a transaction block.
        let mut created = ctl
            .batch_execute(&format!("DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
            .await;
        if created.is_ok() {
            created = ctl
                .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
                .await;
        }
        let (name, own) = match created {
            Ok(()) => (DATABASE.to_owned(), true),
            Err(e) => {
                let row = ctl
                    .query_one("SELECT current_database()", &[])
                    .await
                    .unwrap_or_else(|e| panic!("the current database: {}", pg_error(&e)));
                let name: String = row.try_get(0).unwrap_or_else(|e| panic!("{e}"));
                println!(
                    "  (cannot create the database {DATABASE}: {}; running in {name}, where the \
                     transaction count includes any other client's)",
                    pg_error(&e)
                );
                (name, false)
            }
        };
        let url = if own {
            with_params(url, &[("dbname", &name), ("application_name", APP)])
        } else {
            with_params(url, &[("application_name", APP)])
        };
        Self {
            ctl,
            name,
            own,
            url,
        }
    }

    /// Runs `sql` on a connection of its own to the benchmark's database, closed afterwards.
    pub(crate) async fn exec(&self, sql: &str) {
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls)
            .await
            .unwrap_or_else(|e| panic!("connecting to the benchmark's database: {}", pg_error(&e)));
        let driver = tokio::spawn(connection);
        client
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {}", pg_error(&e)));
        drop(client);
        let _ = driver.await;
    }

    /// Waits until every connection a workload opened has closed. A server process adds its
    /// transactions to the database's statistics when it exits (a live one only every second
    /// or so), so [`BenchDb::commits`] is complete after this.
    pub(crate) async fn settle(&self) {
        loop {
            let row = self
                .ctl
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                    &[&APP],
                )
                .await
                .unwrap_or_else(|e| panic!("reading pg_stat_activity: {}", pg_error(&e)));
            let open: i64 = row.try_get(0).unwrap_or_else(|e| panic!("{e}"));
            if open == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The CPU time so far of the server process of each connection a workload has open, in ns
    /// by process id (`/proc/<pid>/schedstat`); empty when the server runs on another machine.
    pub(crate) async fn server_cpu_ns(&self) -> BTreeMap<i32, u64> {
        let rows = self
            .ctl
            .query(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
                &[&APP],
            )
            .await
            .unwrap_or_else(|e| panic!("reading pg_stat_activity: {}", pg_error(&e)));
        rows.iter()
            .filter_map(|row| row.try_get::<_, i32>(0).ok())
            .filter_map(|pid| Some((pid, schedstat_ns(&format!("/proc/{pid}/schedstat"))?)))
            .collect()
    }

    /// Transactions committed in the benchmark's database so far.
    pub(crate) async fn commits(&self) -> u64 {
        let row = self
            .ctl
            .query_one(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = $1",
                &[&self.name],
            )
            .await
            .unwrap_or_else(|e| panic!("reading pg_stat_database: {}", pg_error(&e)));
        let n: i64 = row.try_get(0).unwrap_or_else(|e| panic!("{e}"));
        u64::try_from(n).unwrap_or(0)
    }

    /// Drops the benchmark's database, if the program created it.
    pub(crate) async fn close(self) {
        if !self.own {
            return;
        }
        let dropped = self
            .ctl
            .batch_execute(&format!("DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
            .await;
        if let Err(e) = dropped {
            println!("  (cannot drop the database {DATABASE}: {})", pg_error(&e));
        }
    }
}

/// The URL, `None` (the figures skipped) when it is not set and not required.
pub(crate) fn postgres_url() -> Option<String> {
    match std::env::var("AWAKEN_TEST_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            let required = std::env::var("AWAKEN_REQUIRE_POSTGRES").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "AWAKEN_REQUIRE_POSTGRES=1 but AWAKEN_TEST_POSTGRES_URL is not set"
            );
            println!(
                "fleet: AWAKEN_TEST_POSTGRES_URL is not set, so the PostgreSQL figures are \
                 skipped; run `eval \"$(bash .ci/postgres.sh start)\"` first to include them"
            );
            None
        }
    }
}

/// `url` with `params` added: as query parameters of a `postgresql://` URL, as `key=value`
/// pairs of a libpq-style string. Either way a later `dbname` wins over the URL's own.
fn with_params(url: &str, params: &[(&str, &str)]) -> String {
    let mut out = url.trim().to_owned();
    let is_url = out.starts_with("postgres://") || out.starts_with("postgresql://");
    for (key, value) in params {
        if !is_url {
            out.push(' ');
        } else if out.contains('?') {
            out.push('&');
        } else {
            out.push('?');
        }
        out.push_str(&format!("{key}={value}"));
    }
    out
}

/// The CPU time the server processes of `after` spent since `before` (a process absent from
/// `before` since it started), in ns.
pub(crate) fn cpu_since(before: &BTreeMap<i32, u64>, after: &BTreeMap<i32, u64>) -> u64 {
    after
        .iter()
        .map(|(pid, ns)| ns.saturating_sub(before.get(pid).copied().unwrap_or(0)))
        .sum()
}

/// The CPU time so far of this process's threads, in ns (0 where it cannot be read).
pub(crate) fn own_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| schedstat_ns(&task.ok()?.path().join("schedstat").to_string_lossy()))
        .sum()
}

/// The first field of a `schedstat` file: time spent on a CPU, in ns.
fn schedstat_ns(path: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What the server said, when it said something; the driver's error otherwise.
pub(crate) fn pg_error(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), |db| db.message().to_owned())
}

/// A connection to `url`, its driver on the current runtime.
pub(crate) async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to PostgreSQL: {}", pg_error(&e)));
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}
