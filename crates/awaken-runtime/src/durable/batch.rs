//! The tool batch as a commit carries it: kept typed, serialized only by a store that writes it
//! out.

use std::sync::Arc;

use awaken_event::{ToolCallId, ToolCallState};
use awaken_store::{BatchData, BatchSource, BatchWrite};
use awaken_tool::{BatchCall, ToolBatch};

/// The batch as a commit carries it: a copy kept typed, serialized only by a store that writes
/// it out (the in-memory store keeps it as it is). A batch of one call (most steps) is copied
/// into the shared value itself, which saves an allocation per commit.
pub(crate) fn batch_set(batch: &ToolBatch) -> BatchWrite {
    let typed = match batch.calls() {
        [call] => TypedBatch::One(call.clone()),
        _ => TypedBatch::Many(batch.clone()),
    };
    BatchWrite::Set(BatchData::typed(Arc::new(typed)))
}

/// A [`ToolBatch`] as a [`BatchSource`]: its one call inline, or the batch.
#[derive(Debug)]
enum TypedBatch {
    One(BatchCall),
    Many(ToolBatch),
}

impl TypedBatch {
    fn calls(&self) -> &[BatchCall] {
        match self {
            Self::One(call) => std::slice::from_ref(call),
            Self::Many(batch) => batch.calls(),
        }
    }
}

/// The serde form of a `ToolBatch` (`{"calls": [...]}`), which a one-call batch writes the
/// same way.
impl serde::Serialize for TypedBatch {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Many(batch) => batch.serialize(serializer),
            Self::One(call) => {
                use serde::ser::SerializeStruct;
                let mut batch = serializer.serialize_struct("ToolBatch", 1)?;
                batch.serialize_field("calls", std::slice::from_ref(call))?;
                batch.end()
            }
        }
    }
}

impl BatchSource for TypedBatch {
    fn to_json(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::to_value(self)
    }

    fn to_text(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    fn open_call(
        &self,
    ) -> Result<Option<(ToolCallId, ToolCallState)>, awaken_store::CommitViolation> {
        Ok(self
            .calls()
            .iter()
            .find(|c| !c.state().is_terminal())
            .map(|c| (c.id().clone(), c.state())))
    }

    /// A `ToolBatch` is a batch by construction (its every change checked).
    fn check(&self) -> Result<(), awaken_store::CommitViolation> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use awaken_event::{SuspendTicket, ToolCall, ToolCallId, ToolResult};
    use awaken_store::BatchWrite;
    use awaken_tool::ToolBatch;
    use serde_json::json;

    use super::batch_set;

    fn call(id: &str) -> ToolCall {
        ToolCall::new(
            ToolCallId::new(id).expect("id"),
            "echo",
            json!({"text": id}),
        )
    }

    fn id(s: &str) -> ToolCallId {
        ToolCallId::new(s).expect("id")
    }

    /// What a commit carries of `batch`: as JSON, as text, and its open call.
    fn carried(batch: &ToolBatch) -> (serde_json::Value, String, Option<String>) {
        let BatchWrite::Set(data) = batch_set(batch) else {
            panic!("a set batch")
        };
        let open = data
            .open_call()
            .expect("a batch")
            .map(|(id, state)| format!("{id}:{state:?}"));
        (
            data.to_json().expect("json"),
            data.to_text().expect("text"),
            open,
        )
    }

    /// A commit's copy of a batch reads and writes as the batch itself, whatever its calls and
    /// their states (a one-call batch is copied differently from a longer one).
    #[test]
    fn a_commits_batch_is_written_as_the_tool_batch() {
        let mut batches = vec![
            ToolBatch::default(),
            ToolBatch::new([call("a")]).expect("one"),
        ];
        let mut one = ToolBatch::new([call("a")]).expect("one");
        one.start(&id("a")).expect("start");
        batches.push(one.clone());
        one.succeed(&id("a"), ToolResult::success(json!({"echoed": "a"})))
            .expect("succeed");
        batches.push(one);
        let mut two = ToolBatch::new([call("a"), call("b")]).expect("two");
        two.start(&id("a")).expect("start");
        two.fail(&id("a"), ToolResult::error("no")).expect("fail");
        let ticket = SuspendTicket {
            suspension_id: "s1".into(),
            call: awaken_tool::pending_call(&call("b")),
            message: "approve?".into(),
            response_schema: None,
            resume_mode: Default::default(),
        };
        two.suspend(&id("b"), ticket).expect("suspend");
        batches.push(two);
        for batch in &batches {
            let (value, text, open) = carried(batch);
            assert_eq!(
                value,
                serde_json::to_value(batch).expect("json"),
                "{batch:?}"
            );
            assert_eq!(text, serde_json::to_string(batch).expect("text"));
            assert_eq!(
                open,
                batch
                    .open_calls()
                    .next()
                    .map(|c| format!("{}:{:?}", c.id(), c.state()))
            );
            // And it reads back as the same batch.
            let back: ToolBatch = serde_json::from_value(value).expect("a tool batch");
            assert_eq!(&back, batch);
        }
    }
}
