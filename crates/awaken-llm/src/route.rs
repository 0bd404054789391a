//! What a routing executor (a model pool) reports about the member that answered; apart from
//! the pool so the stream's event type can carry it without depending on the pool.

use std::sync::Arc;

use crate::error::ErrorClass;

/// Which member of a pool answered: the payload of [`LlmStreamEvent::Routed`](crate::LlmStreamEvent::Routed).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolRoute {
    /// The pool's id.
    pub pool: Arc<str>,
    /// The member that answered.
    pub member: Arc<str>,
    /// The model name the member was asked for.
    pub upstream_model: Arc<str>,
    /// The members passed over before it, in the order they were considered.
    pub failed_over: Vec<FailedOver>,
}

/// A member a request passed over.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedOver {
    /// The member's id.
    pub member: Arc<str>,
    /// Why it was passed over.
    pub reason: FailoverReason,
}

/// Why a request passed a member over.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum FailoverReason {
    /// Its circuit breaker was open (or half-open with its trial under way): nothing was sent.
    BreakerOpen,
    /// It failed with a failover error before its first event.
    Error {
        /// The error's class.
        class: ErrorClass,
        /// The error's message.
        message: String,
    },
}
