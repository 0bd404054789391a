//! What the two plugins share: the configuration, the estimator and the run's cache, and the
//! planning of what a request keeps.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use awaken_event::{Message, RunId, ToolDescriptor};
use awaken_llm::InferenceRequest;

use crate::config::ContextConfig;
use crate::counts::Counts;
use crate::estimate::TokenEstimator;

/// How the omission marker begins; the whole text is [`omission_marker`]'s.
pub const OMISSION_MARKER_PREFIX: &str = "[Earlier context omitted:";

/// How the summary message begins; the whole text is [`summary_message`]'s.
pub const SUMMARY_PREFIX: &str = "[Summary of the earlier conversation";

/// The system message that tells the model `omitted` messages were left out.
pub fn omission_marker(omitted: usize) -> Message {
    Message::system(format!(
        "{OMISSION_MARKER_PREFIX} {omitted} messages of this conversation are not shown, to fit the context window.]"
    ))
}

/// Whether `message` is an omission marker.
pub fn is_omission_marker(message: &Message) -> bool {
    message.role == awaken_event::Role::System && message.text().starts_with(OMISSION_MARKER_PREFIX)
}

/// The system message that stands for the first `covers` messages of a thread.
pub fn summary_message(covers: usize, text: &str) -> Message {
    Message::system(format!(
        "{SUMMARY_PREFIX}, standing for its first {covers} messages]\n{text}"
    ))
}

/// Whether `message` is a compaction summary.
pub fn is_summary_message(message: &Message) -> bool {
    message.role == awaken_event::Role::System && message.text().starts_with(SUMMARY_PREFIX)
}

pub(crate) struct Core {
    pub(crate) config: ContextConfig,
    pub(crate) estimator: Arc<dyn TokenEstimator>,
    cache: Mutex<Cache>,
}

impl Core {
    pub(crate) fn new(config: ContextConfig, estimator: Arc<dyn TokenEstimator>) -> Self {
        Self {
            config,
            estimator,
            cache: Mutex::new(Cache::default()),
        }
    }

    /// The cache of `run` (emptied when it belonged to another run).
    pub(crate) fn cache(&self, run: &RunId) -> MutexGuard<'_, Cache> {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.run.as_ref() != Some(run) {
            *cache = Cache {
                run: Some(run.clone()),
                ..Cache::default()
            };
        }
        cache
    }
}

/// One run's memo: message counts and the counts of the parts that rarely change.
#[derive(Default)]
pub(crate) struct Cache {
    run: Option<RunId>,
    pub(crate) counts: Counts,
    system: Option<(std::sync::Arc<str>, u64)>,
    tools: Option<(Arc<[ToolDescriptor]>, u64)>,
    summary: Option<(usize, String, u64)>,
    marker_bound: Option<u64>,
    /// Raw tokens of the last request's overhead, system prompt and tools (0 before the
    /// first request): what the compaction hook adds to the history, which is all it sees.
    pub(crate) fixed: u64,
    /// The step and raw estimate of the last request sent, for calibration.
    pub(crate) last_sent: Option<(u32, u64)>,
}

impl Cache {
    /// Raw tokens of what every request of this agent carries besides messages.
    pub(crate) fn fixed_tokens(
        &mut self,
        request: &InferenceRequest,
        estimator: &dyn TokenEstimator,
    ) -> u64 {
        let system = match &request.system_prompt {
            None => 0,
            Some(prompt) => match &self.system {
                // `Arc<str>`'s equality checks the pointer first.
                Some((cached, tokens)) if cached == prompt => *tokens,
                _ => {
                    let tokens = estimator.system_prompt_tokens(prompt);
                    self.system = Some((prompt.clone(), tokens));
                    tokens
                }
            },
        };
        let tools = match &self.tools {
            Some((cached, tokens))
                if Arc::ptr_eq(cached, &request.tools) || **cached == *request.tools =>
            {
                *tokens
            }
            _ => {
                let tokens = request.tools.iter().map(|t| estimator.tool_tokens(t)).sum();
                self.tools = Some((request.tools.clone(), tokens));
                tokens
            }
        };
        self.fixed = estimator.request_overhead() + system + tools;
        self.fixed
    }

    /// Raw tokens of the summary message for `covers` and `text`.
    pub(crate) fn summary_tokens(
        &mut self,
        covers: usize,
        text: &str,
        estimator: &dyn TokenEstimator,
    ) -> u64 {
        match &self.summary {
            Some((c, t, tokens)) if *c == covers && t == text => *tokens,
            _ => {
                let tokens = estimator.message_tokens(&summary_message(covers, text));
                self.summary = Some((covers, text.to_owned(), tokens));
                tokens
            }
        }
    }

    /// An upper bound of the omission marker's raw tokens: the marker's for the largest count.
    pub(crate) fn marker_bound(&mut self, estimator: &dyn TokenEstimator) -> u64 {
        *self
            .marker_bound
            .get_or_insert_with(|| estimator.message_tokens(&omission_marker(usize::MAX)))
    }
}

/// What one request keeps of its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fit {
    /// First message not covered by the summary (a place where a request may start).
    pub(crate) start: usize,
    /// First message kept after dropping (`start` when nothing is dropped).
    pub(crate) cut: usize,
    /// The latest user message, sent ahead of the kept messages when it comes before `cut`.
    pub(crate) pinned_user: Option<usize>,
    /// Messages dropped (neither summarised nor sent).
    pub(crate) omitted: usize,
    /// Raw tokens of the request as planned.
    pub(crate) raw_total: u64,
}

/// The inputs of a plan.
pub(crate) struct PlanInput<'a> {
    pub(crate) counts: &'a Counts,
    /// Leading messages the summary stands for (0 without one).
    pub(crate) covers: usize,
    /// Raw tokens of overhead, system prompt, tools and the summary message.
    pub(crate) base: u64,
    /// The largest raw budget whose corrected count fits.
    pub(crate) raw_budget: u64,
    /// An upper bound of the marker's tokens.
    pub(crate) marker_bound: u64,
    /// May messages be dropped at all (`DropOldest`)?
    pub(crate) may_drop: bool,
    /// Drop in coarse chunks.
    pub(crate) stable: bool,
}

impl PlanInput<'_> {
    fn start(&self) -> usize {
        let n = self.counts.len();
        self.counts.next_cut(self.covers.min(n)).unwrap_or(n)
    }

    /// Raw tokens of the messages a request sends when it keeps `cut..` plus the pinned user
    /// message. Never increases with `cut`.
    fn kept(&self, cut: usize) -> u64 {
        let n = self.counts.len();
        let pinned = match self.counts.latest_user() {
            Some(u) if u < cut => self.counts.tokens(u),
            _ => 0,
        };
        self.counts.range(cut, n) + pinned
    }

    /// What the request keeps, or the raw tokens of the smallest request possible when even
    /// that is over the budget. `marker_tokens(k)` counts the marker for `k` omitted messages.
    pub(crate) fn plan(&self, marker_tokens: impl Fn(usize) -> u64) -> Result<Fit, u64> {
        let counts = self.counts;
        let start = self.start();
        let pinned_user = counts.latest_user();
        let full = self.base + self.kept(start);
        if full <= self.raw_budget {
            return Ok(Fit {
                start,
                cut: start,
                pinned_user,
                omitted: 0,
                raw_total: full,
            });
        }
        // The newest unit (a message, or a call with its results) is always kept.
        let last = counts.last_cut(start).unwrap_or(start);
        if !self.may_drop || last <= start {
            return Err(full);
        }
        let omitted = |cut: usize| {
            let pinned = pinned_user.is_some_and(|u| u >= start && u < cut);
            cut - start - usize::from(pinned)
        };
        let minimum = self.base + marker_tokens(omitted(last)) + self.kept(last);
        if minimum > self.raw_budget {
            return Err(minimum);
        }
        // Plan with the largest marker; the loop below settles with the real one.
        let room = self
            .raw_budget
            .saturating_sub(self.base + self.marker_bound);
        let first = counts
            .first_fitting(start + 1, last, |c| self.kept(c) <= room)
            .unwrap_or(last);
        let mut cut = counts.next_cut(first).unwrap_or(last).min(last);
        if self.stable {
            // Round what is dropped up to a multiple of a quarter of the room: the cut then
            // stays put while the history grows by that much, so the kept prefix is stable.
            let chunk = (room / 4).max(1);
            let target = counts.range(start, cut).div_ceil(chunk) * chunk;
            cut = counts
                .first_fitting(cut, last, |c| counts.range(start, c) >= target)
                .and_then(|c| counts.next_cut(c))
                .unwrap_or(last)
                .min(last);
        }
        loop {
            let omitted = omitted(cut);
            let total = self.base + marker_tokens(omitted) + self.kept(cut);
            if total <= self.raw_budget {
                return Ok(Fit {
                    start,
                    cut,
                    pinned_user,
                    omitted,
                    raw_total: total,
                });
            }
            if cut >= last {
                return Err(total);
            }
            cut = counts.next_cut(cut + 1).unwrap_or(last).min(last);
        }
    }

    /// Where a compaction starting at `covers` should end, when the history passes
    /// `raw_budget`: the first place from which what remains fits `keep` (with `base`), or the
    /// newest unit's start, pulled back so that at most `input` raw tokens are summarised;
    /// `None` when the history is below the threshold or the range would not shrink anything
    /// (`min_gain` tokens or fewer).
    pub(crate) fn compaction_end(&self, keep: u64, input: u64, min_gain: u64) -> Option<usize> {
        let counts = self.counts;
        let n = counts.len();
        let start = counts.next_cut(self.covers.min(n))?;
        let kept = |c: usize| self.kept(c);
        if self.base + kept(start) <= self.raw_budget {
            return None;
        }
        let last = counts.last_cut(start)?;
        if last <= start {
            return None;
        }
        let room = keep.saturating_sub(self.base);
        let mut to = counts
            .first_fitting(start + 1, last, |c| kept(c) <= room)
            .and_then(|c| counts.next_cut(c))
            .unwrap_or(last)
            .min(last);
        if counts.range(self.covers, to) > input {
            // The first end past what one call can read; end at the cut before it.
            let over =
                counts.first_fitting(start + 1, to, |c| counts.range(self.covers, c) > input)?;
            to = (start + 1..over).rev().find(|&c| counts.is_cut(c))?;
        }
        (counts.range(self.covers, to) > min_gain).then_some(to)
    }
}

/// The messages a request sends for `fit`: the summary, the marker, the pinned user message,
/// then the kept messages.
pub(crate) fn assemble(messages: &[Message], fit: &Fit, summary: Option<Message>) -> Vec<Message> {
    let pinned = fit.pinned_user.filter(|&u| u < fit.cut);
    let mut out = Vec::with_capacity(
        messages.len() - fit.cut + 2 + usize::from(pinned.is_some()) + usize::from(fit.omitted > 0),
    );
    out.extend(summary);
    if fit.omitted > 0 {
        out.push(omission_marker(fit.omitted));
    }
    if let Some(u) = pinned {
        out.push(messages[u].clone());
    }
    out.extend(messages[fit.cut..].iter().cloned());
    out
}
