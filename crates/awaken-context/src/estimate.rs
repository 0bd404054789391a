//! Token accounting: the [`TokenEstimator`] trait, the documented default heuristic, and the
//! calibration that corrects estimates by the usage providers report.

use std::io::Write;

use awaken_event::{ContentBlock, Message, ToolDescriptor};
use awaken_state::{StateError, StateKey};
use serde::{Deserialize, Serialize};

/// Estimates how many tokens the parts of a request take.
///
/// Called on the run's task, from a request transform and from pure phase hooks, so it must be
/// deterministic (the same input always gives the same count: counts are cached per message)
/// and cheap (no IO). It may be called more than once for the same message. The estimate need
/// not be exact: the context transform multiplies it by a ratio learnt from the prompt tokens
/// the provider reports (see [`Calibration`]).
pub trait TokenEstimator: Send + Sync + 'static {
    /// Tokens of one message as sent: its content, its tool calls (name and arguments), and
    /// whatever the provider adds per message.
    fn message_tokens(&self, message: &Message) -> u64;

    /// Tokens of one tool's schema as sent: name, description and parameter schema.
    fn tool_tokens(&self, tool: &ToolDescriptor) -> u64;

    /// Tokens of the system prompt.
    fn system_prompt_tokens(&self, prompt: &str) -> u64;

    /// Tokens every request costs whatever it holds (default 0).
    fn request_overhead(&self) -> u64 {
        0
    }
}

/// The default estimator: a heuristic close to BPE tokenizers on English text and code, meant to
/// be corrected by [`Calibration`] once the provider reports usage.
///
/// - text: one token per 4 ASCII bytes (rounded up) plus one token per non-ASCII character
///   (CJK text runs close to one token per character; accented Latin letters are
///   over-counted, which errs on the safe side);
/// - JSON (a structured block, tool-call arguments, a tool's parameter schema): the text rule
///   over its compact serialization;
/// - an image: a flat [`DefaultEstimator::IMAGE_TOKENS`];
/// - each message: [`DefaultEstimator::MESSAGE_OVERHEAD`] for the role and separators, each
///   tool call [`DefaultEstimator::TOOL_CALL_OVERHEAD`] plus its name and arguments, a tool
///   result its call id;
/// - each tool schema: [`DefaultEstimator::TOOL_OVERHEAD`] plus name, description and schema;
/// - each request: [`DefaultEstimator::REQUEST_OVERHEAD`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultEstimator;

impl DefaultEstimator {
    /// Tokens added per message (role, separators).
    pub const MESSAGE_OVERHEAD: u64 = 4;
    /// Tokens added per tool call (id, type, framing).
    pub const TOOL_CALL_OVERHEAD: u64 = 8;
    /// Tokens added per tool schema (framing).
    pub const TOOL_OVERHEAD: u64 = 8;
    /// Tokens counted for an image block (a high-detail 512×512 tile's cost at OpenAI).
    pub const IMAGE_TOKENS: u64 = 765;
    /// Tokens added per request (priming of the reply).
    pub const REQUEST_OVERHEAD: u64 = 3;
}

impl TokenEstimator for DefaultEstimator {
    fn message_tokens(&self, message: &Message) -> u64 {
        let mut tokens = Self::MESSAGE_OVERHEAD;
        for block in message.content.iter() {
            tokens += match block {
                ContentBlock::Text { text } | ContentBlock::Reasoning { text } => text_tokens(text),
                ContentBlock::Json { value } => json_tokens(value),
                ContentBlock::Image { .. } => Self::IMAGE_TOKENS,
                // A block kind added later: count its JSON form.
                other => json_tokens(&serde_json::to_value(other).unwrap_or_default()),
            };
        }
        for call in message.tool_calls.iter() {
            tokens += Self::TOOL_CALL_OVERHEAD + text_tokens(&call.name);
            tokens += match &call.invalid_arguments {
                Some(raw) => text_tokens(raw),
                None => json_tokens(&call.arguments),
            };
        }
        if let Some(id) = &message.tool_call_id {
            tokens += text_tokens(id.as_str());
        }
        tokens
    }

    fn tool_tokens(&self, tool: &ToolDescriptor) -> u64 {
        Self::TOOL_OVERHEAD
            + text_tokens(&tool.name)
            + text_tokens(&tool.description)
            + json_tokens(&tool.parameters)
    }

    fn system_prompt_tokens(&self, prompt: &str) -> u64 {
        Self::MESSAGE_OVERHEAD + text_tokens(prompt)
    }

    fn request_overhead(&self) -> u64 {
        Self::REQUEST_OVERHEAD
    }
}

/// The default estimator's text rule: ⌈ASCII bytes / 4⌉ + non-ASCII characters.
pub fn text_tokens(text: &str) -> u64 {
    let mut counter = ByteCounter::default();
    counter.add(text.as_bytes());
    counter.tokens()
}

/// The default estimator's JSON rule: the text rule over the compact serialization (counted
/// without building the string).
pub fn json_tokens(value: &serde_json::Value) -> u64 {
    let mut counter = ByteCounter::default();
    // Writing to a counter cannot fail; a value that cannot serialize counts as empty.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.tokens()
}

#[derive(Default)]
struct ByteCounter {
    ascii: u64,
    non_ascii_chars: u64,
}

impl ByteCounter {
    fn add(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b < 0x80 {
                self.ascii += 1;
            } else if b >= 0xC0 {
                // The first byte of a multi-byte UTF-8 character.
                self.non_ascii_chars += 1;
            }
        }
    }

    fn tokens(&self) -> u64 {
        self.ascii.div_ceil(4) + self.non_ascii_chars
    }
}

impl Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.add(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The ratio between the prompt tokens providers reported and what the estimator predicted
/// for the same requests, kept per thread ([`CalibrationKey`]).
///
/// Each sample's ratio is clamped to [`Calibration::MIN_RATIO`]..=[`Calibration::MAX_RATIO`]
/// (a provider that reports nonsense cannot make the budget meaningless); the first sample
/// sets the ratio, later ones move it by an exponential moving average with weight
/// [`Calibration::WEIGHT`], so a single odd response does not swing it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Reported ÷ estimated (1 until the first sample).
    pub ratio: f64,
    /// Samples taken.
    pub samples: u64,
}

impl Default for Calibration {
    fn default() -> Self {
        Self {
            ratio: 1.0,
            samples: 0,
        }
    }
}

impl Calibration {
    /// The smallest ratio a sample may have.
    pub const MIN_RATIO: f64 = 0.25;
    /// The largest ratio a sample may have.
    pub const MAX_RATIO: f64 = 4.0;
    /// How much a new sample moves the ratio.
    pub const WEIGHT: f64 = 0.3;

    /// Takes one sample (ignored when either side is 0).
    pub fn observe(&mut self, sample: UsageSample) {
        if sample.estimated == 0 || sample.reported == 0 {
            return;
        }
        let ratio = (sample.reported as f64 / sample.estimated as f64)
            .clamp(Self::MIN_RATIO, Self::MAX_RATIO);
        self.ratio = if self.samples == 0 {
            ratio
        } else {
            self.ratio * (1.0 - Self::WEIGHT) + ratio * Self::WEIGHT
        };
        self.samples = self.samples.saturating_add(1);
    }

    /// The corrected count of a raw estimate: ⌈raw × ratio⌉.
    pub fn correct(&self, raw: u64) -> u64 {
        if self.ratio == 1.0 {
            return raw;
        }
        (raw as f64 * self.ratio).ceil() as u64
    }

    /// The largest raw estimate whose corrected count is at most `budget`.
    pub fn raw_budget(&self, budget: u64) -> u64 {
        if self.ratio == 1.0 {
            return budget;
        }
        let mut raw = (budget as f64 / self.ratio).floor() as u64;
        // Floating point may land one off either way.
        while raw > 0 && self.correct(raw) > budget {
            raw -= 1;
        }
        while self.correct(raw + 1) <= budget {
            raw += 1;
        }
        raw
    }
}

/// One inference's reported prompt tokens beside the estimate of the request that was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageSample {
    /// The raw estimate of the request as sent.
    pub estimated: u64,
    /// The prompt (input) tokens the provider reported.
    pub reported: u64,
}

/// The state key of [`Calibration`] (`Thread` scope: a thread keeps its correction across
/// runs). Written by the context-transform plugin's `AfterInference` hook.
pub struct CalibrationKey;

impl StateKey for CalibrationKey {
    const KEY: &'static str = "awaken.context.calibration";
    type Value = Calibration;
    type Update = UsageSample;

    fn apply(value: &mut Calibration, update: UsageSample) -> Result<(), StateError> {
        value.observe(update);
        Ok(())
    }
}
