//! `append_file`: appends one line to a text file under an allowed directory.
//!
//! Idempotent per call, and the file gets only the line: the tool keeps its own bookkeeping in
//! a journal, the hidden file [`JOURNAL`] in its root directory, one JSON record per line:
//!
//! - `intent` (`key`, `path`, `from`, `len`, `digest`), written and synced *before* the line
//!   is appended: the call's idempotency key, the target's path relative to the root, the
//!   target's length before the append, and the line's length and SHA-256 digest;
//! - `done` (`key`, `path`, `at`), written after the line is appended and synced: the offset
//!   at which the line starts.
//!
//! A call whose key already has a `done` record for the path writes nothing (`"appended":
//! false`), so a replay of the same call (same thread, run and call id) never adds the line
//! twice. A call with only an `intent` record (the process stopped between the two records)
//! looks for its line in the target: a whole line, starting at or after `from`, with the
//! recorded length and digest, at an offset no other call's `done` record claims. Found, the
//! append happened: the `done` record is written and nothing else. Not found, the process
//! stopped before the append, which happens now.
//!
//! Concurrency: the journal and the target are opened for appending and each record, like the
//! line (with the newline put before it when the file ends in the middle of a line), is one
//! `write`, so records and lines from concurrent processes never interleave. Another process
//! may append between a call's `intent` and its line, which is why the line is searched from
//! `from` on rather than expected at `from`, and why offsets claimed by other calls are skipped.
//!
//! Bounds: only the last [`WINDOW`] bytes of the journal (some thousands of records) are
//! searched, and a target only from `from` to `from + WINDOW`; a call replayed after that many
//! later appends is treated as new. The journal itself grows by about 300 bytes per append and
//! may be deleted when no run that appends is unfinished.
//!
//! Remaining edge cases, all after a process stopped between a call's `intent` and its `done`
//! record: the same line appended in that window by another writer that keeps no journal (a
//! person, another program), or by another call that also stopped before its `done` record, is
//! taken for this call's line, and this call appends nothing; a line cut short by a crash of
//! the machine itself (before the data reached the disk) is not recognised, so the whole line
//! is appended after the partial one; and if the target was rewritten (shortened, edited) in
//! that window the line may be appended again.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use awaken::event::{EffectClass, ToolDescriptor};
use awaken::tool::{DigestWriter, ToolCallContext, ToolError, ToolOutput};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::confine::{canonical, failed, normalize_path, outside};

/// The file name of the tool's journal in its root directory.
pub(crate) const JOURNAL: &str = ".awaken-append-journal";

/// Most bytes at the end of the journal searched for a call's records, and most bytes of a
/// target searched for a call's line after the target's recorded length.
const WINDOW: u64 = 1024 * 1024;

/// `append_file {"path": string, "line": string}`: appends `line` to the file at `path` (relative
/// to `root`; created if missing, but its directory must exist).
pub(crate) struct AppendFile {
    pub(crate) root: PathBuf,
}

/// A resolved target: the real root, the file's real path and its path relative to the root.
struct Target {
    root: PathBuf,
    file: PathBuf,
    relative: String,
}

/// One append: who asks (the idempotency key), where and what.
struct Call<'a> {
    key: &'a str,
    path: &'a str,
    line: &'a str,
}

/// One line of the journal.
#[derive(Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Record {
    /// Written and synced before the line is appended.
    Intent {
        key: String,
        path: String,
        from: u64,
        len: u64,
        digest: String,
    },
    /// Written after the line is appended and synced.
    Done { key: String, path: String, at: u64 },
}

impl AppendFile {
    /// The real path of `requested` under the root, which must be the path's canonical
    /// spelling (`confine`): the root is created if missing; the file's directory must exist,
    /// and the file must not be a directory. The journal is not a target.
    fn target(&self, requested: &str) -> Result<Target, ToolError> {
        canonical(&self.root, requested)?;
        std::fs::create_dir_all(&self.root).map_err(|e| {
            failed(format!(
                "cannot create the allowed directory {}: {e}",
                self.root.display()
            ))
        })?;
        let root = std::fs::canonicalize(&self.root).map_err(|_| outside(requested))?;
        if requested == JOURNAL {
            return Err(failed(format!(
                "`{requested}` is append_file's own journal, not a file to append to"
            )));
        }
        let file = root.join(requested);
        let dir = file.parent().unwrap_or(&root);
        if !dir.is_dir() {
            return Err(failed(format!(
                "the directory of `{requested}` does not exist under the allowed directory"
            )));
        }
        if file.is_dir() {
            return Err(failed(format!("`{requested}` is a directory")));
        }
        Ok(Target {
            root,
            file,
            relative: requested.to_owned(),
        })
    }

    /// Runs a call up to its synced `intent` record and stops, as a process killed right
    /// before the append would.
    #[cfg(test)]
    pub(crate) fn stop_before_the_append(
        &self,
        requested: &str,
        key: &str,
        line: &str,
    ) -> std::io::Result<()> {
        let target = self
            .target(requested)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let call = Call {
            key,
            path: &target.relative,
            line,
        };
        begin(&target, &call).map(drop)
    }
}

/// The journal's records at its end and whether it ends in the middle of a record.
struct Journal {
    file: File,
    records: Vec<Record>,
    open_record: bool,
}

impl Journal {
    /// Opens (creating if missing) the journal in `root` and reads its last [`WINDOW`] bytes.
    fn open(root: &Path) -> std::io::Result<Self> {
        let path = root.join(JOURNAL);
        if let Ok(meta) = std::fs::symlink_metadata(&path)
            && !meta.is_file()
        {
            return Err(std::io::Error::other(format!(
                "{} is not a regular file",
                path.display()
            )));
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)?;
        let (start, tail) = read_tail(&mut file)?;
        let mut lines = tail.split(|b| *b == b'\n');
        if start > 0 {
            // The first piece may be the end of a record cut by the window.
            lines.next();
        }
        let records = lines
            .filter_map(|line| serde_json::from_slice(line).ok())
            .collect();
        Ok(Self {
            file,
            records,
            open_record: tail.last().is_some_and(|b| *b != b'\n'),
        })
    }

    /// Whether the call's append is recorded as done.
    fn done(&self, call: &Call<'_>) -> bool {
        self.records.iter().any(
            |r| matches!(r, Record::Done { key, path, .. } if key == call.key && path == call.path),
        )
    }

    /// The call's last `intent`: the target's length before the append, and the line's length
    /// and digest.
    fn intent(&self, call: &Call<'_>) -> Option<(u64, u64, &str)> {
        self.records.iter().rev().find_map(|r| match r {
            Record::Intent {
                key,
                path,
                from,
                len,
                digest,
            } if key == call.key && path == call.path => Some((*from, *len, digest.as_str())),
            _ => None,
        })
    }

    /// Offsets in the call's target where other calls' lines start.
    fn claimed(&self, call: &Call<'_>) -> Vec<u64> {
        self.records
            .iter()
            .filter_map(|r| match r {
                Record::Done { key, path, at } if key != call.key && path == call.path => Some(*at),
                _ => None,
            })
            .collect()
    }

    /// Appends `record` in one write (after a newline if a cut record ends the journal), synced
    /// when `sync` is set.
    fn write(&mut self, record: &Record, sync: bool) -> std::io::Result<()> {
        let mut text = if self.open_record {
            b"\n".to_vec()
        } else {
            Vec::new()
        };
        serde_json::to_writer(&mut text, record)?;
        text.push(b'\n');
        self.file.write_all(&text)?;
        self.open_record = false;
        if sync {
            self.file.sync_data()?;
        }
        Ok(())
    }
}

/// The offset where the last [`WINDOW`] bytes of `file` start, and those bytes.
fn read_tail(file: &mut File) -> std::io::Result<(u64, Vec<u8>)> {
    let start = file.metadata()?.len().saturating_sub(WINDOW);
    file.seek(SeekFrom::Start(start))?;
    let mut tail = Vec::new();
    file.take(WINDOW).read_to_end(&mut tail)?;
    Ok((start, tail))
}

/// `sha256:` and the hex digits of the SHA-256 digest of `bytes`.
fn digest(bytes: &[u8]) -> std::io::Result<String> {
    let mut digest = DigestWriter::new();
    digest.write_all(bytes)?;
    Ok(digest.finish())
}

/// Where in `file` a whole line of `len` bytes with `digest` starts, at or after `from` (and
/// before `from + WINDOW`), at an offset not in `claimed`.
fn find_line(
    file: &mut File,
    from: u64,
    len: u64,
    digest_of_line: &str,
    claimed: &[u64],
) -> std::io::Result<Option<u64>> {
    // From the byte before `from`, to see whether a line starts at `from`.
    let start = from.saturating_sub(1);
    file.seek(SeekFrom::Start(start))?;
    let mut chunk = Vec::new();
    file.take(WINDOW + 1).read_to_end(&mut chunk)?;
    let after_newlines = chunk
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| i + 1);
    let starts = (from == 0).then_some(0).into_iter().chain(after_newlines);
    for i in starts {
        let at = start + i as u64;
        if at < from || claimed.contains(&at) {
            continue;
        }
        let rest = &chunk[i..];
        let Some(end) = rest.iter().position(|b| *b == b'\n') else {
            break;
        };
        if end as u64 == len && digest(&rest[..end])? == digest_of_line {
            return Ok(Some(at));
        }
    }
    Ok(None)
}

/// Appends `line` (after a newline when `file` ends in the middle of a line) in one write and
/// syncs it; returns the offset where the line starts, when it can be read back there.
fn write_line(file: &mut File, line: &str) -> std::io::Result<Option<u64>> {
    let len = file.metadata()?.len();
    let mut last = [0u8; 1];
    let open_line = if len == 0 {
        false
    } else {
        file.seek(SeekFrom::Start(len - 1))?;
        file.read_exact(&mut last)?;
        last[0] != b'\n'
    };
    let text = format!("{}{line}\n", if open_line { "\n" } else { "" });
    file.write_all(text.as_bytes())?;
    file.sync_data()?;
    // Appending leaves the position at the end of what was written, wherever other
    // processes' appends put it; read the line back there to be sure.
    let Some(at) = file
        .stream_position()
        .ok()
        .and_then(|end| end.checked_sub(line.len() as u64 + 1))
    else {
        return Ok(None);
    };
    let mut back = vec![0u8; line.len() + 1];
    let read = file
        .seek(SeekFrom::Start(at))
        .and_then(|_| file.read_exact(&mut back));
    Ok((read.is_ok() && back == format!("{line}\n").as_bytes()).then_some(at))
}

/// The first step of a call: `None` when the journal shows the call's line was already
/// appended (its `done` record is then written if it was missing); otherwise the journal, with
/// the call's `intent` written and synced, and the target opened for appending.
fn begin(target: &Target, call: &Call<'_>) -> std::io::Result<Option<(Journal, File)>> {
    let mut journal = Journal::open(&target.root)?;
    if journal.done(call) {
        return Ok(None);
    }
    #[cfg(unix)]
    let fresh_journal = journal.records.is_empty() && !journal.open_record;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(&target.file)?;
    if let Some((from, len, digest_of_line)) = journal.intent(call) {
        let claimed = journal.claimed(call);
        if let Some(at) = find_line(&mut file, from, len, digest_of_line, &claimed)? {
            record_done(&mut journal, call, at);
            return Ok(None);
        }
    }
    let intent = Record::Intent {
        key: call.key.to_owned(),
        path: call.path.to_owned(),
        from: file.metadata()?.len(),
        len: call.line.len() as u64,
        digest: digest(call.line.as_bytes())?,
    };
    journal.write(&intent, true)?;
    #[cfg(unix)]
    if fresh_journal {
        // A new journal's directory entry must be as durable as its first record.
        File::open(&target.root)?.sync_all()?;
    }
    Ok(Some((journal, file)))
}

/// Writes the call's `done` record. Not synced, and a failure only costs a later replay the
/// search for the line, so a failure is logged rather than returned.
fn record_done(journal: &mut Journal, call: &Call<'_>, at: u64) {
    let done = Record::Done {
        key: call.key.to_owned(),
        path: call.path.to_owned(),
        at,
    };
    if let Err(e) = journal.write(&done, false) {
        tracing::warn!(path = call.path, error = %e, "append_file: cannot journal a done append");
    }
}

/// Appends the call's line unless the journal shows it was appended already; returns whether
/// it was appended now.
fn append(target: &Target, call: &Call<'_>) -> std::io::Result<bool> {
    let Some((mut journal, mut file)) = begin(target, call)? else {
        return Ok(false);
    };
    if let Some(at) = write_line(&mut file, call.line)? {
        record_done(&mut journal, call, at);
    }
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

    fn normalize_arguments(&self, args: &Value) -> Result<Option<Value>, ToolError> {
        normalize_path("append_file", &self.root, args)
    }

    async fn execute(&self, args: &Value, ctx: &ToolCallContext) -> Result<ToolOutput, ToolError> {
        let requested = args["path"].as_str().unwrap_or_default();
        let line = args["line"].as_str().unwrap_or_default();
        if line.contains(['\n', '\r']) {
            return Err(failed("`line` must be a single line".into()));
        }
        let target = self.target(requested)?;
        let call = Call {
            key: ctx.idempotency_key().as_str(),
            path: &target.relative,
            line,
        };
        let appended = append(&target, &call)
            .map_err(|e| failed(format!("cannot append to `{requested}`: {e}")))?;
        let mut result = json!({"path": requested, "line": line, "appended": appended});
        if !appended {
            result["note"] = json!("this call already appended its line; nothing was written");
        }
        Ok(ToolOutput::success(result))
    }
}
