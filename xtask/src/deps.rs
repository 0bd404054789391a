//! The crate-direction check, over `cargo metadata` output: the workspace crates form one
//! ordered table, and each row also names what that crate must never know.
//!
//! For each workspace crate of the table, its normal (non-dev, non-build) dependencies are
//! followed transitively with the features that crate itself enables (its default features,
//! then every feature they turn on, through every dependency), and two rules are checked:
//!
//! 1. direction: a workspace crate may only reach workspace crates listed before it in the
//!    table, and never one its row says it must not know;
//! 2. the "must never know" column: crates whose row excludes IO, storage or HTTP must not
//!    reach a crate of that kind (`tokio` counts only with runtime features).
//!
//! A violation names the crate, the path to the forbidden crate and the rule.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// What a crate must not reach besides later workspace crates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Forbid {
    /// No IO at all: tokio with runtime features, HTTP, storage, sockets.
    Io,
    /// No storage engines and no HTTP (timers and file reading are allowed).
    StorageAndHttp,
    /// Only the workspace direction rule.
    Nothing,
}

/// One row of the crate table: a crate and what it must never know.
struct Row {
    name: &'static str,
    forbid: Forbid,
    /// Earlier workspace crates this one must still never know.
    never: &'static [&'static str],
}

/// The crate table, in order: a crate may depend only on crates listed before it.
const TABLE: &[Row] = &[
    Row {
        name: "awaken-event",
        forbid: Forbid::Io,
        never: &[],
    },
    Row {
        name: "awaken-spec",
        forbid: Forbid::Io,
        never: &[],
    },
    Row {
        name: "awaken-state",
        forbid: Forbid::Io,
        never: &[],
    },
    Row {
        name: "awaken-tool",
        forbid: Forbid::Io,
        never: &["awaken-phase"],
    },
    Row {
        name: "awaken-phase",
        forbid: Forbid::Io,
        never: &[],
    },
    Row {
        name: "awaken-llm",
        forbid: Forbid::Nothing,
        never: &["awaken-state", "awaken-phase", "awaken-tool"],
    },
    Row {
        name: "awaken-net",
        forbid: Forbid::Nothing,
        never: &[
            "awaken-event",
            "awaken-spec",
            "awaken-state",
            "awaken-tool",
            "awaken-phase",
            "awaken-llm",
        ],
    },
    Row {
        name: "awaken-plugin",
        forbid: Forbid::StorageAndHttp,
        never: &[],
    },
    Row {
        name: "awaken-context",
        forbid: Forbid::StorageAndHttp,
        never: &[],
    },
    Row {
        name: "awaken-resolver",
        forbid: Forbid::Io,
        never: &[],
    },
    Row {
        name: "awaken-store",
        forbid: Forbid::Nothing,
        never: &[
            "awaken-phase",
            "awaken-plugin",
            "awaken-context",
            "awaken-resolver",
        ],
    },
    Row {
        name: "awaken-mcp",
        forbid: Forbid::Nothing,
        never: &[
            "awaken-phase",
            "awaken-llm",
            "awaken-net",
            "awaken-plugin",
            "awaken-context",
            "awaken-resolver",
            "awaken-store",
        ],
    },
    Row {
        name: "awaken-runtime",
        forbid: Forbid::Nothing,
        never: &[],
    },
    Row {
        name: "awaken-a2a",
        forbid: Forbid::Nothing,
        never: &["awaken-runtime"],
    },
    Row {
        name: "awaken-server",
        forbid: Forbid::Nothing,
        never: &[],
    },
    Row {
        name: "awaken",
        forbid: Forbid::Nothing,
        never: &[],
    },
    Row {
        name: "awaken-otel",
        forbid: Forbid::Nothing,
        never: &[
            "awaken-event",
            "awaken-spec",
            "awaken-state",
            "awaken-tool",
            "awaken-phase",
            "awaken-llm",
            "awaken-net",
            "awaken-plugin",
            "awaken-context",
            "awaken-resolver",
            "awaken-store",
            "awaken-mcp",
            "awaken-runtime",
            "awaken-a2a",
            "awaken-server",
            "awaken",
        ],
    },
    Row {
        name: "awaken-cli",
        forbid: Forbid::Nothing,
        never: &[],
    },
];

/// Workspace members outside the table that may depend on anything (tools, never
/// dependencies: the benches and the soak, which enables the test-only failpoints).
const UNCHECKED: &[&str] = &["xtask", "awaken-benches", "awaken-soak"];

const HTTP_CRATES: &[&str] = &[
    "reqwest",
    "hyper",
    "hyper-util",
    "h2",
    "axum",
    "ureq",
    "isahc",
    "curl",
    "tonic",
    "warp",
    "actix-web",
];
const STORAGE_CRATES: &[&str] = &[
    "rusqlite",
    "libsqlite3-sys",
    "tokio-postgres",
    "postgres",
    "sqlx",
    "sled",
    "redb",
    "diesel",
];
const IO_CRATES: &[&str] = &[
    "mio",
    "socket2",
    "async-std",
    "smol",
    "async-io",
    "tokio-util",
];
/// tokio features that bring a runtime, sockets, files, processes or signals.
const TOKIO_RUNTIME_FEATURES: &[&str] = &[
    "full",
    "rt",
    "rt-multi-thread",
    "net",
    "fs",
    "process",
    "signal",
    "io-std",
];

/// A broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Violation {
    /// The checked crate.
    pub(crate) krate: String,
    /// Package names from the crate to the forbidden one.
    pub(crate) path: Vec<String>,
    /// What rule it breaks.
    pub(crate) rule: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} (path: {})",
            self.krate,
            self.rule,
            self.path.join(" -> ")
        )
    }
}

struct Package<'a> {
    name: &'a str,
    deps: Vec<Dep<'a>>,
    features: BTreeMap<&'a str, Vec<&'a str>>,
}

struct Dep<'a> {
    /// The name the dependency is known by in the manifest (its rename, or its package name).
    key: String,
    package_name: &'a str,
    optional: bool,
    default_features: bool,
    features: Vec<&'a str>,
}

struct Graph<'a> {
    packages: HashMap<&'a str, Package<'a>>,
    /// Package id → (dependency package name → resolved package id), normal edges only.
    resolved: HashMap<&'a str, HashMap<&'a str, &'a str>>,
    workspace: BTreeMap<&'a str, &'a str>,
}

fn str_field<'a>(v: &'a Value, key: &str) -> Result<&'a str> {
    v.get(key)
        .and_then(Value::as_str)
        .with_context(|| format!("metadata: missing string `{key}`"))
}

fn parse(meta: &Value) -> Result<Graph<'_>> {
    let mut packages = HashMap::new();
    for p in meta["packages"]
        .as_array()
        .context("metadata: no packages array")?
    {
        let id = str_field(p, "id")?;
        let mut deps = Vec::new();
        for d in p["dependencies"]
            .as_array()
            .context("metadata: package without dependencies")?
        {
            if !d["kind"].is_null() {
                continue; // dev and build dependencies are not part of what a crate knows
            }
            let package_name = str_field(d, "name")?;
            deps.push(Dep {
                key: d["rename"].as_str().unwrap_or(package_name).to_owned(),
                package_name,
                optional: d["optional"].as_bool().unwrap_or(false),
                default_features: d["uses_default_features"].as_bool().unwrap_or(true),
                features: d["features"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default(),
            });
        }
        let mut features = BTreeMap::new();
        if let Some(map) = p["features"].as_object() {
            for (k, v) in map {
                let list = v
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                features.insert(k.as_str(), list);
            }
        }
        packages.insert(
            id,
            Package {
                name: str_field(p, "name")?,
                deps,
                features,
            },
        );
    }
    let mut resolved = HashMap::new();
    for node in meta["resolve"]["nodes"]
        .as_array()
        .context("metadata: no resolve graph (run without --no-deps)")?
    {
        let id = str_field(node, "id")?;
        let mut edges = HashMap::new();
        for d in node["deps"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let normal = d["dep_kinds"]
                .as_array()
                .is_some_and(|kinds| kinds.iter().any(|k| k["kind"].is_null()));
            if !normal {
                continue;
            }
            let pkg = str_field(d, "pkg")?;
            let name = packages
                .get(pkg)
                .map(|p| p.name)
                .with_context(|| format!("metadata: unknown package {pkg}"))?;
            edges.insert(name, pkg);
        }
        resolved.insert(id, edges);
    }
    let mut workspace = BTreeMap::new();
    for m in meta["workspace_members"]
        .as_array()
        .context("metadata: no workspace_members")?
    {
        let id = m
            .as_str()
            .context("metadata: workspace member is not a string")?;
        let name = packages
            .get(id)
            .map(|p| p.name)
            .with_context(|| format!("metadata: unknown member {id}"))?;
        workspace.insert(name, id);
    }
    Ok(Graph {
        packages,
        resolved,
        workspace,
    })
}

/// Activated packages with their features, and the BFS parent of each for path reports.
struct Activation<'a> {
    features: HashMap<&'a str, BTreeSet<String>>,
    parent: HashMap<&'a str, Option<&'a str>>,
}

impl<'a> Graph<'a> {
    fn activate(&self, root: &'a str) -> Activation<'a> {
        let mut act = Activation {
            features: HashMap::new(),
            parent: HashMap::new(),
        };
        let mut queue: VecDeque<(&'a str, Option<&'a str>, Vec<String>)> = VecDeque::new();
        queue.push_back((root, None, vec!["default".to_owned()]));
        while let Some((id, parent, wanted)) = queue.pop_front() {
            let Some(pkg) = self.packages.get(id) else {
                continue;
            };
            let first_visit = !act.features.contains_key(id);
            act.parent.entry(id).or_insert(parent);
            let enabled = act.features.entry(id).or_default();
            let mut new_features = Vec::new();
            let mut stack: Vec<String> = wanted;
            while let Some(f) = stack.pop() {
                if f == "default" && !pkg.features.contains_key("default") {
                    continue;
                }
                if enabled.insert(f.clone()) {
                    new_features.push(f.clone());
                    if let Some(list) = pkg.features.get(f.as_str()) {
                        stack.extend(
                            list.iter()
                                .filter(|e| !e.contains('/') && !e.starts_with("dep:"))
                                .map(|e| (*e).to_owned()),
                        );
                    }
                }
            }
            if !first_visit && new_features.is_empty() {
                continue;
            }
            let enabled = enabled.clone();
            let edges = self.resolved.get(id);
            // Which optional deps are on, and extra features per dep key.
            let mut dep_on: BTreeSet<String> = BTreeSet::new();
            let mut dep_features: BTreeMap<String, Vec<String>> = BTreeMap::new();
            let mut weak: Vec<(String, String)> = Vec::new();
            for f in &enabled {
                let Some(list) = pkg.features.get(f.as_str()) else {
                    // An implicit feature named after an optional dependency.
                    dep_on.insert(f.clone());
                    continue;
                };
                for e in list {
                    if let Some(dep) = e.strip_prefix("dep:") {
                        dep_on.insert(dep.to_owned());
                    } else if let Some((dep, feat)) = e.split_once('/') {
                        if let Some(dep) = dep.strip_suffix('?') {
                            weak.push((dep.to_owned(), feat.to_owned()));
                        } else {
                            dep_on.insert(dep.to_owned());
                            dep_features
                                .entry(dep.to_owned())
                                .or_default()
                                .push(feat.to_owned());
                        }
                    } else if !pkg.features.contains_key(e) {
                        dep_on.insert((*e).to_owned());
                    }
                }
            }
            for (dep, feat) in weak {
                if dep_on.contains(&dep) || pkg.deps.iter().any(|d| d.key == dep && !d.optional) {
                    dep_features.entry(dep).or_default().push(feat);
                }
            }
            for dep in &pkg.deps {
                if dep.optional && !dep_on.contains(&dep.key) {
                    continue;
                }
                let Some(target) = edges.and_then(|e| e.get(dep.package_name)) else {
                    continue;
                };
                let mut wanted: Vec<String> =
                    dep.features.iter().map(|f| (*f).to_owned()).collect();
                if dep.default_features {
                    wanted.push("default".to_owned());
                }
                wanted.extend(dep_features.get(&dep.key).cloned().unwrap_or_default());
                queue.push_back((target, Some(id), wanted));
            }
        }
        act
    }

    fn path(&self, act: &Activation<'a>, mut id: &'a str) -> Vec<String> {
        let mut path = Vec::new();
        loop {
            path.push(self.packages.get(id).map_or(id, |p| p.name).to_owned());
            match act.parent.get(id).copied().flatten() {
                Some(p) => id = p,
                None => break,
            }
        }
        path.reverse();
        path
    }
}

fn io_kind(name: &str, features: &BTreeSet<String>, forbid: Forbid) -> Option<String> {
    let http = HTTP_CRATES.contains(&name);
    let storage = STORAGE_CRATES.contains(&name);
    match forbid {
        Forbid::Nothing => None,
        Forbid::StorageAndHttp if http => {
            Some(format!("must never know HTTP, but reaches `{name}`"))
        }
        Forbid::StorageAndHttp if storage => Some(format!(
            "must never know storage engines, but reaches `{name}`"
        )),
        Forbid::StorageAndHttp => None,
        Forbid::Io if http || storage || IO_CRATES.contains(&name) => {
            Some(format!("must do no IO, but reaches `{name}`"))
        }
        Forbid::Io if name == "tokio" => {
            let bad: Vec<&str> = TOKIO_RUNTIME_FEATURES
                .iter()
                .copied()
                .filter(|f| features.contains(*f))
                .collect();
            (!bad.is_empty()).then(|| {
                format!("must do no IO, but reaches `tokio` with runtime features {bad:?}")
            })
        }
        Forbid::Io => None,
    }
}

/// Runs both rules over parsed `cargo metadata` JSON.
pub(crate) fn check(meta: &Value) -> Result<Vec<Violation>> {
    let graph = parse(meta)?;
    let mut violations = Vec::new();
    for name in graph.workspace.keys() {
        if !UNCHECKED.contains(name) && !TABLE.iter().any(|r| r.name == *name) {
            bail!("workspace crate `{name}` has no row in the crate table of xtask/src/deps.rs");
        }
    }
    for (pos, row) in TABLE.iter().enumerate() {
        let Some(root) = graph.workspace.get(row.name).copied() else {
            continue;
        };
        let act = graph.activate(root);
        let mut reached: Vec<&str> = act.features.keys().copied().collect();
        reached.sort_unstable();
        for id in reached {
            if id == root {
                continue;
            }
            let Some(pkg) = graph.packages.get(id) else {
                continue;
            };
            let rule = if graph.workspace.contains_key(pkg.name) {
                match TABLE.iter().position(|r| r.name == pkg.name) {
                    _ if row.never.contains(&pkg.name) => {
                        Some(format!("must never know `{}`", pkg.name))
                    }
                    Some(p) if p >= pos => Some(format!(
                        "may only depend on crates listed before it in the table, but reaches `{}`",
                        pkg.name
                    )),
                    None => Some(format!(
                        "must not depend on the tooling crate `{}`",
                        pkg.name
                    )),
                    Some(_) => None,
                }
            } else {
                io_kind(pkg.name, &act.features[id], row.forbid)
            };
            if let Some(rule) = rule {
                violations.push(Violation {
                    krate: row.name.to_owned(),
                    path: graph.path(&act, id),
                    rule,
                });
            }
        }
    }
    Ok(violations)
}

#[cfg(test)]
mod tests;
