//! Alternating turns: a model is never sent two user messages in a row.
//!
//! A thread's stored history may hold them: a run cancelled before the model wrote anything
//! ends with its user message, and the thread's next run adds its own. Providers that require
//! user and assistant turns to alternate refuse such a request, so the runtime merges each run
//! of adjacent user messages into one when it builds a request; the stored history keeps them
//! as they were written.

use std::sync::Arc;

use awaken_event::{ContentBlock, Message, Role};

/// What goes between the content of two merged user messages: a provider that takes plain
/// text joins text blocks as they are, and would run the last word of one message into the
/// first of the next.
pub(crate) const USER_MESSAGE_SEPARATOR: &str = "\n\n";

/// The position of the first message, from `from` on, that is a user message right after
/// another one. Allocates nothing.
pub(crate) fn first_adjacent_user(messages: &[Message], from: usize) -> Option<usize> {
    (from.max(1)..messages.len()).find(|&i| is_user(&messages[i - 1]) && is_user(&messages[i]))
}

/// `messages` with each run of adjacent user messages merged into one (their content blocks in
/// order, [`USER_MESSAGE_SEPARATOR`] between two messages'), given `first`, the position
/// [`first_adjacent_user`] found.
pub(crate) fn merge_adjacent_users(messages: &[Message], first: usize) -> Vec<Message> {
    let start = first.saturating_sub(1);
    let mut merged = Vec::with_capacity(messages.len());
    merged.extend_from_slice(&messages[..start]);
    let mut rest = &messages[start..];
    while let Some(message) = rest.first() {
        let users = if is_user(message) {
            rest.iter().take_while(|m| is_user(m)).count()
        } else {
            1
        };
        let (group, after) = rest.split_at(users);
        merged.push(match group {
            [one] => one.clone(),
            _ => merged_users(group),
        });
        rest = after;
    }
    merged
}

fn is_user(message: &Message) -> bool {
    message.role == Role::User
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

    fn render(messages: &[Message]) -> String {
        messages
            .iter()
            .map(|m| format!("{:?} {:?}", m.role, m.text()))
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
        let first = first_adjacent_user(&messages, 0);
        assert_eq!(first, Some(4));
        assert_eq!(first_adjacent_user(&messages, 5), Some(5));
        assert_eq!(first_adjacent_user(&messages, 6), Some(8));
        expect_test::expect![[r#"System "s" | User "a" | Assistant "b" | User "c\n\nd\n\ne" | Assistant "f" | User "g\n\nh""#]]
            .assert_eq(&render(&merge_adjacent_users(&messages, 4)));
    }

    #[test]
    fn alternating_messages_have_no_adjacent_users() {
        let messages = [
            Message::user("a"),
            Message::incomplete_assistant("b"),
            Message::user("c"),
        ];
        assert_eq!(first_adjacent_user(&messages, 0), None);
        assert_eq!(first_adjacent_user(&[], 0), None);
        assert_eq!(first_adjacent_user(&messages[..1], 0), None);
    }
}
