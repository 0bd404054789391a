//! Tool providers: their tools are taken at each resolution (a change reaches the next one
//! only), filtered and checked for id conflicts like any tool, and named by their provider.

use std::sync::{Arc, Mutex};

use awaken_resolver::*;
use awaken_spec::{AgentSpec, Glob};
use awaken_tool::{RegisteredTool, ToolProvider};

use crate::support::*;

/// A provider whose tools the test changes.
struct Changing {
    id: &'static str,
    tools: Mutex<Arc<[RegisteredTool]>>,
}

impl Changing {
    fn new(id: &'static str, ids: &[&str]) -> Arc<Self> {
        let provider = Arc::new(Self {
            id,
            tools: Mutex::new(Arc::from(Vec::new())),
        });
        provider.set(ids);
        provider
    }

    fn set(&self, ids: &[&str]) {
        let tools: Vec<RegisteredTool> = ids
            .iter()
            .map(|id| RegisteredTool::new(echo(id)).expect("valid tool"))
            .collect();
        *self.tools.lock().expect("lock") = Arc::from(tools);
    }
}

impl ToolProvider for Changing {
    fn id(&self) -> &str {
        self.id
    }

    fn tools(&self) -> Arc<[RegisteredTool]> {
        self.tools.lock().expect("lock").clone()
    }
}

fn tools(resolved: &ResolvedAgent) -> String {
    resolved
        .tools
        .iter()
        .map(|t| format!("{} ({})", t.tool.id(), t.source))
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn a_providers_tools_are_taken_as_they_are_at_each_resolution() {
    let fs = Changing::new("fs", &["fs__read", "fs__write"]);
    let registries = base()
        .with_tool(echo("search"))
        .with_tool_provider(fs.clone())
        .with_agent_spec(
            AgentSpec::new("a", "m").with_excluded_tool_pattern(Glob::new("fs__w*").expect("glob")),
        );
    let resolver = resolver(registries);
    let first = resolver.resolve("a").expect("resolves");
    assert_eq!(tools(&first), "search (global), fs__read (provider:fs)");
    fs.set(&["fs__read", "fs__list"]);
    let second = resolver.resolve("a").expect("resolves");
    assert_eq!(
        tools(&second),
        "search (global), fs__read (provider:fs), fs__list (provider:fs)"
    );
    assert_eq!(
        tools(&first),
        "search (global), fs__read (provider:fs)",
        "a resolution made before keeps its tools"
    );
    assert_ne!(
        first.spec_digest, second.spec_digest,
        "the tool set is part of the digest"
    );
}

#[test]
fn a_provider_tool_whose_id_is_taken_is_a_conflict_naming_both_sources() {
    let registries = base()
        .with_tool(echo("search"))
        .with_tool_provider(Changing::new("web", &["search"]))
        .with_agent_spec(AgentSpec::new("a", "m"));
    let err = resolver(registries).resolve("a").expect_err("conflict");
    assert!(
        matches!(&err, ResolveError::ToolIdConflict { id, first, second }
            if id == "search" && first == "global" && second == "provider:web"),
        "{err}"
    );
}

#[test]
fn two_providers_with_one_id_are_a_registration_error() {
    let registries = base()
        .with_tool_provider(Changing::new("fs", &[]))
        .with_tool_provider(Changing::new("fs", &[]));
    let errors: Vec<String> = registries
        .errors()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("tool provider") && errors[0].contains("fs"),
        "{errors:?}"
    );
}
