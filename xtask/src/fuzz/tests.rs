use super::*;

/// The workspace root (the parent of `xtask/`).
fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The `[[bin]]` names of `fuzz/Cargo.toml`.
fn fuzz_bins() -> BTreeSet<String> {
    let manifest = fs::read_to_string(root().join("fuzz/Cargo.toml")).expect("fuzz/Cargo.toml");
    let mut bins = BTreeSet::new();
    let mut in_bin = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin && let Some(name) = line.strip_prefix("name = ") {
            bins.insert(name.trim_matches('"').to_owned());
        }
    }
    bins
}

#[test]
fn the_table_lists_every_fuzz_target_and_its_seeds_and_dictionary_exist() {
    let listed: BTreeSet<String> = TARGETS.iter().map(|t| t.name.to_owned()).collect();
    assert_eq!(
        listed,
        fuzz_bins(),
        "TARGETS and fuzz/Cargo.toml's [[bin]]s differ"
    );
    for t in TARGETS {
        assert!(
            root()
                .join("fuzz/fuzz_targets")
                .join(format!("{}.rs", t.name))
                .is_file(),
            "{}: no source",
            t.name
        );
        for seeds in t.seeds {
            assert!(
                root().join(seeds).is_dir(),
                "{}: no seed directory {seeds}",
                t.name
            );
        }
        if let Some(dict) = t.dict {
            assert!(
                root().join("fuzz/dicts").join(dict).is_file(),
                "{}: no dictionary {dict}",
                t.name
            );
        }
    }
}

#[test]
fn arguments_name_the_seconds_and_the_targets() {
    let names = |(s, t): (u64, Vec<&'static Target>)| {
        (s, t.iter().map(|t| t.name).collect::<Vec<_>>().join(" "))
    };
    assert_eq!(
        names(parse(&[]).expect("no arguments")),
        (
            60,
            TARGETS.iter().map(|t| t.name).collect::<Vec<_>>().join(" ")
        )
    );
    assert_eq!(
        names(parse(&["--seconds", "5", "compact", "sse"]).expect("parses")),
        (5, "compact sse".to_owned())
    );
    let errors: Vec<String> = [
        &["nope"][..],
        &["--seconds"],
        &["--seconds", "0"],
        &["--seconds", "x"],
        &["--minutes", "1"],
    ]
    .iter()
    .map(|args| format!("{:#}", parse(args).err().expect("an error")))
    .collect();
    expect_test::expect![[r#"
        no fuzz target "nope"; the targets are sse, openai_stream, agent_file, plugin_manifest, tool_arguments, compact, sqlite_rows, event_grammar
        usage: cargo xtask fuzz [--seconds N] [target...]
        --seconds 0: expected a whole number above 0
        --seconds x: expected a whole number above 0
        unknown option --minutes
        usage: cargo xtask fuzz [--seconds N] [target...]"#]]
    .assert_eq(&errors.join("\n"));
}

#[test]
fn the_childrens_cpu_time_is_read_past_a_command_name_with_spaces() {
    // pid (comm) state ppid pgrp sid tty tpgid flags minflt cminflt majflt cmajflt utime
    // stime cutime cstime ...
    let stat = "42 (x) (y z) S 1 42 42 0 -1 4194560 100 200 0 0 7 3 1234 566 20 0 1 0";
    assert_eq!(cpu_from_stat(stat), Some(18.0));
    assert_eq!(cpu_from_stat("42 (x) S 1"), None);
}
