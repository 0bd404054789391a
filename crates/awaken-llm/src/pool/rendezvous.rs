//! Weighted rendezvous (highest-random-weight) hashing: a ranking of members per routing key
//! that is the same in every process and every release.
//!
//! The hash of (key, member) is FNV-1a (64-bit) over the key's bytes, a `0xFF` separator (a
//! byte no UTF-8 string contains, so no two pairs give the same input) and the member id's
//! bytes, finished with MurmurHash3's 64-bit finalizer (`fmix64`) so that every output bit
//! depends on every input bit. Its top 52 bits give `u` in (0, 1), and the member's score is
//! `-weight / ln(u)`: the member with the highest score serves the key, and each member wins a
//! share of keys proportional to its weight.

pub(super) const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
const SEPARATOR: u8 = 0xFF;

/// The hash state after a routing key and the separator; each member continues from it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyHash(u64);

impl KeyHash {
    /// Hashes `key` and the separator.
    pub(crate) fn new(key: &str) -> Self {
        Self(fnv1a(fnv1a(FNV_OFFSET_BASIS, key.as_bytes()), &[SEPARATOR]))
    }

    /// The 64-bit hash of (key, `member_id`).
    pub(crate) fn member_hash(self, member_id: &str) -> u64 {
        fmix64(fnv1a(self.0, member_id.as_bytes()))
    }

    /// The member's rendezvous score for this key; higher wins.
    pub(crate) fn score(self, member_id: &str, weight: u32) -> f64 {
        score(self.member_hash(member_id), weight)
    }
}

/// `-weight / ln(u)` with `u` taken from the hash's top 52 bits, centred in their interval:
/// `u` lies in [2⁻⁵³, 1 − 2⁻⁵³], so `ln(u)` is negative and finite, and so is the score.
pub(crate) fn score(hash: u64, weight: u32) -> f64 {
    let u = ((hash >> 12) as f64 + 0.5) / (1u64 << 52) as f64;
    -f64::from(weight) / u.ln()
}

/// FNV-1a (64-bit) continued from `state` over `bytes`.
pub(super) fn fnv1a(mut state: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        state ^= u64::from(b);
        state = state.wrapping_mul(FNV_PRIME);
    }
    state
}

/// MurmurHash3's 64-bit finalizer.
pub(super) fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}
