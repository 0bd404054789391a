//! The typed form of the `permission` section: ordered rules deciding whether a tool call is
//! allowed, denied or needs a human's approval. First matching rule wins; otherwise the default.

use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

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

/// How an `equals` condition reads the argument and its operand (the matcher's `as` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Comparison {
    /// As JSON values (the default): equal types and contents, numbers by value (`1`, `1.0`,
    /// `1e0` and `10e-1` are one number), arrays item by item in order, objects key by key
    /// whatever their order. A string never equals a number.
    #[default]
    Json,
    /// As numbers: the argument is a JSON number, or a string that is exactly a JSON number
    /// (`"1"`, `"1.0"`, `"1e0"`), compared by value with the operand (a number, or a string
    /// holding one). Anything else does not match.
    Number,
    /// As strings: the argument is a string with exactly the operand's characters (a string).
    /// A number never matches, whatever its digits.
    String,
}

impl Comparison {
    /// The name the rule format uses (`json`, `number`, `string`).
    pub fn as_str(self) -> &'static str {
        match self {
            Comparison::Json => "json",
            Comparison::Number => "number",
            Comparison::String => "string",
        }
    }
}

/// A condition on one argument, addressed by JSON pointer (`/path/0/name`). Exactly one of
/// `equals` and `matches` is set; `as` (only with `equals`) says how the values compare.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgMatcher {
    /// JSON pointer into the arguments (RFC 6901: empty or starting with `/`).
    pub pointer: String,
    /// The argument must equal this value, compared as [`ArgMatcher::compare_as`] says
    /// (`null` included: a JSON `equals: null` is the value `null`, not an absent field).
    #[serde(
        default,
        deserialize_with = "present_value",
        skip_serializing_if = "Option::is_none"
    )]
    pub equals: Option<Value>,
    /// How `equals` compares (the rule format's `as`; absent: [`Comparison::Json`]).
    #[serde(rename = "as", default, skip_serializing_if = "Option::is_none")]
    pub compare_as: Option<Comparison>,
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
            (Some(expected), _) => match self.compare_as.unwrap_or_default() {
                Comparison::Json => json_equal(v, expected),
                Comparison::Number => match (number_in(v), number_in(expected)) {
                    (Some(a), Some(b)) => numbers_equal(&a, &b),
                    _ => false,
                },
                Comparison::String => matches!(
                    (v, expected),
                    (Value::String(a), Value::String(b)) if a == b
                ),
            },
            (None, Some(glob)) => v.as_str().is_some_and(|s| glob.matches(s)),
            (None, None) => false,
        }
    }
}

/// A field that is present holds a value, `null` included.
fn present_value<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// Whether two JSON values are equal with numbers compared by value, at any depth: the
/// comparison of the default `equals` ([`Comparison::Json`]).
pub fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => numbers_equal(x, y),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_equal(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

/// Whether two JSON numbers have the same value: integers exactly (also an integer against a
/// whole floating-point number), other numbers as the `f64` they were read as.
fn numbers_equal(x: &Number, y: &Number) -> bool {
    match (whole(x), whole(y)) {
        (Some(a), Some(b)) => a == b,
        // A number that is not whole never equals a whole one.
        (None, None) => x.as_f64() == y.as_f64(),
        _ => false,
    }
}

/// The value of a whole number (an integer, or a floating-point number without a fraction
/// within the range of `i128`).
fn whole(n: &Number) -> Option<i128> {
    if let Some(i) = n.as_i64() {
        return Some(i128::from(i));
    }
    if let Some(u) = n.as_u64() {
        return Some(i128::from(u));
    }
    let f = n.as_f64()?;
    // Below 2^127 in magnitude every whole `f64` converts exactly.
    (f.is_finite() && f.fract() == 0.0 && f.abs() < 1.7e38).then_some(f as i128)
}

/// The number `v` holds: a JSON number, or a string that is exactly a JSON number (no sign
/// other than a leading `-`, no spaces, no hexadecimal).
fn number_in(v: &Value) -> Option<Number> {
    match v {
        Value::Number(n) => Some(n.clone()),
        Value::String(s) if is_json_number(s) => serde_json::from_str(s).ok(),
        _ => None,
    }
}

/// Whether `s` is a number in JSON's grammar (RFC 8259 §6), and nothing else.
fn is_json_number(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = usize::from(b.first() == Some(&b'-'));
    let digits = |i: &mut usize| {
        let start = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i > start
    };
    match b.get(i) {
        Some(b'0') => i += 1,
        Some(b'1'..=b'9') => {
            digits(&mut i);
        }
        _ => return false,
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        if !digits(&mut i) {
            return false;
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !digits(&mut i) {
            return false;
        }
    }
    i == b.len()
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
                if let (Some(how), Some(operand)) = (m.compare_as, &m.equals) {
                    let fits = match how {
                        Comparison::Json => true,
                        Comparison::Number => number_in(operand).is_some(),
                        Comparison::String => operand.is_string(),
                    };
                    if !fits {
                        let wanted = match how {
                            Comparison::Number => "a number, or a string holding one",
                            _ => "a string",
                        };
                        return Err(SpecError::invalid(
                            format!("{field}.equals"),
                            format!(
                                "{operand} does not compare as {}: with `as = \"{}\"` it must be {wanted}",
                                how.as_str(),
                                how.as_str()
                            ),
                        ));
                    }
                } else if m.compare_as.is_some() {
                    return Err(SpecError::invalid(
                        format!("{field}.as"),
                        "`as` says how `equals` compares; `matches` always compares a string",
                    ));
                }
            }
        }
        Ok(())
    }
}
