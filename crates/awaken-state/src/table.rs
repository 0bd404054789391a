//! The persistent table behind snapshots: a radix tree of fan-out 4 over key indexes.
//!
//! A commit copies only the nodes on the path to each changed key (`Arc::make_mut` for branches;
//! leaves by hand, so that the slots it writes are not cloned into the copy only to be
//! replaced), so its cost grows with the depth (log4 of the key count), not with the number of
//! keys. Every node records
//! the highest revision that changed anything below it, so delta export skips unchanged subtrees.
//!
//! Why fan-out 4: copying a node costs one atomic increment per occupied child (and freeing the
//! old one a decrement each), which dominates a commit. Measured on the 2-core bench machine
//! (`state/commit_1_of_{64,4096}_live_snapshot`), fan-out 4 beat fan-out 8 (a two-level 8×8
//! table at 64 keys) by about 10%: ~0.52 µs vs ~0.58 µs at 64 keys, ~0.82 µs vs ~0.93 µs at 4,096.

use std::sync::Arc;

use crate::key::AnyValue;

const BITS: usize = 2;
const WIDTH: usize = 1 << BITS;
const MASK: usize = WIDTH - 1;

/// A slot's value as [`Table::write_each`] hands it to a write.
pub(crate) enum SlotValue<'a> {
    /// Held by this table alone (its leaf is private): change it in place if no other version
    /// shares the value itself, or return a new one.
    Private(&'a mut Arc<AnyValue>),
    /// Held by a leaf other versions share: read only; return the new value.
    Shared(&'a Arc<AnyValue>),
}

#[derive(Clone)]
pub(crate) struct Slot {
    pub(crate) value: Arc<AnyValue>,
    /// Revision of the last commit that wrote this slot (0: never written).
    pub(crate) changed_at: u64,
}

#[derive(Clone)]
enum Node {
    Leaf {
        max_rev: u64,
        slots: [Option<Slot>; WIDTH],
    },
    Branch {
        max_rev: u64,
        children: [Option<Arc<Node>>; WIDTH],
    },
}

#[derive(Clone)]
pub(crate) struct Table {
    root: Arc<Node>,
    depth: usize,
    len: usize,
}

impl Table {
    /// A table holding `values` at indexes `0..len`, none changed yet.
    pub(crate) fn build(values: &[Arc<AnyValue>]) -> Table {
        let mut depth = 1;
        while WIDTH.pow(depth as u32) < values.len() {
            depth += 1;
        }
        Table {
            root: Arc::new(build_node(values, 0, depth - 1)),
            depth,
            len: values.len(),
        }
    }

    pub(crate) fn get(&self, index: usize) -> Option<&Slot> {
        if index >= self.len {
            return None;
        }
        let mut node = &*self.root;
        let mut shift = BITS * (self.depth - 1);
        loop {
            match node {
                Node::Branch { children, .. } => {
                    node = children[(index >> shift) & MASK].as_deref()?;
                    shift -= BITS;
                }
                Node::Leaf { slots, .. } => return slots[index & MASK].as_ref(),
            }
        }
    }

    /// The slot at `index`, with every node on its path made unique (copied if shared) and
    /// marked as changed at `rev`.
    pub(crate) fn slot_mut(&mut self, index: usize, rev: u64) -> Option<&mut Slot> {
        self.leaf_mut(index, rev)?[index & MASK].as_mut()
    }

    /// Writes the slots of `items`, in order. `write(item, value)` gets the value of the slot at
    /// `index(&item)` (`None` past the end) and returns its new value, or `None` if it changed
    /// a private value in place or left it as it was. Slots given a new value, and every slot of
    /// a private leaf handed to `write`, are marked changed at `rev`.
    ///
    /// Consecutive items in one leaf are one run, written with one walk from the root. A leaf
    /// shared with other versions is copied once per run, its written slots read from the old
    /// leaf rather than cloned into the copy and then replaced: each `Arc` count change or
    /// `Arc::make_mut` costs an atomic operation, and these are most of a commit's cost. Stops
    /// at the first `Err` of `write`, leaving the table half-written.
    pub(crate) fn write_each<T, E>(
        &mut self,
        rev: u64,
        items: impl IntoIterator<Item = T>,
        index: impl Fn(&T) -> usize,
        mut write: impl FnMut(T, Option<SlotValue<'_>>) -> Result<Option<Arc<AnyValue>>, E>,
    ) -> Result<(), E> {
        let mut items = items.into_iter().peekable();
        while let Some(first) = items.next() {
            let leaf_start = index(&first) & !MASK;
            let mut run = std::iter::once(first).chain(std::iter::from_fn(|| {
                items.next_if(|item| index(item) & !MASK == leaf_start)
            }));
            let Some(leaf) = self.leaf_arc_mut(leaf_start, rev) else {
                for item in run {
                    write(item, None)?;
                }
                continue;
            };
            if Arc::strong_count(leaf) == 1
                && let Some(Node::Leaf { slots, max_rev }) = Arc::get_mut(leaf)
            {
                // This table's own leaf: write in place.
                *max_rev = (*max_rev).max(rev);
                for item in run {
                    let Some(slot) = slots[index(&item) & MASK].as_mut() else {
                        write(item, None)?;
                        continue;
                    };
                    if let Some(new) = write(item, Some(SlotValue::Private(&mut slot.value)))? {
                        slot.value = new;
                    }
                    slot.changed_at = rev;
                }
                continue;
            }
            // Shared: build the copy from the written slots, then clone the others into it.
            let Node::Leaf {
                slots: old,
                max_rev,
            } = &**leaf
            else {
                unreachable!("the path ends at a leaf")
            };
            let mut slots: [Option<Slot>; WIDTH] = std::array::from_fn(|_| None);
            for item in &mut run {
                let p = index(&item) & MASK;
                let Some(old) = old[p].as_ref() else {
                    write(item, None)?;
                    continue;
                };
                match &mut slots[p] {
                    Some(slot) => {
                        if let Some(new) = write(item, Some(SlotValue::Private(&mut slot.value)))? {
                            slot.value = new;
                        }
                    }
                    empty => {
                        if let Some(value) = write(item, Some(SlotValue::Shared(&old.value)))? {
                            *empty = Some(Slot {
                                value,
                                changed_at: rev,
                            });
                        }
                    }
                }
            }
            for (slot, old) in slots.iter_mut().zip(old) {
                if slot.is_none() {
                    slot.clone_from(old);
                }
            }
            let max_rev = (*max_rev).max(rev);
            *leaf = Arc::new(Node::Leaf { max_rev, slots });
        }
        Ok(())
    }

    /// The `Arc` of the leaf holding `index`, in a branch made unique (copied if shared) and
    /// marked as changed at `rev`, like every branch on its path; the leaf itself is left as
    /// it is.
    fn leaf_arc_mut(&mut self, index: usize, rev: u64) -> Option<&mut Arc<Node>> {
        if index >= self.len {
            return None;
        }
        let mut node = &mut self.root;
        let mut shift = BITS * (self.depth - 1);
        while shift > 0 {
            let Node::Branch { children, max_rev } = Arc::make_mut(node) else {
                return None;
            };
            *max_rev = (*max_rev).max(rev);
            node = children[(index >> shift) & MASK].as_mut()?;
            shift -= BITS;
        }
        Some(node)
    }

    /// The leaf holding `index`, with every node on its path made unique and marked as changed
    /// at `rev`.
    fn leaf_mut(&mut self, index: usize, rev: u64) -> Option<&mut [Option<Slot>; WIDTH]> {
        if index >= self.len {
            return None;
        }
        let mut node = Arc::make_mut(&mut self.root);
        let mut shift = BITS * (self.depth - 1);
        loop {
            match node {
                Node::Branch { children, max_rev } => {
                    *max_rev = (*max_rev).max(rev);
                    node = Arc::make_mut(children[(index >> shift) & MASK].as_mut()?);
                    shift -= BITS;
                }
                Node::Leaf { slots, max_rev } => {
                    *max_rev = (*max_rev).max(rev);
                    return Some(slots);
                }
            }
        }
    }

    /// Calls `f(index, slot)` for every slot with `changed_at > since`, in index order, without
    /// visiting unchanged subtrees.
    pub(crate) fn for_each_changed(&self, since: u64, f: &mut dyn FnMut(usize, &Slot)) {
        visit(&self.root, 0, BITS * (self.depth - 1), since, f);
    }
}

fn build_node(values: &[Arc<AnyValue>], start: usize, level: usize) -> Node {
    if level == 0 {
        let slots = std::array::from_fn(|i| {
            values.get(start + i).map(|v| Slot {
                value: v.clone(),
                changed_at: 0,
            })
        });
        return Node::Leaf { max_rev: 0, slots };
    }
    let span = WIDTH.pow(level as u32);
    let children = std::array::from_fn(|i| {
        let child_start = start + i * span;
        (child_start < values.len()).then(|| Arc::new(build_node(values, child_start, level - 1)))
    });
    Node::Branch {
        max_rev: 0,
        children,
    }
}

fn visit(node: &Node, base: usize, shift: usize, since: u64, f: &mut dyn FnMut(usize, &Slot)) {
    match node {
        Node::Leaf { max_rev, slots } => {
            if *max_rev <= since {
                return;
            }
            for (i, slot) in slots.iter().enumerate() {
                if let Some(slot) = slot.as_ref().filter(|s| s.changed_at > since) {
                    f(base + i, slot);
                }
            }
        }
        Node::Branch { max_rev, children } => {
            if *max_rev <= since {
                return;
            }
            for (i, child) in children.iter().enumerate() {
                if let Some(child) = child {
                    visit(
                        child,
                        base + (i << shift),
                        shift.saturating_sub(BITS),
                        since,
                        f,
                    );
                }
            }
        }
    }
}
