//! Model pools: one executor over several members, one member chosen per routing key by
//! weighted rendezvous hashing, failing over to the next member on errors another member may
//! not have, each member behind a circuit breaker.

mod breaker;
mod rendezvous;
#[cfg(test)]
mod tests;

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use futures_util::StreamExt;
use futures_util::stream;
use tracing::Instrument;

use crate::error::InferenceExecutionError;
use crate::event::{LlmEventStream, LlmStreamEvent};
use crate::executor::LlmExecutor;
use crate::request::InferenceRequest;
pub use crate::route::{FailedOver, FailoverReason, PoolRoute};

use breaker::{Admission, Breaker, Outcome, Transition};
pub use breaker::{
    BreakerPolicy, BreakerState, DEFAULT_COOL_DOWN, DEFAULT_FAILURES_TO_OPEN, PoolClock,
    SystemClock,
};
use rendezvous::KeyHash;

/// The routing key used for a request without one: all such requests rank the members alike
/// (and so go to the same member while it is healthy).
pub const DEFAULT_ROUTING_KEY: &str = "awaken:no-routing-key";

/// One executor of a [`ModelPool`].
#[derive(Clone)]
pub struct PoolMember {
    id: Arc<str>,
    executor: Arc<dyn LlmExecutor>,
    upstream_model: Arc<str>,
    weight: u32,
    fallback_only: bool,
}

impl fmt::Debug for PoolMember {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolMember")
            .field("id", &self.id)
            .field("executor", &self.executor.name())
            .field("upstream_model", &self.upstream_model)
            .field("weight", &self.weight)
            .field("fallback_only", &self.fallback_only)
            .finish()
    }
}

impl PoolMember {
    /// A member `id` (usually the model id) that sends its requests to `executor` under
    /// `upstream_model`; weight 1, taking traffic first (not fallback-only).
    pub fn new(
        id: impl Into<Arc<str>>,
        executor: Arc<dyn LlmExecutor>,
        upstream_model: impl Into<Arc<str>>,
    ) -> Self {
        Self {
            id: id.into(),
            executor,
            upstream_model: upstream_model.into(),
            weight: 1,
            fallback_only: false,
        }
    }

    /// Sets the weight (at least 1): the member's share of routing keys is its weight over
    /// the sum of the weights of the members that take traffic first.
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// Makes the member fallback-only: it is tried only after every other member, in the
    /// order the fallback-only members were declared.
    pub fn fallback_only(mut self) -> Self {
        self.fallback_only = true;
        self
    }

    /// The member's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The member's executor.
    pub fn executor(&self) -> &Arc<dyn LlmExecutor> {
        &self.executor
    }

    /// The model name the member's requests carry.
    pub fn upstream_model(&self) -> &str {
        &self.upstream_model
    }

    /// The member's weight.
    pub fn weight(&self) -> u32 {
        self.weight
    }

    /// Whether the member is tried only after the others.
    pub fn is_fallback_only(&self) -> bool {
        self.fallback_only
    }

    /// `request` as this member sends it: its `upstream_model`, and no `upstream_model`
    /// override (an override names a model of one provider; a pool's members may differ).
    fn request_for(&self, request: &InferenceRequest) -> InferenceRequest {
        let mut request = request.clone();
        request.upstream_model = Arc::clone(&self.upstream_model);
        request.overrides.upstream_model = None;
        request
    }
}

/// Why a [`ModelPool`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The pool's id is blank.
    #[error("a model pool's id must not be blank")]
    BlankPoolId,
    /// The pool has no members.
    #[error("model pool `{pool}` has no members")]
    NoMembers {
        /// The pool's id.
        pool: String,
    },
    /// A member's id is blank.
    #[error("model pool `{pool}`: members[{index}] has a blank id")]
    BlankMemberId {
        /// The pool's id.
        pool: String,
        /// The member's position in the list (0-based).
        index: usize,
    },
    /// Two members have the same id.
    #[error("model pool `{pool}` lists member `{member}` twice")]
    DuplicateMember {
        /// The pool's id.
        pool: String,
        /// The repeated id.
        member: String,
    },
    /// A member's `upstream_model` is blank.
    #[error("model pool `{pool}`: member `{member}` has a blank upstream_model")]
    BlankUpstreamModel {
        /// The pool's id.
        pool: String,
        /// The member's id.
        member: String,
    },
    /// A member's weight is 0.
    #[error("model pool `{pool}`: member `{member}` has weight 0 (weights start at 1)")]
    ZeroWeight {
        /// The pool's id.
        pool: String,
        /// The member's id.
        member: String,
    },
    /// Every member is fallback-only, so none takes traffic first.
    #[error(
        "model pool `{pool}`: every member is fallback-only; at least one must take traffic first"
    )]
    NoPrimaryMember {
        /// The pool's id.
        pool: String,
    },
    /// The breaker policy's `failures_to_open` is 0.
    #[error("model pool `{pool}`: the breaker's failures_to_open is 0 (it must be at least 1)")]
    ZeroFailuresToOpen {
        /// The pool's id.
        pool: String,
    },
}

/// Whether a pool tries its next member after `error` came before the first event: rate
/// limits, overload, server errors, timeouts, interrupted streams, failed connections, and the
/// member's own configuration (`Unauthorized`, `ModelNotFound`, `EndpointNotFound`), which
/// another member does not share. Errors of the request itself (`InvalidRequest`,
/// `ContextOverflow`, `ContentFiltered`), `MalformedResponse`, `Config`, `ScriptExhausted` and
/// `Cancelled` are returned at once.
pub fn is_failover_error(error: &InferenceExecutionError) -> bool {
    use InferenceExecutionError as E;
    match error {
        E::RateLimited { .. }
        | E::Overloaded { .. }
        | E::ServerError { .. }
        | E::Timeout { .. }
        | E::StreamInterrupted { .. }
        | E::Connection { .. }
        | E::Unauthorized { .. }
        | E::ModelNotFound { .. }
        | E::EndpointNotFound { .. } => true,
        E::InvalidRequest { .. }
        | E::ContextOverflow { .. }
        | E::ContentFiltered { .. }
        | E::MalformedResponse { .. }
        | E::Config { .. }
        | E::ScriptExhausted { .. }
        | E::Cancelled => false,
    }
}

/// A pool's context window: the smallest of its members' (members that declare none are left
/// out; `None` when none declares one). A request that fits it fits every member it may fail
/// over to.
pub fn pool_context_window(member_windows: impl IntoIterator<Item = Option<u64>>) -> Option<u64> {
    member_windows.into_iter().flatten().min()
}

/// An executor over several members with per-key affinity, failover and circuit breakers.
///
/// Per request, the members that take traffic first are ranked by weighted rendezvous hashing
/// of the request's `routing_key` (the thread id; [`DEFAULT_ROUTING_KEY`] when it has none),
/// and the fallback-only members follow in their declared order. The request goes to the first
/// member whose breaker lets it through, carrying the member's `upstream_model`:
///
/// - An error before the member's first event that [`is_failover_error`] accepts counts as a
///   breaker failure, and the next member is tried. Any other error is returned at once.
/// - The first event of the member that answers is preceded by one
///   [`LlmStreamEvent::Routed`] naming it; from then on the member's stream is passed through
///   unchanged, and a later error is returned as it is (a breaker failure unless it is
///   `Cancelled`).
/// - A stream that reaches `Stop` is a success and resets the member's failure count.
/// - When every member failed or was skipped, the last member's error is returned; when every
///   breaker was open and nothing was sent, an `Overloaded` error with status 503 (what a
///   gateway with no healthy backend answers) whose `retry_after` is the shortest remaining
///   cool-down.
///
/// Retrying belongs around the pool ([`crate::RetryingExecutor`] wrapping it), not around its
/// members: a member that retries delays the failover by its backoffs.
///
/// In a pool of several members, each member tried gets a `chat` span inside the caller's
/// (`otel.name` = `chat {upstream model}`, `gen_ai.provider.name` = the member executor's
/// name, `gen_ai.request.model` = its upstream model, `awaken.pool.member` = its id, and
/// `error.type` when its attempt failed): the answering member's span lasts until its stream
/// ends. Nothing is recorded when no subscriber listens.
pub struct ModelPool {
    shared: Arc<Shared>,
    clock: Arc<dyn PoolClock>,
}

struct Shared {
    id: Arc<str>,
    members: Vec<PoolMember>,
    breakers: Vec<Breaker>,
    policy: BreakerPolicy,
}

impl fmt::Debug for ModelPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelPool")
            .field("id", &self.shared.id)
            .field("members", &self.shared.members)
            .field("policy", &self.shared.policy)
            .finish_non_exhaustive()
    }
}

impl ModelPool {
    /// A pool `id` over `members` (in declared order) with a breaker per member, on the
    /// [`SystemClock`]. Fails when the id is blank, there are no members, a member id is blank
    /// or repeated, an `upstream_model` is blank, a weight is 0, every member is fallback-only,
    /// or `breaker.failures_to_open` is 0.
    pub fn new(
        id: impl Into<Arc<str>>,
        members: impl IntoIterator<Item = PoolMember>,
        breaker: BreakerPolicy,
    ) -> Result<Self, PoolError> {
        let id: Arc<str> = id.into();
        if id.trim().is_empty() {
            return Err(PoolError::BlankPoolId);
        }
        let pool = || id.to_string();
        let members: Vec<PoolMember> = members.into_iter().collect();
        if members.is_empty() {
            return Err(PoolError::NoMembers { pool: pool() });
        }
        for (index, member) in members.iter().enumerate() {
            if member.id.trim().is_empty() {
                return Err(PoolError::BlankMemberId {
                    pool: pool(),
                    index,
                });
            }
            if members[..index].iter().any(|m| m.id == member.id) {
                return Err(PoolError::DuplicateMember {
                    pool: pool(),
                    member: member.id.to_string(),
                });
            }
            if member.upstream_model.trim().is_empty() {
                return Err(PoolError::BlankUpstreamModel {
                    pool: pool(),
                    member: member.id.to_string(),
                });
            }
            if member.weight == 0 {
                return Err(PoolError::ZeroWeight {
                    pool: pool(),
                    member: member.id.to_string(),
                });
            }
        }
        if members.iter().all(|m| m.fallback_only) {
            return Err(PoolError::NoPrimaryMember { pool: pool() });
        }
        if breaker.failures_to_open == 0 {
            return Err(PoolError::ZeroFailuresToOpen { pool: pool() });
        }
        let breakers = members.iter().map(|_| Breaker::new()).collect();
        Ok(Self {
            shared: Arc::new(Shared {
                id,
                members,
                breakers,
                policy: breaker,
            }),
            clock: Arc::new(SystemClock),
        })
    }

    /// Sets the clock the breakers read (tests pass one they advance by hand).
    pub fn with_clock(mut self, clock: Arc<dyn PoolClock>) -> Self {
        self.clock = clock;
        self
    }

    /// The pool's id.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// The members, in declared order.
    pub fn members(&self) -> &[PoolMember] {
        &self.shared.members
    }

    /// The breaker policy.
    pub fn breaker_policy(&self) -> &BreakerPolicy {
        &self.shared.policy
    }

    /// The order in which a request with `routing_key` considers the members (their ids),
    /// breakers aside: the members that take traffic first by descending rendezvous score,
    /// then the fallback-only members in declared order.
    pub fn member_order(&self, routing_key: Option<&str>) -> Vec<&str> {
        self.shared
            .order(routing_key)
            .into_iter()
            .map(|i| &*self.shared.members[i].id)
            .collect()
    }

    /// The state of member `member_id`'s breaker now, or `None` when the pool has no such
    /// member.
    pub fn breaker_state(&self, member_id: &str) -> Option<BreakerState> {
        let index = self
            .shared
            .members
            .iter()
            .position(|m| &*m.id == member_id)?;
        Some(self.shared.breakers[index].state(&self.shared.policy, self.clock.now()))
    }
}

impl Shared {
    /// Member indices in the order a request with `routing_key` tries them.
    fn order(&self, routing_key: Option<&str>) -> Vec<usize> {
        let key = KeyHash::new(routing_key.unwrap_or(DEFAULT_ROUTING_KEY));
        let mut ranked: Vec<(f64, usize)> = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| !m.fallback_only)
            .map(|(i, m)| (key.score(&m.id, m.weight), i))
            .collect();
        // Highest score first; equal scores (never seen in practice) keep declared order.
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let fallbacks = self
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.fallback_only)
            .map(|(i, _)| i);
        ranked
            .into_iter()
            .map(|(_, i)| i)
            .chain(fallbacks)
            .collect()
    }

    /// The error when every breaker was open and nothing was sent.
    fn all_open(&self, retry_after: Option<Duration>) -> InferenceExecutionError {
        InferenceExecutionError::Overloaded {
            status: 503,
            retry_after,
            message: format!(
                "model pool `{}` sent no request: every member's circuit breaker is open",
                self.id
            ),
        }
    }
}

impl LlmExecutor for ModelPool {
    fn name(&self) -> &str {
        "pool"
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        let shared = Arc::clone(&self.shared);
        let clock = Arc::clone(&self.clock);
        let first = async move {
            // One member: its attempt is the whole request, already the caller's span.
            let several = shared.members.len() > 1;
            let mut failed_over = Vec::new();
            let mut last_error = None;
            let mut reopens_in: Option<Duration> = None;
            for index in shared.order(request.routing_key.as_deref()) {
                let member = &shared.members[index];
                let admission = match shared.breakers[index].admit(&shared.policy, clock.now()) {
                    Ok(admission) => admission,
                    Err(remaining) => {
                        if let Some(r) = remaining {
                            reopens_in = Some(reopens_in.map_or(r, |d| d.min(r)));
                        }
                        failed_over.push(FailedOver {
                            member: Arc::clone(&member.id),
                            reason: FailoverReason::BreakerOpen,
                        });
                        continue;
                    }
                };
                let mut ticket = Ticket {
                    shared: Arc::clone(&shared),
                    clock: Arc::clone(&clock),
                    member: index,
                    admission,
                    settled: false,
                };
                let span = if several {
                    attempt_span(member)
                } else {
                    tracing::Span::none()
                };
                let mut attempt = member.executor.execute_stream(member.request_for(&request));
                let error = match attempt.next().instrument(span.clone()).await {
                    Some(Ok(event)) => {
                        let route = PoolRoute {
                            pool: Arc::clone(&shared.id),
                            member: Arc::clone(&member.id),
                            upstream_model: Arc::clone(&member.upstream_model),
                            failed_over,
                        };
                        return RoutedStream {
                            routed: Some(LlmStreamEvent::Routed(Box::new(route))),
                            first: Some(event),
                            rest: attempt,
                            ticket,
                            done: false,
                            span,
                        }
                        .boxed();
                    }
                    Some(Err(error)) => error,
                    None => InferenceExecutionError::interrupted(format!(
                        "pool member `{}` ended its stream before any event",
                        member.id
                    )),
                };
                drop(attempt);
                span.record("error.type", attempt_error_type(&error));
                drop(span);
                if !is_failover_error(&error) {
                    // The request's own fault or a cancellation: the member is not to blame,
                    // and another member would answer the same.
                    ticket.settle(Outcome::Neutral);
                    return stream::once(async move { Err(error) }).boxed();
                }
                ticket.settle(Outcome::Failure);
                tracing::warn!(
                    pool = %shared.id,
                    member = %member.id,
                    error = %error,
                    "model pool member failed; trying the next"
                );
                failed_over.push(FailedOver {
                    member: Arc::clone(&member.id),
                    reason: FailoverReason::Error {
                        class: error.class(),
                        message: error.to_string(),
                    },
                });
                last_error = Some(error);
            }
            let error = last_error.unwrap_or_else(|| shared.all_open(reopens_in));
            stream::once(async move { Err(error) }).boxed()
        };
        stream::once(first).flatten().boxed()
    }
}

/// The span of one member's attempt (see [`ModelPool`]).
fn attempt_span(member: &PoolMember) -> tracing::Span {
    let model = &*member.upstream_model;
    tracing::info_span!(
        "chat",
        otel.name = %format_args!("chat {model}"),
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = member.executor.name(),
        gen_ai.request.model = model,
        awaken.pool.member = &*member.id,
        error.type = tracing::field::Empty,
    )
}

/// The `error.type` of a failed attempt: the kind of error, in snake case.
fn attempt_error_type(error: &InferenceExecutionError) -> &'static str {
    use InferenceExecutionError as E;
    match error {
        E::RateLimited { .. } => "rate_limited",
        E::Overloaded { .. } => "overloaded",
        E::Timeout { .. } => "timeout",
        E::StreamInterrupted { .. } => "stream_interrupted",
        E::ServerError { .. } => "server_error",
        E::Connection { .. } => "connection",
        E::InvalidRequest { .. } => "invalid_request",
        E::Unauthorized { .. } => "unauthorized",
        E::ModelNotFound { .. } => "model_not_found",
        E::EndpointNotFound { .. } => "endpoint_not_found",
        E::ContextOverflow { .. } => "context_overflow",
        E::ContentFiltered { .. } => "content_filtered",
        E::MalformedResponse { .. } => "malformed_response",
        E::ScriptExhausted { .. } => "script_exhausted",
        E::Config { .. } => "config",
        E::Cancelled => "cancelled",
    }
}

/// An attempt let through a member's breaker; it records its outcome once, and a dropped
/// attempt that recorded nothing counts as neutral (so a trial never stays in flight).
struct Ticket {
    shared: Arc<Shared>,
    clock: Arc<dyn PoolClock>,
    member: usize,
    admission: Admission,
    settled: bool,
}

impl Ticket {
    fn settle(&mut self, outcome: Outcome) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        let shared = &self.shared;
        let transition = shared.breakers[self.member].record(
            self.admission,
            outcome,
            &shared.policy,
            self.clock.now(),
        );
        let member = &shared.members[self.member].id;
        let cool_down_ms = u64::try_from(shared.policy.cool_down.as_millis()).unwrap_or(u64::MAX);
        match transition {
            Transition::None => {}
            Transition::Opened => tracing::warn!(
                pool = %shared.id,
                member = %member,
                failures = shared.policy.failures_to_open,
                cool_down_ms,
                "circuit breaker opened"
            ),
            Transition::Reopened => tracing::warn!(
                pool = %shared.id,
                member = %member,
                cool_down_ms,
                "circuit breaker reopened: the trial request failed"
            ),
            Transition::Closed => tracing::info!(
                pool = %shared.id,
                member = %member,
                "circuit breaker closed: the trial request succeeded"
            ),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.settle(Outcome::Neutral);
    }
}

/// The answering member's stream behind its `Routed` event, settling the breaker when the
/// stream stops, fails or ends.
struct RoutedStream {
    routed: Option<LlmStreamEvent>,
    first: Option<LlmStreamEvent>,
    rest: LlmEventStream,
    ticket: Ticket,
    done: bool,
    /// The member's attempt span: entered while its stream is polled, closed with it.
    span: tracing::Span,
}

impl Stream for RoutedStream {
    type Item = Result<LlmStreamEvent, InferenceExecutionError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(routed) = this.routed.take() {
            return Poll::Ready(Some(Ok(routed)));
        }
        if this.done {
            return Poll::Ready(None);
        }
        let item = match this.first.take() {
            Some(event) => Some(Ok(event)),
            None => match this.span.in_scope(|| this.rest.as_mut().poll_next(cx)) {
                Poll::Ready(item) => item,
                Poll::Pending => return Poll::Pending,
            },
        };
        match &item {
            Some(Ok(LlmStreamEvent::Stop(_))) => this.ticket.settle(Outcome::Success),
            Some(Ok(_)) => {}
            Some(Err(error)) if error.is_cancelled() => this.ticket.settle(Outcome::Neutral),
            Some(Err(error)) => {
                this.span.record("error.type", attempt_error_type(error));
                this.ticket.settle(Outcome::Failure);
            }
            None => {
                this.done = true;
                // Ended without a stop: interrupted (a no-op when it did stop).
                this.ticket.settle(Outcome::Failure);
            }
        }
        Poll::Ready(item)
    }
}
