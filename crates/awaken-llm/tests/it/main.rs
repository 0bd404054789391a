//! Integration tests of awaken-llm: one binary, a module per feature.

#[cfg(feature = "anthropic")]
mod anthropic;
mod anthropic_decoder;
mod decoder;
#[cfg(any(feature = "openai", feature = "anthropic"))]
mod fakellm;
#[cfg(feature = "openai")]
mod openai;
mod pool;
mod retry;
mod scripted;
#[cfg(any(feature = "openai", feature = "anthropic"))]
mod server;
mod sse;

use std::fmt::Write as _;

use awaken_event::{InferenceResponse, Message};
use awaken_llm::{InferenceExecutionError, InferenceRequest, LlmEventStream, LlmStreamEvent};
use futures_util::StreamExt;

/// Renders one stream item as a line: the events in a compact form, errors with their class.
pub(crate) fn render_item(item: &Result<LlmStreamEvent, InferenceExecutionError>) -> String {
    match item {
        Ok(LlmStreamEvent::TextDelta(t)) => format!("text {t:?}"),
        Ok(LlmStreamEvent::ReasoningDelta(t)) => format!("reasoning {t:?}"),
        Ok(LlmStreamEvent::ToolCallStart { index, id, name }) => {
            format!("call_start #{index} {} {name}", id.as_str())
        }
        Ok(LlmStreamEvent::ToolCallArgsDelta { index, delta }) => {
            format!("call_args #{index} {delta:?}")
        }
        Ok(LlmStreamEvent::Usage(u)) => format!(
            "usage in={} out={} cached={} reasoning={}",
            u.input_tokens, u.output_tokens, u.cached_input_tokens, u.reasoning_tokens
        ),
        Ok(LlmStreamEvent::Stop(r)) => format!("stop {r:?}"),
        Ok(other) => format!("{other:?}"),
        Err(e) => render_error(e),
    }
}

/// An error as `error <Class> <Variant>: <display>`.
pub(crate) fn render_error(e: &InferenceExecutionError) -> String {
    let debug = format!("{e:?}");
    let variant = debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_owned();
    format!("error {:?} {variant}: {e}", e.class())
}

/// Renders a list of items, one per line.
pub(crate) fn render_items(items: &[Result<LlmStreamEvent, InferenceExecutionError>]) -> String {
    let mut out = String::new();
    for item in items {
        let _ = writeln!(out, "{}", render_item(item));
    }
    out
}

/// Drains a stream and renders it.
pub(crate) async fn render_stream(mut stream: LlmEventStream) -> String {
    let mut items = Vec::new();
    while let Some(item) = stream.next().await {
        items.push(item);
    }
    render_items(&items)
}

/// Renders a collected response.
pub(crate) fn render_response(r: &InferenceResponse) -> String {
    let mut out = format!(
        "stop={:?} usage in={} out={}\n",
        r.stop_reason, r.usage.input_tokens, r.usage.output_tokens
    );
    for block in r.message.content.iter() {
        let _ = writeln!(
            out,
            "block {}",
            serde_json::to_string(block).unwrap_or_default()
        );
    }
    for call in r.message.tool_calls.iter() {
        let _ = writeln!(
            out,
            "call {} {} {} raw={:?}",
            call.id.as_str(),
            call.name,
            call.arguments,
            call.invalid_arguments
        );
    }
    out
}

/// A one-message request.
pub(crate) fn request(text: &str) -> InferenceRequest {
    InferenceRequest::new("test-model", vec![Message::user(text)])
}
