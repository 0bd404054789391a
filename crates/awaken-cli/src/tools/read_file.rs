//! `read_file`: a UTF-8 file under the tool's root.

use std::path::PathBuf;

use async_trait::async_trait;
use awaken::event::{EffectClass, ToolDescriptor};
use awaken::tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use serde_json::{Value, json};

use super::confine::{canonical, failed, normalize_path};

/// Most bytes `read_file` returns.
const MAX_READ: u64 = 64 * 1024;

/// `read_file {"path": string}`: reads a UTF-8 file under `root` (no absolute paths, nothing
/// that leads out of it). The path is put in its canonical spelling before the gates run
/// (`confine`), and read only in that spelling.
pub(crate) struct ReadFile {
    pub(crate) root: PathBuf,
}

#[async_trait]
impl Tool for ReadFile {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new(
            "read_file",
            "Read a UTF-8 text file, given its path relative to the allowed directory.",
        )
        .with_parameters(json!({
            "type": "object",
            "properties": {"path": {"type": "string", "minLength": 1}},
            "required": ["path"],
            "additionalProperties": false
        }))
        .with_effect(EffectClass::ReadOnly)
    }

    fn normalize_arguments(&self, args: &Value) -> Result<Option<Value>, ToolError> {
        normalize_path("read_file", &self.root, args)
    }

    async fn execute(&self, args: &Value, _ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        let requested = args["path"].as_str().unwrap_or_default();
        let path = canonical(&self.root, requested)?;
        let cannot = |e: std::io::Error| failed(format!("cannot read `{requested}`: {e}"));
        let meta = std::fs::metadata(&path).map_err(cannot)?;
        if meta.len() > MAX_READ {
            return Err(ToolError::Execution {
                message: format!(
                    "`{requested}` is {} bytes; at most {MAX_READ} are read",
                    meta.len()
                ),
            });
        }
        let text = std::fs::read_to_string(&path).map_err(cannot)?;
        Ok(ToolOutput::success(
            json!({"path": requested, "content": text}),
        ))
    }
}
