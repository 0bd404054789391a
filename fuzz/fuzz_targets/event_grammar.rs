//! The event-grammar checker (`awaken_event::check_events`, `check_activation`,
//! `GrammarChecker`) over arbitrary event sequences (calls and steps from small pools, so that
//! they meet): it never panics, a violation points at the event that broke the rule (every
//! event before it passes), and what it accepts has the shape the grammar describes. Every
//! event also round-trips through its JSON form.

#![no_main]

use std::collections::BTreeSet;

use awaken_event::{AgentEvent, GrammarChecker, check_activation, check_events};
use awaken_fuzz::Event;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: Vec<Event>| {
    let events: Vec<AgentEvent> = input.iter().map(Event::get).collect();
    for e in &events {
        let text = serde_json::to_string(e).expect("an event serializes");
        match serde_json::from_str::<AgentEvent>(&text) {
            Ok(back) => assert_eq!(&back, e, "{text}"),
            // `serde_json` reads no deeper than 128 (values nested past it are generated on
            // purpose for the stores' limits).
            Err(err) if err.to_string().starts_with("recursion limit exceeded") => {}
            Err(err) => panic!("{text} does not read back: {err}"),
        }
    }

    match check_events(&events) {
        Ok(()) => accepted_shape(&events),
        Err(v) => {
            // Every event before the offending one passes, one at a time.
            let mut checker = GrammarChecker::new();
            for (i, e) in events[..v.index.min(events.len())].iter().enumerate() {
                if let Err(early) = checker.push(e) {
                    panic!("event {i} fails ({early}) before the reported violation ({v})");
                }
            }
            match events.get(v.index) {
                Some(e) => {
                    assert_eq!(v.event, e.type_name(), "{v}");
                    assert!(checker.push(e).is_err(), "{v}: the event passes alone");
                }
                None => {
                    assert_eq!(v.event, "end", "{v}");
                    assert!(checker.finish().is_err(), "{v}: the end passes alone");
                }
            }
        }
    }

    if check_activation(&events).is_ok() {
        // Exactly one activation: `RunStart` first, `RunFinish` last and nowhere else.
        let starts = events
            .iter()
            .filter(|e| matches!(e, AgentEvent::RunStart { .. }))
            .count();
        let finishes = events
            .iter()
            .filter(|e| matches!(e, AgentEvent::RunFinish { .. }))
            .count();
        assert_eq!((starts, finishes), (1, 1));
        assert!(matches!(events.first(), Some(AgentEvent::RunStart { .. })));
        assert!(matches!(events.last(), Some(AgentEvent::RunFinish { .. })));
    }
});

/// What an accepted stream looks like, checked without the checker's own bookkeeping:
/// activations that open with `RunStart` and close with `RunFinish`, with nothing between or
/// after them; inside, balanced steps numbered alike, stream events and tool-call events only
/// inside a step, and every call of a step closed before it ends.
fn accepted_shape(events: &[AgentEvent]) {
    let mut in_activation = false;
    let mut step: Option<u32> = None;
    let mut open: BTreeSet<String> = BTreeSet::new();
    for (i, e) in events.iter().enumerate() {
        let at = format!(
            "accepted, but event {i} ({}) breaks the grammar",
            e.type_name()
        );
        match e {
            AgentEvent::RunStart { .. } => {
                assert!(!in_activation, "{at}");
                in_activation = true;
                continue;
            }
            _ => assert!(in_activation, "{at}"),
        }
        match e {
            AgentEvent::RunFinish { .. } => {
                assert!(step.is_none(), "{at}");
                in_activation = false;
            }
            AgentEvent::StepStart { step: n } => {
                assert!(step.is_none(), "{at}");
                step = Some(*n);
            }
            AgentEvent::StepEnd { step: n } => {
                assert_eq!(step, Some(*n), "{at}");
                assert!(open.is_empty(), "{at}: calls {open:?} are open");
                step = None;
            }
            AgentEvent::TextDelta { .. }
            | AgentEvent::ReasoningDelta { .. }
            | AgentEvent::InferenceComplete { .. } => assert!(step.is_some(), "{at}"),
            AgentEvent::ToolCallStart { call_id, .. }
            | AgentEvent::ToolCallResumed { call_id, .. } => {
                assert!(step.is_some(), "{at}");
                assert!(open.insert(call_id.to_string()), "{at}");
            }
            AgentEvent::ToolCallArgsDelta { call_id, .. }
            | AgentEvent::ToolCallReady { call_id, .. }
            | AgentEvent::ToolCallProgress { call_id, .. } => {
                assert!(step.is_some() && open.contains(call_id.as_str()), "{at}");
            }
            AgentEvent::ToolCallDone { call_id, .. }
            | AgentEvent::ToolCallSuspended { call_id, .. } => {
                assert!(step.is_some() && open.remove(call_id.as_str()), "{at}");
            }
            _ => {}
        }
    }
    assert!(
        !in_activation,
        "accepted, but the last activation has no run_finish"
    );
}
