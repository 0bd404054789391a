//! Tools with serde argument and output structs.

use async_trait::async_trait;
use awaken_event::ToolDescriptor;
use awaken_state::StateCommand;
use serde::Deserialize;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::context::ToolCallContext;
use crate::error::{ToolError, Violation};
use crate::recovery::ToolRecoveryPolicy;
use crate::tool::{Tool, ToolOutput};

/// A tool whose arguments and output are serde types. Wrap it in [`TypedToolAdapter`] (or call
/// [`TypedToolAdapter::new`]) to get a [`Tool`].
///
/// The argument schema is written once, in [`TypedTool::descriptor`]'s `parameters`; it is what
/// the model sees and what arguments are validated against before they are deserialized into
/// [`TypedTool::Args`]. Arguments that pass the schema but not serde (a schema looser than the
/// struct) fail the call with [`ToolError::InvalidArguments`] carrying serde's message at the
/// root path.
///
/// ```
/// use async_trait::async_trait;
/// use awaken_event::ToolDescriptor;
/// use awaken_tool::{ToolCallContext, ToolError, TypedOutput, TypedTool};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Deserialize)]
/// struct Args { a: i64, b: i64 }
/// #[derive(Serialize)]
/// struct Sum { sum: i64 }
///
/// struct Add;
/// #[async_trait]
/// impl TypedTool for Add {
///     type Args = Args;
///     type Output = Sum;
///     fn descriptor(&self) -> ToolDescriptor {
///         ToolDescriptor::new("add", "Adds two integers").with_parameters(serde_json::json!({
///             "type": "object",
///             "properties": { "a": { "type": "integer" }, "b": { "type": "integer" } },
///             "required": ["a", "b"],
///             "additionalProperties": false
///         }))
///     }
///     async fn call(&self, args: Args, _ctx: &ToolCallContext) -> Result<TypedOutput<Sum>, ToolError> {
///         Ok(Sum { sum: args.a + args.b }.into())
///     }
/// }
/// ```
#[async_trait]
pub trait TypedTool: Send + Sync + 'static {
    /// The arguments, deserialized from the validated JSON.
    type Args: DeserializeOwned + Send;
    /// The output; serialized as the success result's content.
    type Output: Serialize + Send;

    /// As [`Tool::descriptor`]: the argument schema is written here, once.
    fn descriptor(&self) -> ToolDescriptor;

    /// As [`Tool::recovery_policy`].
    fn recovery_policy(&self) -> ToolRecoveryPolicy {
        ToolRecoveryPolicy::default_for(self.descriptor().effect)
    }

    /// As [`Tool::writes`].
    fn writes(&self) -> &[&'static str] {
        &[]
    }

    /// Runs the call; as [`Tool::execute`].
    async fn call(
        &self,
        args: Self::Args,
        ctx: &ToolCallContext,
    ) -> Result<TypedOutput<Self::Output>, ToolError>;
}

/// A typed tool's output and an optional state command. `From<O>` makes `Ok(out.into())` the
/// common case.
#[derive(Debug, Clone)]
pub struct TypedOutput<O> {
    /// The output value.
    pub value: O,
    /// State changes to commit with the result.
    pub command: Option<StateCommand>,
}

impl<O> TypedOutput<O> {
    /// An output with no command.
    pub fn new(value: O) -> Self {
        Self {
            value,
            command: None,
        }
    }

    /// With a state command.
    pub fn with_command(mut self, command: StateCommand) -> Self {
        self.command = Some(command);
        self
    }
}

impl<O> From<O> for TypedOutput<O> {
    fn from(value: O) -> Self {
        Self::new(value)
    }
}

/// The [`Tool`] made from a [`TypedTool`].
#[derive(Debug, Clone, Default)]
pub struct TypedToolAdapter<T>(pub T);

impl<T: TypedTool> TypedToolAdapter<T> {
    /// Wraps `tool`.
    pub fn new(tool: T) -> Self {
        Self(tool)
    }
}

#[async_trait]
impl<T: TypedTool> Tool for TypedToolAdapter<T> {
    fn descriptor(&self) -> ToolDescriptor {
        self.0.descriptor()
    }

    fn recovery_policy(&self) -> ToolRecoveryPolicy {
        self.0.recovery_policy()
    }

    fn writes(&self) -> &[&'static str] {
        self.0.writes()
    }

    async fn execute(&self, args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        let args: T::Args =
            T::Args::deserialize(args).map_err(|e| ToolError::InvalidArguments {
                tool_id: self.0.descriptor().id,
                violations: vec![Violation {
                    path: String::new(),
                    message: e.to_string(),
                }],
            })?;
        let out = self.0.call(args, ctx).await?;
        let content = serde_json::to_value(&out.value).map_err(|e| ToolError::Execution {
            message: format!("the tool's output could not be serialized: {e}"),
        })?;
        let mut output = ToolOutput::success(content);
        output.command = out.command;
        Ok(output)
    }
}
