//! What the file tools share: paths kept inside their root, and the error a tool reports.

use std::path::{Component, Path, PathBuf};

use awaken::tool::ToolError;

/// `root` joined with `requested`, refusing absolute paths and `..` (a lexical check; the
/// callers also check where symbolic links lead).
pub(super) fn confine(root: &Path, requested: &str) -> Result<PathBuf, ToolError> {
    let rel = Path::new(requested);
    let escapes = rel.is_absolute()
        || rel.components().any(|c| {
            matches!(
                c,
                Component::ParentDir | Component::RootDir | Component::Prefix(_)
            )
        });
    if escapes {
        return Err(outside(requested));
    }
    Ok(root.join(rel))
}

pub(super) fn outside(requested: &str) -> ToolError {
    failed(format!("`{requested}` is outside the allowed directory"))
}

pub(super) fn failed(message: String) -> ToolError {
    ToolError::Execution { message }
}
