//! Test keys, tools and contexts shared by the modules.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use awaken_event::{
    EffectClass, RunId, ThreadId, ToolCall, ToolCallId, ToolDescriptor, ToolResult,
};
use awaken_state::{
    KeyOptions, KeyRegistry, MergeStrategy, Snapshot, StateCommand, StateError, StateKey,
    StateStore,
};
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput, ToolRecoveryPolicy};
use serde_json::{Value, json};

/// An exclusive string key: updates replace the value.
pub struct Notes;
impl StateKey for Notes {
    const KEY: &'static str = "test.notes";
    type Value = String;
    type Update = String;
    fn apply(value: &mut String, update: String) -> Result<(), StateError> {
        *value = update;
        Ok(())
    }
}

/// A second exclusive key.
pub struct Owner;
impl StateKey for Owner {
    const KEY: &'static str = "test.owner";
    type Value = String;
    type Update = String;
    fn apply(value: &mut String, update: String) -> Result<(), StateError> {
        *value = update;
        Ok(())
    }
}

/// A commutative counter: updates add.
pub struct Hits;
impl StateKey for Hits {
    const KEY: &'static str = "test.hits";
    type Value = i64;
    type Update = i64;
    fn apply(value: &mut i64, add: i64) -> Result<(), StateError> {
        *value = value
            .checked_add(add)
            .ok_or_else(|| StateError::invalid_update(Self::KEY, "overflow"))?;
        Ok(())
    }
}

#[test]
fn hits_is_commutative() {
    awaken_state::testing::assert_commutative::<Hits>(-1000i64..1000);
}

pub fn registry() -> KeyRegistry {
    let mut r = KeyRegistry::new();
    r.register_key::<Notes>(KeyOptions::new()).expect("notes");
    r.register_key::<Owner>(KeyOptions::new()).expect("owner");
    r.register_key::<Hits>(KeyOptions::new().with_merge(MergeStrategy::Commutative))
        .expect("hits");
    r
}

pub fn snapshot() -> Snapshot {
    StateStore::new(registry()).snapshot()
}

pub fn call_id(s: &str) -> ToolCallId {
    ToolCallId::new(s).expect("test call id")
}

pub fn call(id: &str, name: &str, arguments: Value) -> ToolCall {
    ToolCall {
        id: call_id(id),
        name: name.to_owned(),
        arguments: arguments.into(),
        invalid_arguments: None,
    }
}

pub fn tool_ctx(id: &str) -> ToolCallContext {
    ToolCallContext::new(
        ThreadId::new("thread-1").expect("thread"),
        RunId::new("run-1").expect("run"),
        call_id(id),
        snapshot(),
    )
}

/// What a scripted tool does when called.
#[derive(Clone)]
pub enum Behaviour {
    /// Echo the arguments and the idempotency key.
    Echo,
    /// Panic with a message.
    Panic,
    /// Return this command with an `ok` result.
    Write(fn() -> StateCommand),
    /// Fail with a message the model sees.
    Fail,
}

/// A tool with a scripted behaviour that counts its calls.
pub struct Scripted {
    pub descriptor: ToolDescriptor,
    pub behaviour: Behaviour,
    pub writes: &'static [&'static str],
    pub policy: Option<ToolRecoveryPolicy>,
    pub calls: Arc<AtomicUsize>,
}

impl Scripted {
    pub fn new(id: &str, behaviour: Behaviour) -> Self {
        Self {
            descriptor: ToolDescriptor::new(id, "a scripted test tool"),
            behaviour,
            writes: &[],
            policy: None,
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn with_schema(mut self, schema: Value) -> Self {
        self.descriptor = self.descriptor.with_parameters(schema);
        self
    }

    pub fn with_effect(mut self, effect: EffectClass) -> Self {
        self.descriptor = self.descriptor.with_effect(effect);
        self
    }

    pub fn with_writes(mut self, writes: &'static [&'static str]) -> Self {
        self.writes = writes;
        self
    }

    pub fn with_policy(mut self, policy: ToolRecoveryPolicy) -> Self {
        self.policy = Some(policy);
        self
    }
}

#[async_trait]
impl Tool for Scripted {
    fn descriptor(&self) -> ToolDescriptor {
        self.descriptor.clone()
    }

    fn recovery_policy(&self) -> ToolRecoveryPolicy {
        self.policy
            .unwrap_or_else(|| ToolRecoveryPolicy::default_for(self.descriptor.effect))
    }

    fn writes(&self) -> &[&'static str] {
        self.writes
    }

    async fn execute(&self, args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match &self.behaviour {
            Behaviour::Echo => Ok(ToolOutput::success(json!({
                "args": args,
                "key": ctx.idempotency_key().as_str(),
            }))),
            Behaviour::Panic => panic!("the scripted tool panics"),
            Behaviour::Write(command) => {
                Ok(ToolOutput::new(ToolResult::success(json!("ok"))).with_command(command()))
            }
            Behaviour::Fail => Err(ToolError::execution("the service said no")),
        }
    }
}
