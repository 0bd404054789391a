//! [`History`]: a run's messages, shared with its phase contexts and inference requests.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::message::Message;

/// A thread's messages, oldest first, as a run shares them with its phase contexts and its
/// inference requests: cloning is one reference count, reading is a slice (`Deref<[Message]>`).
///
/// [`push`](Self::push) appends in place when no clone is alive, so a run that lets go of the
/// contexts and requests of its previous step appends each message at O(1) cost whatever the
/// length of the thread; while a clone is alive, the next push copies the messages once (the
/// clone keeps what it saw). Two histories sharing one buffer therefore always hold the same
/// messages ([`ptr_eq`](Self::ptr_eq)).
#[derive(Clone, Default, PartialEq)]
pub struct History(Arc<Vec<Message>>);

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `message` (in place unless a clone is alive; see the type's docs).
    pub fn push(&mut self, message: Message) {
        Arc::make_mut(&mut self.0).push(message);
    }

    /// Appends `messages` (in place unless a clone is alive).
    pub fn extend(&mut self, messages: impl IntoIterator<Item = Message>) {
        Arc::make_mut(&mut self.0).extend(messages);
    }

    /// Whether both share one buffer (and so hold the same messages).
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        Arc::ptr_eq(&a.0, &b.0)
    }

    /// The messages as a vector (a copy, unless this is the only reference).
    pub fn into_vec(self) -> Vec<Message> {
        Arc::unwrap_or_clone(self.0)
    }
}

impl Deref for History {
    type Target = [Message];

    fn deref(&self) -> &[Message] {
        &self.0
    }
}

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

impl From<Vec<Message>> for History {
    fn from(messages: Vec<Message>) -> Self {
        Self(Arc::new(messages))
    }
}

impl From<&[Message]> for History {
    fn from(messages: &[Message]) -> Self {
        Self(Arc::new(messages.to_vec()))
    }
}

impl<const N: usize> From<[Message; N]> for History {
    fn from(messages: [Message; N]) -> Self {
        Self(Arc::new(messages.into()))
    }
}

impl FromIterator<Message> for History {
    fn from_iter<I: IntoIterator<Item = Message>>(iter: I) -> Self {
        Self(Arc::new(iter.into_iter().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_in_place_when_unshared_and_copies_once_when_a_clone_is_alive() {
        let mut history = History::from(vec![Message::user("a")]);
        let buffer = Arc::as_ptr(&history.0);
        history.push(Message::assistant("b"));
        assert_eq!(Arc::as_ptr(&history.0), buffer, "no clone alive: in place");

        let seen = history.clone();
        assert!(History::ptr_eq(&seen, &history));
        history.push(Message::user("c"));
        assert!(!History::ptr_eq(&seen, &history), "a clone alive: copied");
        assert_eq!(seen.len(), 2, "the clone keeps what it saw");
        assert_eq!(history.len(), 3);
        assert_eq!(history.last().map(Message::text).as_deref(), Some("c"));

        drop(seen);
        let buffer = Arc::as_ptr(&history.0);
        history.extend([Message::assistant("d")]);
        assert_eq!(
            Arc::as_ptr(&history.0),
            buffer,
            "the clone is gone: in place again"
        );
        assert_eq!(history.into_vec().len(), 4);
    }
}
