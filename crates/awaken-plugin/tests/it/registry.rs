//! The plugin registry: agent definitions and conflicts, loading, reload.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use awaken_plugin::*;
use expect_test::expect;

use crate::support::*;

fn defines(id: &str, agents: Vec<AgentDefinition>) -> Arc<dyn Plugin> {
    TestPlugin::new(id)
        .defining(move |_| Ok(agents.clone()))
        .arc()
}

fn prompts(configs: &AgentConfigs) -> String {
    configs
        .agents
        .values()
        .map(|a| format!("{}={} ({})", a.spec.id, a.spec.system_prompt, a.plugin_id))
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn on_conflict_error_skip_and_overwrite() {
    let base = defines(
        "base",
        vec![
            AgentDefinition::new(agent("helper", "v1")),
            AgentDefinition::new(agent("other", "o")),
        ],
    );
    let skip = defines(
        "skipper",
        vec![AgentDefinition::new(agent("helper", "v2")).with_on_conflict(OnConflict::Skip)],
    );
    let over = defines(
        "overwriter",
        vec![AgentDefinition::new(agent("helper", "v3")).with_on_conflict(OnConflict::Overwrite)],
    );
    let registry = PluginRegistry::from_plugins(vec![base.clone(), skip]).expect("registry");
    assert_eq!(
        prompts(&registry.build_agent_configs()),
        "helper=v1 (base), other=o (base)"
    );
    let registry = PluginRegistry::from_plugins(vec![base.clone(), over]).expect("registry");
    assert_eq!(
        prompts(&registry.build_agent_configs()),
        "helper=v3 (overwriter), other=o (base)"
    );

    // `error` (the default) refuses the whole batch of the colliding plugin: its new agent too.
    let clash = defines(
        "clasher",
        vec![
            AgentDefinition::new(agent("fresh", "f")),
            AgentDefinition::new(agent("helper", "v4")),
        ],
    );
    let registry = PluginRegistry::from_plugins(vec![base, clash]).expect("registry");
    let configs = registry.build_agent_configs();
    assert_eq!(prompts(&configs), "helper=v1 (base), other=o (base)");
    assert_eq!(configs.rejected.len(), 1);
    assert_eq!(
        configs.rejected[0].to_string(),
        "agent `helper` from plugin `clasher` collides with an existing definition"
    );
}

#[test]
fn the_build_context_shows_earlier_definitions_and_can_replace_them() {
    let base = defines(
        "base",
        vec![
            AgentDefinition::new(agent("a", "1")),
            AgentDefinition::new(agent("b", "2")),
        ],
    );
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let editor = TestPlugin::new("editor")
        .defining(move |ctx| {
            s.lock()
                .expect("seen")
                .extend(ctx.list_agent_configs().iter().map(|a| a.id.clone()));
            let kept: Vec<_> = ctx
                .list_agent_configs()
                .iter()
                .filter(|a| a.id != "a")
                .cloned()
                .collect();
            ctx.set_agent_configs(kept);
            Ok(vec![AgentDefinition::new(agent("c", "3"))])
        })
        .arc();
    let registry = PluginRegistry::from_plugins(vec![base, editor]).expect("registry");
    assert_eq!(*seen.lock().expect("seen"), vec!["a", "b"]);
    assert_eq!(
        prompts(&registry.build_agent_configs()),
        "b=2 (base), c=3 (editor)"
    );
}

#[test]
fn an_invalid_contributed_agent_rejects_the_batch() {
    let bad = defines(
        "bad",
        vec![
            AgentDefinition::new(agent("ok", "x")),
            AgentDefinition::new(agent("zero", "y").with_max_rounds(0)),
        ],
    );
    let configs = PluginRegistry::from_plugins(vec![bad])
        .expect("registry")
        .build_agent_configs();
    assert!(configs.agents.is_empty());
    assert!(
        configs.rejected[0].to_string().contains("agent.max_rounds"),
        "{}",
        configs.rejected[0]
    );
}

#[test]
fn duplicate_plugin_ids_are_refused_and_plugins_are_listed_in_execution_order() {
    let registry = PluginRegistry::new();
    registry
        .register_bundle(
            TestPlugin::new("b")
                .with_manifest(|m| m.with_dependency("a"))
                .arc(),
        )
        .expect("b");
    registry
        .register_bundle(TestPlugin::new("a").arc())
        .expect("a");
    let err = registry
        .register_bundle(TestPlugin::new("a").arc())
        .expect_err("dup");
    assert_eq!(err.to_string(), "plugin `a` is already registered");
    let ids: Vec<String> = registry
        .list_plugins()
        .iter()
        .map(|p| p.manifest().id.clone())
        .collect();
    assert_eq!(ids, vec!["a", "b"]);
    assert!(registry.get_plugin("b").is_some() && registry.get_plugin("zzz").is_none());
}

/// The registry's current snapshot as text: listed plugins in order, disabled ids, agent
/// definitions and the number of refused batches.
fn render(registry: &PluginRegistry) -> String {
    let snapshot = registry.snapshot();
    let listed: Vec<&str> = snapshot
        .list_plugins()
        .iter()
        .map(|p| p.manifest().id.as_str())
        .collect();
    format!(
        "plugins={}\ndisabled={}\nagents={}\nrejected={}",
        listed.join(","),
        snapshot.disabled_plugin_ids().join(","),
        prompts(snapshot.agent_configs()),
        snapshot.agent_configs().rejected.len()
    )
}

#[test]
fn a_disabled_plugin_is_not_listed_even_at_the_highest_priority() {
    let off = TestPlugin::new("off")
        .with_manifest(|m| m.with_priority(100).with_enabled(false))
        .defining(|_| Ok(vec![AgentDefinition::new(agent("ghost", "g"))]))
        .arc();
    let mid = TestPlugin::new("mid")
        .with_manifest(|m| m.with_priority(5))
        .arc();
    let registry = PluginRegistry::from_plugins(vec![TestPlugin::new("low").arc(), off, mid])
        .expect("registry");
    expect![[r#"
        plugins=mid,low
        disabled=off
        agents=
        rejected=0"#]]
    .assert_eq(&render(&registry));
    assert!(registry.get_plugin("off").is_none());
    assert!(registry.snapshot().get_plugin("off").is_none());
    assert!(registry.get_plugin("low").is_some());
    // Its id still counts against duplicates.
    let err = registry
        .register_bundle(TestPlugin::new("off").arc())
        .expect_err("dup");
    assert_eq!(err.to_string(), "plugin `off` is already registered");
}

#[test]
fn a_disabled_declarative_plugin_defines_no_agents() {
    let registry = PluginRegistry::new();
    registry.load_dir(fixtures("disabled")).expect("loads");
    expect![[r#"
        plugins=plain
        disabled=retired
        agents=writer=plain (plain)
        rejected=0"#]]
    .assert_eq(&render(&registry));
}

#[tokio::test]
async fn a_disabled_plugin_gets_no_reload_and_no_lifecycle_hook() {
    let log = Log::default();
    let l = log.clone();
    let builds = Arc::new(AtomicUsize::new(0));
    let b = builds.clone();
    // `off` is always disabled; `flip` is enabled at first and disabled by the reload's rebuild.
    let registry = PluginRegistry::from_configurator(move |set| {
        let first = b.fetch_add(1, Ordering::SeqCst) == 0;
        for (id, enabled) in [("on", true), ("off", false), ("flip", first)] {
            let mut p = TestPlugin::new(id).with_manifest(|m| m.with_enabled(enabled));
            p.log = l.clone();
            set.register_bundle(p.arc());
        }
        Ok(())
    })
    .expect("registry");
    assert_eq!(render(&registry).lines().next(), Some("plugins=on,flip"));
    registry.reload("r1").await.expect("reload");
    assert_eq!(log.lines(), vec!["on on_reload(r1)"]);
    expect![[r#"
        plugins=on
        disabled=off,flip
        agents=
        rejected=0"#]]
    .assert_eq(&render(&registry));
    // The runtime's start and shutdown hooks go to the listed plugins: never a disabled one.
    let dispatcher = LifecycleDispatcher::default();
    for event in [
        LifecycleEvent::RuntimeStart,
        LifecycleEvent::RuntimeShutdown,
    ] {
        dispatcher.dispatch(&registry.list_plugins(), event).await;
    }
    let called: Vec<String> = dispatcher
        .all_stats()
        .into_keys()
        .map(|(id, hook)| format!("{id} {}", hook.as_str()))
        .collect();
    assert_eq!(
        called,
        vec!["on on_runtime_start", "on on_runtime_shutdown"]
    );
}

fn fixtures(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn a_directory_of_good_manifests_loads_plugins_and_their_agents() {
    let registry = PluginRegistry::new();
    registry.load_dir(fixtures("good")).expect("loads");
    let ids: Vec<String> = registry
        .list_plugins()
        .iter()
        .map(|p| p.manifest().id.clone())
        .collect();
    assert_eq!(ids, vec!["house-style", "reviewers"]);
    let configs = registry.build_agent_configs();
    assert_eq!(
        configs.agents.keys().cloned().collect::<Vec<_>>(),
        vec!["reviewer"]
    );
    assert_eq!(configs.agents["reviewer"].plugin_id, "reviewers");
    let style = registry.get_plugin("house-style").expect("loaded");
    assert_eq!(style.manifest().version, semver::Version::new(1, 2, 0));
}

#[test]
fn one_bad_manifest_fails_the_whole_load_naming_the_file_and_line() {
    let registry = PluginRegistry::new();
    let err = registry.load_dir(fixtures("bad")).expect_err("bad file");
    let msg = err.to_string();
    assert!(msg.contains("b_typo.toml:3:"), "{msg}");
    assert!(msg.contains("promt_fragments"), "{msg}");
    assert!(registry.list_plugins().is_empty(), "nothing registered");
    let err = registry
        .load_dir(fixtures("missing-dir"))
        .expect_err("no dir");
    assert!(matches!(err, LoadError::Io { .. }));
}

/// A folder of one test under the system's temporary folder, removed when dropped.
struct TestDir(PathBuf);

impl TestDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("awaken-plugin-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        Self(dir)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The effective user id, as the owner of a file this process just made.
fn effective_uid(dir: &std::path::Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    let probe = dir.join("uid-probe");
    std::fs::write(&probe, "").expect("probe");
    let uid = std::fs::metadata(&probe).expect("probe").uid();
    std::fs::remove_file(&probe).expect("probe");
    uid
}

#[test]
fn an_unreadable_toml_entry_fails_the_whole_load_naming_it_and_its_cause() {
    use std::os::unix::fs::{PermissionsExt, symlink};
    type Make = fn(&std::path::Path);
    let rows: [(&str, Make, &str); 5] = [
        (
            "a symlink loop",
            |d| {
                symlink("loop-b", d.join("loop.toml")).expect("link");
                symlink("loop.toml", d.join("loop-b")).expect("link");
            },
            "loop.toml: Too many levels of symbolic links (os error 40)",
        ),
        (
            "a symlink to itself",
            |d| symlink("self.toml", d.join("self.toml")).expect("link"),
            "self.toml: Too many levels of symbolic links (os error 40)",
        ),
        (
            "a broken symlink",
            |d| symlink("gone.toml", d.join("dangling.toml")).expect("link"),
            "dangling.toml: No such file or directory (os error 2)",
        ),
        (
            "a directory",
            |d| std::fs::create_dir(d.join("nested.toml")).expect("dir"),
            "nested.toml: it is a directory, not a regular file",
        ),
        (
            "a file without read permission",
            |d| {
                let path = d.join("secret.toml");
                std::fs::write(&path, "id = \"secret\"\n").expect("write");
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000))
                    .expect("chmod");
            },
            "secret.toml: Permission denied (os error 13)",
        ),
    ];
    let good = std::fs::read_to_string(fixtures("good").join("a_style.toml")).expect("fixture");
    for (i, (what, make, expected)) in rows.into_iter().enumerate() {
        let dir = TestDir::new(&format!("unreadable-{i}"));
        if what == "a file without read permission" && effective_uid(&dir.0) == 0 {
            // Root reads a file whatever its mode: this row cannot fail as root. Said on the
            // stderr handle itself, so the harness does not capture it.
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "awaken-plugin: the row `{what}` of the unreadable-entry test is SKIPPED: \
                 running as root (effective uid 0), which can read any file"
            );
            continue;
        }
        // A good manifest sorted before the bad entry and one after it: neither is registered.
        std::fs::write(dir.0.join("a_good.toml"), &good).expect("write");
        std::fs::write(
            dir.0.join("z_good.toml"),
            good.replace("house-style", "later"),
        )
        .expect("write");
        make(&dir.0);
        let registry = PluginRegistry::new();
        let err = registry.load_dir(&dir.0).expect_err(what);
        let msg = err.to_string();
        let named = match &err {
            LoadError::Io { path, .. } | LoadError::NotAFile { path, .. } => path.clone(),
            other => panic!("{what}: not an entry error: {other:?}"),
        };
        assert_eq!(named.parent(), Some(dir.0.as_path()), "{what}: {msg}");
        assert!(
            msg.starts_with("cannot ") && msg.ends_with(expected),
            "{what}: {msg}"
        );
        assert!(msg.contains(&*dir.0.to_string_lossy()), "{what}: {msg}");
        assert!(
            registry.list_plugins().is_empty(),
            "{what}: nothing registered"
        );
        // The same registry loads the folder once the bad entry is gone.
        let bad = named;
        if std::fs::symlink_metadata(&bad).is_ok_and(|m| m.is_dir()) {
            std::fs::remove_dir(&bad).expect("remove");
        } else {
            std::fs::remove_file(&bad).expect("remove");
        }
        registry.load_dir(&dir.0).expect(what);
        assert_eq!(registry.list_plugins().len(), 2, "{what}");
    }
}

#[tokio::test]
async fn reload_swaps_atomically_only_when_every_plugin_agrees() {
    let generation = Arc::new(AtomicUsize::new(0));
    let log = Log::default();
    let g = generation.clone();
    let l = log.clone();
    let fail_next = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = fail_next.clone();
    let registry = PluginRegistry::from_configurator(move |set| {
        let n = g.fetch_add(1, Ordering::SeqCst);
        let mut p = TestPlugin::new("versioned");
        p.log = l.clone();
        if f.load(Ordering::SeqCst) {
            p.reload = Behaviour::Fail;
        }
        let spec = agent("assistant", &format!("generation {n}"));
        set.register_bundle(
            p.defining(move |_| Ok(vec![AgentDefinition::new(spec.clone())]))
                .arc(),
        );
        Ok(())
    })
    .expect("registry");
    let held = registry.snapshot();
    assert_eq!(
        held.agent_configs().agents["assistant"].spec.system_prompt,
        "generation 0"
    );

    let outcome = registry.reload("r1").await.expect("reload");
    assert_eq!(outcome, ReloadOutcome::Applied { version: 2 });
    assert_eq!(
        registry.build_agent_configs().agents["assistant"]
            .spec
            .system_prompt,
        "generation 1"
    );
    assert_eq!(
        held.agent_configs().agents["assistant"].spec.system_prompt,
        "generation 0",
        "a held snapshot is unchanged"
    );
    assert_eq!(log.lines(), vec!["versioned on_reload(r1)"]);

    assert_eq!(
        registry.reload("r1").await.expect("repeat"),
        ReloadOutcome::AlreadyApplied
    );
    assert_eq!(
        generation.load(Ordering::SeqCst),
        2,
        "a repeated reload id rebuilds nothing"
    );

    fail_next.store(true, Ordering::SeqCst);
    let err = registry.reload("r2").await.expect_err("a plugin refuses");
    assert!(matches!(err, RegistryError::ReloadFailed { .. }));
    assert_eq!(
        registry.build_agent_configs().agents["assistant"]
            .spec
            .system_prompt,
        "generation 1",
        "old snapshot stays"
    );
    assert_eq!(registry.snapshot().version, 2);
}

#[test]
fn the_documented_example_plugin_loads() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/plugins");
    let registry = PluginRegistry::new();
    registry.load_dir(&dir).expect("examples/plugins loads");
    let style = registry.get_plugin("house-style").expect("house-style");
    assert_eq!(style.manifest().version, semver::Version::new(1, 0, 0));
    assert_eq!(
        registry.build_agent_configs().agents["editor"]
            .spec
            .plugin_ids,
        vec!["house-style"]
    );
}

#[test]
fn an_agent_definition_outside_the_bound_rejects_the_batch() {
    let bounded = TestPlugin::new("bounded")
        .with_manifest(|m| {
            m.with_bound(CapabilityBound::nothing().with_agent_definitions(["allowed"]))
        })
        .defining(|_| {
            Ok(vec![
                AgentDefinition::new(agent("allowed", "a")),
                AgentDefinition::new(agent("sneaky", "s")),
            ])
        })
        .arc();
    let configs = PluginRegistry::from_plugins(vec![bounded])
        .expect("registry")
        .build_agent_configs();
    assert!(configs.agents.is_empty(), "nothing of the batch is applied");
    assert!(
        configs.rejected[0]
            .to_string()
            .contains("agent `sneaky` is outside the plugin's capability bound"),
        "{}",
        configs.rejected[0]
    );
}
