use serde_json::Value;

use super::check;

fn fixture() -> Value {
    serde_json::from_str(include_str!("../../fixtures/metadata_violations.json"))
        .expect("fixture is JSON")
}

/// Every violation of the fixture, one per line, sorted.
fn render(meta: &Value) -> String {
    let mut lines: Vec<String> = check(meta)
        .expect("checkable")
        .iter()
        .map(ToString::to_string)
        .collect();
    lines.sort();
    lines.join("\n")
}

#[test]
fn fixture_reports_every_violation_with_its_path() {
    expect_test::expect![[r#"
        awaken-event: must do no IO, but reaches `hyper` (path: awaken-event -> hyper)
        awaken-llm: must never know `awaken-phase` (path: awaken-llm -> awaken-state -> awaken-phase)
        awaken-llm: must never know `awaken-state` (path: awaken-llm -> awaken-state)
        awaken-resolver: must do no IO, but reaches `hyper` (path: awaken-resolver -> awaken-llm -> awaken-event -> hyper)
        awaken-resolver: must do no IO, but reaches `rusqlite` (path: awaken-resolver -> awaken-plugin -> rusqlite)
        awaken-spec: must do no IO, but reaches `tokio` with runtime features ["rt"] (path: awaken-spec -> optnet -> tokio)
        awaken-state: may only depend on crates listed before it in the table, but reaches `awaken-phase` (path: awaken-state -> awaken-phase)
        awaken-store: must never know `awaken-phase` (path: awaken-store -> awaken-resolver -> awaken-llm -> awaken-state -> awaken-phase)
        awaken-store: must never know `awaken-plugin` (path: awaken-store -> awaken-resolver -> awaken-plugin)
        awaken-store: must never know `awaken-resolver` (path: awaken-store -> awaken-resolver)"#]].assert_eq(&render(&fixture()));
}

#[test]
fn clean_graph_has_no_violation() {
    let mut meta = fixture();
    // Keep only the crates that break nothing: tool (tokio without runtime features) and
    // plugin (rusqlite behind a feature it does not enable).
    let keep = ["awaken-tool", "awaken-plugin"];
    let members: Vec<Value> = meta["workspace_members"]
        .as_array()
        .expect("array")
        .iter()
        .filter(|m| {
            keep.iter()
                .any(|k| m.as_str().is_some_and(|s| s.contains(&format!("/{k}#"))))
        })
        .cloned()
        .collect();
    assert_eq!(members.len(), 2);
    meta["workspace_members"] = Value::Array(members);
    assert_eq!(render(&meta), "");
}

#[test]
fn unknown_workspace_crate_is_an_error() {
    let mut meta = fixture();
    let packages = meta["packages"].as_array_mut().expect("array");
    let mut extra = packages[0].clone();
    extra["name"] = "awaken-mystery".into();
    extra["id"] = "path+file:///ws/awaken-mystery#0.1.0".into();
    packages.push(extra);
    meta["workspace_members"]
        .as_array_mut()
        .expect("array")
        .push("path+file:///ws/awaken-mystery#0.1.0".into());
    let err = check(&meta).expect_err("not in the table");
    assert!(err.to_string().contains("awaken-mystery"), "{err}");
}

#[test]
fn the_net_guard_may_reach_http_but_no_workspace_crate() {
    let mut meta = fixture();
    let id = "path+file:///ws/awaken-net#0.1.0";
    let hyper = "registry+https://github.com/rust-lang/crates.io-index#hyper@1.0.0";
    let tool = "path+file:///ws/awaken-tool#0.1.0";
    let dep = |name: &str| {
        serde_json::json!({"name": name, "source": null, "req": "*", "kind": null,
            "rename": null, "optional": false, "uses_default_features": true, "features": [],
            "target": null, "registry": null})
    };
    meta["packages"]
        .as_array_mut()
        .expect("array")
        .push(serde_json::json!({
            "name": "awaken-net", "version": "0.1.0", "id": id, "license": null,
            "source": null, "dependencies": [dep("hyper"), dep("awaken-tool")],
            "targets": [], "features": {}, "manifest_path": "/ws/awaken-net/Cargo.toml"
        }));
    let edge = |name: &str, pkg: &str| serde_json::json!({"name": name, "pkg": pkg, "dep_kinds": [{"kind": null, "target": null}]});
    meta["resolve"]["nodes"]
        .as_array_mut()
        .expect("array")
        .push(serde_json::json!({
            "id": id, "dependencies": [hyper, tool],
            "deps": [edge("hyper", hyper), edge("awaken_tool", tool)], "features": []
        }));
    meta["workspace_members"]
        .as_array_mut()
        .expect("array")
        .push(id.into());
    let net: Vec<String> = render(&meta)
        .lines()
        .filter(|l| l.starts_with("awaken-net:"))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        net,
        ["awaken-net: must never know `awaken-tool` (path: awaken-net -> awaken-tool)"]
    );
}
