//! Request transforms: the last word on a request before it goes to the model.

use std::sync::Arc;

use awaken_event::TokenUsage;
use awaken_llm::InferenceRequest;
use awaken_phase::RunIdentity;
use awaken_state::Snapshot;

use crate::isolate::catch_panic;

/// Token counts a transform may use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenCounts {
    /// The previous inference's reported usage, if any.
    pub last_usage: Option<TokenUsage>,
    /// The run's usage so far.
    pub run_usage: TokenUsage,
}

/// What a transform sees besides the request: read-only state and run facts.
#[derive(Debug, Clone, Copy)]
pub struct TransformContext<'a> {
    /// The state after `BeforeInference`.
    pub snapshot: &'a Snapshot,
    /// The run.
    pub run: &'a RunIdentity,
    /// The step about to infer.
    pub step: u32,
    /// Token counts.
    pub tokens: TokenCounts,
}

/// Why a transform refused a request. It ends the run with this error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransformError {
    /// Even the smallest request the transform can build does not fit the context budget.
    #[error("the request needs at least {required} tokens but the budget is {budget}")]
    ContextOverflow {
        /// Tokens of the smallest request.
        required: u64,
        /// The budget.
        budget: u64,
    },
    /// Another reason.
    #[error("{reason}")]
    Rejected {
        /// Why.
        reason: String,
    },
    /// The transform panicked; the panic was caught (set by [`apply_transforms`], not by
    /// transforms).
    #[error("panicked: {message}")]
    Panicked {
        /// The panic message.
        message: String,
    },
}

/// Changes an inference request just before it is sent.
///
/// Transforms run in plugin order, each on the previous one's output, once per inference, on
/// the run's task. They may change the system prompt, messages, tools and parameters, and must
/// be deterministic and quick (no IO). An `Err` ends the run with that error, and so does a
/// panic (caught, as [`TransformError::Panicked`]).
pub trait InferenceRequestTransform: Send + Sync + 'static {
    /// The transform's name (for capability bounds, errors and traces).
    fn name(&self) -> &str;

    /// Returns the request to send.
    fn transform(
        &self,
        request: InferenceRequest,
        ctx: &TransformContext<'_>,
    ) -> Result<InferenceRequest, TransformError>;
}

/// A transform as installed, with its plugin.
#[derive(Clone)]
pub struct RegisteredTransform {
    /// The contributing plugin.
    pub plugin_id: Arc<str>,
    /// The transform.
    pub transform: Arc<dyn InferenceRequestTransform>,
}

/// A transform failure, naming the plugin and transform.
#[derive(Debug, thiserror::Error)]
#[error("request transform `{transform}` of plugin `{plugin_id}` failed: {source}")]
pub struct TransformFailure {
    /// The plugin.
    pub plugin_id: String,
    /// The transform.
    pub transform: String,
    /// Its error.
    #[source]
    pub source: TransformError,
}

/// Runs `transforms` in order over `request`.
///
/// # Errors
/// The first transform's error or panic (caught: [`TransformError::Panicked`]), naming the
/// transform and its plugin; the transforms after it do not run.
pub fn apply_transforms(
    transforms: &[RegisteredTransform],
    mut request: InferenceRequest,
    ctx: &TransformContext<'_>,
) -> Result<InferenceRequest, TransformFailure> {
    for t in transforms {
        request = catch_panic(|| t.transform.transform(request, ctx))
            .unwrap_or_else(|message| Err(TransformError::Panicked { message }))
            .map_err(|source| TransformFailure {
                plugin_id: t.plugin_id.to_string(),
                transform: t.transform.name().to_owned(),
                source,
            })?;
    }
    Ok(request)
}
