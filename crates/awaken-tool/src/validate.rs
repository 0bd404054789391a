//! Argument validation with a schema compiled once per tool, and the registered tool that owns
//! it.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use awaken_event::{EffectClass, ToolCall, ToolCallState, ToolDescriptor};
use awaken_state::{KeyRegistry, panic_message};
use serde_json::Value;

use crate::context::ToolCallContext;
use crate::error::{ToolError, ToolRegistrationError, Violation};
use crate::execute::{execute_guarded, execute_guarded_with_timeout};
use crate::recovery::{RecoveryAction, ToolRecoveryPolicy, recovery_action};
use crate::schema_cost;
use crate::tool::{Tool, ToolOutput, check_writes};

/// A tool's argument schema, compiled once. Cheap to clone (shared).
///
/// The schema's draft is detected from `$schema` (2020-12 when absent). References are resolved
/// only inside the schema itself: this crate does no IO, so a reference to a file or URL makes
/// the schema invalid at registration.
#[derive(Clone)]
pub struct ArgumentValidator {
    tool_id: Arc<str>,
    validator: Arc<jsonschema::Validator>,
}

impl ArgumentValidator {
    /// Compiles `schema` for tool `tool_id`.
    ///
    /// # Errors
    /// [`ToolRegistrationError::InvalidSchema`] when the schema is not a valid JSON Schema, or
    /// when validating against it could not end or could take unbounded work: a reference
    /// cycle that never moves into the value, or nested and shared in-place subschemas
    /// (under `unevaluatedProperties`/`unevaluatedItems` especially) whose work grows
    /// exponentially with the schema's size.
    pub fn compile(tool_id: &str, schema: &Value) -> Result<Self, ToolRegistrationError> {
        let validator = jsonschema::validator_for(schema).map_err(|e| {
            ToolRegistrationError::InvalidSchema {
                tool_id: tool_id.to_owned(),
                schema_path: e.instance_path().as_str().to_owned(),
                message: e.to_string(),
            }
        })?;
        schema_cost::check(schema).map_err(|refusal| ToolRegistrationError::InvalidSchema {
            tool_id: tool_id.to_owned(),
            schema_path: refusal.path,
            message: refusal.message,
        })?;
        Ok(Self {
            tool_id: Arc::from(tool_id),
            validator: Arc::new(validator),
        })
    }

    /// Whether `args` satisfies the schema (the fast path: no error is built).
    pub fn is_valid(&self, args: &Value) -> bool {
        self.validator.is_valid(args)
    }

    /// Every violation of the schema by `args`, each with its JSON path, in the validator's
    /// order; empty when `args` is valid.
    pub fn violations(&self, args: &Value) -> Vec<Violation> {
        self.validator
            .iter_errors(args)
            .map(|e| Violation {
                path: e.instance_path().as_str().to_owned(),
                message: e.to_string(),
            })
            .collect()
    }

    /// Validates `args`.
    ///
    /// # Errors
    /// [`ToolError::InvalidArguments`] listing every violation.
    pub fn validate(&self, args: &Value) -> Result<(), ToolError> {
        if self.is_valid(args) {
            return Ok(());
        }
        Err(ToolError::InvalidArguments {
            tool_id: self.tool_id.to_string(),
            violations: self.violations(args),
        })
    }
}

impl fmt::Debug for ArgumentValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArgumentValidator")
            .field("tool_id", &self.tool_id)
            .finish_non_exhaustive()
    }
}

/// A tool's descriptor as read at registration, with its id and name shared.
#[derive(Debug)]
struct Described {
    descriptor: ToolDescriptor,
    id: Arc<str>,
    name: Arc<str>,
}

/// A tool accepted for use: its descriptor read once, its schema compiled, its recovery policy
/// checked against its effect class. Cheap to clone (shared).
///
/// [`RegisteredTool::invoke`] is the whole call as the runtime runs it once the gates allowed
/// it: validate the arguments (invalid ones never reach the tool), execute with panics caught
/// and cancellation observed, and check the returned command against the declared writes.
#[derive(Clone)]
pub struct RegisteredTool {
    tool: Arc<dyn Tool>,
    descriptor: Arc<Described>,
    validator: ArgumentValidator,
    policy: ToolRecoveryPolicy,
}

impl RegisteredTool {
    /// Registers `tool`.
    ///
    /// # Errors
    /// - [`ToolRegistrationError::InvalidSchema`]: the argument schema does not compile;
    /// - [`ToolRegistrationError::PolicyNotAllowed`]: a `SideEffecting` tool declares
    ///   [`ToolRecoveryPolicy::Rerun`].
    pub fn new(tool: Arc<dyn Tool>) -> Result<Self, ToolRegistrationError> {
        let descriptor = tool.descriptor();
        let policy = tool.recovery_policy();
        if !policy.is_allowed_for(descriptor.effect) {
            return Err(ToolRegistrationError::PolicyNotAllowed {
                tool_id: descriptor.id,
                effect: descriptor.effect,
                policy,
            });
        }
        let validator = ArgumentValidator::compile(&descriptor.id, &descriptor.parameters)?;
        Ok(Self {
            tool,
            descriptor: Arc::new(Described {
                id: Arc::from(descriptor.id.as_str()),
                name: Arc::from(descriptor.name.as_str()),
                descriptor,
            }),
            validator,
            policy,
        })
    }

    /// Registers a tool given by value.
    ///
    /// # Errors
    /// As [`RegisteredTool::new`].
    pub fn from_tool(tool: impl Tool) -> Result<Self, ToolRegistrationError> {
        Self::new(Arc::new(tool))
    }

    /// The tool's id.
    pub fn id(&self) -> &str {
        &self.descriptor.id
    }

    /// The descriptor, as read at registration.
    pub fn descriptor(&self) -> &ToolDescriptor {
        &self.descriptor.descriptor
    }

    /// The tool's id, shared (for events and statistics that name the tool on every call).
    pub fn shared_id(&self) -> &Arc<str> {
        &self.descriptor.id
    }

    /// The tool's name as models call it, shared.
    pub fn shared_name(&self) -> &Arc<str> {
        &self.descriptor.name
    }

    /// The effect class.
    pub fn effect(&self) -> EffectClass {
        self.descriptor.descriptor.effect
    }

    /// The declared (and accepted) recovery policy.
    pub fn recovery_policy(&self) -> ToolRecoveryPolicy {
        self.policy
    }

    /// The `Exclusive` keys the tool may write.
    pub fn writes(&self) -> &[&'static str] {
        self.tool.writes()
    }

    /// The compiled argument validator.
    pub fn validator(&self) -> &ArgumentValidator {
        &self.validator
    }

    /// The tool itself.
    pub fn tool(&self) -> &Arc<dyn Tool> {
        &self.tool
    }

    /// What recovery does with a call of this tool last durably in state `last`.
    pub fn recovery_action(&self, last: ToolCallState) -> RecoveryAction {
        recovery_action(self.descriptor.descriptor.effect, self.policy, last)
    }

    /// Validates `args` against the cached schema.
    ///
    /// # Errors
    /// [`ToolError::InvalidArguments`] listing every violation with its JSON path.
    pub fn validate(&self, args: &Value) -> Result<(), ToolError> {
        self.validator.validate(args)
    }

    /// The tool's canonical form of `args` ([`Tool::normalize_arguments`]), checked against
    /// the schema, or `None` when they are in it already. A panic in the tool's code is caught.
    ///
    /// # Errors
    /// The tool's own error, [`ToolError::Panicked`], or [`ToolError::InvalidArguments`] when
    /// the canonical form breaks the schema.
    pub fn normalize_arguments(&self, args: &Value) -> Result<Option<Value>, ToolError> {
        let normalized = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.tool.normalize_arguments(args)
        }))
        .map_err(|payload| ToolError::Panicked {
            tool_id: self.id().to_owned(),
            message: panic_message(payload.as_ref()),
        })??;
        if let Some(canonical) = &normalized {
            self.validate(canonical)?;
        }
        Ok(normalized)
    }

    /// Checks a call as the model sent it: arguments that were not JSON at all
    /// (`ToolCall::invalid_arguments`) or that break the schema.
    ///
    /// # Errors
    /// [`ToolError::InvalidArguments`]; for non-JSON arguments, one violation at the root
    /// quoting (at most 200 characters of) the text the model sent.
    pub fn check_call(&self, call: &ToolCall) -> Result<(), ToolError> {
        if let Some(raw) = &call.invalid_arguments {
            let shown: String = raw.chars().take(200).collect();
            let ellipsis = if shown.len() < raw.len() { "…" } else { "" };
            return Err(ToolError::InvalidArguments {
                tool_id: self.id().to_owned(),
                violations: vec![Violation {
                    path: String::new(),
                    message: format!("the arguments are not valid JSON: {shown:?}{ellipsis}"),
                }],
            });
        }
        self.validate(&call.arguments)
    }

    /// Runs one allowed call: validate, execute (panics caught, cancellation observed), check
    /// the command's writes against `registry`.
    ///
    /// # Errors
    /// Any [`ToolError`]; the tool is not called when the arguments are invalid.
    pub async fn invoke(
        &self,
        args: &Value,
        ctx: &ToolCallContext,
        registry: &KeyRegistry,
    ) -> Result<ToolOutput, ToolError> {
        self.validate(args)?;
        let output = execute_guarded(self.tool.as_ref(), self.id(), args, ctx).await?;
        self.check_output(output, registry)
    }

    /// As [`RegisteredTool::invoke`], abandoning the call with [`ToolError::Timeout`] when
    /// `timeout` completes first (a runtime-agnostic timer: any future, e.g. a sleep).
    ///
    /// # Errors
    /// Any [`ToolError`].
    pub async fn invoke_with_timeout<T>(
        &self,
        args: &Value,
        ctx: &ToolCallContext,
        registry: &KeyRegistry,
        timeout: T,
    ) -> Result<ToolOutput, ToolError>
    where
        T: Future<Output = ()> + Send,
    {
        self.validate(args)?;
        self.invoke_checked_with_timeout(args, ctx, registry, timeout)
            .await
    }

    /// As [`RegisteredTool::invoke_with_timeout`], for arguments [`RegisteredTool::check_call`]
    /// (or [`RegisteredTool::validate`]) has accepted already: they are not validated again.
    ///
    /// # Errors
    /// Any [`ToolError`] (`InvalidArguments` only if the tool returns it).
    pub async fn invoke_checked_with_timeout<T>(
        &self,
        args: &Value,
        ctx: &ToolCallContext,
        registry: &KeyRegistry,
        timeout: T,
    ) -> Result<ToolOutput, ToolError>
    where
        T: Future<Output = ()> + Send,
    {
        let output =
            execute_guarded_with_timeout(self.tool.as_ref(), self.id(), args, ctx, timeout, None)
                .await?;
        self.check_output(output, registry)
    }

    fn check_output(
        &self,
        output: ToolOutput,
        registry: &KeyRegistry,
    ) -> Result<ToolOutput, ToolError> {
        if let Some(command) = &output.command {
            check_writes(self.id(), command, self.tool.writes(), registry)?;
        }
        Ok(output)
    }
}

impl fmt::Debug for RegisteredTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredTool")
            .field("id", &self.descriptor.id)
            .field("effect", &self.descriptor.descriptor.effect)
            .field("policy", &self.policy)
            .field("writes", &self.tool.writes())
            .finish_non_exhaustive()
    }
}
