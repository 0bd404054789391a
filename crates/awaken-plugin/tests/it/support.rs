//! A configurable plugin for the tests, and small keys, actions and effects.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use awaken_event::TerminationReason;
use awaken_phase::{EffectContext, EffectHandler, EffectSpec, HookError};
use awaken_plugin::*;
use awaken_spec::AgentSpec;
use awaken_state::{StateError, StateKey};

type RegisterFn = dyn Fn(&mut PluginRegistrar) -> Result<(), PluginError> + Send + Sync;
type AgentsFn =
    dyn Fn(&mut AgentBuildContext) -> Result<Vec<AgentDefinition>, PluginError> + Send + Sync;

/// How a lifecycle hook of a [`TestPlugin`] behaves.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Behaviour {
    Ok,
    Fail,
    Hang,
}

/// A shared log.
#[derive(Clone, Default)]
pub struct Log(pub Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn push(&self, s: impl Into<String>) {
        self.0.lock().expect("log").push(s.into());
    }
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().expect("log").clone()
    }
}

pub struct TestPlugin {
    pub manifest: PluginManifest,
    pub register: Box<RegisterFn>,
    pub agents: Box<AgentsFn>,
    pub log: Log,
    pub lifecycle: Behaviour,
    pub reload: Behaviour,
    pub schemas: Vec<ConfigSchema>,
    pub hooks: LifecycleHooks,
}

impl TestPlugin {
    pub fn new(id: &str) -> Self {
        Self {
            manifest: PluginManifest::new(id),
            register: Box::new(|_| Ok(())),
            agents: Box::new(|_| Ok(Vec::new())),
            log: Log::default(),
            lifecycle: Behaviour::Ok,
            reload: Behaviour::Ok,
            schemas: Vec::new(),
            hooks: LifecycleHooks::ALL,
        }
    }

    pub fn registering(
        mut self,
        f: impl Fn(&mut PluginRegistrar) -> Result<(), PluginError> + Send + Sync + 'static,
    ) -> Self {
        self.register = Box::new(f);
        self
    }

    pub fn defining(
        mut self,
        f: impl Fn(&mut AgentBuildContext) -> Result<Vec<AgentDefinition>, PluginError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.agents = Box::new(f);
        self
    }

    pub fn with_manifest(mut self, f: impl FnOnce(PluginManifest) -> PluginManifest) -> Self {
        self.manifest = f(self.manifest);
        self
    }

    pub fn arc(self) -> Arc<dyn Plugin> {
        Arc::new(self)
    }

    async fn behave(&self, hook: &str, how: Behaviour) -> Result<(), PluginError> {
        self.log.push(format!("{} {hook}", self.manifest.id));
        match how {
            Behaviour::Ok => Ok(()),
            Behaviour::Fail => Err(PluginError::hook(self.manifest.id.clone(), hook, "refused")),
            Behaviour::Hang => std::future::pending().await,
        }
    }
}

#[async_trait]
impl Plugin for TestPlugin {
    fn manifest(&self) -> &PluginManifest {
        &self.manifest
    }
    fn register(&self, registrar: &mut PluginRegistrar) -> Result<(), PluginError> {
        (self.register)(registrar)
    }
    fn config_schemas(&self) -> Vec<ConfigSchema> {
        self.schemas.clone()
    }
    fn lifecycle_hooks(&self) -> LifecycleHooks {
        self.hooks
    }
    fn agent_definitions(
        &self,
        ctx: &mut AgentBuildContext,
    ) -> Result<Vec<AgentDefinition>, PluginError> {
        (self.agents)(ctx)
    }
    async fn on_run_start(&self, _run: &RunLifecycle) -> Result<(), PluginError> {
        self.behave("on_run_start", self.lifecycle).await
    }
    async fn on_run_complete(
        &self,
        _run: &RunLifecycle,
        t: &TerminationReason,
    ) -> Result<(), PluginError> {
        self.behave(&format!("on_run_complete({})", t.kind()), self.lifecycle)
            .await
    }
    async fn on_reload(&self, reload_id: &str) -> Result<(), PluginError> {
        self.behave(&format!("on_reload({reload_id})"), self.reload)
            .await
    }
}

pub fn agent(id: &str, prompt: &str) -> AgentSpec {
    AgentSpec::new(id, "model").with_system_prompt(prompt)
}

macro_rules! key {
    ($name:ident, $key:literal) => {
        pub struct $name;
        impl StateKey for $name {
            const KEY: &'static str = $key;
            type Value = i64;
            type Update = i64;
            fn apply(v: &mut i64, u: i64) -> Result<(), StateError> {
                *v = u;
                Ok(())
            }
        }
    };
}
key!(KeyA, "t.a");
key!(KeyB, "t.b");

pub struct Ping;
impl EffectSpec for Ping {
    const KEY: &'static str = "t.ping";
    type Payload = String;
}

pub struct RecordPing(pub Log);
#[async_trait]
impl EffectHandler<Ping> for RecordPing {
    async fn handle(&self, _ctx: &EffectContext, payload: String) -> Result<(), HookError> {
        self.0.push(format!("ping {payload}"));
        Ok(())
    }
}
