//! The SQLite store's rows read back after arbitrary damage. Two threads are written once per
//! process through the store (messages and events of every kind, a finished run, a waiting
//! run with its tool batch, run, thread and profile state); each input overwrites a few stored
//! column values (arbitrary text or bytes, another type, another id, or an edit of the stored
//! JSON), reads everything back through the store, and puts the values back.
//!
//! A read never panics (a panic on the store's blocking pool would come back as
//! `StoreError::Task`). It fails with a typed error (`Corrupt`, naming the thread, or the
//! driver's error for a value of the wrong type), or it gives back exactly what
//! was written where nothing was damaged, and what the damaged JSON decodes to where it was;
//! a checkpoint's run is always a run of its thread.

#![no_main]

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use arbitrary::Arbitrary;
use awaken_event::{
    AgentEvent, ContentBlock, Message, ProfileId, ResumeMode, RunId, SuspendTicket,
    TerminationReason, ThreadId, TokenUsage, ToolCall, ToolCallId, ToolResult,
};
use awaken_fuzz::{Json, Text};
use awaken_state::PersistedState;
use awaken_store::{
    Checkpoint, ProfileState, RunRecord, RunStatus, SqliteConfig, SqliteStore, StoreError,
    StoredEvent, ThreadCommit, ThreadStore, ThreadSummary, Timestamp,
};
use awaken_tool::{ToolBatch, pending_call};
use libfuzzer_sys::fuzz_target;
use rusqlite::types::{Value as SqlValue, ValueRef};
use serde_json::{Value, json};

/// A stored column the damage may reach: its table, its name, the columns that key a row, and
/// how its value is read back.
struct Column {
    table: &'static str,
    name: &'static str,
    keys: &'static [&'static str],
    json: Option<JsonKind>,
}

/// What a JSON column holds.
#[derive(Clone, Copy, Debug, PartialEq)]
enum JsonKind {
    Message,
    Event,
    Termination,
    Usage,
    Batch,
    Value,
}

#[rustfmt::skip]
const COLUMNS: &[Column] = &[
    Column { table: "messages", name: "body", keys: &["thread_id", "idx"], json: Some(JsonKind::Message) },
    Column { table: "events", name: "body", keys: &["thread_id", "seq"], json: Some(JsonKind::Event) },
    Column { table: "events", name: "run_id", keys: &["thread_id", "seq"], json: None },
    Column { table: "runs", name: "termination", keys: &["run_id"], json: Some(JsonKind::Termination) },
    Column { table: "runs", name: "usage", keys: &["run_id"], json: Some(JsonKind::Usage) },
    Column { table: "runs", name: "batch", keys: &["run_id"], json: Some(JsonKind::Batch) },
    Column { table: "runs", name: "status", keys: &["run_id"], json: None },
    Column { table: "runs", name: "run_id", keys: &["run_id"], json: None },
    Column { table: "runs", name: "thread_id", keys: &["run_id"], json: None },
    Column { table: "runs", name: "parent_run_id", keys: &["run_id"], json: None },
    Column { table: "runs", name: "profile_id", keys: &["run_id"], json: None },
    Column { table: "runs", name: "steps", keys: &["run_id"], json: None },
    Column { table: "runs", name: "created_at", keys: &["run_id"], json: None },
    Column { table: "runs", name: "state_revision", keys: &["run_id"], json: None },
    Column { table: "run_state", name: "value", keys: &["run_id", "key"], json: Some(JsonKind::Value) },
    Column { table: "thread_state", name: "value", keys: &["thread_id", "key"], json: Some(JsonKind::Value) },
    Column { table: "profile_state", name: "value", keys: &["profile_id", "key"], json: Some(JsonKind::Value) },
    Column { table: "profile_state", name: "version", keys: &["profile_id", "key"], json: None },
    Column { table: "threads", name: "latest_run_id", keys: &["thread_id"], json: None },
    Column { table: "threads", name: "state_revision", keys: &["thread_id"], json: None },
    Column { table: "threads", name: "event_count", keys: &["thread_id"], json: None },
    Column { table: "threads", name: "message_count", keys: &["thread_id"], json: None },
];

#[derive(Debug, Arbitrary)]
struct Damage {
    column: u8,
    row: u8,
    value: NewValue,
}

#[derive(Debug, Arbitrary)]
enum NewValue {
    Text(String),
    Bytes(Vec<u8>),
    /// Text that is not UTF-8 stored as text.
    BadText(Vec<u8>),
    Null,
    Integer(i64),
    Real(f64),
    /// An id of the store (another run, another thread, one that is not stored).
    Id(u8),
    /// The stored JSON, edited.
    Edit(Vec<Edit>),
    /// The stored text, cut short.
    Cut(u16),
}

/// An edit at the value the path leads to (each step picks an element or a key by position).
#[derive(Debug, Arbitrary)]
struct Edit {
    path: Vec<u8>,
    op: EditOp,
}

#[derive(Debug, Arbitrary)]
enum EditOp {
    Replace(Json),
    Remove,
    Insert(Text, Json),
}

const IDS: &[&str] = &["r0", "r1", "r2", "t1", "t2", "p1", "missing", ""];

/// The written store, the connection that damages it, and what it gave back before.
struct Fixture {
    runtime: tokio::runtime::Runtime,
    store: SqliteStore,
    conn: Mutex<rusqlite::Connection>,
    /// Per column of [`COLUMNS`]: every row's key values and stored value.
    rows: Vec<Vec<(Vec<SqlValue>, SqlValue)>>,
    reads: Reads,
    _dir: tempfile::TempDir,
}

/// Everything the store gives back of the threads.
#[derive(Debug, Clone, PartialEq)]
struct Reads {
    checkpoint: Result<Option<Checkpoint>, String>,
    other: Result<Option<Checkpoint>, String>,
    events: Result<Vec<StoredEvent>, String>,
    runs: Result<Vec<RunRecord>, String>,
    latest: Result<Option<RunRecord>, String>,
    run: Result<Option<RunRecord>, String>,
    profile: Result<ProfileState, String>,
    threads: Result<Vec<ThreadSummary>, String>,
}

fn tid(s: &str) -> ThreadId {
    ThreadId::new(s).expect("valid")
}

fn rid(s: &str) -> RunId {
    RunId::new(s).expect("valid")
}

fn call_id(s: &str) -> ToolCallId {
    ToolCallId::new(s).expect("valid")
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("awaken.db");
        let store = runtime.block_on(async {
            let store = SqliteStore::open(SqliteConfig::file(&path))
                .await
                .expect("the store opens");
            for commit in commits() {
                store.commit(&commit).await.expect("the commit is written");
            }
            store
        });
        let conn = rusqlite::Connection::open(&path).expect("a second connection");
        let rows = COLUMNS
            .iter()
            .map(|c| {
                let keys = c.keys.join(", ");
                let mut stmt = conn
                    .prepare(&format!(
                        "SELECT {keys}, {} FROM {} ORDER BY {keys}",
                        c.name, c.table
                    ))
                    .expect("a select");
                stmt.query_map([], |r| {
                    let mut key = Vec::new();
                    for i in 0..c.keys.len() {
                        key.push(r.get::<_, SqlValue>(i)?);
                    }
                    Ok((key, r.get::<_, SqlValue>(c.keys.len())?))
                })
                .expect("the rows")
                .collect::<Result<Vec<_>, _>>()
                .expect("the rows read")
            })
            .collect();
        let reads = runtime.block_on(read_all(&store));
        for (what, ok) in [
            ("checkpoint", reads.checkpoint.is_ok()),
            ("events", reads.events.is_ok()),
            ("runs", reads.runs.is_ok()),
            ("profile", reads.profile.is_ok()),
            ("threads", reads.threads.is_ok()),
        ] {
            assert!(ok, "the undamaged {what} reads back: {reads:?}");
        }
        Fixture {
            runtime,
            store,
            conn: Mutex::new(conn),
            rows,
            reads,
            _dir: dir,
        }
    })
}

fuzz_target!(|damage: Vec<Damage>| {
    let f = fixture();
    let conn = f.conn.lock().unwrap_or_else(|e| e.into_inner());
    // (column, row) damaged, and the value each now holds.
    let mut damaged: Vec<(usize, usize, SqlValue)> = Vec::new();
    for d in damage.iter().take(3) {
        let c = usize::from(d.column) % COLUMNS.len();
        let rows = &f.rows[c];
        if rows.is_empty() {
            continue;
        }
        let r = usize::from(d.row) % rows.len();
        let (mut value, mut as_text) = new_value(&d.value, &rows[r].1);
        let column = &COLUMNS[c];
        let key_at = column.keys.iter().position(|k| *k == column.name);
        if key_at.is_some() {
            // A key stays text, so that the row is found again by it.
            value = SqlValue::Text(match value {
                SqlValue::Text(t) => t,
                SqlValue::Integer(i) => i.to_string(),
                other => format!("{other:?}"),
            });
            as_text = false;
        }
        // (A row whose key an earlier damage changed is not found: nothing changes.)
        if set(&conn, c, &rows[r].0, &value, as_text).is_ok_and(|n| n == 1) {
            // What the column holds now (its type affinity may have converted the value).
            let mut key = rows[r].0.clone();
            if let Some(i) = key_at {
                key[i] = value.clone();
            }
            damaged.push((c, r, get(&conn, c, &key).expect("the damaged value reads")));
        }
    }
    let latest: Option<String> = conn
        .query_row(
            "SELECT latest_run_id FROM threads WHERE thread_id = 't1'",
            [],
            |r| r.get(0),
        )
        .ok()
        .flatten();
    let reads = f.runtime.block_on(read_all(&f.store));
    check(f, &damaged, latest.as_deref(), &reads);
    for (c, r, now) in damaged.iter().rev() {
        let (key, value) = &f.rows[*c][*r];
        // A damaged key column is found by its damaged value.
        let mut key = key.clone();
        let column = &COLUMNS[*c];
        if let Some(i) = column.keys.iter().position(|k| *k == column.name) {
            key[i] = now.clone();
        }
        let restored = set(&conn, *c, &key, value, false).expect("the value is put back");
        assert_eq!(restored, 1, "the damaged row is found again");
    }
});

fn filter(column: &Column) -> String {
    let filter: Vec<String> = column
        .keys
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{k} = ?{}", i + 2))
        .collect();
    filter.join(" AND ")
}

fn get(conn: &rusqlite::Connection, c: usize, key: &[SqlValue]) -> rusqlite::Result<SqlValue> {
    let column = &COLUMNS[c];
    // `?1` is not used: the key's parameters are numbered as `set` numbers them.
    let sql = format!(
        "SELECT {} FROM {} WHERE ?1 IS NULL AND {}",
        column.name,
        column.table,
        filter(column)
    );
    let mut params: Vec<&dyn rusqlite::ToSql> = vec![&SqlValue::Null];
    params.extend(key.iter().map(|k| k as &dyn rusqlite::ToSql));
    conn.query_row(&sql, params.as_slice(), |r| {
        // Text that is not UTF-8 is not text to the store (`types::Value` would panic on it).
        Ok(match r.get_ref(0)? {
            ValueRef::Text(t) => match std::str::from_utf8(t) {
                Ok(t) => SqlValue::Text(t.to_owned()),
                Err(_) => SqlValue::Blob(t.to_vec()),
            },
            other => other.into(),
        })
    })
}

fn set(
    conn: &rusqlite::Connection,
    c: usize,
    key: &[SqlValue],
    value: &SqlValue,
    as_text: bool,
) -> rusqlite::Result<usize> {
    let column = &COLUMNS[c];
    let new = if as_text { "CAST(?1 AS TEXT)" } else { "?1" };
    let sql = format!(
        "UPDATE {} SET {} = {new} WHERE {}",
        column.table,
        column.name,
        filter(column)
    );
    let mut params: Vec<&dyn rusqlite::ToSql> = vec![value];
    params.extend(key.iter().map(|k| k as &dyn rusqlite::ToSql));
    conn.execute(&sql, params.as_slice())
}

/// The value to store, and whether to store it as text whatever it holds.
fn new_value(v: &NewValue, stored: &SqlValue) -> (SqlValue, bool) {
    let text = match stored {
        SqlValue::Text(t) => t.clone(),
        _ => String::new(),
    };
    let value = match v {
        NewValue::Text(t) => SqlValue::Text(t.clone()),
        NewValue::Bytes(b) => SqlValue::Blob(b.clone()),
        NewValue::BadText(b) => return (SqlValue::Blob(b.clone()), true),
        NewValue::Null => SqlValue::Null,
        NewValue::Integer(i) => SqlValue::Integer(*i),
        NewValue::Real(r) => SqlValue::Real(*r),
        NewValue::Id(i) => SqlValue::Text(IDS[usize::from(*i) % IDS.len()].to_owned()),
        NewValue::Cut(n) => {
            let mut end = usize::from(*n).min(text.len());
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            SqlValue::Text(text[..end].to_owned())
        }
        NewValue::Edit(edits) => match serde_json::from_str::<Value>(&text) {
            Ok(mut value) => {
                for e in edits.iter().take(4) {
                    edit(&mut value, &e.path, &e.op);
                }
                SqlValue::Text(value.to_string())
            }
            Err(_) => SqlValue::Text(text),
        },
    };
    (value, false)
}

fn edit(value: &mut Value, path: &[u8], op: &EditOp) {
    let Some((&step, rest)) = path.split_first() else {
        if let EditOp::Replace(v) = op {
            *value = v.get();
        }
        return;
    };
    match value {
        Value::Array(items) if !items.is_empty() => {
            let i = usize::from(step) % items.len();
            match (rest.is_empty(), op) {
                (true, EditOp::Remove) => {
                    items.remove(i);
                }
                (true, EditOp::Insert(_, v)) => items.insert(i, v.get()),
                _ => edit(&mut items[i], rest, op),
            }
        }
        Value::Object(map) if !map.is_empty() => {
            let key = map
                .keys()
                .nth(usize::from(step) % map.len())
                .cloned()
                .unwrap_or_default();
            match (rest.is_empty(), op) {
                (true, EditOp::Remove) => {
                    map.remove(&key);
                }
                (true, EditOp::Insert(k, v)) => {
                    map.insert(k.get(), v.get());
                }
                _ => {
                    if let Some(v) = map.get_mut(&key) {
                        edit(v, rest, op);
                    }
                }
            }
        }
        _ => {
            if let EditOp::Replace(v) = op {
                *value = v.get();
            }
        }
    }
}

async fn read_all(store: &SqliteStore) -> Reads {
    let t1 = tid("t1");
    let text = |e: StoreError| typed(&e);
    Reads {
        checkpoint: store.load_checkpoint(&t1).await.map_err(text),
        other: store.load_checkpoint(&tid("t2")).await.map_err(text),
        events: store.load_events(&t1, 0).await.map_err(text),
        runs: store.list_runs(&t1).await.map_err(text),
        latest: store.latest_run(&t1).await.map_err(text),
        run: store.load_run(&t1, &rid("r1")).await.map_err(text),
        profile: store
            .load_profile(&ProfileId::new("p1").expect("valid"))
            .await
            .map_err(text),
        threads: store.list_threads().await.map_err(text),
    }
}

/// The error as text, after checking that it is one a damaged row may give: `Corrupt`, or the
/// driver's error about a value of the wrong type. A panic inside the store's blocking task
/// comes back as `Task`, and fails here.
fn typed(e: &StoreError) -> String {
    match e {
        StoreError::Corrupt { .. } => format!("corrupt: {e}"),
        StoreError::Sqlite {
            source:
                rusqlite::Error::InvalidColumnType(..)
                | rusqlite::Error::FromSqlConversionFailure(..)
                | rusqlite::Error::IntegralValueOutOfRange(..),
            ..
        } => format!("sqlite: {e}"),
        other => panic!("a damaged row gave an error of the wrong kind: {other:?}"),
    }
}

/// Whether damage to row `r` of column `c` may change what `read` gives back.
fn reaches(c: usize, r: usize, rows: &[Vec<(Vec<SqlValue>, SqlValue)>], read: &str) -> bool {
    let column = &COLUMNS[c];
    let key = match rows[c][r].0.first() {
        Some(SqlValue::Text(k)) => k.as_str(),
        _ => "",
    };
    let of_t2 = key == "t2" || key == "r2";
    match read {
        "checkpoint" => {
            column.table != "events"
                && (!of_t2
                    || column.table == "profile_state"
                    || (column.table == "runs" && matches!(column.name, "run_id" | "thread_id")))
        }
        "other" => of_t2 || column.table == "profile_state",
        "events" => column.table == "events" && !of_t2,
        "runs" => column.table == "runs",
        "latest" => matches!(column.table, "threads" | "runs"),
        "run" => column.table == "runs",
        "profile" => column.table == "profile_state",
        _ => column.table == "threads",
    }
}

fn check(f: &Fixture, damaged: &[(usize, usize, SqlValue)], latest: Option<&str>, reads: &Reads) {
    let was = &f.reads;
    // Reads no damage reaches give back what they gave before.
    let reached = |read: &str| {
        damaged
            .iter()
            .any(|(c, r, _)| reaches(*c, *r, &f.rows, read))
    };
    macro_rules! unchanged {
        ($($read:ident: $message:literal),* $(,)?) => {$(
            if !reached(stringify!($read)) {
                assert_eq!(reads.$read, was.$read, $message);
            }
        )*};
    }
    unchanged!(
        checkpoint: "undamaged rows of t1 read back differently",
        other: "undamaged rows of t2 read back differently",
        events: "undamaged events read back differently",
        runs: "undamaged runs read back differently",
        latest: "an undamaged latest run reads back differently",
        run: "an undamaged run reads back differently",
        profile: "an undamaged profile reads back differently",
        threads: "undamaged threads read back differently",
    );
    // Errors about a thread's damaged data name the thread.
    for (what, result) in [
        ("checkpoint", reads.checkpoint.as_ref().err()),
        ("events", reads.events.as_ref().err()),
        ("runs", reads.runs.as_ref().err()),
        ("run", reads.run.as_ref().err()),
    ] {
        if let Some(e) = result
            && e.starts_with("corrupt")
        {
            assert!(
                e.contains("of thread t1"),
                "the {what} error does not name thread t1: {e}"
            );
        }
    }
    // The latest run read alone is the checkpoint's, which reads all that it reads and more.
    if let Ok(cp) = &reads.checkpoint {
        let run = cp.as_ref().and_then(|cp| cp.run.clone());
        assert_eq!(
            reads.latest,
            Ok(run),
            "the latest run read alone is not the checkpoint's"
        );
    }
    // A run read by its id is the one the thread's list holds, which reads all it reads.
    if let Ok(runs) = &reads.runs {
        let listed = runs.iter().find(|r| r.run_id.as_str() == "r1").cloned();
        assert_eq!(
            reads.run,
            Ok(listed),
            "run r1 read by its id is not the listed one"
        );
    }
    // A checkpoint holds its thread's latest run, with that run's batch.
    if let Ok(Some(cp)) = &reads.checkpoint {
        match &cp.run {
            Some(run) => assert!(
                ["r0", "r1"].contains(&run.run_id.as_str()),
                "thread t1's checkpoint holds run {} of another thread",
                run.run_id
            ),
            None => {
                assert!(cp.batch.is_none(), "a batch without a run");
                if let Some(latest) = latest {
                    panic!("thread t1's latest run {latest:?} is not stored, yet t1 reads back");
                }
            }
        }
    }
    // A damaged JSON value that was accepted is what that JSON decodes to.
    if let [(c, r, value)] = damaged {
        let column = &COLUMNS[*c];
        if let Some(kind) = column.json {
            let decoded = match value {
                SqlValue::Text(t) => decode(kind, t),
                SqlValue::Null => Ok(None),
                _ => Err(()),
            };
            accepted_as_decoded(column, kind, &f.rows[*c][*r].0, decoded, reads);
        }
    }
}

/// The JSON text `t` decoded as the column's kind (`Ok(None)`: a JSON kind's null).
fn decode(kind: JsonKind, t: &str) -> Result<Option<String>, ()> {
    fn show<T: std::fmt::Debug>(r: serde_json::Result<T>) -> Result<Option<String>, ()> {
        r.map(|v| Some(format!("{v:?}"))).map_err(|_| ())
    }
    match kind {
        JsonKind::Message => show(stored::<Message>(t)),
        JsonKind::Event => show(stored::<AgentEvent>(t)),
        JsonKind::Termination => show(serde_json::from_str::<TerminationReason>(t)),
        JsonKind::Usage => show(serde_json::from_str::<TokenUsage>(t)),
        JsonKind::Batch => show(stored::<ToolBatch>(t)),
        JsonKind::Value => show(stored::<Value>(t)),
    }
}

/// How deep the stores read stored messages, events, batches and values back.
const STORED_DEPTH: usize = 512;

/// `t` parsed as the stores read those columns: no deeper than [`STORED_DEPTH`] (brackets in
/// strings do not count), without `serde_json`'s own limit of 128.
fn stored<T: serde::de::DeserializeOwned>(t: &str) -> serde_json::Result<T> {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in t.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if deepest > STORED_DEPTH {
        return Err(serde::de::Error::custom("nested too deep"));
    }
    let mut de = serde_json::Deserializer::from_str(t);
    de.disable_recursion_limit();
    let value = T::deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// When the read holding a damaged JSON value succeeded, the value it holds is the damaged
/// JSON decoded; when that JSON does not decode, the read failed.
fn accepted_as_decoded(
    column: &Column,
    kind: JsonKind,
    key: &[SqlValue],
    decoded: Result<Option<String>, ()>,
    reads: &Reads,
) {
    let text = |v: &SqlValue| match v {
        SqlValue::Text(t) => t.clone(),
        SqlValue::Integer(i) => i.to_string(),
        _ => String::new(),
    };
    let (thread_or_run, second) = (text(&key[0]), key.get(1).map(text));
    let got: Option<Result<Option<String>, String>> = match (column.table, kind) {
        ("messages", _) if thread_or_run == "t1" => reads
            .checkpoint
            .as_ref()
            .map(|cp| {
                let i: usize = second
                    .as_deref()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(usize::MAX);
                cp.as_ref()
                    .and_then(|cp| cp.messages.get(i))
                    .map(|m| format!("{m:?}"))
            })
            .map_err(Clone::clone)
            .into(),
        ("events", _) if thread_or_run == "t1" => reads
            .events
            .as_ref()
            .map(|events| {
                let seq: u64 = second
                    .as_deref()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(u64::MAX);
                events
                    .iter()
                    .find(|e| e.seq == seq)
                    .map(|e| format!("{:?}", e.event))
            })
            .map_err(Clone::clone)
            .into(),
        ("thread_state", _) if thread_or_run == "t1" => reads
            .checkpoint
            .as_ref()
            .map(|cp| {
                cp.as_ref()
                    .and_then(|cp| value_of(&cp.thread_state, second.as_deref()))
            })
            .map_err(Clone::clone)
            .into(),
        ("profile_state", _) => reads
            .profile
            .as_ref()
            .map(|p| {
                second
                    .as_deref()
                    .and_then(|k| p.keys.get(k))
                    .map(|e| format!("{:?}", e.value))
            })
            .map_err(Clone::clone)
            .into(),
        ("run_state", _) if thread_or_run == "r1" => reads
            .checkpoint
            .as_ref()
            .map(|cp| {
                cp.as_ref()
                    .and_then(|cp| value_of(&cp.run_state, second.as_deref()))
            })
            .map_err(Clone::clone)
            .into(),
        ("runs", JsonKind::Batch) if thread_or_run == "r1" => reads
            .checkpoint
            .as_ref()
            .map(|cp| {
                cp.as_ref()
                    .and_then(|cp| cp.batch.as_ref())
                    .map(|b| format!("{b:?}"))
            })
            .map_err(Clone::clone)
            .into(),
        ("runs", JsonKind::Termination | JsonKind::Usage) if thread_or_run != "r2" => reads
            .runs
            .as_ref()
            .map(|runs| {
                runs.iter()
                    .find(|r| r.run_id.as_str() == thread_or_run)
                    .and_then(|r| {
                        if kind == JsonKind::Usage {
                            Some(format!("{:?}", r.usage))
                        } else {
                            r.termination.as_ref().map(|t| format!("{t:?}"))
                        }
                    })
            })
            .map_err(Clone::clone)
            .into(),
        _ => None,
    };
    let Some(got) = got else { return };
    match (decoded, got) {
        (Ok(expected), Ok(got)) => assert_eq!(
            got, expected,
            "damaged {}.{} was accepted as another value than its JSON",
            column.table, column.name
        ),
        (Err(()), Ok(got)) => panic!(
            "damaged {}.{} that does not decode was accepted: {got:?}",
            column.table, column.name
        ),
        _ => {}
    }
}

fn value_of(state: &PersistedState, key: Option<&str>) -> Option<String> {
    key.and_then(|k| state.values.get(k))
        .map(|v| format!("{v:?}"))
}

/// Thread t1: run r0 done with every kind of message and event, then run r1 waiting on a
/// suspended call of its batch, with run, thread and profile state; thread t2: run r2 waiting.
fn commits() -> Vec<ThreadCommit> {
    let usage = TokenUsage {
        input_tokens: 7,
        output_tokens: 3,
        cached_input_tokens: 2,
        reasoning_tokens: 1,
    };
    let mut r0 = RunRecord::new(rid("r0"), "agent", Timestamp::from_unix_millis(1_000));
    r0.status = RunStatus::Done;
    r0.termination = Some(TerminationReason::stopped("max_rounds", "5"));
    r0.steps = 2;
    r0.usage = usage;
    r0.spec_digest = "sha256:spec".into();
    let arguments =
        json!({"q": "héllo \"x\"", "n": -42, "f": 0.1, "nested": {"a": [1, {"b": null}]}});
    let messages = vec![
        Message::system("be brief"),
        Message::user("look"),
        Message {
            role: awaken_event::Role::Assistant,
            content: std::sync::Arc::new([
                ContentBlock::Reasoning {
                    text: "thinking".into(),
                },
                ContentBlock::text("calling"),
                ContentBlock::Incomplete,
            ]),
            tool_calls: std::sync::Arc::new([
                ToolCall::new(call_id("c1"), "search", arguments.clone()),
                ToolCall::from_raw_arguments(call_id("c2"), "search", "{not json"),
            ]),
            tool_call_id: None,
        },
        Message::tool(call_id("c1"), &ToolResult::success(arguments.clone())),
        Message::tool(call_id("c2"), &ToolResult::error("bad arguments")),
        Message::assistant("done"),
    ];
    let events = vec![
        AgentEvent::RunStart {
            thread_id: tid("t1"),
            run_id: rid("r0"),
            agent_id: "agent".into(),
            parent_run_id: None,
            resumed: false,
        },
        AgentEvent::StepStart { step: 1 },
        AgentEvent::ToolCallStart {
            call_id: call_id("c1"),
            name: "search".into(),
        },
        AgentEvent::ToolCallReady {
            call_id: call_id("c1"),
            name: "search".into(),
            arguments: std::sync::Arc::new(arguments.clone()),
        },
        AgentEvent::ToolCallDone {
            call_id: call_id("c1"),
            result: std::sync::Arc::new(ToolResult::success(json!("ok"))),
            state: awaken_event::ToolCallState::Succeeded,
        },
        AgentEvent::InferenceComplete {
            model: "m".into(),
            usage,
            duration_ms: 12,
            stop_reason: awaken_event::StopReason::MaxTokens,
        },
        AgentEvent::StepEnd { step: 1 },
        AgentEvent::RunFinish {
            thread_id: tid("t1"),
            run_id: rid("r0"),
            termination: Box::new(TerminationReason::stopped("max_rounds", "5")),
            response: Some("done".into()),
            usage: Box::new(usage),
        },
    ];
    let first = ThreadCommit::new(tid("t1"), r0, 0)
        .with_messages(messages)
        .with_events(events)
        .with_thread_state(PersistedState {
            revision: 1,
            values: BTreeMap::from([
                ("memory.notes".to_owned(), json!(["a", 1.5, {"k": null}])),
                ("memory.count".to_owned(), json!(3)),
            ]),
        });

    let waiting = |run: &str, thread: &str, expected: u64, profile: bool| {
        let mut record = RunRecord::new(rid(run), "agent", Timestamp::from_unix_millis(2_000));
        record.status = RunStatus::Waiting;
        record.termination = Some(TerminationReason::Suspended);
        record.steps = 1;
        record.profile_id = Some(ProfileId::new("p1").expect("valid"));
        record.parent_run_id = Some(rid("r0"));
        let call = ToolCall::new(call_id("c9"), "pay", json!({"amount": 3}));
        let mut batch = ToolBatch::new([call.clone()]).expect("one call");
        batch
            .suspend(
                &call_id("c9"),
                SuspendTicket {
                    suspension_id: "c9:0".into(),
                    call: pending_call(&call),
                    message: "pay?".into(),
                    response_schema: Some(json!({"type": "string"})),
                    resume_mode: ResumeMode::Replay,
                },
            )
            .expect("suspends");
        let commit = ThreadCommit::new(tid(thread), record, expected)
            .with_messages([
                Message::user("pay 3"),
                Message::assistant_with_calls("", vec![call]),
            ])
            .with_batch(batch)
            .with_run_state(PersistedState {
                revision: 2,
                values: BTreeMap::from([("loop.round".to_owned(), json!(1))]),
            });
        let commit = if profile {
            commit.with_profile_state(
                PersistedState {
                    revision: 1,
                    values: BTreeMap::from([("prefs.tone".to_owned(), json!({"formal": true}))]),
                },
                BTreeMap::from([("prefs.tone".to_owned(), 0)]),
            )
        } else {
            commit
        };
        commit.with_events([
            AgentEvent::RunStart {
                thread_id: tid(thread),
                run_id: rid(run),
                agent_id: "agent".into(),
                parent_run_id: Some(rid("r0")),
                resumed: false,
            },
            AgentEvent::StepStart { step: 1 },
            AgentEvent::ToolCallStart {
                call_id: call_id("c9"),
                name: "pay".into(),
            },
        ])
    };
    vec![
        first,
        waiting("r1", "t1", 6, true),
        waiting("r2", "t2", 0, false),
    ]
}
