//! Row encoding shared by the SQL stores: ids and JSON as text, times as milliseconds.

use awaken_event::{AgentEvent, Message, ProfileId, RunId, ThreadId};
use awaken_tool::ToolBatch;

use crate::commit::{RunRecord, RunStatus, Timestamp};
use crate::error::StoreError;
use crate::json_depth::nests_within;
use crate::store::ProfileEntry;

/// Column list of a run record, in [`RawRun`]'s order.
pub(crate) const RUN_COLUMNS: &str = "run_id, parent_run_id, agent_id, profile_id, status, \
     termination, steps, usage, spec_digest, created_at, updated_at";

/// A run record's columns as stored.
pub(crate) struct RawRun {
    pub(crate) run_id: String,
    pub(crate) parent_run_id: Option<String>,
    pub(crate) agent_id: String,
    pub(crate) profile_id: Option<String>,
    pub(crate) status: String,
    pub(crate) termination: Option<String>,
    pub(crate) steps: i64,
    pub(crate) usage: String,
    pub(crate) spec_digest: String,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
}

impl RawRun {
    pub(crate) fn decode(self) -> Result<RunRecord, StoreError> {
        let what = "run record";
        Ok(RunRecord {
            run_id: RunId::new(&self.run_id).map_err(|e| StoreError::corrupt(what, e))?,
            parent_run_id: self
                .parent_run_id
                .map(RunId::new)
                .transpose()
                .map_err(|e| StoreError::corrupt(what, e))?,
            agent_id: self.agent_id.into(),
            profile_id: self
                .profile_id
                .map(ProfileId::new)
                .transpose()
                .map_err(|e| StoreError::corrupt(what, e))?,
            status: RunStatus::parse(&self.status)
                .ok_or_else(|| StoreError::corrupt(what, format!("status {:?}", self.status)))?,
            termination: self
                .termination
                .map(|t| serde_json::from_str(&t))
                .transpose()
                .map_err(|e| StoreError::corrupt(what, e))?,
            steps: u32::try_from(self.steps).map_err(|e| StoreError::corrupt(what, e))?,
            usage: serde_json::from_str(&self.usage).map_err(|e| StoreError::corrupt(what, e))?,
            spec_digest: self.spec_digest.into(),
            created_at: Timestamp::from_unix_millis(self.created_at),
            updated_at: Timestamp::from_unix_millis(self.updated_at),
        })
    }
}

/// The JSON columns of a run record.
pub(crate) struct EncodedRun {
    pub(crate) termination: Option<String>,
    pub(crate) usage: String,
}

pub(crate) fn encode_run(run: &RunRecord) -> Result<EncodedRun, StoreError> {
    Ok(EncodedRun {
        termination: run
            .termination
            .as_ref()
            .map(|t| to_json("termination", t))
            .transpose()?,
        usage: to_json("token usage", &run.usage)?,
    })
}

pub(crate) fn to_json<T: serde::Serialize + ?Sized>(
    what: &'static str,
    value: &T,
) -> Result<String, StoreError> {
    let text =
        serde_json::to_string(value).map_err(|source| StoreError::Serialize { what, source })?;
    within_depth(what, text)
}

/// How deep the JSON a SQL store writes and reads back may nest. Deeper than `serde_json`'s
/// default read limit (128): a value parsed at that limit (a model's tool-call arguments) is
/// stored a few levels down, inside a message or an event, and must read back all the same.
const MAX_STORED_DEPTH: usize = 512;

/// A stored JSON text read back as `T`: refused as `Corrupt` when it nests deeper than
/// [`MAX_STORED_DEPTH`] (checked before parsing, so no stored text can exhaust the stack), and
/// parsed without `serde_json`'s lower recursion limit.
fn from_json<T: serde::de::DeserializeOwned>(
    what: &'static str,
    body: &str,
) -> Result<T, StoreError> {
    if !nests_within(body, MAX_STORED_DEPTH) {
        return Err(StoreError::corrupt(
            what,
            format!("JSON nested deeper than {MAX_STORED_DEPTH}"),
        ));
    }
    let mut de = serde_json::Deserializer::from_str(body);
    de.disable_recursion_limit();
    let value = T::deserialize(&mut de).map_err(|e| StoreError::corrupt(what, e))?;
    de.end().map_err(|e| StoreError::corrupt(what, e))?;
    Ok(value)
}

/// A written JSON text, refused when it nests deeper than a read gives back.
fn within_depth(what: &'static str, text: String) -> Result<String, StoreError> {
    if nests_within(&text, MAX_STORED_DEPTH) {
        Ok(text)
    } else {
        Err(StoreError::Serialize {
            what,
            source: serde::ser::Error::custom(format!(
                "JSON nested deeper than {MAX_STORED_DEPTH}"
            )),
        })
    }
}

/// A commit's tool batch as JSON text, for a store that writes it out.
pub(crate) fn batch_text(batch: &ToolBatch) -> Result<String, StoreError> {
    to_json("tool batch", batch)
}

/// A stored tool batch read back: its serde form, with the batch's invariants checked.
pub(crate) fn batch(body: &str) -> Result<ToolBatch, StoreError> {
    from_json("tool batch", body)
}

/// A state value as JSON text, for a store that writes it out.
pub(crate) fn state_text(
    what: &'static str,
    value: &awaken_state::StateValue,
) -> Result<String, StoreError> {
    let text = value
        .to_text()
        .map_err(|source| StoreError::StateValue { what, source })?;
    within_depth(what, text)
}

pub(crate) fn message(body: &str) -> Result<Message, StoreError> {
    from_json("message", body)
}

pub(crate) fn event(body: &str) -> Result<AgentEvent, StoreError> {
    from_json("event", body)
}

pub(crate) fn value(what: &'static str, body: &str) -> Result<serde_json::Value, StoreError> {
    from_json(what, body)
}

pub(crate) fn thread_id(s: &str) -> Result<ThreadId, StoreError> {
    ThreadId::new(s).map_err(|e| StoreError::corrupt("thread id", e))
}

/// A thread names `rid` as its latest run, which is not stored with it: the commit that names
/// a run writes it, so the store is damaged.
pub(crate) fn latest_run_missing(rid: &str) -> StoreError {
    StoreError::corrupt(
        "run record",
        format!("the latest run {rid:?} is not stored"),
    )
}

pub(crate) fn run_id(s: &str) -> Result<RunId, StoreError> {
    RunId::new(s).map_err(|e| StoreError::corrupt("run id", e))
}

/// A stored run status.
pub(crate) fn run_status(s: &str) -> Result<RunStatus, StoreError> {
    RunStatus::parse(s).ok_or_else(|| StoreError::corrupt("run status", format!("{s:?}")))
}

/// A profile key's stored value and version.
pub(crate) fn profile_entry(value: &str, version: i64) -> Result<ProfileEntry, StoreError> {
    Ok(ProfileEntry {
        value: self::value("profile state", value)?,
        version: count("profile key version", version)?,
    })
}

/// A count or version stored as a signed integer.
pub(crate) fn count(what: &'static str, n: i64) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|e| StoreError::corrupt(what, e))
}

/// A count or version to store as a signed integer (saturating: no real count gets near).
pub(crate) fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A claimed run from a `RETURNING thread_id, lease_epoch, <run columns>` row.
pub(crate) fn claimed_run(
    thread_id: &str,
    epoch: i64,
    raw: RawRun,
    worker_id: &str,
    expires_at: Timestamp,
) -> Result<crate::store::ClaimedRun, StoreError> {
    let run = raw.decode()?;
    Ok(crate::store::ClaimedRun {
        thread_id: self::thread_id(thread_id)?,
        lease: crate::commit::LeaseToken {
            run_id: run.run_id.clone(),
            worker_id: worker_id.to_owned(),
            epoch: count("lease epoch", epoch)?,
        },
        run,
        expires_at,
    })
}
