//! How deep a JSON text nests, counted without parsing it: the stores refuse to write or read
//! text nested deeper than they can read back without exhausting the stack.

/// Whether JSON `text` nests arrays and objects no deeper than `limit` (brackets inside
/// strings do not count).
pub(crate) fn nests_within(text: &str, limit: usize) -> bool {
    // No more opening brackets in all than the limit (the common case, counted without
    // following strings): it nests no deeper.
    if text.bytes().filter(|b| matches!(b, b'[' | b'{')).count() <= limit {
        return true;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in text.as_bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    true
}
