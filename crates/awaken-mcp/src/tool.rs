//! One tool of an MCP server as an Awaken [`Tool`]: its descriptor from the server's listing,
//! its calls sent over the server's current connection.

use std::sync::Arc;

use async_trait::async_trait;
use awaken_event::{EffectClass, ToolDescriptor};
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientRequest, RequestMetaObject, ServerResult, ToolAnnotations,
};
use rmcp::service::{PeerRequestOptions, ServiceError};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::connection::Connection;

/// The `_meta` key under which each call carries its idempotency key.
pub const IDEMPOTENCY_META_KEY: &str = "awaken/idempotency-key";

/// A tool the server lists, called by its MCP name.
pub(crate) struct McpTool {
    pub(crate) connection: Arc<Connection>,
    /// The name the server knows it by.
    pub(crate) mcp_name: String,
    pub(crate) descriptor: ToolDescriptor,
}

/// The effect class the tool's annotations give: `readOnlyHint` makes it read-only;
/// `idempotentHint` without `destructiveHint` makes it idempotent (a repeated call with the
/// same arguments has no further effect, so recovery may re-run it); anything else, no
/// annotation included, is side-effecting.
pub(crate) fn effect_of(annotations: Option<&ToolAnnotations>) -> EffectClass {
    let Some(a) = annotations else {
        return EffectClass::SideEffecting;
    };
    if a.read_only_hint == Some(true) {
        EffectClass::ReadOnly
    } else if a.idempotent_hint == Some(true) && a.destructive_hint != Some(true) {
        EffectClass::Idempotent
    } else {
        EffectClass::SideEffecting
    }
}

/// The tool id for the MCP name `name`: the prefix, then the name with each character a tool
/// id does not allow replaced by `_`.
pub(crate) fn tool_id(prefix: &str, name: &str) -> String {
    let mut id = String::with_capacity(prefix.len() + name.len());
    id.push_str(prefix);
    id.extend(name.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
            c
        } else {
            '_'
        }
    }));
    id
}

/// What the model sees of a successful result: the structured content when the server gives
/// one; else the text, when every block is text; else the content blocks as the server sent
/// them.
fn result_value(result: &CallToolResult) -> Value {
    if let Some(structured) = &result.structured_content {
        return structured.clone();
    }
    let blocks = serde_json::to_value(&result.content).unwrap_or(Value::Null);
    match text_of(&blocks) {
        Some(text) => Value::String(text),
        None => blocks,
    }
}

/// The blocks' texts joined by newlines, or `None` when a block is not text.
fn text_of(blocks: &Value) -> Option<String> {
    let mut out = String::new();
    for (i, block) in blocks.as_array()?.iter().enumerate() {
        if block.get("type").and_then(Value::as_str) != Some("text") {
            return None;
        }
        if i > 0 {
            out.push('\n');
        }
        out.push_str(block.get("text").and_then(Value::as_str)?);
    }
    Some(out)
}

#[async_trait]
impl Tool for McpTool {
    fn descriptor(&self) -> ToolDescriptor {
        self.descriptor.clone()
    }

    async fn execute(&self, args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        let server = self.connection.name();
        let peer = self
            .connection
            .peer()
            .map_err(|e| ToolError::execution(e.to_string()))?;
        let mut params = CallToolRequestParams::new(self.mcp_name.clone());
        params.arguments = match args {
            Value::Object(map) => Some(map.clone()),
            _ => None,
        };
        // The same key on every attempt of this call: a server that honours it can make a
        // re-run after a crash harmless.
        let mut meta = serde_json::Map::with_capacity(1);
        meta.insert(
            IDEMPOTENCY_META_KEY.to_owned(),
            Value::String(ctx.idempotency_key().as_str().to_owned()),
        );
        params.meta = Some(RequestMetaObject::from(meta));
        let timeout = self.connection.timeout();
        let options = PeerRequestOptions::with_timeout(timeout);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let handle = peer
            .send_cancellable_request(request, options)
            .await
            .map_err(|e| unavailable(server, &self.mcp_name, &e))?;
        let (progress_to, mut progress) = mpsc::unbounded_channel();
        let _route = self
            .connection
            .progress()
            .register(handle.progress_token.clone(), progress_to);
        let request_id = handle.id.clone();
        let response = handle.await_response();
        tokio::pin!(response);
        let response = loop {
            tokio::select! {
                response = &mut response => break response,
                Some(report) = progress.recv() => ctx.report_progress(report),
                () = ctx.cancel_token().cancelled() => {
                    // The server is told, so it can stop the work; the call ends here either way.
                    let notice = CancelledNotificationParam::new(
                        Some(request_id),
                        Some("the run was cancelled".to_owned()),
                    );
                    let _ = peer.notify_cancelled(notice).await;
                    return Err(ToolError::Cancelled { tool_id: self.descriptor.id.clone() });
                }
            }
        };
        // Reports the server sent before its result are queued already.
        while let Ok(report) = progress.try_recv() {
            ctx.report_progress(report);
        }
        let result = match response {
            Ok(ServerResult::CallToolResult(result)) => result,
            Ok(_) => {
                return Err(ToolError::execution(format!(
                    "MCP server `{server}` answered the call of `{}` with something other than a tool result",
                    self.mcp_name
                )));
            }
            Err(ServiceError::Timeout { timeout }) => {
                return Err(ToolError::Timeout {
                    tool_id: self.descriptor.id.clone(),
                    after: Some(timeout),
                });
            }
            Err(ServiceError::McpError(error)) => {
                return Err(ToolError::execution(format!(
                    "MCP server `{server}` refused the call of `{}`: {}",
                    self.mcp_name, error.message
                )));
            }
            Err(e) => return Err(unavailable(server, &self.mcp_name, &e)),
        };
        if result.is_error == Some(true) {
            let message = match result_value(&result) {
                Value::String(text) => text,
                other => other.to_string(),
            };
            return Err(ToolError::execution(format!(
                "`{}` on MCP server `{server}` failed: {message}",
                self.mcp_name
            )));
        }
        Ok(ToolOutput::success(result_value(&result)))
    }
}

/// The error of a call the connection could not carry.
fn unavailable(server: &str, tool: &str, error: &ServiceError) -> ToolError {
    ToolError::execution(format!(
        "MCP server `{server}` is unavailable, `{tool}` was not completed: {error}"
    ))
}

#[cfg(test)]
mod tests {
    use super::{effect_of, text_of, tool_id};
    use awaken_event::EffectClass;
    use rmcp::model::ToolAnnotations;
    use serde_json::json;

    #[test]
    fn annotations_give_the_effect_class() {
        let with = |read: Option<bool>, destructive: Option<bool>, idempotent: Option<bool>| {
            let mut a = ToolAnnotations::default();
            a.read_only_hint = read;
            a.destructive_hint = destructive;
            a.idempotent_hint = idempotent;
            effect_of(Some(&a))
        };
        assert_eq!(effect_of(None), EffectClass::SideEffecting);
        assert_eq!(with(None, None, None), EffectClass::SideEffecting);
        assert_eq!(with(Some(true), None, None), EffectClass::ReadOnly);
        assert_eq!(with(Some(false), None, Some(true)), EffectClass::Idempotent);
        assert_eq!(
            with(None, Some(true), Some(true)),
            EffectClass::SideEffecting
        );
        assert_eq!(with(None, Some(true), None), EffectClass::SideEffecting);
    }

    #[test]
    fn tool_ids_keep_only_the_characters_providers_accept() {
        assert_eq!(tool_id("fs__", "read_file"), "fs__read_file");
        assert_eq!(tool_id("fs__", "files.read/v2"), "fs__files_read_v2");
    }

    #[test]
    fn text_blocks_are_joined_and_other_blocks_kept() {
        let text = json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]);
        assert_eq!(text_of(&text).as_deref(), Some("a\nb"));
        let mixed = json!([{"type": "text", "text": "a"}, {"type": "image", "data": "x"}]);
        assert_eq!(text_of(&mixed), None);
    }
}
