use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// A fresh directory under the system's temporary directory, removed on drop.
struct Tree(PathBuf);

impl Tree {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "awaken-tidy-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create a temporary directory");
        Tree(dir)
    }

    fn write(&self, path: &str, text: &str) -> &Self {
        let path = self.0.join(path);
        fs::create_dir_all(path.parent().expect("a parent")).expect("create directories");
        fs::write(path, text).expect("write a file");
        self
    }

    fn findings(&self) -> Vec<String> {
        check(&self.0)
            .expect("the check reads the tree")
            .iter()
            .map(ToString::to_string)
            .collect()
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_planted_word_fails_the_check_with_its_place() {
    let tree = Tree::new();
    tree.write("README.md", "# Awaken\n\nA runtime for agents.\n")
        .write(
            "docs/guide.md",
            "Intro.\n\nAs decided in Issue 14, commits are atomic.\n",
        )
        .write("crates/a/Cargo.toml", "[package]\nname = \"a\"\n")
        .write("crates/a/src/lib.rs", "//! A crate.\n// see DESIGN §4\n");
    assert_eq!(
        tree.findings(),
        [
            "docs/guide.md:3: \"issue 14\" speaks of how the project was made, not of what it is",
            "crates/a/src/lib.rs:2: \"design §\" speaks of how the project was made, not of what it is",
        ]
    );
}

#[test]
fn a_clean_tree_passes() {
    let tree = Tree::new();
    tree.write(
        "README.md",
        "Known issues are listed on the tracker; seed 0.5 is a float.\n",
    )
    .write(
        "docs/mcp.md",
        "An MCP session carries 3 tools; tissue 4 is not a word.\n",
    )
    .write(
        "crates/a/src/lib.rs",
        "//! A crate.\npub fn f() -> u32 { 1 }\n",
    );
    assert_eq!(tree.findings(), Vec::<String>::new());
}

#[test]
fn numbered_words_are_whole_words_followed_by_a_number() {
    let cases = [
        ("fixed in issue 14", Some("issue 14")),
        ("see issue #31.", Some("issue #31")),
        ("the seed 007 says", Some("seed 007")),
        ("in session 3, we", Some("session 3")),
        ("issues 12 and 13", Some("issues 12")),
        ("3 issues remain", None),
        ("tissue 4", None),
        ("issue 14b", None),
        ("seed 0.5", None),
        ("an mcp session id", None),
    ];
    for (text, want) in cases {
        assert_eq!(numbered(text).as_deref(), want, "{text:?}");
    }
}

#[test]
fn a_long_source_file_fails_unless_it_holds_tests() {
    let long = "fn f() {}\n".repeat(MAX_LINES + 1);
    let tree = Tree::new();
    tree.write("crates/a/src/big.rs", &long)
        .write("crates/a/src/tests.rs", &long)
        .write("crates/a/tests/it/main.rs", &long)
        .write("crates/a/src/ok.rs", &"fn f() {}\n".repeat(MAX_LINES));
    assert_eq!(
        tree.findings(),
        ["crates/a/src/big.rs: 1001 lines; split it by concept (at most 1000 outside tests)"]
    );
}

fn cycles_in(tree: &Tree) -> Vec<String> {
    cycles("a", &tree.0.join("src"))
        .expect("the check reads the crate")
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn files_that_refer_to_each_other_are_a_cycle() {
    let tree = Tree::new();
    tree.write(
        "src/lib.rs",
        "mod run;\nmod error;\nmod ids;\npub use run::Run;\n",
    )
    .write(
        "src/run/mod.rs",
        "mod step;\nuse crate::{ids::Id, error::{E, F}};\npub struct Run;\n",
    )
    .write(
        "src/run/step.rs",
        "use super::Run;\nimpl Run { fn s(&self) {} }\n",
    )
    .write("src/ids.rs", "pub struct Id;\n")
    .write(
        "src/error.rs",
        "// crate::run is only named in this comment\npub struct E(crate::run::Run);\n\
             pub struct F;\n",
    );
    assert_eq!(
        cycles_in(&tree),
        ["a: modules refer to each other in a circle: error -> run -> error"]
    );
}

#[test]
fn a_parent_naming_its_child_and_the_child_naming_the_parent_is_a_cycle() {
    let tree = Tree::new();
    tree.write("src/lib.rs", "mod run;\n")
        .write(
            "src/run/mod.rs",
            "mod step;\npub struct Run;\nfn go() { step::go() }\n",
        )
        .write("src/run/step.rs", "use super::Run;\npub fn go() {}\n");
    assert_eq!(
        cycles_in(&tree),
        ["a: modules refer to each other in a circle: run -> run::step -> run"]
    );
}

#[test]
fn one_direction_strings_and_unit_tests_are_no_cycle() {
    let tree = Tree::new();
    tree.write("src/lib.rs", "mod run;\nmod ids;\n")
        .write("src/run/mod.rs", "mod step;\npub struct Run(crate::ids::Id);\n")
        .write("src/run/step.rs", "use super::Run;\nuse crate::ids::Id;\n")
        .write(
            "src/ids.rs",
            "pub struct Id;\nconst S: &str = \"crate::run::Run\";\nconst R: &str = r#\"super::run\"#;\n\
             fn c() -> char { '\"' }\n\
             #[cfg(test)]\nmod tests {\n    use crate::run::Run;\n}\n",
        );
    assert_eq!(cycles_in(&tree), Vec::<String>::new());
}
