use std::hint::black_box;

use async_trait::async_trait;
use awaken_event::{EffectClass, ToolCall, ToolCallId, ToolDescriptor, ToolResult};
use awaken_tool::{RegisteredTool, Tool, ToolBatch, ToolCallContext, ToolError, ToolOutput};
use criterion::Criterion;
use serde_json::{Value, json};

struct Booking;

#[async_trait]
impl Tool for Booking {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("book_table", "Books a table")
            .with_effect(EffectClass::SideEffecting)
            .with_parameters(json!({
                "type": "object",
                "properties": {
                    "restaurant": { "type": "string", "minLength": 1 },
                    "date": { "type": "string" },
                    "party_size": { "type": "integer", "minimum": 1, "maximum": 20 },
                    "outdoor": { "type": "boolean" },
                    "notes": { "type": "string", "maxLength": 500 }
                },
                "required": ["restaurant", "date", "party_size"],
                "additionalProperties": false
            }))
    }

    async fn execute(
        &self,
        _args: &Value,
        _ctx: &ToolCallContext,
    ) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::success(json!("booked")))
    }
}

fn batch_of_four() -> (ToolBatch, Vec<ToolCallId>) {
    let calls: Vec<ToolCall> =
        (0..4)
            .map(|i| ToolCall {
                id: ToolCallId::new(format!("call_{i}")).expect("bench id"),
                name: "book_table".into(),
                arguments:
                    json!({"restaurant": "Chez Nous", "date": "2026-12-01", "party_size": i + 1})
                        .into(),
                invalid_arguments: None,
            })
            .collect();
    let ids = calls.iter().map(|c| c.id.clone()).collect();
    (ToolBatch::new(calls).expect("bench batch"), ids)
}

fn round_trip(batch: &ToolBatch) -> ToolBatch {
    let json = serde_json::to_vec(batch).expect("serialize");
    serde_json::from_slice(&json).expect("deserialize")
}

pub(crate) fn benches(c: &mut Criterion) {
    let tool = RegisteredTool::from_tool(Booking).expect("bench tool");
    let args = json!({
        "restaurant": "Chez Nous",
        "date": "2026-12-01",
        "party_size": 4,
        "outdoor": true,
        "notes": "window seat"
    });
    assert!(tool.validate(&args).is_ok());
    c.bench_function("tool/validate_args_small_object", |b| {
        b.iter(|| tool.validate(black_box(&args)).is_ok())
    });

    // Each of the 8 transitions (4 × Requested→Executing, 4 × Executing→Succeeded) is followed
    // by a serde round trip of the whole batch, as the runtime persists it at each commit.
    let (fresh, ids) = batch_of_four();
    let done = ToolResult::success(json!("booked"));
    c.bench_function("tool/batch_transition_roundtrip", |b| {
        b.iter(|| {
            let mut batch = fresh.clone();
            for id in &ids {
                batch.start(id).expect("start");
                batch = round_trip(&batch);
            }
            for id in &ids {
                batch.succeed(id, done.clone()).expect("succeed");
                batch = round_trip(&batch);
            }
            assert!(batch.is_closed());
            black_box(batch)
        })
    });
}
