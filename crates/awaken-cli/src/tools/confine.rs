//! What the file tools share: a path argument in its canonical spelling under the tool's root,
//! and the error a tool reports.
//!
//! The canonical spelling of a path names the file the path leads to, relative to the root, in
//! one way only: components joined by single `/`, no `.` or empty component, no trailing `/`,
//! `..` taken back against the components before it, and every symbolic link on the way (inside
//! the root) replaced by where it leads. A path that leads out of the root, absolute or through
//! `..` or a link, has none. The runtime puts every call's path in this spelling before the
//! gates run ([`normalize_path`]), so a permission rule sees the file the tool will act on; the
//! tool then acts only on a path that is still canonical ([`canonical`]), so a link changed
//! after the gates looked is refused rather than followed.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use awaken::tool::{ToolError, Violation};
use serde_json::Value;

/// Most symbolic links followed while resolving one path (as Linux's `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// Why a path has no canonical spelling under the root.
#[derive(Debug)]
pub(super) enum PathError {
    /// It is absolute, or leads out of the root through `..` or a symbolic link.
    Outside,
    /// It names the root itself, not a file in it.
    Root,
    /// More than [`MAX_LINKS`] symbolic links on the way (a loop).
    TooManyLinks,
    /// A symbolic link on the way leads to a name that is not UTF-8.
    NotUtf8,
    /// A component could not be inspected.
    Io(std::io::Error),
}

impl PathError {
    /// The error's text about `requested`, as the model sees it.
    pub(super) fn message(&self, requested: &str) -> String {
        match self {
            PathError::Outside => format!("`{requested}` is outside the allowed directory"),
            PathError::Root => {
                format!("`{requested}` names the allowed directory itself, not a file in it")
            }
            PathError::TooManyLinks => format!(
                "`{requested}` passes through more than {MAX_LINKS} symbolic links (a loop?)"
            ),
            PathError::NotUtf8 => {
                format!("`{requested}` leads through a symbolic link to a name that is not UTF-8")
            }
            PathError::Io(e) => format!("cannot resolve `{requested}`: {e}"),
        }
    }
}

/// The canonical spelling of `requested` under `root` (see the module docs). Reads the file
/// system (the kind of each existing component, the target of each link), changes nothing; a
/// component that does not exist, and everything after it, is taken as written. A root that
/// does not exist yet holds no links.
pub(super) fn resolve(root: &Path, requested: &str) -> Result<String, PathError> {
    let rel = Path::new(requested);
    if rel.has_root() {
        return Err(PathError::Outside);
    }
    let real_root = match std::fs::canonicalize(root) {
        Ok(r) => Some(r),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(PathError::Io(e)),
    };
    // The components still to walk, the next one last.
    let mut pending: Vec<OsString> = Vec::new();
    push_components(&mut pending, rel)?;
    let mut resolved: Vec<OsString> = Vec::new();
    let mut links = 0usize;
    while let Some(name) = pending.pop() {
        if name == ".." {
            resolved.pop().ok_or(PathError::Outside)?;
            continue;
        }
        let Some(real_root) = &real_root else {
            resolved.push(name);
            continue;
        };
        let here: PathBuf = real_root
            .join(resolved.iter().collect::<PathBuf>())
            .join(&name);
        let meta = match std::fs::symlink_metadata(&here) {
            Ok(meta) => meta,
            Err(e) if missing(&e) => {
                resolved.push(name);
                continue;
            }
            Err(e) => return Err(PathError::Io(e)),
        };
        if !meta.file_type().is_symlink() {
            resolved.push(name);
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return Err(PathError::TooManyLinks);
        }
        let target = std::fs::read_link(&here).map_err(PathError::Io)?;
        if target.has_root() {
            // An absolute target counts only under the root (its real path or as configured).
            let inside = target
                .strip_prefix(real_root)
                .or_else(|_| target.strip_prefix(root))
                .map_err(|_| PathError::Outside)?;
            resolved.clear();
            push_components(&mut pending, inside)?;
        } else {
            push_components(&mut pending, &target)?;
        }
    }
    let mut spelled = String::new();
    for (i, name) in resolved.iter().enumerate() {
        if i > 0 {
            spelled.push('/');
        }
        spelled.push_str(name.to_str().ok_or(PathError::NotUtf8)?);
    }
    if spelled.is_empty() {
        return Err(PathError::Root);
    }
    Ok(spelled)
}

/// For [`awaken::tool::Tool::normalize_arguments`]: the arguments with their `path` in its
/// canonical spelling, or `None` when it is in it already.
///
/// # Errors
/// [`ToolError::InvalidArguments`] at `/path` when the path has no canonical spelling.
pub(super) fn normalize_path(
    tool_id: &str,
    root: &Path,
    args: &Value,
) -> Result<Option<Value>, ToolError> {
    let Some(requested) = args.get("path").and_then(Value::as_str) else {
        return Ok(None);
    };
    let spelled = resolve(root, requested).map_err(|e| ToolError::InvalidArguments {
        tool_id: tool_id.to_owned(),
        violations: vec![Violation {
            path: "/path".to_owned(),
            message: e.message(requested),
        }],
    })?;
    if spelled == requested {
        return Ok(None);
    }
    let mut args = args.clone();
    args["path"] = Value::String(spelled);
    Ok(Some(args))
}

/// The root's real path and `requested`, which must be canonical now: a path in another
/// spelling is refused, not acted on (the gates saw the canonical spelling, so a path that
/// is no longer canonical leads somewhere they did not look).
pub(super) fn canonical(root: &Path, requested: &str) -> Result<PathBuf, ToolError> {
    let spelled = resolve(root, requested).map_err(|e| failed(e.message(requested)))?;
    if spelled != requested {
        return Err(failed(format!(
            "`{requested}` is not the canonical spelling of the path it names (`{spelled}`): \
             a file tool acts only on the spelling its call was checked with, and nothing was done"
        )));
    }
    Ok(root.join(spelled))
}

pub(super) fn outside(requested: &str) -> ToolError {
    failed(PathError::Outside.message(requested))
}

pub(super) fn failed(message: String) -> ToolError {
    ToolError::Execution { message }
}

/// Pushes the components of `path` onto `pending` so that the first is popped first; `.` is
/// left out, and a root or prefix (a link's absolute target after its root was stripped cannot
/// have one) is refused.
fn push_components(pending: &mut Vec<OsString>, path: &Path) -> Result<(), PathError> {
    let start = pending.len();
    for c in path.components() {
        match c {
            Component::Normal(name) => pending.push(name.to_owned()),
            Component::ParentDir => pending.push(OsString::from("..")),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return Err(PathError::Outside),
        }
    }
    pending[start..].reverse();
    Ok(())
}

/// Whether a lookup failed because the component is not there (or a component before it is
/// not a directory).
fn missing(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}
