//! Where run ids and times come from: the [`IdSource`] a runtime is built with, the system's
//! and a deterministic one for tests.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

use awaken_event::RunId;
use awaken_store::Timestamp;

/// Where run ids and times come from; tests make both deterministic.
pub trait IdSource: Send + Sync {
    /// A new, unique run id.
    fn next_run_id(&self) -> RunId;
    /// Milliseconds since the Unix epoch (or any monotonic origin the caller chooses).
    fn now_ms(&self) -> u64;

    /// [`now_ms`](Self::now_ms) as a store timestamp.
    fn timestamp(&self) -> Timestamp {
        Timestamp::from_unix_millis(i64::try_from(self.now_ms()).unwrap_or(i64::MAX))
    }
}

/// Run ids `run-1`, `run-2`, ... and a clock that advances 1 ms per reading.
#[derive(Debug, Default)]
pub struct SequentialIds {
    runs: AtomicU64,
    clock: AtomicU64,
}

impl IdSource for SequentialIds {
    fn next_run_id(&self) -> RunId {
        let n = self.runs.fetch_add(1, Ordering::Relaxed) + 1;
        RunId::new(format!("run-{n}"))
            .unwrap_or_else(|e| unreachable!("generated ids are valid: {e}"))
    }
    fn now_ms(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }
}

/// Run ids from the wall clock and a counter; the system clock.
///
/// The counter starts at a random value, so runtimes in different processes (or two in one)
/// that make an id in the same microsecond still make different ones.
#[derive(Debug)]
pub struct SystemIds {
    counter: AtomicU64,
}

impl Default for SystemIds {
    fn default() -> Self {
        Self {
            counter: AtomicU64::new(random_bits() & COUNTER_START_MASK),
        }
    }
}

/// The counter starts below 2^35: seven base-32 digits, so an id fits in 24 bytes.
const COUNTER_START_MASK: u64 = (1 << 35) - 1;

/// A worker identity for a process named `name`: `name-<pid>-<8 random hex digits>` (pids
/// repeat across machines and containers; two workers must never share an identity).
pub fn process_worker_id(name: &str) -> String {
    let pid = std::process::id();
    format!("{name}-{pid}-{:08x}", random_bits() as u32)
}

/// Bits that differ between processes and between calls in one: the standard library seeds
/// `RandomState` from the operating system's randomness.
fn random_bits() -> u64 {
    RandomState::new().hash_one((std::process::id(), micros_now()))
}

fn micros_now() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

impl IdSource for SystemIds {
    fn next_run_id(&self) -> RunId {
        let micros = micros_now();
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        // `run-{micros}-{n}` in base 32, written on the stack rather than grown by `format!`:
        // base 32 keeps the id short, and every finished run the store keeps holds it.
        let mut id = [0u8; 4 + 26 + 1 + 32];
        id[..4].copy_from_slice(b"run-");
        let mut len = 4;
        len += push_digits(&mut id[len..], micros, BASE32);
        id[len] = b'-';
        len += 1;
        len += push_digits(&mut id[len..], u128::from(n), BASE32);
        let id = std::str::from_utf8(&id[..len])
            .unwrap_or_else(|e| unreachable!("the digits are ASCII: {e}"));
        RunId::new(id).unwrap_or_else(|e| unreachable!("generated ids are valid: {e}"))
    }
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// Crockford's base-32 digits, lowercase (no `i`, `l`, `o`, `u`): ids stay ordered by time.
const BASE32: &[u8] = b"0123456789abcdefghjkmnpqrstvwxyz";

/// Writes `n` in `digits` (16 or 32 of them: a digit is 4 or 5 bits) at the start of `out`,
/// the most significant first (in lowercase hex digits, as `{n:x}` formats it); returns the
/// digits' count. `out` has room for 32.
fn push_digits(out: &mut [u8], n: u128, digits: &[u8]) -> usize {
    let bits = digits.len().trailing_zeros();
    let count = (128 - n.leading_zeros()).div_ceil(bits).max(1) as usize;
    let mask = (1u128 << bits) - 1;
    for (i, d) in out[..count].iter_mut().enumerate() {
        let digit = (n >> (bits as usize * (count - 1 - i))) & mask;
        *d = digits[digit as usize];
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &[u8] = b"0123456789abcdef";

    #[test]
    fn digits_are_written_as_formatted() {
        for n in [
            0u128,
            1,
            0xf,
            0x10,
            0xdead_beef,
            u128::from(u64::MAX),
            u128::MAX,
        ] {
            let mut out = [0u8; 32];
            let len = push_digits(&mut out, n, HEX);
            assert_eq!(
                std::str::from_utf8(&out[..len]),
                Ok(format!("{n:x}").as_str())
            );
            // Base 32: read back digit by digit.
            let len = push_digits(&mut out, n, BASE32);
            let back = out[..len].iter().fold(0u128, |v, d| {
                let digit = BASE32.iter().position(|b| b == d).expect("a base-32 digit");
                v.wrapping_shl(5) | digit as u128
            });
            assert_eq!(back, n, "{n}");
        }
    }

    fn counter_of(id: &RunId) -> u128 {
        let digits = id.as_str().rsplit('-').next().unwrap_or_default();
        digits.bytes().fold(0u128, |v, d| {
            let digit = BASE32
                .iter()
                .position(|b| *b == d)
                .expect("a base-32 digit");
            (v << 5) | digit as u128
        })
    }

    #[test]
    fn system_run_ids_are_distinct_and_shaped() {
        let ids = SystemIds::default();
        let (a, b) = (ids.next_run_id(), ids.next_run_id());
        assert_ne!(a, b);
        for id in [a.as_str(), b.as_str()] {
            let mut parts = id.splitn(3, '-');
            assert_eq!(parts.next(), Some("run"));
            let time = parts.next().unwrap_or_default();
            assert!(
                time.len() == 11 && time.bytes().all(|c| BASE32.contains(&c)),
                "{id}"
            );
            let n = parts.next().unwrap_or_default();
            assert!(
                !n.is_empty() && n.bytes().all(|c| BASE32.contains(&c)),
                "{id}"
            );
            // Short: every run the store keeps holds its id.
            assert!(id.len() <= 24, "{id}");
        }
        assert_eq!(counter_of(&b), counter_of(&a) + 1, "{a} then {b}");
    }

    #[test]
    fn two_sources_made_at_once_make_different_ids() {
        // Two processes starting together used to make the same first id: the counters
        // started at zero and the clock reads the same in both.
        let (one, two) = (SystemIds::default(), SystemIds::default());
        let (a, b) = (one.next_run_id(), two.next_run_id());
        assert_ne!(counter_of(&a), counter_of(&b), "{a} and {b}");
    }
}
