//! The persistent table behind snapshots: a radix tree of fan-out 4 over key indexes.
//!
//! A commit copies only the nodes on the paths to the changed keys (each once, building what it
//! writes into the copy rather than cloning it in to replace it), so its cost grows with the
//! depth (log4 of the key count), not with the number of keys. Every node records
//! the highest revision that changed anything below it, so delta export skips unchanged subtrees.
//!
//! Why fan-out 4: copying a node costs one atomic increment per occupied child (and freeing the
//! old one a decrement each), which dominates a commit, so narrow nodes commit faster than a
//! wider, shallower table (`state/commit_1_of_{64,4096}_live_snapshot`; the figures are in
//! ADR 0001 and `docs/performance.md`).

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
    /// a private leaf handed to `write`, are marked changed at `rev`. Stops at the first `Err`
    /// of `write`, leaving the table half-written.
    ///
    /// Each `Arc` count change, `Arc::make_mut` or `Arc::get_mut` costs an atomic operation,
    /// and these are most of a commit's cost, so the tree is walked once per ascending run of
    /// indexes (one walk in all when keys are written in registration order), and a node other
    /// versions share is copied from the old one: the children and slots the run writes are
    /// built into the copy, only the others are cloned into it (rather than cloning them all
    /// and dropping the written ones again).
    pub(crate) fn write_each<T, E>(
        &mut self,
        rev: u64,
        items: impl IntoIterator<Item = T>,
        index: impl Fn(&T) -> usize,
        write: impl FnMut(T, Option<SlotValue<'_>>) -> Result<Option<Arc<AnyValue>>, E>,
    ) -> Result<(), E> {
        let mut writes = Writes {
            rev,
            items: items.into_iter().peekable(),
            index,
            write,
        };
        let shift = BITS * (self.depth - 1);
        let span = WIDTH.pow(self.depth as u32);
        while let Some(i) = writes.peek() {
            if i >= span {
                writes.skip(span, usize::MAX)?;
            } else {
                writes.node(&mut self.root, shift, 0)?;
            }
        }
        Ok(())
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
    pub(crate) fn for_each_changed<'t>(&'t self, since: u64, f: &mut dyn FnMut(usize, &'t Slot)) {
        visit(&self.root, 0, BITS * (self.depth - 1), since, f);
    }
}

/// The state of one [`Table::write_each`]: the items left, and what to do with each.
struct Writes<I: Iterator, X, W> {
    rev: u64,
    items: std::iter::Peekable<I>,
    index: X,
    write: W,
}

impl<T, E, I, X, W> Writes<I, X, W>
where
    I: Iterator<Item = T>,
    X: Fn(&T) -> usize,
    W: FnMut(T, Option<SlotValue<'_>>) -> Result<Option<Arc<AnyValue>>, E>,
{
    /// The index of the next item.
    fn peek(&mut self) -> Option<usize> {
        let index = &self.index;
        self.items.peek().map(index)
    }

    /// The next item, if its index is in `start..end`.
    fn next_in(&mut self, start: usize, end: usize) -> Option<(usize, T)> {
        let index = &self.index;
        let item = self
            .items
            .next_if(|item| (start..end).contains(&index(item)))?;
        Some((index(&item), item))
    }

    /// Hands the next items in `start..end` to `write` as slots that do not exist.
    fn skip(&mut self, start: usize, end: usize) -> Result<(), E> {
        while let Some((_, item)) = self.next_in(start, end) {
            (self.write)(item, None)?;
        }
        Ok(())
    }

    /// Writes the ascending run of next items in the span of `node` (which starts at `base`;
    /// `shift` is its level's): in place if the table owns it alone, else into a copy.
    fn node(&mut self, node: &mut Arc<Node>, shift: usize, base: usize) -> Result<(), E> {
        // The count, a plain load, spares a shared node `get_mut`'s atomic exchange.
        if Arc::strong_count(node) == 1
            && let Some(own) = Arc::get_mut(node)
        {
            return self.in_place(own, shift, base);
        }
        let copy = self.copy(node, shift, base)?;
        *node = Arc::new(copy);
        Ok(())
    }

    fn in_place(&mut self, node: &mut Node, shift: usize, base: usize) -> Result<(), E> {
        match node {
            Node::Leaf { slots, max_rev } => {
                *max_rev = (*max_rev).max(self.rev);
                while let Some((i, item)) = self.next_in(base, base + WIDTH) {
                    let Some(slot) = slots[i - base].as_mut() else {
                        (self.write)(item, None)?;
                        continue;
                    };
                    let value = SlotValue::Private(&mut slot.value);
                    if let Some(new) = (self.write)(item, Some(value))? {
                        slot.value = new;
                    }
                    slot.changed_at = self.rev;
                }
            }
            Node::Branch { children, max_rev } => {
                *max_rev = (*max_rev).max(self.rev);
                let mut from = 0;
                while let Some(c) = self.child_of_next(shift, base, from) {
                    let child_base = base + (c << shift);
                    match children[c].as_mut() {
                        Some(child) => self.node(child, shift - BITS, child_base)?,
                        None => self.skip(child_base, child_base + (1 << shift))?,
                    }
                    from = c + 1;
                }
            }
        }
        Ok(())
    }

    /// A copy of `old` (which other versions share) with the run's writes in it.
    fn copy(&mut self, old: &Node, shift: usize, base: usize) -> Result<Node, E> {
        match old {
            Node::Leaf {
                slots: old_slots,
                max_rev,
            } => {
                let mut slots: [Option<Slot>; WIDTH] = std::array::from_fn(|_| None);
                while let Some((i, item)) = self.next_in(base, base + WIDTH) {
                    let Some(old) = old_slots[i - base].as_ref() else {
                        (self.write)(item, None)?;
                        continue;
                    };
                    match &mut slots[i - base] {
                        Some(slot) => {
                            let value = SlotValue::Private(&mut slot.value);
                            if let Some(new) = (self.write)(item, Some(value))? {
                                slot.value = new;
                            }
                        }
                        empty => {
                            let value = SlotValue::Shared(&old.value);
                            if let Some(value) = (self.write)(item, Some(value))? {
                                *empty = Some(Slot {
                                    value,
                                    changed_at: self.rev,
                                });
                            }
                        }
                    }
                }
                fill_untouched(&mut slots, old_slots);
                Ok(Node::Leaf {
                    max_rev: (*max_rev).max(self.rev),
                    slots,
                })
            }
            Node::Branch {
                children: old_children,
                max_rev,
            } => {
                let mut children: [Option<Arc<Node>>; WIDTH] = std::array::from_fn(|_| None);
                let mut from = 0;
                while let Some(c) = self.child_of_next(shift, base, from) {
                    let child_base = base + (c << shift);
                    match old_children[c].as_deref() {
                        Some(old) => {
                            let copy = self.copy(old, shift - BITS, child_base)?;
                            children[c] = Some(Arc::new(copy));
                        }
                        None => self.skip(child_base, child_base + (1 << shift))?,
                    }
                    from = c + 1;
                }
                fill_untouched(&mut children, old_children);
                Ok(Node::Branch {
                    max_rev: (*max_rev).max(self.rev),
                    children,
                })
            }
        }
    }

    /// Which child of the branch at `base` (`from` or a later one) holds the next item, if the
    /// next item is in the branch's span and not behind `from`: a run going backwards ends
    /// there, and the next one starts again from the root.
    fn child_of_next(&mut self, shift: usize, base: usize, from: usize) -> Option<usize> {
        let i = self.peek()?;
        let c = i.checked_sub(base)? >> shift;
        (from..WIDTH).contains(&c).then_some(c)
    }
}

/// Completes a copy: what a run did not write is cloned from the old node.
fn fill_untouched<T: Clone>(copy: &mut [Option<T>; WIDTH], old: &[Option<T>; WIDTH]) {
    for (new, old) in copy.iter_mut().zip(old) {
        if new.is_none() {
            new.clone_from(old);
        }
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

fn visit<'t>(
    node: &'t Node,
    base: usize,
    shift: usize,
    since: u64,
    f: &mut dyn FnMut(usize, &'t Slot),
) {
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
