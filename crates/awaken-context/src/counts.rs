//! Per-message token counts, cached for a run: a step costs work proportional to the messages
//! that are new since the previous call, not to the length of the history.
//!
//! The cache relies on what the loop guarantees: within a thread the history is append-only,
//! and what follows it in a request (context messages of the step) changes from step to step.
//! So a new slice is compared with the previous one backwards from the end of the shorter: the
//! first index where the two hold equal messages ends the changed tail, and everything before
//! it is taken as unchanged. In the usual step that is one comparison, then only the new
//! messages are estimated. A slice that shares nothing is recounted from scratch.

use std::collections::HashMap;

use awaken_event::{Message, Role, ToolCallId};

use crate::estimate::TokenEstimator;

/// Counts of one run's messages, with prefix sums and the places a history may be cut.
pub(crate) struct Counts {
    /// The messages the counts describe: a copy kept up to date one new message at a time, so
    /// the cache never holds the run's history buffer (which the run then appends to in place).
    seen: Vec<Message>,
    /// Raw tokens per message.
    tokens: Vec<u64>,
    /// `prefix[i]` = tokens of messages `0..i` (one longer than `tokens`).
    prefix: Vec<u64>,
    /// `cut[i]`: the kept part of a request may start at message `i` (no tool call before `i`
    /// waits for a result at or after `i`).
    cut: Vec<bool>,
    /// Whether message `i` has tool calls or answers one (rolling it back rebuilds `pending`).
    tool_related: Vec<bool>,
    /// Indices of user messages, in order.
    users: Vec<usize>,
    /// Calls not answered yet, with the index of the message that made them.
    pending: HashMap<ToolCallId, usize>,
}

impl Default for Counts {
    fn default() -> Self {
        Self {
            seen: Vec::new(),
            tokens: Vec::new(),
            prefix: vec![0],
            cut: Vec::new(),
            tool_related: Vec::new(),
            users: Vec::new(),
            pending: HashMap::new(),
        }
    }
}

impl Counts {
    /// Brings the counts in line with `messages`.
    pub(crate) fn sync(&mut self, messages: &[Message], estimator: &dyn TokenEstimator) {
        let common = common_prefix(&self.seen, messages);
        self.truncate(common);
        for message in &messages[common..] {
            self.push(message, estimator);
            self.seen.push(message.clone());
        }
    }

    /// Number of messages counted.
    pub(crate) fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Raw tokens of message `i`.
    pub(crate) fn tokens(&self, i: usize) -> u64 {
        self.tokens[i]
    }

    /// Raw tokens of messages `from..to`.
    pub(crate) fn range(&self, from: usize, to: usize) -> u64 {
        self.prefix[to] - self.prefix[from]
    }

    /// Whether a request's kept messages may start at `i`.
    pub(crate) fn is_cut(&self, i: usize) -> bool {
        self.cut[i]
    }

    /// The first cut at or after `i` (below `len`).
    pub(crate) fn next_cut(&self, i: usize) -> Option<usize> {
        (i..self.len()).find(|&j| self.cut[j])
    }

    /// The last cut at or after `from`, i.e. the start of the newest unit.
    pub(crate) fn last_cut(&self, from: usize) -> Option<usize> {
        (from..self.len()).rev().find(|&j| self.cut[j])
    }

    /// The latest user message.
    pub(crate) fn latest_user(&self) -> Option<usize> {
        self.users.last().copied()
    }

    /// The smallest index `i` in `lo..=hi` for which `fits(i)` holds, where `fits` is monotone
    /// (false … false true … true); `None` when it never holds.
    pub(crate) fn first_fitting(
        &self,
        lo: usize,
        hi: usize,
        fits: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        if lo > hi || !fits(hi) {
            return None;
        }
        let (mut lo, mut hi) = (lo, hi);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Some(lo)
    }

    fn push(&mut self, message: &Message, estimator: &dyn TokenEstimator) {
        let i = self.tokens.len();
        let tokens = estimator.message_tokens(message);
        self.cut.push(self.pending.is_empty());
        self.tokens.push(tokens);
        let total = self.prefix[i].saturating_add(tokens);
        self.prefix.push(total);
        let related = self.track_calls(message, i);
        self.tool_related.push(related);
        if message.role == Role::User {
            self.users.push(i);
        }
    }

    /// Updates `pending` for message `i`; whether the message has calls or answers one.
    fn track_calls(&mut self, message: &Message, i: usize) -> bool {
        if let Some(id) = &message.tool_call_id {
            self.pending.remove(id);
        }
        for call in message.tool_calls.iter() {
            self.pending.insert(call.id.clone(), i);
        }
        message.tool_call_id.is_some() || !message.tool_calls.is_empty()
    }

    fn truncate(&mut self, len: usize) {
        if len >= self.tokens.len() {
            return;
        }
        let rebuild = self.tool_related[len..].iter().any(|r| *r);
        self.tokens.truncate(len);
        self.prefix.truncate(len + 1);
        self.cut.truncate(len);
        self.tool_related.truncate(len);
        while self.users.last().is_some_and(|&u| u >= len) {
            self.users.pop();
        }
        let seen = std::mem::take(&mut self.seen);
        if rebuild {
            self.pending.clear();
            for (i, message) in seen[..len].iter().enumerate() {
                self.track_calls(message, i);
            }
        }
        self.seen = seen;
        self.seen.truncate(len);
    }
}

/// How many leading messages `new` shares with `old`, assuming both are the same append-only
/// history followed by tails that may differ.
fn common_prefix(old: &[Message], new: &[Message]) -> usize {
    let shorter = old.len().min(new.len());
    (0..shorter)
        .rev()
        .find(|&i| old[i] == new[i])
        .map_or(0, |i| i + 1)
}
