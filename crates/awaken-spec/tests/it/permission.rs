//! Permission rules' conditions: how `equals` compares (as JSON values with numbers by value,
//! as numbers, as strings), `matches`, and the errors of a matcher that cannot work.

use awaken_spec::*;
use serde_json::Value;

/// The decision on a call of `t` whose arguments are the JSON text `args` (parsed as a model's
/// arguments are), under one rule `deny t when <matcher>` and the default `allow`.
fn decide(matcher: &str, args: &str) -> PermissionDecision {
    let config: PermissionConfig = parse_toml(&format!(
        "default = \"allow\"\n[[rules]]\ntool = \"t\"\ndecision = \"deny\"\nargs = [{matcher}]\n"
    ))
    .expect("the rule parses");
    config.validate().expect("the rule is valid");
    let args: Value = serde_json::from_str(args).expect("the arguments are JSON");
    config.decide("t", &args)
}

/// Each row: the matcher, the arguments, whether the rule matches (the call is denied).
fn check(rows: &[(&str, &str, bool)]) {
    let wrong: Vec<String> = rows
        .iter()
        .filter(|(matcher, args, denied)| {
            (decide(matcher, args) == PermissionDecision::Deny) != *denied
        })
        .map(|(matcher, args, denied)| {
            format!(
                "{matcher} on {args}: expected {}",
                if *denied { "deny" } else { "allow" }
            )
        })
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn equals_compares_numbers_by_value_at_any_depth() {
    let one = r#"{ pointer = "/n", equals = 1 }"#;
    let list = r#"{ pointer = "/n", equals = [1, { a = 2 }] }"#;
    let half = r#"{ pointer = "/n", equals = 0.5 }"#;
    check(&[
        // One number, many spellings.
        (one, r#"{"n": 1}"#, true),
        (one, r#"{"n": 1.0}"#, true),
        (one, r#"{"n": 1e0}"#, true),
        (one, r#"{"n": 10e-1}"#, true),
        (one, r#"{"n": 0.1e1}"#, true),
        (one, r#"{"n": 1.000}"#, true),
        (one, r#"{"n": 100E-2}"#, true),
        (r#"{ pointer = "/n", equals = 1.0 }"#, r#"{"n": 1}"#, true),
        (r#"{ pointer = "/n", equals = 0 }"#, r#"{"n": -0.0}"#, true),
        (half, r#"{"n": 5e-1}"#, true),
        (half, r#"{"n": 0.50}"#, true),
        // Other values, and other types with the same digits.
        (one, r#"{"n": 2}"#, false),
        (one, r#"{"n": 1.5}"#, false),
        (one, r#"{"n": -1}"#, false),
        (one, r#"{"n": "1"}"#, false),
        (one, r#"{"n": true}"#, false),
        (one, r#"{"n": [1]}"#, false),
        (one, r#"{}"#, false),
        (half, r#"{"n": 0}"#, false),
        // Past 2^53 an integer is exact, and a decimal is the f64 it was read as (2^53 + 1 is none).
        (
            r#"{ pointer = "/n", equals = 9007199254740993 }"#,
            r#"{"n": 9007199254740993.0}"#,
            false,
        ),
        (
            r#"{ pointer = "/n", equals = 9007199254740992 }"#,
            r#"{"n": 9007199254740992.0}"#,
            true,
        ),
        // Arrays item by item, objects key by key, numbers inside by value.
        (list, r#"{"n": [1.0, {"a": 2e0}]}"#, true),
        (list, r#"{"n": [10e-1, {"a": 20E-1}]}"#, true),
        (list, r#"{"n": [{"a": 2}, 1]}"#, false),
        (list, r#"{"n": [1, {"a": 2, "b": 3}]}"#, false),
        (list, r#"{"n": [1, {"a": "2"}]}"#, false),
        (list, r#"{"n": [1, {"a": 2}, 3]}"#, false),
        (
            r#"{ pointer = "/o", equals = { x = 1, y = "z" } }"#,
            r#"{"o": {"y": "z", "x": 1e0}}"#,
            true,
        ),
        // Strings, booleans and null are themselves only.
        (r#"{ pointer = "/s", equals = "1" }"#, r#"{"s": "1"}"#, true),
        (r#"{ pointer = "/s", equals = "1" }"#, r#"{"s": 1}"#, false),
        (
            r#"{ pointer = "/s", equals = "1" }"#,
            r#"{"s": "1.0"}"#,
            false,
        ),
        (
            r#"{ pointer = "/b", equals = true }"#,
            r#"{"b": true}"#,
            true,
        ),
        (r#"{ pointer = "/b", equals = true }"#, r#"{"b": 1}"#, false),
        (
            r#"{ pointer = "/b", equals = true }"#,
            r#"{"b": "true"}"#,
            false,
        ),
    ]);
    // JSON's `null` (TOML has none): only `null` equals it.
    let null: PermissionConfig = parse_json(
        r#"{"rules": [{"tool": "t", "decision": "deny", "args": [{"pointer": "/v", "equals": null}]}]}"#,
    )
    .expect("parses");
    let on = |args: &str| null.decide("t", &serde_json::from_str(args).expect("json"));
    assert_eq!(on(r#"{"v": null}"#), PermissionDecision::Deny);
    assert_eq!(on(r#"{"v": 0}"#), PermissionDecision::Ask);
    assert_eq!(on(r#"{"v": "null"}"#), PermissionDecision::Ask);
    assert_eq!(on(r#"{}"#), PermissionDecision::Ask, "missing is not null");
}

#[test]
fn as_number_reads_numbers_and_numeric_strings_by_value() {
    let one = r#"{ pointer = "/n", equals = 1, as = "number" }"#;
    let quoted = r#"{ pointer = "/n", equals = "1e0", as = "number" }"#;
    check(&[
        (one, r#"{"n": 1}"#, true),
        (one, r#"{"n": 1.0}"#, true),
        (one, r#"{"n": 1e0}"#, true),
        (one, r#"{"n": 10e-1}"#, true),
        (one, r#"{"n": "1"}"#, true),
        (one, r#"{"n": "1.0"}"#, true),
        (one, r#"{"n": "1e0"}"#, true),
        (one, r#"{"n": "10e-1"}"#, true),
        (one, r#"{"n": "-0.1e1"}"#, false),
        (quoted, r#"{"n": 1}"#, true),
        (quoted, r#"{"n": "1.0"}"#, true),
        // Strings that are not exactly a JSON number are not numbers.
        (one, r#"{"n": " 1"}"#, false),
        (one, r#"{"n": "1 "}"#, false),
        (one, r#"{"n": "+1"}"#, false),
        (one, r#"{"n": "01"}"#, false),
        (one, r#"{"n": "1."}"#, false),
        (one, r#"{"n": ".1e1"}"#, false),
        (one, r#"{"n": "0x1"}"#, false),
        (one, r#"{"n": "one"}"#, false),
        (one, r#"{"n": true}"#, false),
        (one, r#"{"n": [1]}"#, false),
        (one, r#"{"n": 2}"#, false),
    ]);
}

#[test]
fn as_string_compares_the_characters_of_strings_only() {
    let one = r#"{ pointer = "/s", equals = "1", as = "string" }"#;
    check(&[
        (one, r#"{"s": "1"}"#, true),
        (one, r#"{"s": "\u0031"}"#, true),
        (one, r#"{"s": 1}"#, false),
        (one, r#"{"s": 1.0}"#, false),
        (one, r#"{"s": "1.0"}"#, false),
        (one, r#"{"s": " 1"}"#, false),
        (one, r#"{"s": ["1"]}"#, false),
    ]);
}

#[test]
fn matches_is_a_glob_on_strings_only() {
    let env = r#"{ pointer = "/path", matches = "*.env" }"#;
    check(&[
        (env, r#"{"path": ".env"}"#, true),
        (env, r#"{"path": "a/b.env"}"#, true),
        (env, r#"{"path": ".envrc"}"#, false),
        (
            r#"{ pointer = "/n", matches = "1*" }"#,
            r#"{"n": 1}"#,
            false,
        ),
        (
            r#"{ pointer = "/n", matches = "1*" }"#,
            r#"{"n": "10"}"#,
            true,
        ),
    ]);
}

#[test]
fn a_matcher_that_cannot_work_is_named_with_its_field() {
    let error = |matcher: &str| {
        let config: PermissionConfig = parse_toml(&format!(
            "[[rules]]\ntool = \"t\"\ndecision = \"deny\"\nargs = [{{ pointer = \"/a\", equals = 1 }}, {matcher}]\n"
        ))
        .expect("parses");
        config.validate().expect_err("refused").to_string()
    };
    let errors = [
        error(r#"{ pointer = "/n", equals = "one", as = "number" }"#),
        error(r#"{ pointer = "/n", equals = [1], as = "number" }"#),
        error(r#"{ pointer = "/n", equals = 1, as = "string" }"#),
        error(r#"{ pointer = "/n", matches = "1*", as = "string" }"#),
    ];
    expect_test::expect![[r#"
        invalid `permission.rules[0].args[1].equals`: "one" does not compare as number: with `as = "number"` it must be a number, or a string holding one
        invalid `permission.rules[0].args[1].equals`: [1] does not compare as number: with `as = "number"` it must be a number, or a string holding one
        invalid `permission.rules[0].args[1].equals`: 1 does not compare as string: with `as = "string"` it must be a string
        invalid `permission.rules[0].args[1].as`: `as` says how `equals` compares; `matches` always compares a string"#]]
    .assert_eq(&errors.join("\n"));
    let unknown = parse_toml::<PermissionConfig>(
        "[[rules]]\ntool = \"t\"\ndecision = \"deny\"\nargs = [{ pointer = \"/n\", equals = 1, as = \"int\" }]\n",
    )
    .expect_err("refused")
    .to_string();
    assert!(unknown.contains("line 4"), "{unknown}");
    assert!(unknown.contains("unknown variant `int`"), "{unknown}");
}
