//! Serde helper for shared JSON values (`Arc<Value>` fields).
//!
//! Serde's own `Arc<T>` deserializes into a `Box<T>` first and then moves it into a new `Arc`:
//! two allocations per value. Reading the value and wrapping it once is one.

use std::sync::Arc;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// Deserializes an `Arc<Value>` with one allocation for the `Arc`.
pub(crate) fn arc_value<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<Value>, D::Error> {
    Value::deserialize(d).map(Arc::new)
}
