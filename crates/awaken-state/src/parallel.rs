//! [`ParallelBatch`]: the greedy merge of commands computed in parallel from one snapshot.

use crate::command::{StateCommand, UNRESOLVED};
use crate::key::{KeyRegistry, MergeStrategy};

/// Merges commands computed in parallel from one snapshot, as the phase engine's GATHER does.
///
/// Commands are [offered](Self::offer) in order. One joins the batch unless one of its
/// `Exclusive` keys (unregistered names count as exclusive) is already written by a command in
/// the batch; a key written twice by one command is not a conflict, and `Commutative` keys never
/// conflict. When every command joins, the batch is their [`StateCommand::concat`], the same as
/// repeated [`StateCommand::merge_parallel`].
///
/// Each offer looks every key of the command up once (by key type for typed updates, else by
/// name), and the command remembers what it found, so committing the batch does not look the
/// keys up again. Up to 256 registered keys, the batch allocates nothing but the merged
/// command's update list.
pub struct ParallelBatch<'r> {
    registry: &'r KeyRegistry,
    command: StateCommand,
    /// The `Exclusive` keys the batch writes, by registry index.
    written: SlotSet,
    /// Unregistered names the batch writes (a commit rejects them; until then they conflict
    /// like exclusive keys).
    unregistered: Vec<String>,
}

impl<'r> ParallelBatch<'r> {
    /// An empty batch over the keys of `registry`.
    pub fn new(registry: &'r KeyRegistry) -> Self {
        Self::with_capacity(registry, 0)
    }

    /// An empty batch with room for `updates` key updates in the merged command (e.g. one per
    /// hook).
    pub fn with_capacity(registry: &'r KeyRegistry, updates: usize) -> Self {
        let mut command = StateCommand::new();
        command.updates.reserve(updates);
        ParallelBatch {
            registry,
            command,
            written: SlotSet::new(registry.len()),
            unregistered: Vec::new(),
        }
    }

    /// Adds `command` after the commands already in the batch and returns `true`, unless it
    /// writes an `Exclusive` key that the batch already writes: then the batch is unchanged,
    /// `command` is dropped and the result is `false`.
    pub fn offer(&mut self, mut command: StateCommand) -> bool {
        let registry = self.registry;
        let mut overlaps = false;
        for update in command.updates.as_mut_slice() {
            update.slot = update.locate(registry).unwrap_or(UNRESOLVED);
            overlaps |= match exclusive(registry, update.slot) {
                Some(true) => self.written.contains(update.slot),
                Some(false) => false,
                None => self.unregistered.iter().any(|k| **k == *update.key),
            };
        }
        if overlaps {
            return false;
        }
        for update in command.updates() {
            match exclusive(registry, update.slot) {
                Some(true) => self.written.insert(update.slot),
                Some(false) => {}
                None => self.unregistered.push(update.key().to_owned()),
            }
        }
        self.command.extend(command);
        true
    }

    /// The merged command so far.
    pub fn command(&self) -> &StateCommand {
        &self.command
    }

    /// The merged command.
    pub fn into_command(self) -> StateCommand {
        self.command
    }
}

/// Whether the key at `slot` is exclusive; `None` if no key is registered there.
fn exclusive(registry: &KeyRegistry, slot: usize) -> Option<bool> {
    registry
        .entries()
        .get(slot)
        .map(|e| e.options.merge == MergeStrategy::Exclusive)
}

/// A set of key indexes below a registry's length; no allocation for up to 256 keys.
struct SlotSet {
    inline: [u64; 4],
    heap: Vec<u64>,
}

impl SlotSet {
    fn new(len: usize) -> Self {
        let words = len.div_ceil(64);
        SlotSet {
            inline: [0; 4],
            heap: if words > 4 {
                vec![0; words]
            } else {
                Vec::new()
            },
        }
    }

    fn words(&mut self) -> &mut [u64] {
        if self.heap.is_empty() {
            &mut self.inline
        } else {
            &mut self.heap
        }
    }

    fn contains(&mut self, slot: usize) -> bool {
        self.words()[slot / 64] & (1 << (slot % 64)) != 0
    }

    fn insert(&mut self, slot: usize) {
        self.words()[slot / 64] |= 1 << (slot % 64);
    }
}
