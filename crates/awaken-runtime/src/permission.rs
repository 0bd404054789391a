//! The standard `permission` plugin: a tool gate driven by the agent's `permission` section
//! (ordered rules of tool glob, argument matchers and decision; first match wins; a default).
//! `deny` blocks the call (the model is told), `ask` suspends it with a ticket showing the call,
//! `allow` lets it run. A call a human answered is not asked again, when the answer was given
//! on exactly the call's arguments (their digest); any other answer refuses the call, unless it
//! answers a question asked while the call ran (a delegate's child asking), which is the tool's.
//!
//! An ordinary plugin: the runtime puts it in its plugin source, and an agent turns it on by
//! listing [`PERMISSION_PLUGIN`] in its `plugin_ids`.

use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use awaken_event::{ResumeMode, SuspendTicket, ToolCallId};
use awaken_phase::{HookError, PhaseContext};
use awaken_plugin::{
    ConfigSchema, LifecycleHooks, Plugin, PluginError, PluginManifest, PluginRegistrar,
    ToolGateHook,
};
use awaken_spec::{PERMISSION_SECTION, PermissionConfig, PermissionDecision, Sections};
use awaken_state::StateCommand;
use awaken_tool::{ToolInterceptPayload, argument_digest, pending_call};
use serde_json::json;

/// The permission plugin's id.
pub const PERMISSION_PLUGIN: &str = "awaken.permission";

/// The standard permission plugin.
pub struct PermissionPlugin {
    manifest: PluginManifest,
}

impl Default for PermissionPlugin {
    fn default() -> Self {
        Self {
            manifest: PluginManifest::new(PERMISSION_PLUGIN),
        }
    }
}

impl Plugin for PermissionPlugin {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }

    fn lifecycle_hooks(&self) -> LifecycleHooks {
        LifecycleHooks::NONE
    }

    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_tool_gate_hook("rules", Arc::new(PermissionGate))
    }

    fn config_schemas(&self) -> Vec<ConfigSchema> {
        vec![permission_schema().clone()]
    }

    /// Checks what the schema cannot (argument pointers), before any call is gated.
    fn on_activate(&self, sections: &Sections) -> Result<Option<StateCommand>, PluginError> {
        config(sections).map_err(|message| PluginError::Hook {
            plugin_id: PERMISSION_PLUGIN.to_owned(),
            hook: "on_activate".to_owned(),
            message,
        })?;
        Ok(None)
    }
}

/// The agent's permission configuration (the default one when it has no `permission`
/// section: ask for everything).
fn config(sections: &Sections) -> Result<PermissionConfig, String> {
    let config = sections
        .get_typed::<PermissionConfig>(PERMISSION_SECTION)
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

/// Why the permission gate refused a call that a human's answer reached: the answer was not
/// given on this call as it is. The call is blocked with this error's text as its result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PermissionRefusal {
    /// The answer is for another call.
    #[error(
        "the answer for call {answered} cannot decide call {call_id} of `{tool}`; it was not run"
    )]
    OtherCall {
        /// The call being decided.
        call_id: ToolCallId,
        /// The tool's name as the model called it.
        tool: String,
        /// The call the answer names.
        answered: ToolCallId,
    },
    /// The answer was given on other arguments than the call has now (the digest it carries
    /// is not the digest of the call's arguments).
    #[error(
        "the answer for call {call_id} of `{tool}` was given on other arguments (digest {answered}) than the call has (digest {actual}); it was not run"
    )]
    OtherArguments {
        /// The call.
        call_id: ToolCallId,
        /// The tool's name as the model called it.
        tool: String,
        /// The digest the answer carries.
        answered: String,
        /// The digest of the call's arguments.
        actual: String,
    },
}

/// The gate: the first matching rule's decision (by the tool's name as the model called it).
///
/// The arguments it reads are the ones the tool runs with (in the tool's canonical form, see
/// `Tool::normalize_arguments`). On `ask`, a human's answer lets the call through only when it
/// names this call and carries the digest of exactly these arguments: the gate checks it
/// itself, whatever path brought the answer, and refuses the call otherwise
/// ([`PermissionRefusal`]).
pub struct PermissionGate;

#[async_trait]
impl ToolGateHook for PermissionGate {
    async fn decide(&self, ctx: &PhaseContext) -> Result<Option<ToolInterceptPayload>, HookError> {
        let Some(tool) = &ctx.tool else {
            return Ok(None);
        };
        let config = config(&ctx.sections).map_err(HookError::failed)?;
        let call = &tool.call;
        Ok(match config.decide(&call.name, &call.arguments) {
            PermissionDecision::Allow => None,
            PermissionDecision::Deny => Some(ToolInterceptPayload::Block {
                reason: format!("`{}` is not permitted for this agent", call.name),
            }),
            PermissionDecision::Ask => {
                // A human answered this call: an approval, or a denial its ticket hands to
                // the tool (a delegate forwards it to its child run). Not asked again, if the
                // answer was given on this call with these arguments.
                // (Any other denial closes the call before the gates run.)
                // An answer to a question asked while the call ran (its tool's, such as a
                // delegate's child asking) is not this gate's: the gate let the call run then.
                if let Some(answer) = &tool.resume {
                    if tool.asked_while_running {
                        return Ok(None);
                    }
                    answer_refusal(call, answer).map(|refusal| ToolInterceptPayload::Block {
                        reason: refusal.to_string(),
                    })
                } else {
                    Some(ToolInterceptPayload::Suspend(SuspendTicket {
                        suspension_id: format!("permission-{}", call.id),
                        call: pending_call(call),
                        message: format!(
                            "Allow `{}` with arguments {}?",
                            call.name, call.arguments
                        ),
                        response_schema: None,
                        resume_mode: ResumeMode::Replay,
                    }))
                }
            }
        })
    }
}

/// Why `answer` cannot let `call` through, or `None` when it was given on this call with
/// exactly its arguments.
fn answer_refusal(
    call: &awaken_event::ToolCall,
    answer: &awaken_event::ToolCallResume,
) -> Option<PermissionRefusal> {
    if answer.call_id != call.id {
        return Some(PermissionRefusal::OtherCall {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            answered: answer.call_id.clone(),
        });
    }
    let actual = argument_digest(&call.arguments);
    (answer.argument_digest != actual).then(|| PermissionRefusal::OtherArguments {
        call_id: call.id.clone(),
        tool: call.name.clone(),
        answered: answer.argument_digest.clone(),
        actual,
    })
}

/// The JSON Schema of the `permission` section (the serde shape of [`PermissionConfig`]).
fn permission_schema() -> &'static ConfigSchema {
    static SCHEMA: OnceLock<ConfigSchema> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let decision = json!({"enum": ["allow", "deny", "ask"]});
        ConfigSchema::new(
            PERMISSION_SECTION,
            json!({
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "default": decision,
                    "rules": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": false,
                            "required": ["tool", "decision"],
                            "properties": {
                                "tool": {"type": "string"},
                                "decision": decision,
                                "args": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "additionalProperties": false,
                                        "required": ["pointer"],
                                        "properties": {
                                            "pointer": {"type": "string"},
                                            "equals": {},
                                            "as": {"enum": ["json", "number", "string"]},
                                            "matches": {"type": "string"}
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }),
        )
        .unwrap_or_else(|e| unreachable!("the permission schema is a constant and compiles: {e}"))
    })
}
