//! History repair on load: a stored history never reaches a provider with a tool call that has
//! no result or a result that answers no call (every call gets exactly one closing result). The
//! stored history is left as it is (the store is append-only); the repair is applied to the
//! copy a run works on, every time it is loaded.

use std::collections::HashSet;

use awaken_event::{Message, Role, ToolCallId, ToolResult};

/// The result given to a call whose outcome was never recorded.
pub(crate) const OUTCOME_UNKNOWN: &str =
    "outcome unknown: the call's result was never recorded (the run was interrupted)";

/// Repairs `messages` in place: a call without a result (other than the `open` ones, which
/// legitimately wait for a decision) gets an "outcome unknown" result right after its
/// message's results; a result that answers no earlier call, or a call already answered, is
/// dropped. Returns one line per repair, for the warning event.
pub(crate) fn repair_history(
    messages: &mut Vec<Message>,
    open: &HashSet<ToolCallId>,
) -> Vec<String> {
    if is_paired(messages, open) {
        return Vec::new();
    }
    let mut repairs = Vec::new();
    let mut out = Vec::with_capacity(messages.len() + 1);
    let mut answered: HashSet<ToolCallId> = HashSet::new();
    // Calls of the latest assistant message still waiting for their result.
    let mut pending: Vec<ToolCallId> = Vec::new();
    for message in messages.drain(..) {
        if message.role == Role::Tool {
            let id = message.tool_call_id.clone();
            match id {
                Some(id) if pending.contains(&id) && !answered.contains(&id) => {
                    answered.insert(id);
                    out.push(message);
                }
                Some(id) => repairs.push(format!(
                    "dropped a result for call {id}, which no earlier call it answers"
                )),
                None => repairs.push("dropped a tool result that names no call".to_owned()),
            }
            continue;
        }
        close_pending(&mut pending, &answered, open, &mut out, &mut repairs);
        if message.role == Role::Assistant {
            pending = message.tool_calls.iter().map(|c| c.id.clone()).collect();
        }
        out.push(message);
    }
    close_pending(&mut pending, &answered, open, &mut out, &mut repairs);
    *messages = out;
    repairs
}

fn close_pending(
    pending: &mut Vec<ToolCallId>,
    answered: &HashSet<ToolCallId>,
    open: &HashSet<ToolCallId>,
    out: &mut Vec<Message>,
    repairs: &mut Vec<String>,
) {
    for id in pending.drain(..) {
        if !answered.contains(&id) && !open.contains(&id) {
            repairs.push(format!(
                "call {id} had no result: closed as outcome unknown"
            ));
            out.push(Message::tool(id, &ToolResult::error(OUTCOME_UNKNOWN)));
        }
    }
}

/// Whether every call is answered (or open) once, right after its message, and every result
/// answers such a call: the common case, checked without copying.
fn is_paired(messages: &[Message], open: &HashSet<ToolCallId>) -> bool {
    let mut pending: Vec<&ToolCallId> = Vec::new();
    for message in messages {
        match message.role {
            Role::Tool => {
                let Some(id) = &message.tool_call_id else {
                    return false;
                };
                let Some(at) = pending.iter().position(|p| *p == id) else {
                    return false;
                };
                pending.swap_remove(at);
            }
            _ => {
                if pending.iter().any(|p| !open.contains(*p)) {
                    return false;
                }
                pending.clear();
                if message.role == Role::Assistant {
                    pending.extend(message.tool_calls.iter().map(|c| &c.id));
                }
            }
        }
    }
    pending.iter().all(|p| open.contains(*p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use awaken_event::ToolCall;
    use serde_json::json;

    fn id(s: &str) -> ToolCallId {
        ToolCallId::new(s).expect("id")
    }

    fn calls(ids: &[&str]) -> Message {
        let mut m = Message::assistant("");
        m.tool_calls = ids
            .iter()
            .map(|i| ToolCall::new(id(i), "echo", json!({})))
            .collect();
        m
    }

    fn result(i: &str) -> Message {
        Message::tool(id(i), &ToolResult::success(json!("ok")))
    }

    fn render(messages: &[Message]) -> String {
        messages
            .iter()
            .map(|m| match m.role {
                Role::Tool => format!(
                    "tool {} {}",
                    m.tool_call_id.as_ref().map_or("-", |c| c.as_str()),
                    m.text()
                ),
                Role::Assistant => format!(
                    "assistant {:?}",
                    m.tool_calls
                        .iter()
                        .map(|c| c.id.as_str())
                        .collect::<Vec<_>>()
                ),
                other => format!("{other:?}"),
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn a_paired_history_is_left_alone() {
        let mut h = vec![
            Message::user("hi"),
            calls(&["a", "b"]),
            result("b"),
            result("a"),
        ];
        let before = h.clone();
        assert!(repair_history(&mut h, &HashSet::new()).is_empty());
        assert_eq!(h, before);
    }

    #[test]
    fn a_call_without_result_is_closed_and_an_orphan_result_dropped() {
        let mut h = vec![
            Message::user("hi"),
            calls(&["a", "b"]),
            result("a"),
            Message::user("again"),
            result("zz"),
            calls(&["c"]),
        ];
        let repairs = repair_history(&mut h, &HashSet::new());
        assert_eq!(
            repairs,
            [
                "call b had no result: closed as outcome unknown",
                "dropped a result for call zz, which no earlier call it answers",
                "call c had no result: closed as outcome unknown",
            ]
        );
        expect_test::expect![[r#"
            User
            assistant ["a", "b"]
            tool a ok
            tool b error: outcome unknown: the call's result was never recorded (the run was interrupted)
            User
            assistant ["c"]
            tool c error: outcome unknown: the call's result was never recorded (the run was interrupted)"#]]
        .assert_eq(&render(&h));
        // Repairing twice changes nothing more.
        assert!(repair_history(&mut h, &HashSet::new()).is_empty());
    }

    #[test]
    fn calls_waiting_for_a_decision_are_not_closed() {
        let mut h = vec![Message::user("hi"), calls(&["a", "b"]), result("a")];
        let open: HashSet<ToolCallId> = [id("b")].into();
        assert!(repair_history(&mut h, &open).is_empty());
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn a_duplicate_result_is_dropped() {
        let mut h = vec![calls(&["a"]), result("a"), result("a")];
        let repairs = repair_history(&mut h, &HashSet::new());
        assert_eq!(repairs.len(), 1, "{repairs:?}");
        assert_eq!(h.len(), 2);
    }
}
