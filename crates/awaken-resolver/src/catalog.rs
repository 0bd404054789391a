//! The tool catalog filter: keep `(allowed literals ∪ allowed patterns) − (excluded literals ∪
//! excluded patterns)`; absent allow fields mean allow-all; exclusion always wins.

use awaken_spec::AgentSpec;

use crate::error::ResolveWarning;

/// The filter's outcome for a list of tool ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogOutcome {
    /// Whether each tool (by position) is kept.
    pub keep: Vec<bool>,
    /// Unmatched patterns and permission-like entries.
    pub warnings: Vec<ResolveWarning>,
}

/// Applies `spec`'s catalog fields to `tool_ids`.
pub fn filter_catalog(spec: &AgentSpec, tool_ids: &[&str]) -> CatalogOutcome {
    let mut warnings = Vec::new();
    let allow_all = spec.allowed_tools.is_none() && spec.allowed_tool_patterns.is_none();
    let allowed = spec.allowed_tools.as_deref().unwrap_or_default();
    let allowed_patterns = spec.allowed_tool_patterns.as_deref().unwrap_or_default();
    let keep = tool_ids
        .iter()
        .map(|id| {
            let allowed = allow_all
                || allowed.iter().any(|a| a == id)
                || allowed_patterns.iter().any(|p| p.matches(id));
            let excluded = spec.excluded_tools.iter().any(|e| e == id)
                || spec.excluded_tool_patterns.iter().any(|p| p.matches(id));
            allowed && !excluded
        })
        .collect();
    for (field, patterns) in [
        ("allowed_tool_patterns", allowed_patterns),
        ("excluded_tool_patterns", &spec.excluded_tool_patterns[..]),
    ] {
        for p in patterns {
            if !tool_ids.iter().any(|id| p.matches(id)) {
                warnings.push(ResolveWarning::UnmatchedPattern {
                    field,
                    pattern: p.to_string(),
                });
            }
            if p.as_str().contains('(') {
                warnings.push(ResolveWarning::PermissionLikeCatalogEntry {
                    field,
                    entry: p.to_string(),
                });
            }
        }
    }
    for (field, entries) in [
        ("allowed_tools", allowed),
        ("excluded_tools", &spec.excluded_tools[..]),
    ] {
        for e in entries {
            if e.contains('(') {
                warnings.push(ResolveWarning::PermissionLikeCatalogEntry {
                    field,
                    entry: e.clone(),
                });
            }
        }
    }
    CatalogOutcome { keep, warnings }
}
