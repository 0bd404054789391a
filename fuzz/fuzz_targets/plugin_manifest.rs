//! The declarative plugin manifest (`awaken_plugin::DeclarativePlugin::from_toml_str`): any
//! text is a manifest or a `SpecError`, never a panic. An accepted manifest's identity passes
//! its own validation, its agents theirs, and its reminders' globs match tool names as a plain
//! model of the glob syntax does (`*` any run, `?` one character, `\` escapes).

#![no_main]

use awaken_plugin::{DeclarativePlugin, Plugin};
use awaken_spec::Glob;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The text's short lines double as tool names and as globs.
    let names: Vec<&str> = text.lines().filter(|l| l.len() <= 64).take(8).collect();
    match DeclarativePlugin::from_toml_str(text) {
        Ok(plugin) => {
            plugin
                .manifest()
                .validate()
                .expect("an accepted manifest passes validation");
            for fragment in plugin.prompt_fragments() {
                assert!(
                    !fragment.trim().is_empty(),
                    "a blank prompt fragment was accepted"
                );
            }
            for reminder in plugin.reminders().iter().take(8) {
                check_glob(&reminder.tool, &names);
            }
        }
        Err(e) => {
            let _ = e.to_string();
            let _ = e.line();
        }
    }
    // Any line as a glob of its own.
    for line in &names {
        if let Ok(glob) = Glob::new(*line) {
            check_glob(&glob, &names);
        }
    }
});

fn check_glob(glob: &Glob, names: &[&str]) {
    let pattern = tokens(glob.as_str()).expect("an accepted glob tokenizes");
    assert_eq!(
        glob.is_literal(),
        pattern.iter().all(|t| matches!(t, Token::Literal(_)))
    );
    for name in names.iter().copied().chain([glob.as_str(), ""]) {
        let text: Vec<char> = name.chars().collect();
        assert_eq!(
            glob.matches(name),
            model(&pattern, &text),
            "glob {:?} against {name:?}",
            glob.as_str()
        );
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Token {
    Literal(char),
    Any,
    One,
}

fn tokens(pattern: &str) -> Option<Vec<Token>> {
    let mut out = Vec::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        out.push(match c {
            '*' => Token::Any,
            '?' => Token::One,
            '\\' => Token::Literal(chars.next()?),
            c => Token::Literal(c),
        });
    }
    Some(out)
}

/// Whether `text` matches `pattern`, by dynamic programming over both.
fn model(pattern: &[Token], text: &[char]) -> bool {
    // matches[j]: the pattern so far matches text[..j].
    let mut matches = vec![false; text.len() + 1];
    matches[0] = true;
    for token in pattern {
        let mut next = vec![false; text.len() + 1];
        for j in 0..=text.len() {
            next[j] = match token {
                Token::Any => matches[j] || (j > 0 && next[j - 1]),
                Token::One => j > 0 && matches[j - 1],
                Token::Literal(c) => j > 0 && matches[j - 1] && text[j - 1] == *c,
            };
        }
        matches = next;
    }
    matches[text.len()]
}
