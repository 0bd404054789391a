//! The `InterceptToolCall` action: a decision on the current call taken in `BeforeToolExecute`
//! (a reactive permission check: a hook schedules a check, the check's handler may suspend
//! the call, all within the one phase).

use async_trait::async_trait;
use awaken_event::ToolCallId;
use awaken_phase::{ActionHandler, HookError, Phase, PhaseContext, ScheduledActionSpec};
use awaken_state::{StateCommand, StateError, StateKey};
use awaken_tool::ToolInterceptPayload;
use serde::{Deserialize, Serialize};

/// Blocks, suspends or short-circuits the call whose `BeforeToolExecute` processes it. Several
/// decisions on one call resolve as gate decisions do: Block > Suspend > SetResult, the first
/// of equal rank winning.
pub struct InterceptToolCall;

impl ScheduledActionSpec for InterceptToolCall {
    const KEY: &'static str = "awaken.loop.intercept_tool_call";
    const PHASE: Phase = Phase::BeforeToolExecute;
    type Payload = ToolInterceptPayload;
}

/// A decision taken on one call in its `BeforeToolExecute`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallIntercept {
    /// The call.
    pub call_id: ToolCallId,
    /// The decision.
    pub payload: ToolInterceptPayload,
}

/// The decision of the call being prepared, if an action took one (ephemeral: it only lives
/// between a call's `BeforeToolExecute` and the loop reading it).
pub struct CallInterceptKey;

fn rank(p: &ToolInterceptPayload) -> u8 {
    match p {
        ToolInterceptPayload::Block { .. } => 3,
        ToolInterceptPayload::Suspend(_) => 2,
        ToolInterceptPayload::SetResult(_) => 1,
    }
}

impl StateKey for CallInterceptKey {
    const KEY: &'static str = "awaken.loop.call_intercept";
    type Value = Option<CallIntercept>;
    type Update = CallIntercept;

    fn apply(value: &mut Option<CallIntercept>, update: CallIntercept) -> Result<(), StateError> {
        let keep = matches!(value, Some(v) if v.call_id == update.call_id
            && rank(&v.payload) >= rank(&update.payload));
        if !keep {
            *value = Some(update);
        }
        Ok(())
    }
}

/// The handler of [`InterceptToolCall`]: records the decision for the phase's call. Outside a
/// tool phase there is no call to decide on, and the action is dead-lettered.
pub struct InterceptHandler;

#[async_trait]
impl ActionHandler<InterceptToolCall> for InterceptHandler {
    async fn handle(
        &self,
        ctx: &PhaseContext,
        payload: ToolInterceptPayload,
    ) -> Result<StateCommand, HookError> {
        let Some(tool) = &ctx.tool else {
            return Err(HookError::failed(
                "InterceptToolCall outside a tool call's phase",
            ));
        };
        Ok(
            StateCommand::new().with_update::<CallInterceptKey>(CallIntercept {
                call_id: tool.call.id.clone(),
                payload,
            }),
        )
    }
}
