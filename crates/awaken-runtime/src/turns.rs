//! Turns as a model is sent them: never two user messages in a row, and the results of an
//! assistant message's tool calls in call order.
//!
//! A thread's stored history may hold either. A run cancelled before the model wrote anything
//! ends with its user message, and the thread's next run adds its own; results are stored as
//! their calls close, so a call that waited for a decision is answered after the later calls of
//! its batch that ran, and one a cancelled run closed at its end after those closed before it.
//! Providers that require user and assistant turns to alternate refuse the first, and some pair
//! results with calls by position; so the runtime merges each run of adjacent user messages
//! into one and puts each message's results in call order when it builds a request. The stored
//! history keeps the messages as they were written.

use std::sync::Arc;

use awaken_event::{ContentBlock, Message, Role, ToolCall};

/// What goes between the content of two merged user messages: a provider that takes plain
/// text joins text blocks as they are, and would run the last word of one message into the
/// first of the next.
pub(crate) const USER_MESSAGE_SEPARATOR: &str = "\n\n";

/// The position from which `messages` must be rewritten ([`regular`]): the first of two
/// adjacent user messages, or the assistant message whose results are out of call order.
/// Looks at the messages from `from` on (those before are known to need nothing), and from
/// the assistant message whose results `from` may be among. Allocates nothing.
pub(crate) fn first_irregular(messages: &[Message], from: usize) -> Option<usize> {
    let mut at = from.min(messages.len());
    while at > 0 && messages[at - 1].role == Role::Tool {
        at -= 1;
    }
    // The calls the results being looked at answer, where their message is, and the call
    // position of the last of them.
    let mut calls: &[ToolCall] = &[];
    let mut calls_at = 0;
    let mut last = None;
    for (i, message) in messages.iter().enumerate().skip(at.saturating_sub(1)) {
        match message.role {
            Role::Tool => {
                let position = call_position(calls, message);
                if last.is_some_and(|l| position < l) {
                    return Some(calls_at);
                }
                last = Some(position);
            }
            Role::User if i >= from && i > 0 && is_user(&messages[i - 1]) => return Some(i - 1),
            role => {
                calls = if role == Role::Assistant {
                    &message.tool_calls
                } else {
                    &[]
                };
                calls_at = i;
                last = None;
            }
        }
    }
    None
}

/// `messages` rewritten from `start` (the position [`first_irregular`] found) as a model is
/// sent them: each run of adjacent user messages merged into one (their content blocks in
/// order, [`USER_MESSAGE_SEPARATOR`] between two messages'), and the results after each
/// assistant message in the order of its calls (a result that answers none of them after
/// those that do).
pub(crate) fn regular(messages: &[Message], start: usize) -> Vec<Message> {
    let mut out = Vec::with_capacity(messages.len());
    out.extend_from_slice(&messages[..start]);
    let mut rest = &messages[start..];
    while let Some(message) = rest.first() {
        let users = if is_user(message) {
            rest.iter().take_while(|m| is_user(m)).count()
        } else {
            1
        };
        let (group, after) = rest.split_at(users);
        out.push(match group {
            [one] => one.clone(),
            _ => merged_users(group),
        });
        rest = after;
        if message.role == Role::Assistant && !message.tool_calls.is_empty() {
            let results = rest.iter().take_while(|m| m.role == Role::Tool).count();
            let (group, after) = rest.split_at(results);
            let first = out.len();
            out.extend_from_slice(group);
            // Stable: results that answer no call keep their order.
            out[first..].sort_by_key(|result| call_position(&message.tool_calls, result));
            rest = after;
        }
    }
    out
}

fn is_user(message: &Message) -> bool {
    message.role == Role::User
}

/// The position among `calls` of the call `result` answers (after every call when it answers
/// none of them).
fn call_position(calls: &[ToolCall], result: &Message) -> usize {
    result
        .tool_call_id
        .as_ref()
        .and_then(|id| calls.iter().position(|c| c.id == *id))
        .unwrap_or(usize::MAX)
}

/// One user message with the content of every message of `group`, in order.
fn merged_users(group: &[Message]) -> Message {
    let blocks = group.iter().map(|m| m.content.len()).sum::<usize>() + group.len() - 1;
    let mut content = Vec::with_capacity(blocks);
    for (i, message) in group.iter().enumerate() {
        if i > 0 {
            content.push(ContentBlock::text(USER_MESSAGE_SEPARATOR));
        }
        content.extend(message.content.iter().cloned());
    }
    Message {
        content: Arc::from(content),
        ..group[0].clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use awaken_event::{ToolCallId, ToolResult};

    fn id(s: &str) -> ToolCallId {
        ToolCallId::new(s).expect("id")
    }

    fn calls(ids: &[&str]) -> Message {
        let calls = ids
            .iter()
            .map(|i| ToolCall::new(id(i), "echo", serde_json::json!({})))
            .collect();
        Message::assistant_with_calls("", calls)
    }

    fn result(i: &str) -> Message {
        Message::tool(id(i), &ToolResult::success(serde_json::json!(i)))
    }

    fn render(messages: &[Message]) -> String {
        messages
            .iter()
            .map(|m| match &m.tool_call_id {
                Some(id) => format!("Tool {id}"),
                None => format!("{:?} {:?}", m.role, m.text()),
            })
            .collect::<Vec<_>>()
            .join(" | ")
    }

    #[test]
    fn each_run_of_user_messages_becomes_one_and_the_rest_stays() {
        let messages = [
            Message::system("s"),
            Message::user("a"),
            Message::assistant("b"),
            Message::user("c"),
            Message::user("d"),
            Message::user("e"),
            Message::assistant("f"),
            Message::user("g"),
            Message::user("h"),
        ];
        assert_eq!(first_irregular(&messages, 0), Some(3));
        // Only the messages from `from` on are looked at.
        assert_eq!(first_irregular(&messages, 6), Some(7));
        assert_eq!(first_irregular(&messages, 9), None);
        let regular = regular(&messages, 3);
        expect_test::expect![[r#"System "s" | User "a" | Assistant "b" | User "c\n\nd\n\ne" | Assistant "f" | User "g\n\nh""#]]
            .assert_eq(&render(&regular));
        assert_eq!(first_irregular(&regular, 0), None);
    }

    #[test]
    fn results_are_put_in_call_order() {
        let messages = [
            Message::user("a"),
            calls(&["c1", "c2", "c3"]),
            result("c3"),
            result("c1"),
            result("c2"),
            Message::user("b"),
            calls(&["c4", "c5"]),
            result("c4"),
            result("stray"),
            result("c5"),
        ];
        assert_eq!(first_irregular(&messages, 0), Some(1));
        // From among the results: the calls they answer are looked at again.
        assert_eq!(first_irregular(&messages, 4), Some(1));
        // A result that answers no call of its message goes after those that do.
        assert_eq!(first_irregular(&messages, 6), Some(6));
        let regular = regular(&messages, 1);
        expect_test::expect![[r#"User "a" | Assistant "" | Tool c1 | Tool c2 | Tool c3 | User "b" | Assistant "" | Tool c4 | Tool c5 | Tool stray"#]]
            .assert_eq(&render(&regular));
        assert_eq!(first_irregular(&regular, 0), None);
    }

    #[test]
    fn regular_messages_need_nothing() {
        let messages = [
            Message::user("a"),
            Message::incomplete_assistant("b"),
            Message::user("c"),
            calls(&["c1", "c2"]),
            result("c1"),
            result("c2"),
            Message::user("d"),
        ];
        for from in 0..=messages.len() {
            assert_eq!(first_irregular(&messages, from), None, "from {from}");
        }
        assert_eq!(first_irregular(&[], 0), None);
        assert_eq!(first_irregular(&messages[..1], 0), None);
    }
}
