//! The tidy check: the repository speaks of the project, its files stay readable, and the
//! modules of a crate depend on each other in one direction.
//!
//! 1. Words that narrate how the project was developed (numbered issues, work periods,
//!    documents that are not in the repository) stay out of `docs/`, `README.md`, every
//!    `Cargo.toml`, `crates/`, `benches/`, `soak/`, `examples/` and `xtask/`.
//! 2. No source file outside tests is longer than [`MAX_LINES`] lines.
//! 3. In every crate under `crates/` but those of [`CYCLES_ALLOWED`], no two source files refer
//!    to each other, directly or through others (`use crate::a::b`, `super::x`, a child
//!    module's path); `mod x;` alone is not a reference, and `lib.rs`, which only assembles, is
//!    left out.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The longest a non-test source file may be.
pub(crate) const MAX_LINES: usize = 1_000;

/// Crates whose files may refer to each other in a circle, with the reason.
pub(crate) const CYCLES_ALLOWED: &[(&str, &str)] = &[(
    "awaken-phase",
    "an effect handler's context holds the engine, which holds the handlers",
)];

/// Trees and files the wording rule reads, relative to the workspace root.
const WORDED: &[&str] = &[
    "docs",
    "README.md",
    "Cargo.toml",
    "crates",
    "benches",
    "soak",
    "examples",
    "xtask",
];

/// One thing the tidy check found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Finding {
    /// A phrase about how the project was made.
    Narration {
        /// The file.
        path: PathBuf,
        /// Its line, from 1.
        line: usize,
        /// What matched.
        phrase: String,
    },
    /// A source file over [`MAX_LINES`].
    TooLong {
        /// The file.
        path: PathBuf,
        /// Its length.
        lines: usize,
    },
    /// Files of one crate that refer to each other in a circle.
    Cycle {
        /// The crate.
        krate: String,
        /// The module paths in the circle, in order (the first is named again at the end).
        modules: Vec<String>,
    },
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::Narration { path, line, phrase } => write!(
                f,
                "{}:{line}: {phrase:?} speaks of how the project was made, not of what it is",
                path.display()
            ),
            Finding::TooLong { path, lines } => write!(
                f,
                "{}: {lines} lines; split it by concept (at most {MAX_LINES} outside tests)",
                path.display()
            ),
            Finding::Cycle { krate, modules } => write!(
                f,
                "{krate}: modules refer to each other in a circle: {}",
                modules.join(" -> ")
            ),
        }
    }
}

/// Runs the three rules over the workspace at `root`.
pub(crate) fn check(root: &Path) -> Result<Vec<Finding>> {
    let mut findings = Vec::new();
    for entry in WORDED {
        let path = root.join(entry);
        if path.exists() {
            for file in files_under(&path)? {
                if is_text(&file) && !is_tidy_source(&file) {
                    narration(root, &file, &mut findings)?;
                }
            }
        }
    }
    for tree in ["crates", "benches", "soak", "examples", "xtask"] {
        let path = root.join(tree);
        if path.exists() {
            for file in files_under(&path)? {
                if file.extension().is_some_and(|e| e == "rs") && !is_test_file(&file) {
                    let lines = read(&file)?.lines().count();
                    if lines > MAX_LINES {
                        findings.push(Finding::TooLong {
                            path: relative(root, &file),
                            lines,
                        });
                    }
                }
            }
        }
    }
    let crates = root.join("crates");
    if crates.exists() {
        let mut names: Vec<String> = fs::read_dir(&crates)
            .with_context(|| format!("list {}", crates.display()))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for krate in names {
            let src = crates.join(&krate).join("src");
            if src.is_dir() && !CYCLES_ALLOWED.iter().any(|(name, _)| *name == krate) {
                findings.extend(cycles(&krate, &src)?);
            }
        }
    }
    Ok(findings)
}

/// The phrases that narrate development, matched case-insensitively.
const PHRASES: &[&str] = &[
    "work period",
    "design §",
    "design.md",
    "conventions.md",
    "../shared",
    "this session",
    "previous session",
    "earlier session",
    "next session",
    "filed by",
];

/// Words that narrate development when a number follows (`issue 14`, `seed 007`, `#14`).
const NUMBERED: &[&str] = &["issue", "issues", "seed", "seeds", "session"];

fn narration(root: &Path, file: &Path, findings: &mut Vec<Finding>) -> Result<()> {
    let text = read(file)?;
    for (i, line) in text.lines().enumerate() {
        let lower = line.to_lowercase();
        let mut hit = PHRASES
            .iter()
            .find(|p| lower.contains(*p))
            .map(|p| (*p).to_owned());
        if hit.is_none() {
            hit = numbered(&lower);
        }
        if let Some(phrase) = hit {
            findings.push(Finding::Narration {
                path: relative(root, file),
                line: i + 1,
                phrase,
            });
        }
    }
    Ok(())
}

/// `word N`, `word #N` or `word NNN` for a word of [`NUMBERED`], as a whole word.
fn numbered(lower: &str) -> Option<String> {
    let bytes = lower.as_bytes();
    for word in NUMBERED {
        let mut from = 0;
        while let Some(at) = lower[from..].find(word) {
            let start = from + at;
            let end = start + word.len();
            from = end;
            let before_ok = start == 0 || !is_word_byte(bytes[start - 1]);
            let rest = &lower[end..];
            let number = rest
                .strip_prefix(" #")
                .or_else(|| rest.strip_prefix(' '))
                .or_else(|| rest.strip_prefix('#'));
            let Some(number) = number else { continue };
            let digits = number.bytes().take_while(u8::is_ascii_digit).count();
            let tail = &number.as_bytes()[digits..];
            // `seed 0.5` is a number, not a name.
            let after_ok = match tail {
                [] => true,
                [b'.' | b',', d, ..] if d.is_ascii_digit() => false,
                [b, ..] => !is_word_byte(*b),
            };
            if before_ok && digits > 0 && after_ok {
                return Some(lower[start..end + (rest.len() - number.len()) + digits].to_owned());
            }
        }
    }
    None
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn is_text(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "Cargo.toml"
        || [
            "rs", "md", "toml", "html", "js", "ts", "json", "sql", "sh", "py",
        ]
        .iter()
        .any(|e| path.extension().is_some_and(|x| x == *e))
}

/// This module and its tests name the phrases they look for.
fn is_tidy_source(path: &Path) -> bool {
    path.ends_with("xtask/src/tidy.rs") || path.ends_with("xtask/src/tidy/tests.rs")
}

/// Integration tests, `tests.rs` unit-test modules and files under a `tests` directory.
fn is_test_file(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == "tests")
        || path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n == "tests.rs" || n.ends_with("_tests.rs"))
}

fn files_under(path: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = fs::symlink_metadata(&p).with_context(|| format!("stat {}", p.display()))?;
        if meta.is_dir() {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name == "target" || name == "node_modules" || name.starts_with('.') {
                continue;
            }
            for entry in fs::read_dir(&p).with_context(|| format!("list {}", p.display()))? {
                stack.push(entry?.path());
            }
        } else if meta.is_file() {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("read {}", path.display()))
}

fn relative(root: &Path, path: &Path) -> PathBuf {
    path.strip_prefix(root).unwrap_or(path).to_path_buf()
}

/// A module path inside a crate: `[]` is the crate root, `["run", "step"]` is `run::step`.
type ModPath = Vec<String>;

/// The import cycles among the files of the crate whose sources are at `src`.
pub(crate) fn cycles(krate: &str, src: &Path) -> Result<Vec<Finding>> {
    let mut modules: BTreeMap<ModPath, PathBuf> = BTreeMap::new();
    for file in files_under(src)? {
        if file.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = file.strip_prefix(src).unwrap_or(&file).with_extension("");
        let mut path: ModPath = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if path.last().is_some_and(|l| l == "mod") || path == ["lib"] || path == ["main"] {
            path.pop();
        }
        modules.insert(path, file);
    }
    let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (module, file) in &modules {
        let text = without_tests(&code_only(&read(file)?));
        let mut to = BTreeSet::new();
        for target in references(module, &text) {
            if let Some(found) = deepest(&modules, &target)
                && found != *module
                && !found.is_empty()
                && !module.is_empty()
            {
                to.insert(found);
            }
        }
        edges.insert(module.clone(), to);
    }
    Ok(find_cycles(&edges)
        .into_iter()
        .map(|cycle| Finding::Cycle {
            krate: krate.to_owned(),
            modules: cycle
                .iter()
                .map(|m| {
                    if m.is_empty() {
                        "lib".to_owned()
                    } else {
                        m.join("::")
                    }
                })
                .collect(),
        })
        .collect())
}

/// The longest prefix of `target` that is a file of the crate.
fn deepest(modules: &BTreeMap<ModPath, PathBuf>, target: &[String]) -> Option<ModPath> {
    (0..=target.len())
        .rev()
        .map(|n| target[..n].to_vec())
        .find(|p| modules.contains_key(p))
}

/// The module paths `text` (the code of `module`) names: `crate::…`, `super::…`, `self::…`,
/// a declared child module's path, and the members of `use crate::{a, b::c}` groups.
fn references(module: &[String], text: &str) -> Vec<ModPath> {
    let children: BTreeSet<String> = text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
            let l = l.strip_prefix("pub ").unwrap_or(l);
            l.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(|n| n.trim().to_owned())
        })
        .collect();
    let mut out = Vec::new();
    for path in paths(text) {
        let (head, rest) = (&path[0], &path[1..]);
        let mut base: ModPath = match head.as_str() {
            "crate" => Vec::new(),
            "super" => module[..module.len().saturating_sub(1)].to_vec(),
            "self" => module.to_vec(),
            child if children.contains(child) => {
                let mut m = module.to_vec();
                m.push(child.to_owned());
                m
            }
            _ => continue,
        };
        let mut rest = rest;
        while rest.first().is_some_and(|s| s == "super") {
            base.pop();
            rest = &rest[1..];
        }
        if let Some(group) = rest.iter().position(|s| s == "{") {
            // `use crate::a::{b, c::d}`: each member is a path below `a`.
            let mut prefix = base.clone();
            prefix.extend(rest[..group].iter().cloned());
            let mut member: Vec<String> = Vec::new();
            for part in &rest[group + 1..] {
                match part.as_str() {
                    "," | "}" => {
                        if !member.is_empty() {
                            let mut p = prefix.clone();
                            p.append(&mut member);
                            out.push(p);
                        }
                    }
                    _ => member.push(part.clone()),
                }
            }
        } else {
            base.extend(rest.iter().cloned());
            out.push(base);
        }
    }
    out
}

/// The `a::b::c` paths of `text`, as segments; a path that opens a `{` group keeps the group's
/// segments, commas and closing brace (one level deep).
fn paths(text: &str) -> Vec<Vec<String>> {
    let tokens = tokens(text);
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if is_ident(&tokens[i]) && tokens.get(i + 1).is_some_and(|t| t == "::") {
            let mut path = vec![tokens[i].clone()];
            let mut j = i + 1;
            while tokens.get(j).is_some_and(|t| t == "::") {
                match tokens.get(j + 1) {
                    Some(t) if is_ident(t) => {
                        path.push(t.clone());
                        j += 2;
                    }
                    Some(t) if t == "{" => {
                        path.push("{".to_owned());
                        let mut depth = 0;
                        j += 1;
                        while let Some(t) = tokens.get(j) {
                            match t.as_str() {
                                "{" => depth += 1,
                                "}" => {
                                    depth -= 1;
                                    if depth == 0 {
                                        path.push("}".to_owned());
                                        j += 1;
                                        break;
                                    }
                                }
                                "," if depth == 1 => path.push(",".to_owned()),
                                "::" => {}
                                t if depth == 1 && is_ident(t) => path.push(t.to_owned()),
                                _ => {}
                            }
                            j += 1;
                        }
                        break;
                    }
                    _ => break,
                }
            }
            out.push(path);
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

fn is_ident(t: &str) -> bool {
    t.bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
}

/// Identifiers, `::` and single punctuation characters.
fn tokens(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b.is_ascii_alphanumeric() || b == b'_' {
            let start = i;
            while i < bytes.len() && is_word_byte(bytes[i]) {
                i += 1;
            }
            out.push(text[start..i].to_owned());
        } else if b == b':' && bytes.get(i + 1) == Some(&b':') {
            out.push("::".to_owned());
            i += 2;
        } else {
            if !b.is_ascii_whitespace() {
                out.push((b as char).to_string());
            }
            i += 1;
        }
    }
    out
}

/// `text` without comments, string and character literals (each replaced by a space).
fn code_only(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            (b'/', Some(b'/')) => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            (b'/', Some(b'*')) => {
                i += 2;
                while i < bytes.len() && !(bytes[i] == b'*' && bytes.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i += 2;
                out.push(' ');
            }
            (b'"', _) => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push(' ');
            }
            (b'r', Some(b'#' | b'"')) if i == 0 || !is_word_byte(bytes[i - 1]) => {
                // A raw string: r"…", r#"…"#.
                let mut j = i + 1;
                let mut hashes = 0;
                while bytes.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if bytes.get(j) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                j += 1;
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                while j < bytes.len() && !bytes[j..].starts_with(&close) {
                    j += 1;
                }
                i = j + close.len();
                out.push(' ');
            }
            (b'\'', _) => {
                // A char literal ('a', '\n', '\'') or a lifetime ('a): skip only the literal.
                let lit = match (bytes.get(i + 1), bytes.get(i + 2)) {
                    (Some(b'\\'), _) => bytes[i + 2..]
                        .iter()
                        .position(|b| *b == b'\'')
                        .map(|p| i + 2 + p + 1),
                    (Some(_), Some(b'\'')) => Some(i + 3),
                    _ => None,
                };
                match lit {
                    Some(end) => {
                        i = end;
                        out.push(' ');
                    }
                    None => {
                        out.push('\'');
                        i += 1;
                    }
                }
            }
            (b, _) => {
                let ch_len = text[i..].chars().next().map_or(1, char::len_utf8);
                if b.is_ascii() {
                    out.push(b as char);
                } else {
                    out.push(' ');
                }
                i += ch_len;
            }
        }
    }
    out
}

/// `text` without its `#[cfg(test)]` modules: tests may reach anything.
fn without_tests(text: &str) -> String {
    let mut kept = String::with_capacity(text.len());
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let test_mod = line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "));
        if !test_mod {
            kept.push_str(line);
            kept.push('\n');
            continue;
        }
        let mut depth = 0i32;
        for line in lines.by_ref() {
            depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
            if depth <= 0 && (line.contains('}') || line.trim_end().ends_with(';')) {
                break;
            }
        }
    }
    kept
}

/// One cycle per strongly connected group of more than one module (Tarjan's algorithm), each
/// as a walk through the group that returns to its start.
fn find_cycles(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    struct Tarjan<'a> {
        edges: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on_stack: BTreeSet<&'a ModPath>,
        groups: Vec<Vec<&'a ModPath>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a ModPath) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                let Some((w, _)) = self.edges.get_key_value(w) else {
                    continue;
                };
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    group.push(w);
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    self.groups.push(group);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        groups: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.groups
        .into_iter()
        .map(|group| walk(edges, &group))
        .collect()
}

/// A closed walk inside `group` from its smallest module back to it.
fn walk(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>, group: &[&ModPath]) -> Vec<ModPath> {
    let members: BTreeSet<&ModPath> = group.iter().copied().collect();
    let start = members.iter().next().copied().cloned().unwrap_or_default();
    // Breadth-first from `start` back to it, inside the group: the shortest circle through it.
    let mut parent: BTreeMap<ModPath, ModPath> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::new();
    queue.push_back(start.clone());
    while let Some(v) = queue.pop_front() {
        for w in edges.get(&v).into_iter().flatten() {
            if !members.contains(w) {
                continue;
            }
            if *w == start {
                let mut cycle = vec![v.clone()];
                while let Some(p) = parent.get(cycle.last().unwrap_or(&start)) {
                    cycle.push(p.clone());
                }
                cycle.reverse();
                cycle.push(start.clone());
                return cycle;
            }
            if !parent.contains_key(w) {
                parent.insert(w.clone(), v.clone());
                queue.push_back(w.clone());
            }
        }
    }
    group.iter().map(|m| (*m).clone()).collect()
}

#[cfg(test)]
mod tests;
