use std::hint::black_box;

use awaken_event::{AgentEvent, GrammarChecker, RunId, ThreadId, ToolCallId, ToolResult};
use awaken_event::{TerminationReason, ToolCallState};
use criterion::Criterion;

fn activation(steps: u32) -> Vec<AgentEvent> {
    let thread_id = ThreadId::new("t").expect("static id");
    let run_id = RunId::new("r").expect("static id");
    let mut events = vec![AgentEvent::RunStart {
        thread_id: thread_id.clone(),
        run_id: run_id.clone(),
        agent_id: "a".into(),
        parent_run_id: None,
        resumed: false,
    }];
    for step in 1..=steps {
        let call_id = ToolCallId::new(format!("c{step}")).expect("generated id");
        events.push(AgentEvent::StepStart { step });
        events.push(AgentEvent::TextDelta {
            delta: "hello".into(),
        });
        events.push(AgentEvent::ToolCallStart {
            call_id: call_id.clone(),
            name: "echo".into(),
        });
        events.push(AgentEvent::ToolCallArgsDelta {
            call_id: call_id.clone(),
            delta: "{}".into(),
        });
        events.push(AgentEvent::ToolCallDone {
            call_id,
            result: ToolResult::success(serde_json::json!({"ok": true})).into(),
            state: ToolCallState::Succeeded,
        });
        events.push(AgentEvent::StepEnd { step });
    }
    events.push(AgentEvent::RunFinish {
        thread_id,
        run_id,
        termination: Box::new(TerminationReason::NaturalEnd),
        response: None,
        usage: Box::default(),
    });
    events
}

pub(crate) fn benches(c: &mut Criterion) {
    let events = activation(166);
    c.bench_function("event/grammar_check_1k_events", |b| {
        b.iter(|| {
            let mut checker = GrammarChecker::new();
            for e in black_box(&events) {
                checker.push(e).expect("valid activation");
            }
            checker.finish().expect("finished")
        })
    });
    let delta = AgentEvent::TextDelta {
        delta: "a few words of streamed text".into(),
    };
    c.bench_function("event/serialize_text_delta", |b| {
        b.iter(|| serde_json::to_vec(black_box(&delta)).expect("serializable"))
    });
}
