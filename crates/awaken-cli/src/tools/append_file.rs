//! `append_file`: appends one line to a text file under an allowed directory.
//!
//! Idempotent per call: each appended line ends with a short tag derived from the call's
//! idempotency key (` #awk1-<16 hex digits>`), and a call whose tag is already in the file
//! appends nothing, so replaying the same call (same thread, run and call id) never adds the line
//! twice. The tag is written in the same `write` as the line, so there is no window in which the
//! line is written and its tag is not.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use awaken::event::{EffectClass, ToolDescriptor};
use awaken::tool::{ToolCallContext, ToolError, ToolOutput};
use serde_json::{Value, json};

use super::{confine, failed, outside};

/// Most bytes at the end of a file searched for a call's tag.
const TAG_WINDOW: u64 = 1024 * 1024;

/// `append_file {"path": string, "line": string}`: appends `line` to the file at `path` (relative
/// to `root`; created if missing, but its directory must exist).
pub(crate) struct AppendFile {
    pub(crate) root: PathBuf,
}

/// The tag that marks lines appended by the call with idempotency key `key`.
pub(crate) fn tag(key: &str) -> String {
    let short: String = key.chars().take("awk1-".len() + 16).collect();
    format!("#{short}")
}

impl AppendFile {
    /// The real path of `requested` under the root: the root is created if missing; the file's
    /// directory must exist, and neither it nor the file (if it exists) may lead out of the root.
    fn target(&self, requested: &str) -> Result<PathBuf, ToolError> {
        let path = confine(&self.root, requested)?;
        std::fs::create_dir_all(&self.root).map_err(|e| {
            failed(format!(
                "cannot create the allowed directory {}: {e}",
                self.root.display()
            ))
        })?;
        let root = std::fs::canonicalize(&self.root).map_err(|_| outside(requested))?;
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(failed(format!("`{requested}` does not name a file")));
        };
        let dir = std::fs::canonicalize(dir).map_err(|e| {
            failed(format!(
                "the directory of `{requested}` does not exist under the allowed directory: {e}"
            ))
        })?;
        if !dir.starts_with(&root) {
            return Err(outside(requested));
        }
        let target = dir.join(name);
        if let Ok(meta) = std::fs::symlink_metadata(&target) {
            let real = std::fs::canonicalize(&target).map_err(|_| outside(requested))?;
            if !real.starts_with(&root) {
                return Err(outside(requested));
            }
            if meta.is_dir() || real.is_dir() {
                return Err(failed(format!("`{requested}` is a directory")));
            }
        }
        Ok(target)
    }
}

/// Whether the last [`TAG_WINDOW`] bytes of `file` hold a line ending with `tag`, and whether
/// the file ends in the middle of a line.
fn scan(file: &mut std::fs::File, tag: &str) -> std::io::Result<(bool, bool)> {
    let len = file.metadata()?.len();
    let start = len.saturating_sub(TAG_WINDOW);
    file.seek(SeekFrom::Start(start))?;
    let mut tail = Vec::new();
    file.take(TAG_WINDOW).read_to_end(&mut tail)?;
    let text = String::from_utf8_lossy(&tail);
    let tagged = text
        .split('\n')
        .any(|line| line.trim_end_matches('\r').ends_with(tag));
    let open_line = tail.last().is_some_and(|b| *b != b'\n');
    Ok((tagged, open_line))
}

fn append(path: &Path, line: &str, tag: &str) -> std::io::Result<bool> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)?;
    let (tagged, open_line) = scan(&mut file, tag)?;
    if tagged {
        return Ok(false);
    }
    let text = format!("{}{line} {tag}\n", if open_line { "\n" } else { "" });
    // One write: the line and its tag land together.
    file.write_all(text.as_bytes())?;
    file.sync_data()?;
    Ok(true)
}

#[async_trait]
impl awaken::tool::Tool for AppendFile {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new(
            "append_file",
            "Append one line of text to a file, given its path relative to the allowed directory \
             (the file is created if missing).",
        )
        .with_parameters(json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1},
                "line": {"type": "string", "pattern": "^[^\\r\\n]*$"}
            },
            "required": ["path", "line"],
            "additionalProperties": false
        }))
        .with_effect(EffectClass::SideEffecting)
    }

    async fn execute(&self, args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        let requested = args["path"].as_str().unwrap_or_default();
        let line = args["line"].as_str().unwrap_or_default();
        if line.contains(['\n', '\r']) {
            return Err(failed("`line` must be a single line".into()));
        }
        let path = self.target(requested)?;
        let tag = tag(ctx.idempotency_key().as_str());
        let appended = append(&path, line, &tag)
            .map_err(|e| failed(format!("cannot append to `{requested}`: {e}")))?;
        let mut result = json!({"path": requested, "line": line, "appended": appended});
        if !appended {
            result["note"] = json!("this call already appended its line; nothing was written");
        }
        Ok(ToolOutput::success(result))
    }
}
