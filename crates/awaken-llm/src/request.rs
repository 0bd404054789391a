//! What one model call is asked: the model, the shared history, the tools and the parameters.

use std::sync::Arc;

use awaken_event::{History, ToolDescriptor};
use awaken_spec::InferenceOverride;

/// One inference call's input.
///
/// Cloning is cheap: the history ([`History`]), the tool list (`Arc<[_]>`) and the strings
/// (`Arc<str>`) are shared, never copied per call or per retry attempt; a run builds its
/// strings once and shares them with every step's request.
#[derive(Debug, Clone, PartialEq)]
pub struct InferenceRequest {
    /// The provider-side model name (the model spec's `upstream_model`). A non-blank
    /// `overrides.upstream_model` replaces it; see [`InferenceRequest::effective_model`].
    pub upstream_model: Arc<str>,
    /// The conversation, oldest first. System instructions usually go in `system_prompt`.
    pub messages: History,
    /// The tools the model may call.
    pub tools: Arc<[ToolDescriptor]>,
    /// The system prompt, sent before `messages` when set.
    pub system_prompt: Option<Arc<str>>,
    /// The merged inference parameters (agent default < run override < step override).
    pub overrides: InferenceOverride,
    /// A key for session affinity (usually the thread id): requests with the same key should
    /// reach the same backend, so its prompt cache is reused. Executors may ignore it.
    pub routing_key: Option<Arc<str>>,
}

impl InferenceRequest {
    /// A request for `upstream_model` over `messages`, with no tools, no system prompt and no
    /// overrides.
    pub fn new(upstream_model: impl Into<Arc<str>>, messages: impl Into<History>) -> Self {
        Self {
            upstream_model: upstream_model.into(),
            messages: messages.into(),
            // The shared empty slice: no allocation.
            tools: Arc::default(),
            system_prompt: None,
            overrides: InferenceOverride::default(),
            routing_key: None,
        }
    }

    /// Sets the tools.
    pub fn with_tools(mut self, tools: impl Into<Arc<[ToolDescriptor]>>) -> Self {
        self.tools = tools.into();
        self
    }

    /// Sets the system prompt.
    pub fn with_system_prompt(mut self, prompt: impl Into<Arc<str>>) -> Self {
        self.system_prompt = Some(prompt.into());
        self
    }

    /// Sets the merged overrides.
    pub fn with_overrides(mut self, overrides: InferenceOverride) -> Self {
        self.overrides = overrides;
        self
    }

    /// Sets the routing key.
    pub fn with_routing_key(mut self, key: impl Into<Arc<str>>) -> Self {
        self.routing_key = Some(key.into());
        self
    }

    /// The model name to send: `overrides.upstream_model` when it is set and not blank, else
    /// `upstream_model`. (It renames the model within the provider; it never switches
    /// provider.)
    pub fn effective_model(&self) -> &str {
        match &self.overrides.upstream_model {
            Some(m) if !m.trim().is_empty() => m,
            _ => &self.upstream_model,
        }
    }

    /// [`InferenceRequest::effective_model`], shared: the request's own `upstream_model`
    /// unless an override renames the model (then a new string).
    pub fn effective_model_shared(&self) -> Arc<str> {
        match &self.overrides.upstream_model {
            Some(m) if !m.trim().is_empty() => Arc::from(m.as_str()),
            _ => self.upstream_model.clone(),
        }
    }
}
