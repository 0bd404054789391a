//! The typed form of the `permission` section: ordered rules deciding whether a tool call is
//! allowed, denied or needs a human's approval. First matching rule wins; otherwise the default.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::SpecError;
use crate::glob::Glob;

/// The key of the permission section.
pub const PERMISSION_SECTION: &str = "permission";

/// What a rule decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionDecision {
    /// Let the call run.
    Allow,
    /// Block the call; the model is told.
    Deny,
    /// Suspend the call until a human decides.
    Ask,
}

/// A condition on one argument, addressed by JSON pointer (`/path/0/name`). Exactly one of
/// `equals` and `matches` is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgMatcher {
    /// JSON pointer into the arguments (RFC 6901: empty or starting with `/`).
    pub pointer: String,
    /// The argument must equal this JSON value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<Value>,
    /// The argument must be a string matching this glob.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<Glob>,
}

impl ArgMatcher {
    /// Whether `arguments` satisfy this matcher (a missing argument never matches).
    pub fn is_satisfied(&self, arguments: &Value) -> bool {
        let Some(v) = arguments.pointer(&self.pointer) else {
            return false;
        };
        match (&self.equals, &self.matches) {
            (Some(expected), _) => v == expected,
            (None, Some(glob)) => v.as_str().is_some_and(|s| glob.matches(s)),
            (None, None) => false,
        }
    }
}

/// One ordered rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PermissionRule {
    /// Glob over tool ids.
    pub tool: Glob,
    /// Conditions on the arguments, all of which must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<ArgMatcher>,
    /// What to do when the rule matches.
    pub decision: PermissionDecision,
}

impl PermissionRule {
    /// Whether this rule applies to the call.
    pub fn matches(&self, tool_id: &str, arguments: &Value) -> bool {
        self.tool.matches(tool_id) && self.args.iter().all(|m| m.is_satisfied(arguments))
    }
}

fn default_decision() -> PermissionDecision {
    PermissionDecision::Ask
}

/// The `permission` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PermissionConfig {
    /// Rules in priority order.
    #[serde(default)]
    pub rules: Vec<PermissionRule>,
    /// The decision when no rule matches (default: `ask`).
    #[serde(default = "default_decision")]
    pub default: PermissionDecision,
}

impl Default for PermissionConfig {
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            default: default_decision(),
        }
    }
}

impl PermissionConfig {
    /// The decision for a call: the first matching rule's, else the default.
    pub fn decide(&self, tool_id: &str, arguments: &Value) -> PermissionDecision {
        self.rules
            .iter()
            .find(|r| r.matches(tool_id, arguments))
            .map_or(self.default, |r| r.decision)
    }

    /// Checks every matcher, naming the rule and matcher that is wrong.
    pub fn validate(&self) -> Result<(), SpecError> {
        for (i, rule) in self.rules.iter().enumerate() {
            for (j, m) in rule.args.iter().enumerate() {
                let field = format!("permission.rules[{i}].args[{j}]");
                if !(m.pointer.is_empty() || m.pointer.starts_with('/')) {
                    return Err(SpecError::invalid(
                        format!("{field}.pointer"),
                        format!(
                            "{:?} is not a JSON pointer (it must be empty or start with '/')",
                            m.pointer
                        ),
                    ));
                }
                if m.equals.is_some() == m.matches.is_some() {
                    return Err(SpecError::invalid(
                        field,
                        "set exactly one of `equals` and `matches`",
                    ));
                }
            }
        }
        Ok(())
    }
}
