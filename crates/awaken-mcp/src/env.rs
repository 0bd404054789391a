//! `${VAR}` in the values of `env` and `headers`, expanded when a server is connected.

use crate::error::McpError;

/// `value` with each `${VAR}` replaced by the variable's value (`$` elsewhere is kept as is).
///
/// # Errors
/// [`McpError::MissingVariable`] naming `server`, `field` and the variable.
pub(crate) fn expand(
    value: &str,
    server: &str,
    field: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, McpError> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        let Some(len) = rest[start + 2..].find('}') else {
            break;
        };
        let variable = &rest[start + 2..start + 2 + len];
        let found = lookup(variable).ok_or_else(|| McpError::MissingVariable {
            server: server.to_owned(),
            field: field.to_owned(),
            variable: variable.to_owned(),
        })?;
        out.push_str(&rest[..start]);
        out.push_str(&found);
        rest = &rest[start + 3 + len..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::expand;

    fn lookup(name: &str) -> Option<String> {
        (name == "TOKEN").then(|| "s3cret".to_owned())
    }

    #[test]
    fn variables_are_replaced_and_the_rest_is_kept() {
        let got = expand("Bearer ${TOKEN} $HOME ${TOKEN}", "s", "headers.A", lookup);
        assert_eq!(got.expect("expands"), "Bearer s3cret $HOME s3cret");
        assert_eq!(expand("a ${b", "s", "f", lookup).expect("kept"), "a ${b");
    }

    #[test]
    fn a_missing_variable_is_named_with_its_field() {
        let err = expand("${NOPE}", "files", "env.KEY", lookup).expect_err("missing");
        assert_eq!(
            err.to_string(),
            "MCP server `files`: `env.KEY` names the environment variable `NOPE`, which is not set"
        );
    }
}
