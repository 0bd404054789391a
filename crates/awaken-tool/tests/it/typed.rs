//! Tools with serde argument and output structs.

use async_trait::async_trait;
use awaken_event::{EffectClass, ToolDescriptor, ToolResult};
use awaken_state::{StateCommand, StateKey};
use awaken_tool::{
    RegisteredTool, ToolCallContext, ToolError, ToolRecoveryPolicy, TypedOutput, TypedTool,
    TypedToolAdapter,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::support::{Notes, registry, tool_ctx};

#[derive(Deserialize)]
struct AddArgs {
    a: i64,
    b: i64,
}

#[derive(Serialize)]
struct Sum {
    sum: i64,
}

struct Add {
    /// A schema looser than `AddArgs` (no types), to show serde's own check.
    loose: bool,
}

#[async_trait]
impl TypedTool for Add {
    type Args = AddArgs;
    type Output = Sum;

    fn descriptor(&self) -> ToolDescriptor {
        let schema = if self.loose {
            json!({"type": "object"})
        } else {
            json!({
                "type": "object",
                "properties": { "a": {"type": "integer"}, "b": {"type": "integer"} },
                "required": ["a", "b"],
                "additionalProperties": false
            })
        };
        ToolDescriptor::new("add", "adds")
            .with_parameters(schema)
            .with_effect(EffectClass::Idempotent)
    }

    fn writes(&self) -> &[&'static str] {
        &[Notes::KEY]
    }

    async fn call(
        &self,
        args: AddArgs,
        _ctx: &ToolCallContext,
    ) -> Result<TypedOutput<Sum>, ToolError> {
        let sum = args
            .a
            .checked_add(args.b)
            .ok_or_else(|| ToolError::execution("the sum overflows"))?;
        Ok(TypedOutput::new(Sum { sum })
            .with_command(StateCommand::new().with_update::<Notes>(format!("sum {sum}"))))
    }
}

#[tokio::test]
async fn a_typed_tool_runs_with_its_structs_and_its_command() {
    let tool =
        RegisteredTool::from_tool(TypedToolAdapter::new(Add { loose: false })).expect("registers");
    assert_eq!(tool.recovery_policy(), ToolRecoveryPolicy::Rerun);
    assert_eq!(tool.writes(), &[Notes::KEY]);
    let out = tool
        .invoke(&json!({"a": 2, "b": 40}), &tool_ctx("c1"), &registry())
        .await
        .expect("runs");
    assert_eq!(out.result, ToolResult::success(json!({"sum": 42})));
    let command = out.command.expect("a command");
    assert_eq!(
        command.written_keys().into_iter().collect::<Vec<_>>(),
        [Notes::KEY]
    );

    let err = tool
        .invoke(
            &json!({"a": i64::MAX, "b": 1}),
            &tool_ctx("c2"),
            &registry(),
        )
        .await
        .expect_err("overflow");
    assert_eq!(err, ToolError::execution("the sum overflows"));
    let err = tool
        .invoke(&json!({"a": "2", "b": 1}), &tool_ctx("c3"), &registry())
        .await
        .expect_err("schema");
    assert!(
        matches!(err, ToolError::InvalidArguments { ref violations, .. } if violations[0].path == "/a")
    );
}

#[tokio::test]
async fn arguments_the_schema_lets_through_but_serde_refuses_fail_the_call() {
    let tool =
        RegisteredTool::from_tool(TypedToolAdapter::new(Add { loose: true })).expect("registers");
    let err = tool
        .invoke(&json!({"a": "two", "b": 1}), &tool_ctx("c1"), &registry())
        .await
        .expect_err("serde refuses");
    match err {
        ToolError::InvalidArguments {
            tool_id,
            violations,
        } => {
            assert_eq!(tool_id, "add");
            assert_eq!(violations.len(), 1);
            assert!(
                violations[0].message.contains("invalid type"),
                "{violations:?}"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
}
