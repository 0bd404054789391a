//! A small glob used by tool catalog patterns and permission rules: `*` matches any run of
//! characters (also none), `?` one character, `\` escapes the next character.

use serde::{Deserialize, Serialize};

use crate::error::SpecError;

/// A validated glob pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Glob(String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Literal(char),
    Any,
    One,
}

impl Glob {
    /// Parses a pattern; empty patterns and a trailing lone `\` are rejected.
    pub fn new(pattern: impl Into<String>) -> Result<Self, SpecError> {
        let pattern = pattern.into();
        if pattern.is_empty() {
            return Err(SpecError::invalid(
                "pattern",
                "a glob pattern must not be empty",
            ));
        }
        if tokens(&pattern).is_none() {
            return Err(SpecError::invalid(
                "pattern",
                format!("glob {pattern:?} ends with a lone escape character"),
            ));
        }
        Ok(Self(pattern))
    }

    /// The pattern text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the pattern has no wildcard (matches exactly one string).
    pub fn is_literal(&self) -> bool {
        tokens(&self.0).is_some_and(|t| t.iter().all(|t| matches!(t, Token::Literal(_))))
    }

    /// Whether `text` matches the whole pattern.
    pub fn matches(&self, text: &str) -> bool {
        let Some(pattern) = tokens(&self.0) else {
            return false;
        };
        let text: Vec<char> = text.chars().collect();
        // Classic linear-time wildcard matching with one backtrack point for the last `*`.
        let (mut p, mut t) = (0usize, 0usize);
        let mut star: Option<(usize, usize)> = None;
        while t < text.len() {
            match pattern.get(p) {
                Some(Token::Literal(c)) if *c == text[t] => {
                    p += 1;
                    t += 1;
                }
                Some(Token::One) => {
                    p += 1;
                    t += 1;
                }
                Some(Token::Any) => {
                    star = Some((p, t));
                    p += 1;
                }
                _ => match star {
                    Some((sp, st)) => {
                        p = sp + 1;
                        t = st + 1;
                        star = Some((sp, st + 1));
                    }
                    None => return false,
                },
            }
        }
        pattern[p..].iter().all(|t| *t == Token::Any)
    }
}

fn tokens(pattern: &str) -> Option<Vec<Token>> {
    let mut out = Vec::with_capacity(pattern.len());
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

impl TryFrom<String> for Glob {
    type Error = SpecError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Glob::new(value)
    }
}

impl From<Glob> for String {
    fn from(g: Glob) -> String {
        g.0
    }
}

impl std::fmt::Display for Glob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::Glob;

    fn m(p: &str, t: &str) -> bool {
        Glob::new(p).expect("valid pattern").matches(t)
    }

    #[test]
    fn wildcards() {
        assert!(m("fs_*", "fs_read"));
        assert!(m("fs_*", "fs_"));
        assert!(!m("fs_*", "net_get"));
        assert!(m("*_get", "http_get"));
        assert!(m("a*b*c", "axxbyyc"));
        assert!(!m("a*b*c", "axxbyy"));
        assert!(m("t?ol", "tool"));
        assert!(!m("t?ol", "tol"));
        assert!(m("*", ""));
        assert!(m(r"a\*", "a*"));
        assert!(!m(r"a\*", "ab"));
        assert!(Glob::new("exact").expect("valid").is_literal());
        assert!(!Glob::new("ex*").expect("valid").is_literal());
        assert!(Glob::new("").is_err());
        assert!(Glob::new("a\\").is_err());
    }
}
