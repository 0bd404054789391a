//! The context plugins' state keys: a thread's compaction and the fixed part of its requests,
//! read by both the compaction hook and the request transform.

use awaken_state::{StateError, StateKey};
use serde::{Deserialize, Serialize};

/// Messages the history must grow by, after the first failed summary, before compaction is
/// tried again; it doubles with each further failure in a row, up to 32 times this.
pub const COMPACTION_RETRY_AFTER_MESSAGES: u64 = 8;

/// A thread's compaction: the summary and the leading messages it stands for, and the record
/// of failed attempts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionState {
    /// The latest summary, standing for messages `0..covers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// How many leading messages the summary stands for (0 without one).
    #[serde(default)]
    pub covers: u64,
    /// Summaries committed so far (each covers a longer prefix than the one before).
    #[serde(default)]
    pub summaries: u64,
    /// Summary calls that failed so far; each was reported and fell back to truncation.
    #[serde(default)]
    pub fallbacks: u64,
    /// Failures since the last success.
    #[serde(default)]
    pub failures_in_a_row: u32,
    /// No new attempt before the history has this many messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<u64>,
    /// The last failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl CompactionState {
    /// The summary and what it covers, when it applies to a history of `len` messages.
    pub fn summary_for(&self, len: usize) -> Option<(usize, &str)> {
        let covers = usize::try_from(self.covers).ok()?;
        match &self.summary {
            Some(text) if covers > 0 && covers <= len => Some((covers, text.as_str())),
            _ => None,
        }
    }
}

/// A change to [`CompactionState`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CompactionUpdate {
    /// A summary of messages `0..to`, made from the summary of `0..from` and messages
    /// `from..to`. Applied only when the state still covers exactly `from`: a range is never
    /// summarised into the state twice.
    Commit {
        /// What the previous summary covered.
        from: u64,
        /// What this one covers.
        to: u64,
        /// The summary.
        text: String,
    },
    /// A summary call failed with a history of `messages` messages.
    FellBack {
        /// The history's length.
        messages: u64,
        /// Why.
        error: String,
    },
}

/// The state key of [`CompactionState`] (`Thread` scope: persisted with the thread and seen
/// by every later run; the messages it stands for stay in the store).
pub struct CompactionKey;

impl StateKey for CompactionKey {
    const KEY: &'static str = "awaken.context.compaction";
    type Value = CompactionState;
    type Update = CompactionUpdate;

    fn apply(value: &mut CompactionState, update: CompactionUpdate) -> Result<(), StateError> {
        match update {
            CompactionUpdate::Commit { from, to, text } => {
                if value.covers == from && to > from {
                    value.summary = Some(text);
                    value.covers = to;
                    value.summaries = value.summaries.saturating_add(1);
                    value.failures_in_a_row = 0;
                    value.retry_at = None;
                }
            }
            CompactionUpdate::FellBack { messages, error } => {
                value.fallbacks = value.fallbacks.saturating_add(1);
                value.failures_in_a_row = value.failures_in_a_row.saturating_add(1);
                let doublings = value.failures_in_a_row.saturating_sub(1).min(5);
                value.retry_at =
                    Some(messages.saturating_add(COMPACTION_RETRY_AFTER_MESSAGES << doublings));
                value.last_error = Some(error);
            }
        }
        Ok(())
    }
}

/// Raw tokens of the last request's overhead, system prompt and tools, kept with the thread
/// (last writer wins).
pub struct FixedTokensKey;

impl StateKey for FixedTokensKey {
    const KEY: &'static str = "awaken.context.fixed_tokens";
    type Value = u64;
    type Update = u64;

    fn apply(value: &mut u64, update: u64) -> Result<(), StateError> {
        *value = update;
        Ok(())
    }
}
