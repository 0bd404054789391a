//! Argument validation: valid, missing required, wrong type, extra properties, nested paths,
//! every violation listed, the tool not called, invalid schemas rejected at registration.

use std::sync::atomic::Ordering;

use awaken_tool::{RegisteredTool, ToolError, ToolRegistrationError, Violation};
use expect_test::{Expect, expect};
use serde_json::{Value, json};

use crate::support::{Behaviour, Scripted, registry, tool_ctx};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": { "type": "string" },
            "days": { "type": "integer", "minimum": 1 },
            "address": {
                "type": "object",
                "properties": {
                    "zip": { "type": "string", "pattern": "^[0-9]{5}$" },
                    "lines": { "type": "array", "items": { "type": "string" } }
                },
                "required": ["zip"]
            }
        },
        "required": ["city"],
        "additionalProperties": false
    })
}

fn weather() -> RegisteredTool {
    RegisteredTool::from_tool(Scripted::new("weather", Behaviour::Echo).with_schema(schema()))
        .expect("valid schema")
}

/// Renders the violations as `path | message` lines (`-` when the arguments are valid).
fn check(args: Value, expected: Expect) {
    let tool = weather();
    let rendered = match tool.validate(&args) {
        Ok(()) => "-".to_owned(),
        Err(ToolError::InvalidArguments {
            tool_id,
            violations,
        }) => {
            assert_eq!(tool_id, "weather");
            assert!(!tool.validator().is_valid(&args));
            violations
                .iter()
                .map(|Violation { path, message }| format!("{path:?} | {message}\n"))
                .collect()
        }
        Err(other) => panic!("unexpected error {other:?}"),
    };
    expected.assert_eq(&rendered);
}

#[test]
fn valid_arguments_pass() {
    check(json!({"city": "Paris"}), expect!["-"]);
    check(
        json!({"city": "Paris", "days": 3, "address": {"zip": "75001", "lines": ["a"]}}),
        expect!["-"],
    );
}

#[test]
fn a_missing_required_property_is_reported_at_its_object() {
    check(
        json!({"days": 2}),
        expect![[r#"
            "" | "city" is a required property
        "#]],
    );
}

#[test]
fn a_wrong_type_is_reported_at_its_path() {
    check(
        json!({"city": 7, "days": "three"}),
        expect![[r#"
            "/city" | 7 is not of type "string"
            "/days" | "three" is not of type "integer"
        "#]],
    );
}

#[test]
fn extra_properties_are_rejected_when_the_schema_forbids_them() {
    check(
        json!({"city": "Paris", "country": "FR"}),
        expect![[r#"
            "" | Additional properties are not allowed ('country' was unexpected)
        "#]],
    );
}

#[test]
fn nested_violations_carry_their_full_path() {
    check(
        json!({"city": "Paris", "address": {"zip": "7500", "lines": ["ok", 3]}}),
        expect![[r#"
            "/address/lines/1" | 3 is not of type "string"
            "/address/zip" | "7500" does not match "^[0-9]{5}$"
        "#]],
    );
    check(
        json!({"city": "Paris", "address": {}}),
        expect![[r#"
            "/address" | "zip" is a required property
        "#]],
    );
}

#[tokio::test]
async fn invalid_arguments_become_an_error_result_and_the_tool_is_not_called() {
    let scripted = Scripted::new("weather", Behaviour::Echo).with_schema(schema());
    let calls = scripted.calls.clone();
    let tool = RegisteredTool::from_tool(scripted).expect("valid schema");
    let err = tool
        .invoke(&json!({"city": 1, "days": 0}), &tool_ctx("c1"), &registry())
        .await
        .expect_err("invalid arguments");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the tool must not run");
    let result = err.to_result();
    assert!(result.is_error());
    expect![[r#"invalid arguments for tool `weather`: at /city: 1 is not of type "string"; at /days: 0 is less than the minimum of 1"#]]
        .assert_eq(result.content.as_str().expect("text"));
    // The same tool runs once the arguments are valid.
    tool.invoke(&json!({"city": "Oslo"}), &tool_ctx("c2"), &registry())
        .await
        .expect("valid call");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

fn register_error(schema: Value) -> String {
    match RegisteredTool::from_tool(Scripted::new("bad", Behaviour::Echo).with_schema(schema)) {
        Ok(_) => "registered".to_owned(),
        Err(ToolRegistrationError::InvalidSchema {
            tool_id,
            schema_path,
            message,
        }) => {
            assert_eq!(tool_id, "bad");
            format!("{schema_path:?} | {message}")
        }
        Err(other) => panic!("unexpected error {other:?}"),
    }
}

#[test]
fn an_invalid_schema_is_rejected_at_registration() {
    expect![[
        r#""/type" | 12 is not valid under any of the schemas listed in the 'anyOf' keyword"#
    ]]
    .assert_eq(&register_error(json!({"type": 12})));
    expect![[r#""/properties/a/type" | "nope" is not valid under any of the schemas listed in the 'anyOf' keyword"#]]
        .assert_eq(&register_error(
            json!({"type": "object", "properties": {"a": {"type": "nope"}}}),
        ));
    expect![[r#""" | "not a schema" is not of types "boolean", "object""#]]
        .assert_eq(&register_error(json!("not a schema")));
}

#[test]
fn a_schema_that_needs_io_to_resolve_is_rejected_at_registration() {
    let message = register_error(json!({"$ref": "https://schemas.invalid/args.json"}));
    assert_ne!(message, "registered");
    let message = register_error(json!({"$ref": "file:///etc/args.json"}));
    assert_ne!(message, "registered");
}

#[test]
fn arguments_that_are_not_json_are_reported_without_running_anything() {
    let tool = weather();
    let mut bad = crate::support::call("c1", "weather", Value::Null);
    bad.invalid_arguments = Some("{\"city\": Par".into());
    let err = tool.check_call(&bad).expect_err("not JSON");
    expect![[r#"invalid arguments for tool `weather`: at (root): the arguments are not valid JSON: "{\"city\": Par""#]]
        .assert_eq(&err.to_string());
    let good = crate::support::call("c2", "weather", json!({"city": "Rome"}));
    assert_eq!(tool.check_call(&good), Ok(()));
    let wrong = crate::support::call("c3", "weather", json!({"city": 1}));
    assert!(tool.check_call(&wrong).is_err());
}

/// `levels` nested `allOf`s, each with `unevaluatedProperties`, around `inner`.
fn nested_unevaluated(levels: usize, inner: Value) -> Value {
    let mut schema = inner;
    for _ in 0..levels {
        schema = json!({"type": "object", "unevaluatedProperties": {}, "allOf": [schema]});
    }
    schema
}

/// `defs` definitions, each applying the next one twice: shared targets, 2^defs applications.
fn doubling_defs(defs: usize, applicator: &str) -> Value {
    let mut map = serde_json::Map::new();
    for i in 0..defs {
        let next = format!("#/$defs/d{}", i + 1);
        map.insert(
            format!("d{i}"),
            json!({applicator: [{"$ref": next}, {"$ref": next}]}),
        );
    }
    map.insert(format!("d{defs}"), json!({"type": "object"}));
    json!({"$defs": map, "$ref": "#/$defs/d0"})
}

/// Found by the `tool_arguments` fuzz target: a root reference inside nested `allOf`s with
/// `unevaluatedProperties` kept validation of `{}` busy for minutes (it grows with each level).
#[test]
fn a_reference_cycle_that_stays_on_the_value_is_rejected_at_registration() {
    let fuzzed = nested_unevaluated(4, json!({"type": "object", "$ref": "#", "items": true}));
    expect![[r#""/allOf/0/allOf/0/allOf/0/allOf/0/$ref" | it applies the root schema to the value it is validating, through references that never move into the value: validation would not end"#]]
        .assert_eq(&register_error(fuzzed));
    expect![[r#""/$defs/b/anyOf/0/$ref" | it applies the schema at /$defs/a to the value it is validating, through references that never move into the value: validation would not end"#]]
    .assert_eq(&register_error(json!({
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
        "$ref": "#/$defs/a"
    })));
    // Through an `$id`, an anchor, and the draft-4 `id`.
    for schema in [
        json!({"$id": "urn:x", "allOf": [{"not": {"$ref": "urn:x"}}]}),
        json!({"$defs": {"a": {"$anchor": "here", "if": {"$ref": "#here"}}}, "$ref": "#/$defs/a"}),
        json!({"$schema": "http://json-schema.org/draft-04/schema#", "id": "http://x.invalid/s",
               "properties": {"a": {"oneOf": [{"$ref": "http://x.invalid/s#/properties/a"}]}}}),
    ] {
        let message = register_error(schema.clone());
        assert!(
            message.contains("validation would not end"),
            "{schema}: {message}"
        );
    }
}

#[test]
fn schemas_whose_validation_work_grows_exponentially_are_rejected_at_registration() {
    for schema in [
        nested_unevaluated(16, json!({"type": "object"})),
        doubling_defs(24, "allOf"),
        doubling_defs(24, "anyOf"),
    ] {
        expect![[r#""" | validating a value against it could take more than 1000000 schema applications (nested or shared in-place subschemas under `unevaluatedProperties` or `unevaluatedItems`, or references reused too often)"#]]
            .assert_eq(&register_error(schema));
    }
}

#[test]
fn recursive_and_shared_schemas_of_real_size_register_and_validate() {
    let shallow = RegisteredTool::from_tool(
        Scripted::new("shallow", Behaviour::Echo).with_schema(nested_unevaluated(4, json!({}))),
    )
    .expect("four levels of unevaluatedProperties");
    assert!(shallow.validator().is_valid(&json!({"a": 1})));
    let shared = RegisteredTool::from_tool(
        Scripted::new("shared", Behaviour::Echo).with_schema(doubling_defs(10, "allOf")),
    )
    .expect("a thousand applications");
    assert!(!shared.validator().is_valid(&json!(1)));

    // Recursion through members and items ends with the value, however deep it is.
    let tree = json!({
        "$defs": {"node": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}
            },
            "required": ["name"],
            "unevaluatedProperties": false
        }},
        "$ref": "#/$defs/node"
    });
    let tree = RegisteredTool::from_tool(Scripted::new("tree", Behaviour::Echo).with_schema(tree))
        .expect("a recursive tree");
    let mut value = json!({"name": "leaf"});
    for _ in 0..50 {
        value = json!({"name": "n", "children": [value.clone(), {"name": "x"}]});
    }
    assert!(tree.validator().is_valid(&value));
    assert!(
        !tree
            .validator()
            .is_valid(&json!({"name": "n", "children": [{"other": 1}]}))
    );
    let nested_list =
        json!({"anyOf": [{"type": "string"}, {"type": "array", "items": {"$ref": "#"}}]});
    RegisteredTool::from_tool(Scripted::new("lists", Behaviour::Echo).with_schema(nested_list))
        .expect("a recursive list");

    // The meta-schema itself, with its dynamic references.
    let meta = json!({"$ref": "https://json-schema.org/draft/2020-12/schema"});
    let meta = RegisteredTool::from_tool(Scripted::new("meta", Behaviour::Echo).with_schema(meta))
        .expect("a reference to the 2020-12 meta-schema");
    assert!(meta.validator().is_valid(&json!({"type": "object"})));
    assert!(!meta.validator().is_valid(&json!({"type": 12})));
}

/// A schema that applies itself twice to one member of its value doubles the work with each
/// level of the value (listing violations has no cache: 2^18 errors for 18 levels).
#[test]
fn recursion_that_reaches_one_member_twice_is_rejected_at_registration() {
    expect![[r#""/$defs/n/properties/c/$ref" | it applies the schema at /$defs/n again to one member of the value along two paths (through /$defs/n/allOf/0/properties/c/$ref and /$defs/n/properties/c/$ref): validation work would double with each level of the value"#]]
    .assert_eq(&register_error(json!({
        "$defs": {"n": {
            "type": "object",
            "properties": {"c": {"$ref": "#/$defs/n"}},
            "allOf": [{"properties": {"c": {"$ref": "#/$defs/n"}}}]
        }},
        "$ref": "#/$defs/n"
    })));
    for schema in [
        // A property and a pattern that matches it.
        json!({"properties": {"c": {"$ref": "#"}}, "patternProperties": {"^c$": {"$ref": "#"}}}),
        // An item and any item, through a shared definition.
        json!({"$defs": {"x": {"items": {"$ref": "#"}}},
               "prefixItems": [{"$ref": "#"}], "anyOf": [{"$ref": "#/$defs/x"}]}),
        // Two references through one definition, walked once.
        json!({"$defs": {"n": {"properties": {"c": {"$ref": "#"}}}},
               "anyOf": [{"$ref": "#/$defs/n"}, {"$ref": "#/$defs/n"}]}),
    ] {
        let message = register_error(schema.clone());
        assert!(message.contains("would double"), "{schema}: {message}");
    }
    // Recursion into different members (a binary tree, any JSON value) is linear.
    for schema in [
        json!({"type": "object", "properties": {"left": {"$ref": "#"}, "right": {"$ref": "#"}}}),
        json!({"$defs": {"json": {"anyOf": [
            {"type": "object", "additionalProperties": {"$ref": "#/$defs/json"}},
            {"type": "array", "items": {"$ref": "#/$defs/json"}},
            {"type": ["string", "number", "boolean", "null"]}
        ]}}, "$ref": "#/$defs/json"}),
    ] {
        assert_eq!(register_error(schema.clone()), "registered", "{schema}");
    }
}
