//! Errors of parsing and validating specs.

/// The text format a spec was parsed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecFormat {
    /// TOML.
    Toml,
    /// JSON.
    Json,
}

impl std::fmt::Display for SpecFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SpecFormat::Toml => "TOML",
            SpecFormat::Json => "JSON",
        })
    }
}

/// A spec that could not be parsed or is not valid.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The TOML text did not parse into the expected shape (unknown field, wrong type, syntax).
    #[error("invalid TOML at line {line}, column {column}: {source}")]
    Toml {
        /// 1-based line of the error (0 when the parser gave no position).
        line: usize,
        /// 1-based column of the error (0 when the parser gave no position).
        column: usize,
        /// The parser's error (boxed: it is large, and errors travel far).
        #[source]
        source: Box<toml::de::Error>,
    },
    /// The JSON text did not parse into the expected shape.
    #[error("invalid JSON at line {line}, column {column}: {source}", line = source.line(), column = source.column())]
    Json {
        /// The parser's error (it carries line and column).
        #[source]
        source: serde_json::Error,
    },
    /// A field holds a value that parses but is not allowed.
    #[error("invalid `{field}`: {reason}")]
    Invalid {
        /// Dotted path of the field (`agent.max_rounds`, `model.knowledge_cutoff`, ...).
        field: String,
        /// What is wrong and what is expected.
        reason: String,
    },
    /// A configuration section did not match its typed form.
    #[error("invalid section `{section}`: {source}")]
    Section {
        /// The section key.
        section: String,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
}

impl SpecError {
    /// An `Invalid` error.
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        SpecError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The line the error points at, when it comes from a parser that gave one.
    pub fn line(&self) -> Option<usize> {
        match self {
            SpecError::Toml { line, .. } if *line > 0 => Some(*line),
            SpecError::Json { source } if source.line() > 0 => Some(source.line()),
            _ => None,
        }
    }
}

/// Parses TOML text into `T`, reporting the line and column of an error.
pub fn parse_toml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, SpecError> {
    toml::from_str(text).map_err(|source| {
        let (line, column) = match source.span() {
            Some(span) => line_column(text, span.start),
            None => (0, 0),
        };
        SpecError::Toml {
            line,
            column,
            source: Box::new(source),
        }
    })
}

/// Parses JSON text into `T`.
pub fn parse_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, SpecError> {
    serde_json::from_str(text).map_err(|source| SpecError::Json { source })
}

/// 1-based line and column of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::line_column;

    #[test]
    fn line_column_counts_from_one() {
        assert_eq!(line_column("ab\ncd", 0), (1, 1));
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_column("ab\ncd", 99), (2, 3));
    }
}
