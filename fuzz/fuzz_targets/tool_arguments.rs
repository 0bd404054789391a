//! Tool-argument validation (`awaken_tool::RegisteredTool`, `ArgumentValidator`) with arbitrary
//! schemas and arguments: registering a schema compiles it or fails with
//! `ToolRegistrationError::InvalidSchema`, never a panic; a compiled schema's three answers
//! agree (`is_valid`, `violations`, `validate`), and a call whose arguments were not JSON is
//! refused with one violation.

#![no_main]

use std::sync::Arc;

use arbitrary::{Arbitrary, Result, Unstructured};
use awaken_event::{EffectClass, ToolCall, ToolCallId, ToolDescriptor};
use awaken_fuzz::value;
use awaken_tool::{
    RegisteredTool, Tool, ToolCallContext, ToolError, ToolOutput, ToolRegistrationError,
};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};

#[derive(Debug)]
struct Input {
    schema: Value,
    arguments: Vec<Value>,
    raw: String,
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let schema = schema(u, 0)?;
        let mut arguments = Vec::new();
        for _ in 0..u.int_in_range(1..=3)? {
            arguments.push(if u.ratio(1, 2)? {
                instance(u, 0)?
            } else {
                value(u, 0)?
            });
        }
        Ok(Self {
            schema,
            arguments,
            raw: u.arbitrary()?,
        })
    }
}

const MAX_DEPTH: usize = 5;

/// Property names and strings the schemas and the arguments share.
const NAMES: &[&str] = &["a", "b", "q", "", "é", "$ref", "0"];

/// A `$ref` target: the root, a definition, a property, or something that does not resolve.
const REFS: &[&str] = &[
    "#",
    "#/$defs/a",
    "#/definitions/a",
    "#/properties/a",
    "#/$defs/missing",
    "#/items",
    "#a",
    "other.json",
    "http://example.invalid/schema",
    "#/$defs/a/properties/b",
    "urn:x",
    "#%",
];

const DRAFTS: &[&str] = &[
    "https://json-schema.org/draft/2020-12/schema",
    "https://json-schema.org/draft/2019-09/schema",
    "http://json-schema.org/draft-07/schema#",
    "http://json-schema.org/draft-06/schema#",
    "http://json-schema.org/draft-04/schema#",
    "http://example.invalid/unknown-draft",
];

const PATTERNS: &[&str] = &[
    "^a+$", "[", "(a|b)*c", "\\p{L}", "(?=a)", "\\1", "a{2,}", "^(a+)+$", "(?i)X", "\\d",
];

const FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "email",
    "uri",
    "uuid",
    "ipv4",
    "ipv6",
    "regex",
    "duration",
    "hostname",
    "json-pointer",
    "unknown",
];

const TYPES: &[&str] = &[
    "object", "array", "string", "number", "integer", "boolean", "null", "nope",
];

fn name(u: &mut Unstructured<'_>) -> Result<String> {
    Ok(if u.ratio(7, 8)? {
        (*u.choose(NAMES)?).to_owned()
    } else {
        u.arbitrary()?
    })
}

fn number(u: &mut Unstructured<'_>) -> Result<Value> {
    Ok(match u.choose_index(4)? {
        0 => json!(u.int_in_range(-3i64..=3)?),
        1 => json!(u.arbitrary::<i64>()?),
        2 => serde_json::Number::from_f64(u.arbitrary()?).map_or(json!(0.5), Value::Number),
        _ => json!(*u.choose(&[0.0, 1e-300, 1e308, 0.1, -0.0, 3.0])?),
    })
}

/// A schema: mostly objects of JSON Schema keywords, sometimes a boolean or any value.
fn schema(u: &mut Unstructured<'_>, depth: usize) -> Result<Value> {
    if depth >= MAX_DEPTH || u.ratio(1, 10)? {
        return Ok(if u.ratio(1, 2)? {
            Value::Bool(u.arbitrary()?)
        } else {
            value(u, 6)?
        });
    }
    let mut s = Map::new();
    for _ in 0..u.int_in_range(0..=4)? {
        let sub = |u: &mut Unstructured<'_>| schema(u, depth + 1);
        let (key, v) = match u.choose_index(34)? {
            0 => ("type", json!(*u.choose(TYPES)?)),
            1 => {
                let n = u.int_in_range(0..=3)?;
                let mut types = Vec::new();
                for _ in 0..n {
                    types.push(json!(*u.choose(TYPES)?));
                }
                ("type", Value::Array(types))
            }
            2 => {
                let mut props = Map::new();
                for _ in 0..u.int_in_range(0..=3)? {
                    props.insert(name(u)?, sub(u)?);
                }
                ("properties", Value::Object(props))
            }
            3 => {
                let n = u.int_in_range(0..=3)?;
                let mut req = Vec::new();
                for _ in 0..n {
                    req.push(json!(name(u)?));
                }
                ("required", Value::Array(req))
            }
            4 => ("items", sub(u)?),
            5 => ("additionalProperties", sub(u)?),
            6 => ("enum", Value::Array(vec![instance(u, 3)?, instance(u, 3)?])),
            7 => ("const", instance(u, 3)?),
            8 => ("minimum", number(u)?),
            9 => ("maximum", number(u)?),
            10 => ("exclusiveMinimum", number(u)?),
            11 => ("multipleOf", number(u)?),
            12 => ("minLength", number(u)?),
            13 => ("maxLength", number(u)?),
            14 => ("pattern", json!(*u.choose(PATTERNS)?)),
            15 => ("format", json!(*u.choose(FORMATS)?)),
            16 => ("$ref", json!(*u.choose(REFS)?)),
            17 => {
                let mut defs = Map::new();
                defs.insert("a".into(), sub(u)?);
                ("$defs", Value::Object(defs))
            }
            18 => {
                let mut defs = Map::new();
                defs.insert("a".into(), sub(u)?);
                ("definitions", Value::Object(defs))
            }
            19 => ("anyOf", Value::Array(vec![sub(u)?, sub(u)?])),
            20 => ("allOf", Value::Array(vec![sub(u)?])),
            21 => ("oneOf", Value::Array(vec![sub(u)?, sub(u)?])),
            22 => ("not", sub(u)?),
            23 => ("if", sub(u)?),
            24 => ("then", sub(u)?),
            25 => ("else", sub(u)?),
            26 => ("$schema", json!(*u.choose(DRAFTS)?)),
            27 => {
                let mut props = Map::new();
                props.insert((*u.choose(PATTERNS)?).to_owned(), sub(u)?);
                ("patternProperties", Value::Object(props))
            }
            28 => ("uniqueItems", Value::Bool(u.arbitrary()?)),
            29 => ("contains", sub(u)?),
            30 => ("propertyNames", sub(u)?),
            31 => ("unevaluatedProperties", sub(u)?),
            32 => ("prefixItems", Value::Array(vec![sub(u)?, sub(u)?])),
            _ => ("$id", json!(*u.choose(REFS)?)),
        };
        s.insert(key.to_owned(), v);
    }
    Ok(Value::Object(s))
}

/// Arguments shaped like what the schemas ask about.
fn instance(u: &mut Unstructured<'_>, depth: usize) -> Result<Value> {
    let leaf = depth >= MAX_DEPTH;
    Ok(match u.choose_index(if leaf { 5 } else { 7 })? {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => number(u)?,
        3 => json!(name(u)?),
        4 => json!(*u.choose(&[
            "2024-01-01T00:00:00Z",
            "a@b.c",
            "::1",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaa!",
            "P1D",
            "00000000-0000-0000-0000-000000000000",
        ])?),
        5 => {
            let n = u.int_in_range(0..=3)?;
            let mut items = Vec::new();
            for _ in 0..n {
                items.push(instance(u, depth + 1)?);
            }
            Value::Array(items)
        }
        _ => {
            let mut map = Map::new();
            for _ in 0..u.int_in_range(0..=3)? {
                map.insert(name(u)?, instance(u, depth + 1)?);
            }
            Value::Object(map)
        }
    })
}

/// A tool with the fuzzed schema (registration compiles it; the tool never runs).
struct Fuzzed(Arc<Value>);

#[async_trait::async_trait]
impl Tool for Fuzzed {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("fuzzed", "a tool with a fuzzed schema")
            .with_parameters(Arc::clone(&self.0))
            .with_effect(EffectClass::ReadOnly)
    }

    async fn execute(&self, _: &Value, _: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        Err(ToolError::execution("never run"))
    }
}

fuzz_target!(|input: Input| {
    let tool = match RegisteredTool::new(Arc::new(Fuzzed(Arc::new(input.schema)))) {
        Ok(tool) => tool,
        Err(ToolRegistrationError::InvalidSchema { tool_id, .. }) => {
            assert_eq!(tool_id, "fuzzed");
            return;
        }
        Err(other) => panic!("registering a schema failed with {other:?}"),
    };
    let validator = tool.validator();
    for args in &input.arguments {
        let valid = validator.is_valid(args);
        let violations = validator.violations(args);
        assert_eq!(
            valid,
            violations.is_empty(),
            "is_valid and violations disagree: {violations:?}"
        );
        match tool.validate(args) {
            Ok(()) => assert!(valid),
            Err(ToolError::InvalidArguments {
                tool_id,
                violations: listed,
            }) => {
                assert!(!valid);
                assert_eq!(tool_id, "fuzzed");
                assert_eq!(listed, violations);
            }
            Err(other) => panic!("validation failed with {other:?}"),
        }
    }
    // A call as the model sent it: text that may not be JSON.
    let call =
        ToolCall::from_raw_arguments(ToolCallId::new("c1").expect("valid"), "fuzzed", &input.raw);
    let checked = tool.check_call(&call);
    match &call.invalid_arguments {
        Some(_) => assert!(
            matches!(&checked, Err(ToolError::InvalidArguments { violations, .. }) if violations.len() == 1),
            "text that is not JSON: {checked:?}"
        ),
        None => assert_eq!(checked.is_ok(), validator.is_valid(&call.arguments)),
    }
});
