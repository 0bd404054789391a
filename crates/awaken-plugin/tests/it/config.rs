//! Config sections: valid, invalid with paths, missing, unclaimed.

use awaken_plugin::*;
use awaken_spec::Sections;
use serde_json::json;

fn schema() -> ConfigSchema {
    ConfigSchema::new(
        "audit",
        json!({
            "type": "object",
            "properties": {
                "level": {"enum": ["info", "debug"]},
                "targets": {"type": "array", "items": {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}}
            },
            "required": ["level"],
            "additionalProperties": false
        }),
    )
    .expect("valid schema")
}

fn render(reports: &[SectionReport]) -> String {
    reports
        .iter()
        .map(|r| {
            let status = match &r.status {
                SectionStatus::Valid => "valid".to_owned(),
                SectionStatus::Missing => "missing".to_owned(),
                SectionStatus::Unclaimed => "unclaimed".to_owned(),
                SectionStatus::Invalid(v) => format!(
                    "invalid: {}",
                    v.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(" | ")
                ),
            };
            format!(
                "{} ({}): {status}\n",
                r.section,
                r.claimed_by.as_deref().unwrap_or("-")
            )
        })
        .collect()
}

#[test]
fn sections_are_valid_invalid_missing_or_unclaimed() {
    let claims = vec![
        ("audit-plugin".to_owned(), schema()),
        (
            "other".to_owned(),
            ConfigSchema::new("limits", json!({"type": "object"})).expect("schema"),
        ),
    ];
    let mut sections = Sections::new();
    sections.insert(
        "audit",
        json!({"level": "loud", "targets": [{"url": 3}, {}], "extra": true}),
    );
    sections.insert("stray", json!({}));
    expect_test::expect![[r#"
        audit (audit-plugin): invalid: /level: "loud" is not one of "info" or "debug" | /targets/0/url: 3 is not of type "string" | /targets/1: "url" is a required property | /: Additional properties are not allowed ('extra' was unexpected)
        limits (other): missing
        stray (-): unclaimed
    "#]]
    .assert_eq(&render(&validate_sections(&sections, &claims)));

    let mut good = Sections::new();
    good.insert("audit", json!({"level": "info", "targets": [{"url": "x"}]}));
    assert_eq!(
        render(&validate_sections(&good, &claims)),
        "audit (audit-plugin): valid\nlimits (other): missing\n"
    );
}

#[test]
fn an_invalid_schema_is_rejected_when_made() {
    let err = ConfigSchema::new("broken", json!({"type": "no-such-type"})).expect_err("invalid");
    assert_eq!(err.section, "broken");
    assert!(
        err.to_string()
            .starts_with("the JSON Schema of config section `broken` is invalid"),
        "{err}"
    );
}
