//! Readers on other threads, taking snapshots while one writer commits, only ever see states
//! that a prefix of the commit sequence produced.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};

use awaken_state::{Committed, StateCommand};

use crate::keys::{self, Count, Phase, Scratch, Tally};

const COMMITS: u64 = 2_000;
const READERS: usize = 2;
/// The writer pauses at these revisions until every reader has seen them, so the readers are
/// known to observe the sequence mid-way (a signal, not a sleep).
const CHECKPOINTS: [u64; 4] = [250, 750, 1_250, 1_750];
/// Yields the writer allows per checkpoint (far more than readers need to take one snapshot).
const MAX_SPINS: u64 = 100_000_000;

/// Commit `i` (1-based) adds 1 to `Count` and `Tally`, adds `i` to `Phase` and pushes `i` onto
/// `Scratch`, so the prefix of length `r` is: count = tally = r, phase = r(r+1)/2, scratch = 1..=r.
/// Every third commit goes through a transaction of two commands (still one revision).
fn commit(store: &awaken_state::StateStore, i: u64) {
    let i32 = u32::try_from(i).unwrap();
    let first = StateCommand::new()
        .with_update::<Count>(1)
        .with_update::<Scratch>(i32);
    let second = StateCommand::new()
        .with_update::<Tally>(1)
        .with_update::<Phase>(i32);
    if i.is_multiple_of(3) {
        let mut tx = store.transaction();
        tx.apply(first).unwrap();
        tx.apply(second).unwrap();
        assert_eq!(tx.commit().unwrap().revision, i);
    } else {
        let mut both = first;
        both.extend(second);
        assert_eq!(store.commit(both).unwrap().revision, i);
    }
}

fn check_prefix(snapshot: &awaken_state::Snapshot) {
    let r = snapshot.revision();
    assert_eq!(*snapshot.get::<Count>().unwrap(), r as i64, "count at {r}");
    assert_eq!(
        u64::from(*snapshot.get::<Tally>().unwrap()),
        r,
        "tally at {r}"
    );
    assert_eq!(
        u64::from(*snapshot.get::<Phase>().unwrap()),
        r * (r + 1) / 2,
        "phase at {r}"
    );
    let log = snapshot.get::<Scratch>().unwrap();
    assert_eq!(log.len() as u64, r, "log length at {r}");
    if let (Some(&first), Some(&last)) = (log.first(), log.last()) {
        assert_eq!((first, u64::from(last)), (1, r), "log ends at {r}");
    }
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

#[test]
fn readers_only_see_prefix_states() {
    let store = keys::store();
    let observed = Arc::new(Mutex::new(Vec::new()));
    let log = observed.clone();
    store.subscribe(move |c: &Committed| log.lock().unwrap().push(c.revision));
    let done = AtomicBool::new(false);
    let seen: Vec<AtomicU64> = (0..READERS).map(|_| AtomicU64::new(0)).collect();
    let start = Barrier::new(READERS + 1);
    let distinct = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..READERS)
            .map(|n| {
                let (store, done, seen, start) = (&store, &done, &seen, &start);
                scope.spawn(move || {
                    start.wait();
                    let mut last = 0;
                    let mut distinct = 0;
                    while !done.load(Ordering::Acquire) {
                        let snapshot = store.snapshot();
                        check_prefix(&snapshot);
                        assert!(snapshot.revision() >= last, "revisions went backwards");
                        if snapshot.revision() > last {
                            distinct += 1;
                            last = snapshot.revision();
                        }
                        seen[n].store(last, Ordering::Release);
                    }
                    distinct
                })
            })
            .collect();
        start.wait();
        // Stops the readers even if the writer fails, so a failure is reported, not a hang.
        let _stop = StopOnDrop(&done);
        for i in 1..=COMMITS {
            commit(&store, i);
            if CHECKPOINTS.contains(&i) {
                let mut spins = 0u64;
                // A reader that stopped (failed) can no longer catch up: go on and let the join
                // below report its panic.
                while seen
                    .iter()
                    .zip(&readers)
                    .any(|(s, r)| s.load(Ordering::Acquire) < i && !r.is_finished())
                {
                    // Bounded, so readers stuck on an old revision fail the test, not hang it.
                    spins += 1;
                    assert!(spins < MAX_SPINS, "a reader never saw revision {i}");
                    std::thread::yield_now();
                }
            }
        }
        drop(_stop);
        readers
            .into_iter()
            .map(|r| r.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (reader, count) in distinct.iter().enumerate() {
        assert!(
            *count >= CHECKPOINTS.len(),
            "reader {reader} saw only {count} revisions"
        );
    }
    check_prefix(&store.snapshot());
    assert_eq!(store.revision(), COMMITS);
    assert_eq!(*observed.lock().unwrap(), (1..=COMMITS).collect::<Vec<_>>());
}

/// One-key commits, which write in place when no snapshot is held outside the store, while
/// readers on other threads take snapshots and hold each a while: every snapshot shows the
/// count of its revision, and keeps showing it however many commits happen while it is held.
#[test]
fn one_key_commits_never_change_a_held_snapshot() {
    let store = keys::store();
    let done = AtomicBool::new(false);
    let checks = AtomicU64::new(0);
    let start = Barrier::new(READERS + 1);
    let commits = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                let (store, done, start, checks) = (&store, &done, &start, &checks);
                scope.spawn(move || {
                    start.wait();
                    while !done.load(Ordering::Acquire) {
                        let held = store.snapshot();
                        let r = held.revision();
                        assert_eq!(*held.get::<Count>().unwrap(), r as i64, "count at {r}");
                        // Commits go on meanwhile; the held state does not move.
                        for _ in 0..50 {
                            std::thread::yield_now();
                        }
                        assert_eq!(held.revision(), r);
                        assert_eq!(*held.get::<Count>().unwrap(), r as i64, "held at {r}");
                        checks.fetch_add(1, Ordering::AcqRel);
                    }
                })
            })
            .collect();
        start.wait();
        let _stop = StopOnDrop(&done);
        // At least COMMITS commits, and on until the readers have checked some snapshots held
        // across commits (bounded, so readers that never get to run fail the test).
        let mut i = 0u64;
        while i < COMMITS || checks.load(Ordering::Acquire) < 20 {
            i += 1;
            assert!(i < MAX_SPINS, "the readers checked no snapshot");
            // Commands and typed updates in turn (both in place when no snapshot is held).
            let revision = if i.is_multiple_of(2) {
                store
                    .commit(StateCommand::new().with_update::<Count>(1))
                    .unwrap()
                    .revision
            } else {
                store.update::<Count>(1).unwrap()
            };
            assert_eq!(revision, i);
        }
        drop(_stop);
        for reader in readers {
            reader.join().unwrap();
        }
        i
    });
    assert_eq!(*store.snapshot().get::<Count>().unwrap(), commits as i64);
    assert_eq!(store.revision(), commits);
}

/// A counter whose reducer checks before it changes anything: its typed updates are applied to
/// the stored value in place.
struct Ticks;
impl awaken_state::StateKey for Ticks {
    const KEY: &'static str = "it.ticks";
    type Value = u64;
    type Update = u64;
    const APPLY_IN_PLACE: bool = true;
    fn apply(value: &mut u64, add: u64) -> Result<(), awaken_state::StateError> {
        *value = value
            .checked_add(add)
            .ok_or_else(|| awaken_state::StateError::invalid_update(Self::KEY, "overflow"))?;
        Ok(())
    }
}

/// Writers of every kind on several threads at once — typed updates (applied in place, without
/// the writer lock), one-key commands (in place), publishing commands (writing the typed
/// updates' key too) and transactions — while a reader holds snapshots now and then (sending
/// writes down their copying paths): no update is lost, every write is one revision, and
/// transactions that lost a race fail whole.
#[test]
fn concurrent_writers_of_every_kind_lose_no_update() {
    const EACH: u64 = 2_000;
    let mut registry = keys::registry();
    registry
        .register_key::<Ticks>(awaken_state::KeyOptions::new())
        .unwrap();
    let store = awaken_state::StateStore::new(registry);
    let done = AtomicBool::new(false);
    let lost_races = AtomicU64::new(0);
    let start = Barrier::new(6);
    std::thread::scope(|scope| {
        let (store, done, start, lost_races) = (&store, &done, &start, &lost_races);
        let reader = scope.spawn(move || {
            start.wait();
            while !done.load(Ordering::Acquire) {
                let held = store.snapshot();
                let count = *held.get::<Count>().unwrap();
                std::thread::yield_now();
                assert_eq!(
                    *held.get::<Count>().unwrap(),
                    count,
                    "a held snapshot moved"
                );
            }
        });
        let writers: Vec<_> = (0..4u64)
            .map(|kind| {
                scope.spawn(move || {
                    start.wait();
                    for _ in 0..EACH {
                        match kind {
                            0 => {
                                store.update::<Ticks>(1).unwrap();
                            }
                            1 => {
                                store
                                    .commit(StateCommand::new().with_update::<Count>(1))
                                    .unwrap();
                            }
                            2 => {
                                store
                                    .commit(
                                        StateCommand::new()
                                            .with_update::<Count>(1)
                                            .with_update::<Tally>(1)
                                            .with_update::<Ticks>(1),
                                    )
                                    .unwrap();
                            }
                            _ => loop {
                                let mut tx = store.transaction();
                                tx.apply(StateCommand::new().with_update::<Count>(1))
                                    .unwrap();
                                if tx.commit().is_ok() {
                                    break;
                                }
                                lost_races.fetch_add(1, Ordering::Relaxed);
                            },
                        }
                    }
                })
            })
            .collect();
        start.wait();
        let _stop = StopOnDrop(done);
        for writer in writers {
            writer.join().unwrap();
        }
        drop(_stop);
        reader.join().unwrap();
    });
    let snapshot = store.snapshot();
    assert_eq!(*snapshot.get::<Count>().unwrap(), 3 * EACH as i64);
    assert_eq!(u64::from(*snapshot.get::<Tally>().unwrap()), EACH);
    assert_eq!(*snapshot.get::<Ticks>().unwrap(), 2 * EACH);
    assert_eq!(snapshot.revision(), 4 * EACH);
    assert_eq!(store.revision(), 4 * EACH);
}
