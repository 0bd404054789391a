//! ModelPool: affinity by routing key, failover, fallback-only members and circuit breakers,
//! over scripted members and a hand-advanced clock.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use awaken_llm::{
    BreakerPolicy, BreakerState, ConnectionAttempt, ConnectionFailure, DEFAULT_ROUTING_KEY,
    FailoverReason, InferenceExecutionError, InferenceRequest, LlmEventStream, LlmExecutor,
    LlmStreamEvent, ModelPool, PoolClock, PoolError, PoolMember, RetryPolicy, RetryingExecutor,
    ScriptTurn, ScriptedError, ScriptedErrorKind, ScriptedExecutor,
};
use futures_util::{FutureExt, StreamExt, stream};
use proptest::prelude::*;

use crate::{render_item, render_response, request};

/// A clock the test moves by hand.
struct TestClock {
    start: Instant,
    offset: Mutex<Duration>,
}

impl TestClock {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            offset: Mutex::new(Duration::ZERO),
        })
    }

    fn advance(&self, by: Duration) {
        *self.offset.lock().unwrap_or_else(|p| p.into_inner()) += by;
    }
}

impl PoolClock for TestClock {
    fn now(&self) -> Instant {
        self.start + *self.offset.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A member that fails every call with the same error before any event (or, without an error,
/// ends its stream at once), counting its calls.
struct Failing {
    make: Option<fn() -> InferenceExecutionError>,
    calls: AtomicUsize,
}

impl Failing {
    fn new(make: fn() -> InferenceExecutionError) -> Arc<Self> {
        Arc::new(Self {
            make: Some(make),
            calls: AtomicUsize::new(0),
        })
    }

    fn empty() -> Arc<Self> {
        Arc::new(Self {
            make: None,
            calls: AtomicUsize::new(0),
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl LlmExecutor for Failing {
    fn name(&self) -> &str {
        "failing"
    }

    fn execute_stream(&self, _request: InferenceRequest) -> LlmEventStream {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match self.make {
            Some(make) => stream::once(async move { Err(make()) }).boxed(),
            None => stream::empty().boxed(),
        }
    }
}

fn overloaded_529() -> InferenceExecutionError {
    InferenceExecutionError::Overloaded {
        status: 529,
        retry_after: None,
        message: "overloaded_error".into(),
    }
}

fn rate_limited_429() -> InferenceExecutionError {
    InferenceExecutionError::RateLimited {
        retry_after: None,
        message: "slow down".into(),
    }
}

fn scripted(turns: impl IntoIterator<Item = ScriptTurn>) -> ScriptedExecutor {
    ScriptedExecutor::from_turns(turns).expect("valid script")
}

fn texts(text: &str, n: usize) -> ScriptedExecutor {
    scripted(vec![ScriptTurn::text(text); n])
}

fn err(kind: ScriptedErrorKind) -> ScriptTurn {
    ScriptTurn::error(ScriptedError::new(kind))
}

/// A member `id` over `exec`, asking for `{id}-model`.
fn member(id: &str, exec: Arc<dyn LlmExecutor>) -> PoolMember {
    PoolMember::new(id, exec, format!("{id}-model"))
}

fn scripted_member(id: &str, exec: &ScriptedExecutor) -> PoolMember {
    member(id, Arc::new(exec.clone()))
}

fn make_pool(members: Vec<PoolMember>, breaker: BreakerPolicy) -> ModelPool {
    ModelPool::new("smart", members, breaker).expect("valid pool")
}

/// The member order of a pool of primaries `ids` (weights 1) for `key`.
fn ranked(ids: &[&str], key: &str) -> Vec<String> {
    let dummy: Arc<dyn LlmExecutor> = Failing::empty();
    let members = ids.iter().map(|id| member(id, dummy.clone())).collect();
    let probe = make_pool(members, BreakerPolicy::default());
    probe
        .member_order(Some(key))
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// One stream item as a line; a `Routed` event names the member and what was passed over.
fn render_pool_item(item: &Result<LlmStreamEvent, InferenceExecutionError>) -> String {
    let Ok(LlmStreamEvent::Routed(route)) = item else {
        return render_item(item);
    };
    let mut line = format!("routed {} model={}", route.member, route.upstream_model);
    for passed in &route.failed_over {
        let reason = match &passed.reason {
            FailoverReason::BreakerOpen => "breaker open".to_owned(),
            FailoverReason::Error { class, message } => format!("{class:?} {message}"),
            other => format!("{other:?}"),
        };
        let _ = write!(line, " | passed {}: {reason}", passed.member);
    }
    line
}

async fn render_run(exec: &dyn LlmExecutor, req: InferenceRequest) -> String {
    let mut stream = exec.execute_stream(req);
    let mut out = String::new();
    while let Some(item) = stream.next().await {
        let _ = writeln!(out, "{}", render_pool_item(&item));
    }
    out
}

fn keyed(key: &str) -> InferenceRequest {
    request("hi").with_routing_key(key)
}

/// The member a run was routed to, if it was.
async fn routed_member(exec: &dyn LlmExecutor, req: InferenceRequest) -> Option<String> {
    let first = exec.execute_stream(req).next().await;
    match first {
        Some(Ok(LlmStreamEvent::Routed(route))) => Some(route.member.to_string()),
        _ => None,
    }
}

#[tokio::test]
async fn a_thread_stays_on_its_member_while_healthy() {
    let execs: Vec<(&str, ScriptedExecutor)> = ["a", "b", "c"]
        .into_iter()
        .map(|id| (id, texts(&format!("from {id}"), 5)))
        .collect();
    let members = execs.iter().map(|(id, e)| scripted_member(id, e)).collect();
    let pool = make_pool(members, BreakerPolicy::default());
    let chosen = pool.member_order(Some("thread-7"))[0].to_owned();
    let mut req = keyed("thread-7");
    req.overrides.upstream_model = Some("renamed-by-a-step".into());
    for _ in 0..5 {
        assert_eq!(
            routed_member(&pool, req.clone()).await.as_deref(),
            Some(chosen.as_str())
        );
    }
    for (id, exec) in &execs {
        let requests = exec.requests();
        if *id == chosen {
            assert_eq!(requests.len(), 5);
            for r in requests {
                assert_eq!(&*r.upstream_model, format!("{id}-model"));
                assert_eq!(
                    r.effective_model(),
                    format!("{id}-model"),
                    "override dropped"
                );
                assert_eq!(r.routing_key.as_deref(), Some("thread-7"));
            }
        } else {
            assert!(requests.is_empty(), "{id} was called");
        }
    }
}

#[tokio::test]
async fn a_thread_maps_to_the_same_member_in_another_pool_instance() {
    let dummy: Arc<dyn LlmExecutor> = Failing::empty();
    let build = |ids: &[&str]| {
        let members = ids.iter().map(|id| member(id, dummy.clone())).collect();
        make_pool(members, BreakerPolicy::default())
    };
    // Declared in another order, with other executors: the ranking depends only on the ids,
    // the weights and the key.
    let first = build(&["a", "b", "c"]);
    let second = build(&["c", "a", "b"]);
    let mut chosen = Vec::new();
    for i in 0..60 {
        let key = format!("thread-{i}");
        let order = first.member_order(Some(&key));
        assert_eq!(order, second.member_order(Some(&key)), "{key}");
        chosen.push(order[0]);
    }
    for id in ["a", "b", "c"] {
        assert!(chosen.contains(&id), "{id} never chosen: {chosen:?}");
    }

    // And the executed requests follow the same ranking.
    let one = texts("one", 1);
    let two = texts("two", 1);
    let p1 = make_pool(
        vec![
            scripted_member("a", &one),
            scripted_member("b", &texts("", 1)),
        ],
        BreakerPolicy::default(),
    );
    let p2 = make_pool(
        vec![
            scripted_member("b", &texts("", 1)),
            scripted_member("a", &two),
        ],
        BreakerPolicy::default(),
    );
    let key = (0..)
        .map(|i| format!("thread-{i}"))
        .find(|k| p1.member_order(Some(k))[0] == "a")
        .expect("some key ranks a first");
    assert_eq!(routed_member(&p1, keyed(&key)).await.as_deref(), Some("a"));
    assert_eq!(routed_member(&p2, keyed(&key)).await.as_deref(), Some("a"));
    assert_eq!((one.requests().len(), two.requests().len()), (1, 1));
}

#[test]
fn member_choice_is_pinned_across_releases() {
    let dummy: Arc<dyn LlmExecutor> = Failing::empty();
    let pool = make_pool(
        vec![
            member("gpt-4o", dummy.clone()),
            member("claude-sonnet", dummy.clone()).with_weight(2),
            member("llama", dummy.clone()),
            member("backup", dummy).fallback_only(),
        ],
        BreakerPolicy::default(),
    );
    let mut out = String::new();
    for key in [
        "thread-0", "thread-1", "thread-2", "thread-3", "thread-4", "01J9Z3",
    ] {
        let _ = writeln!(out, "{key}: {}", pool.member_order(Some(key)).join(" "));
    }
    let _ = writeln!(out, "(none): {}", pool.member_order(None).join(" "));
    expect_test::expect![[r#"
        thread-0: claude-sonnet llama gpt-4o backup
        thread-1: gpt-4o llama claude-sonnet backup
        thread-2: gpt-4o claude-sonnet llama backup
        thread-3: claude-sonnet gpt-4o llama backup
        thread-4: claude-sonnet llama gpt-4o backup
        01J9Z3: claude-sonnet llama gpt-4o backup
        (none): claude-sonnet llama gpt-4o backup
    "#]]
    .assert_eq(&out);
}

#[tokio::test]
async fn a_request_without_a_routing_key_uses_the_default_key() {
    let execs: Vec<(&str, ScriptedExecutor)> = ["a", "b", "c", "d"]
        .into_iter()
        .map(|id| (id, texts(id, 1)))
        .collect();
    let members = execs.iter().map(|(id, e)| scripted_member(id, e)).collect();
    let pool = make_pool(members, BreakerPolicy::default());
    let order = pool.member_order(None);
    assert_eq!(order, pool.member_order(Some(DEFAULT_ROUTING_KEY)));
    assert_eq!(
        routed_member(&pool, request("hi")).await.as_deref(),
        Some(order[0])
    );
}

#[tokio::test]
async fn fails_over_on_429_then_529_then_answers_on_the_next_member() {
    let order = ranked(&["a", "b", "c"], "thread-1");
    let limited = Failing::new(rate_limited_429);
    let overloaded = Failing::new(overloaded_529);
    let healthy = texts("answer", 1);
    let execs: [Arc<dyn LlmExecutor>; 3] = [
        limited.clone(),
        overloaded.clone(),
        Arc::new(healthy.clone()),
    ];
    let members = order
        .iter()
        .zip(execs)
        .map(|(id, exec)| member(id, exec))
        .collect();
    let pool = make_pool(members, BreakerPolicy::default());
    let out = render_run(&pool, keyed("thread-1")).await;
    let expected = format!(
        "routed {2} model={2}-model \
         | passed {0}: Retryable rate limited by the provider: slow down \
         | passed {1}: Retryable provider overloaded (HTTP 529): overloaded_error\n\
         text \"answer\"\nstop EndTurn\n",
        order[0], order[1], order[2]
    );
    assert_eq!(out, expected);
    assert_eq!((limited.calls(), overloaded.calls()), (1, 1));
    let failures = |id: &str| match pool.breaker_state(id) {
        Some(BreakerState::Closed {
            consecutive_failures,
        }) => consecutive_failures,
        other => panic!("{id}: {other:?}"),
    };
    assert_eq!(
        [&order[0], &order[1], &order[2]].map(|id| failures(id)),
        [1, 1, 0]
    );
}

#[tokio::test]
async fn every_failover_error_moves_on_to_the_next_member() {
    let scripted_kinds = [
        ScriptedErrorKind::RateLimited,
        ScriptedErrorKind::Overloaded,
        ScriptedErrorKind::Timeout,
        ScriptedErrorKind::StreamInterrupted,
        ScriptedErrorKind::ServerError,
        ScriptedErrorKind::Unauthorized,
        ScriptedErrorKind::ModelNotFound,
    ];
    let mut firsts: Vec<(String, Arc<dyn LlmExecutor>)> = scripted_kinds
        .into_iter()
        .map(|kind| {
            let exec: Arc<dyn LlmExecutor> = Arc::new(scripted([err(kind)]));
            (format!("{kind:?}"), exec)
        })
        .collect();
    firsts.push(("Connection".into(), Failing::new(refused)));
    firsts.push(("EndpointNotFound".into(), Failing::new(no_endpoint)));
    firsts.push(("EmptyStream".into(), Failing::empty()));
    let mut out = String::new();
    for (label, first) in firsts {
        let fallback = texts("fallback", 1);
        let pool = make_pool(
            vec![
                member("p", first),
                scripted_member("f", &fallback).fallback_only(),
            ],
            BreakerPolicy::default(),
        );
        let run = render_run(&pool, keyed("t")).await;
        let _ = writeln!(out, "{label}: {}", run.lines().next().unwrap_or_default());
        assert_eq!(fallback.requests().len(), 1, "{label}");
    }
    expect_test::expect![[r#"
        RateLimited: routed f model=f-model | passed p: Retryable rate limited by the provider: 
        Overloaded: routed f model=f-model | passed p: Retryable provider overloaded (HTTP 503): 
        Timeout: routed f model=f-model | passed p: Retryable inference timed out after 0ns waiting for response headers
        StreamInterrupted: routed f model=f-model | passed p: Retryable the response stream was interrupted: 
        ServerError: routed f model=f-model | passed p: Retryable provider server error (HTTP 500): 
        Unauthorized: routed f model=f-model | passed p: Permanent unauthorized (HTTP 401): 
        ModelNotFound: routed f model=f-model | passed p: Permanent model "" not found: 
        Connection: routed f model=f-model | passed p: Retryable could not reach the provider at http://127.0.0.1:9/v1/chat/completions: connection refused by 127.0.0.1:9 (is the server running?)
        EndpointNotFound: routed f model=f-model | passed p: Permanent the server has no `POST http://127.0.0.1:8000/v1/chat/completions` (HTTP 404: Not Found)
        EmptyStream: routed f model=f-model | passed p: Retryable the response stream was interrupted: pool member `p` ended its stream before any event
    "#]]
    .assert_eq(&out);
}

fn refused() -> InferenceExecutionError {
    InferenceExecutionError::Connection {
        url: "http://127.0.0.1:9/v1/chat/completions".into(),
        attempt: Box::new(ConnectionAttempt::new(
            "127.0.0.1",
            9,
            ConnectionFailure::Refused,
        )),
        source: "connection refused".into(),
    }
}

fn no_endpoint() -> InferenceExecutionError {
    InferenceExecutionError::EndpointNotFound {
        url: "http://127.0.0.1:8000/v1/chat/completions".into(),
        message: "Not Found".into(),
    }
}

fn malformed() -> InferenceExecutionError {
    InferenceExecutionError::malformed("not JSON", "{oops", None)
}

fn misconfigured() -> InferenceExecutionError {
    InferenceExecutionError::Config {
        field: "base_url",
        reason: "not a URL".into(),
    }
}

#[tokio::test]
async fn the_requests_own_errors_are_never_failed_over() {
    let mut firsts: Vec<(String, Arc<dyn LlmExecutor>)> = [
        ScriptedErrorKind::InvalidRequest,
        ScriptedErrorKind::ContextOverflow,
        ScriptedErrorKind::ContentFiltered,
        ScriptedErrorKind::Cancelled,
    ]
    .into_iter()
    .map(|kind| {
        let exec: Arc<dyn LlmExecutor> = Arc::new(scripted([err(kind)]));
        (format!("{kind:?}"), exec)
    })
    .collect();
    firsts.push(("MalformedResponse".into(), Failing::new(malformed)));
    firsts.push(("Config".into(), Failing::new(misconfigured)));
    firsts.push(("ScriptExhausted".into(), Arc::new(scripted([]))));
    let mut out = String::new();
    for (label, first) in firsts {
        let other = texts("never", 1);
        let pool = make_pool(
            vec![
                member("p", first),
                scripted_member("q", &other).fallback_only(),
            ],
            BreakerPolicy::default().with_failures_to_open(1),
        );
        let run = render_run(&pool, keyed("t")).await;
        let _ = write!(out, "{label}: {run}");
        assert!(other.requests().is_empty(), "{label}: failed over");
        assert_eq!(
            pool.breaker_state("p"),
            Some(BreakerState::Closed {
                consecutive_failures: 0
            }),
            "{label}: the request's own error is not the member's failure"
        );
    }
    expect_test::expect![[r#"
        InvalidRequest: error Permanent InvalidRequest: the provider rejected the request (HTTP 400): 
        ContextOverflow: error Permanent ContextOverflow: the request exceeds the model's context window: 
        ContentFiltered: error Permanent ContentFiltered: the provider's content filter refused the request: 
        Cancelled: error Cancelled Cancelled: inference cancelled
        MalformedResponse: error Permanent MalformedResponse: malformed provider response: not JSON (in "{oops")
        Config: error Permanent Config: executor misconfigured: `base_url`: not a URL
        ScriptExhausted: error Permanent ScriptExhausted: the script has no turn left: all 0 turns were used
    "#]]
    .assert_eq(&out);
}

#[tokio::test]
async fn an_error_after_the_first_token_is_passed_through_and_counted() {
    let primary =
        scripted([ScriptTurn::deltas(["par"])
            .with_error(ScriptedError::new(ScriptedErrorKind::ServerError))]);
    let fallback = texts("fallback", 1);
    let pool = make_pool(
        vec![
            scripted_member("p", &primary),
            scripted_member("f", &fallback).fallback_only(),
        ],
        BreakerPolicy::default().with_failures_to_open(1),
    );
    let out = render_run(&pool, keyed("t")).await;
    expect_test::expect![[r#"
        routed p model=p-model
        text "par"
        error Retryable ServerError: provider server error (HTTP 500): 
    "#]]
    .assert_eq(&out);
    assert!(fallback.requests().is_empty());
    assert!(
        matches!(pool.breaker_state("p"), Some(BreakerState::Open { .. })),
        "{:?}",
        pool.breaker_state("p")
    );
    // The next request skips the open member.
    let out = render_run(&pool, keyed("t")).await;
    expect_test::expect![[r#"
        routed f model=f-model | passed p: breaker open
        text "fallback"
        stop EndTurn
    "#]]
    .assert_eq(&out);
}

#[tokio::test]
async fn fallback_only_members_come_after_the_others_in_declared_order() {
    let dummy: Arc<dyn LlmExecutor> = Failing::empty();
    let shape = make_pool(
        vec![
            member("y", dummy.clone()).fallback_only(),
            member("a", dummy.clone()).with_weight(3),
            member("x", dummy.clone()).fallback_only(),
            member("b", dummy),
        ],
        BreakerPolicy::default(),
    );
    for i in 0..100 {
        let key = format!("thread-{i}");
        let order = shape.member_order(Some(&key));
        assert_eq!(&order[2..], ["y", "x"], "{key}");
        let mut primaries = order[..2].to_vec();
        primaries.sort_unstable();
        assert_eq!(primaries, ["a", "b"], "{key}");
    }

    // Healthy primaries: the fallbacks are never called.
    let a = scripted([ScriptTurn::text("a"), err(ScriptedErrorKind::RateLimited)]);
    let y = texts("y", 2);
    let x = texts("x", 1);
    let pool = make_pool(
        vec![
            scripted_member("y", &y).fallback_only(),
            scripted_member("a", &a),
            scripted_member("x", &x).fallback_only(),
        ],
        BreakerPolicy::default(),
    );
    assert_eq!(routed_member(&pool, keyed("t")).await.as_deref(), Some("a"));
    // The primary failing: the first declared fallback answers, the second is not called.
    let out = render_run(&pool, keyed("t")).await;
    expect_test::expect![[r#"
        routed y model=y-model | passed a: Retryable rate limited by the provider: 
        text "y"
        stop EndTurn
    "#]]
    .assert_eq(&out);
    assert_eq!(
        (a.requests().len(), y.requests().len(), x.requests().len()),
        (2, 1, 0)
    );
}

/// One request per line: where it went and what it passed over (or its error), then the
/// breaker of `watched`.
async fn log_request(log: &mut String, pool: &ModelPool, label: &str, watched: &str) {
    let run = render_run(pool, keyed("t")).await;
    let first = run.lines().next().unwrap_or_default();
    let _ = writeln!(
        log,
        "{label}: {first} ; {watched} {:?}",
        pool.breaker_state(watched)
    );
}

#[tokio::test]
async fn the_breaker_opens_skips_the_member_and_half_opens_after_the_cool_down() {
    let clock = TestClock::new();
    let primary = scripted([
        err(ScriptedErrorKind::RateLimited),
        ScriptTurn::text("ok"),
        err(ScriptedErrorKind::RateLimited),
        err(ScriptedErrorKind::RateLimited),
        ScriptTurn::text("back"),
        ScriptTurn::text("again"),
    ]);
    let fallback = texts("fallback", 10);
    let pool = make_pool(
        vec![
            scripted_member("p", &primary),
            scripted_member("f", &fallback).fallback_only(),
        ],
        BreakerPolicy::default()
            .with_failures_to_open(2)
            .with_cool_down(Duration::from_secs(30)),
    )
    .with_clock(clock.clone());
    let mut log = String::new();
    log_request(&mut log, &pool, "fail", "p").await;
    log_request(&mut log, &pool, "success resets", "p").await;
    log_request(&mut log, &pool, "fail", "p").await;
    log_request(&mut log, &pool, "fail opens", "p").await;
    log_request(&mut log, &pool, "open", "p").await;
    clock.advance(Duration::from_secs(29));
    log_request(&mut log, &pool, "29 s", "p").await;
    clock.advance(Duration::from_secs(1));
    let _ = writeln!(log, "30 s: p {:?}", pool.breaker_state("p"));
    log_request(&mut log, &pool, "trial", "p").await;
    log_request(&mut log, &pool, "closed", "p").await;
    expect_test::expect![[r#"
        fail: routed f model=f-model | passed p: Retryable rate limited by the provider:  ; p Some(Closed { consecutive_failures: 1 })
        success resets: routed p model=p-model ; p Some(Closed { consecutive_failures: 0 })
        fail: routed f model=f-model | passed p: Retryable rate limited by the provider:  ; p Some(Closed { consecutive_failures: 1 })
        fail opens: routed f model=f-model | passed p: Retryable rate limited by the provider:  ; p Some(Open { remaining: 30s })
        open: routed f model=f-model | passed p: breaker open ; p Some(Open { remaining: 30s })
        29 s: routed f model=f-model | passed p: breaker open ; p Some(Open { remaining: 1s })
        30 s: p Some(HalfOpen { trial_in_flight: false })
        trial: routed p model=p-model ; p Some(Closed { consecutive_failures: 0 })
        closed: routed p model=p-model ; p Some(Closed { consecutive_failures: 0 })
    "#]]
    .assert_eq(&log);
    assert_eq!(primary.requests().len(), 6, "skipped while open");
}

#[tokio::test]
async fn a_failed_trial_reopens_the_breaker_with_a_fresh_cool_down() {
    let clock = TestClock::new();
    let primary = scripted([
        err(ScriptedErrorKind::ServerError),
        err(ScriptedErrorKind::Overloaded),
        ScriptTurn::text("back"),
    ]);
    let fallback = texts("fallback", 10);
    let pool = make_pool(
        vec![
            scripted_member("p", &primary),
            scripted_member("f", &fallback).fallback_only(),
        ],
        BreakerPolicy::default()
            .with_failures_to_open(1)
            .with_cool_down(Duration::from_secs(10)),
    )
    .with_clock(clock.clone());
    let mut log = String::new();
    log_request(&mut log, &pool, "fail opens", "p").await;
    clock.advance(Duration::from_secs(10));
    log_request(&mut log, &pool, "trial fails", "p").await;
    clock.advance(Duration::from_secs(9));
    log_request(&mut log, &pool, "9 s later", "p").await;
    clock.advance(Duration::from_secs(1));
    log_request(&mut log, &pool, "trial", "p").await;
    expect_test::expect![[r#"
        fail opens: routed f model=f-model | passed p: Retryable provider server error (HTTP 500):  ; p Some(Open { remaining: 10s })
        trial fails: routed f model=f-model | passed p: Retryable provider overloaded (HTTP 503):  ; p Some(Open { remaining: 10s })
        9 s later: routed f model=f-model | passed p: breaker open ; p Some(Open { remaining: 1s })
        trial: routed p model=p-model ; p Some(Closed { consecutive_failures: 0 })
    "#]]
    .assert_eq(&log);
}

#[tokio::test]
async fn a_half_open_member_takes_one_trial_at_a_time() {
    let clock = TestClock::new();
    let primary = scripted([
        err(ScriptedErrorKind::Timeout),
        ScriptTurn {
            wait_for_cancel: true,
            ..ScriptTurn::text("partial")
        },
        ScriptTurn::text("ok"),
    ]);
    let fallback = texts("fallback", 10);
    let pool = make_pool(
        vec![
            scripted_member("p", &primary),
            scripted_member("f", &fallback).fallback_only(),
        ],
        BreakerPolicy::default()
            .with_failures_to_open(1)
            .with_cool_down(Duration::from_secs(10)),
    )
    .with_clock(clock.clone());
    let mut log = String::new();
    log_request(&mut log, &pool, "fail opens", "p").await;
    clock.advance(Duration::from_secs(10));

    // The trial streams its first token and stays open.
    let mut trial = pool.execute_stream(keyed("t"));
    for _ in 0..2 {
        let item = trial.next().await.expect("an item");
        let _ = writeln!(log, "trial: {}", render_pool_item(&item));
    }
    assert!(trial.next().now_or_never().is_none(), "the trial waits");
    let _ = writeln!(log, "trial under way: p {:?}", pool.breaker_state("p"));
    log_request(&mut log, &pool, "meanwhile", "p").await;
    // Dropping the trial settles nothing: the next request is the trial.
    drop(trial);
    let _ = writeln!(log, "trial dropped: p {:?}", pool.breaker_state("p"));
    log_request(&mut log, &pool, "next trial", "p").await;
    expect_test::expect![[r#"
        fail opens: routed f model=f-model | passed p: Retryable inference timed out after 0ns waiting for response headers ; p Some(Open { remaining: 10s })
        trial: routed p model=p-model
        trial: text "partial"
        trial under way: p Some(HalfOpen { trial_in_flight: true })
        meanwhile: routed f model=f-model | passed p: breaker open ; p Some(HalfOpen { trial_in_flight: true })
        trial dropped: p Some(HalfOpen { trial_in_flight: false })
        next trial: routed p model=p-model ; p Some(Closed { consecutive_failures: 0 })
    "#]]
    .assert_eq(&log);
    assert_eq!(primary.dropped_waits(), 1);
}

#[tokio::test]
async fn with_every_breaker_open_the_pool_sends_nothing_and_says_when_to_retry() {
    let clock = TestClock::new();
    let only = Failing::new(rate_limited_429);
    let pool = make_pool(
        vec![member("p", only.clone())],
        BreakerPolicy::default()
            .with_failures_to_open(1)
            .with_cool_down(Duration::from_secs(30)),
    )
    .with_clock(clock.clone());
    let mut out = render_run(&pool, keyed("t")).await;
    clock.advance(Duration::from_secs(12));
    let error = pool.execute(keyed("t")).await.err();
    assert_eq!(
        error.as_ref().and_then(|e| e.retry_after()),
        Some(Duration::from_secs(18))
    );
    out += &render_run(&pool, keyed("t")).await;
    expect_test::expect![[r#"
        error Retryable RateLimited: rate limited by the provider: slow down
        error Retryable Overloaded: provider overloaded (HTTP 503) (retry after 18s): model pool `smart` sent no request: every member's circuit breaker is open
    "#]]
    .assert_eq(&out);
    assert_eq!(only.calls(), 1);
}

#[tokio::test]
async fn the_collected_response_ignores_the_routing_event() {
    let turn = ScriptTurn::text("the answer").with_reasoning("thinking");
    let pool = make_pool(
        vec![
            scripted_member("p", &scripted([turn.clone()])),
            scripted_member("f", &texts("", 1)).fallback_only(),
        ],
        BreakerPolicy::default(),
    );
    let via_pool = pool.execute(keyed("t")).await.expect("answered");
    let direct = scripted([turn])
        .execute(keyed("t"))
        .await
        .expect("answered");
    assert_eq!(render_response(&via_pool), render_response(&direct));
    assert_eq!(via_pool, direct);
}

#[tokio::test(start_paused = true)]
async fn a_retry_wrapper_around_the_pool_retries_only_before_routing() {
    let policy = RetryPolicy {
        max_retries: 2,
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(1),
        multiplier: 2.0,
        jitter: false,
        seed: 0,
    };
    // Every member failed: the retry calls the pool again, which then routes.
    let primary = scripted([err(ScriptedErrorKind::ServerError), ScriptTurn::text("ok")]);
    let pool = make_pool(
        vec![scripted_member("p", &primary)],
        BreakerPolicy::default(),
    );
    let retrying = RetryingExecutor::with_policy(Arc::new(pool), policy.clone());
    let out = render_run(&retrying, keyed("t")).await;
    // After routing, a failure is not retried: the routing event came with model output.
    let primary2 = scripted([
        ScriptTurn::deltas(["par"]).with_error(ScriptedError::new(ScriptedErrorKind::ServerError)),
        ScriptTurn::text("never"),
    ]);
    let pool2 = make_pool(
        vec![scripted_member("p", &primary2)],
        BreakerPolicy::default(),
    );
    let retrying2 = RetryingExecutor::with_policy(Arc::new(pool2), policy);
    let out2 = render_run(&retrying2, keyed("t")).await;
    expect_test::expect![[r#"
        routed p model=p-model
        text "ok"
        stop EndTurn
        --
        routed p model=p-model
        text "par"
        error Retryable ServerError: provider server error (HTTP 500): 
    "#]]
    .assert_eq(&format!("{out}--\n{out2}"));
    assert_eq!(primary.requests().len(), 2);
    assert_eq!(primary2.requests().len(), 1);
}

#[test]
fn bad_pools_are_refused_with_what_is_wrong() {
    let exec: Arc<dyn LlmExecutor> = Failing::empty();
    let m = |id: &str| member(id, exec.clone());
    let policy = BreakerPolicy::default();
    let build = |id: &str, members: Vec<PoolMember>, policy: BreakerPolicy| {
        ModelPool::new(id, members, policy).err()
    };
    let cases: Vec<(Option<PoolError>, PoolError)> = vec![
        (build(" ", vec![m("a")], policy), PoolError::BlankPoolId),
        (
            build("smart", vec![], policy),
            PoolError::NoMembers {
                pool: "smart".into(),
            },
        ),
        (
            build("smart", vec![m("a"), m(" ")], policy),
            PoolError::BlankMemberId {
                pool: "smart".into(),
                index: 1,
            },
        ),
        (
            build("smart", vec![m("a"), m("b"), m("a")], policy),
            PoolError::DuplicateMember {
                pool: "smart".into(),
                member: "a".into(),
            },
        ),
        (
            build(
                "smart",
                vec![PoolMember::new("a", exec.clone(), "")],
                policy,
            ),
            PoolError::BlankUpstreamModel {
                pool: "smart".into(),
                member: "a".into(),
            },
        ),
        (
            build("smart", vec![m("a"), m("b").with_weight(0)], policy),
            PoolError::ZeroWeight {
                pool: "smart".into(),
                member: "b".into(),
            },
        ),
        (
            build(
                "smart",
                vec![m("a").fallback_only(), m("b").fallback_only()],
                policy,
            ),
            PoolError::NoPrimaryMember {
                pool: "smart".into(),
            },
        ),
        (
            build("smart", vec![m("a")], policy.with_failures_to_open(0)),
            PoolError::ZeroFailuresToOpen {
                pool: "smart".into(),
            },
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got.as_ref(), Some(&want));
    }
    assert!(build("smart", vec![m("a"), m("b").fallback_only()], policy).is_none());
}

#[test]
fn a_weight_3_member_gets_about_3_times_the_keys_of_a_weight_1_member() {
    let dummy: Arc<dyn LlmExecutor> = Failing::empty();
    let pool = make_pool(
        vec![
            member("light", dummy.clone()),
            member("heavy", dummy).with_weight(3),
        ],
        BreakerPolicy::default(),
    );
    let (mut light, mut heavy) = (0u32, 0u32);
    for i in 0..20_000 {
        match pool.member_order(Some(&format!("thread-{i}")))[0] {
            "light" => light += 1,
            _ => heavy += 1,
        }
    }
    // Expected 5 000 and 15 000; the key set is fixed, so the counts are too. The bounds are
    // several standard deviations wide (σ ≈ 61 keys): a sound hash lands well inside.
    let ratio = f64::from(heavy) / f64::from(light);
    assert!((2.7..=3.3).contains(&ratio), "{heavy} / {light} = {ratio}");
}

/// Distinct member ids with weights, and a new member with its weight.
fn members_and_newcomer() -> impl Strategy<Value = (Vec<u32>, u32, bool, Vec<String>)> {
    (
        proptest::collection::vec(1u32..=5, 1..=6),
        1u32..=5,
        any::<bool>(),
        proptest::collection::vec(".{0,16}", 1..=24),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// Adding a member moves a key only onto the new member: the old members keep their
    /// relative order for every key, so no key moves between two old members.
    #[test]
    fn adding_a_member_moves_keys_only_onto_it(
        (weights, new_weight, new_is_fallback, keys) in members_and_newcomer()
    ) {
        let dummy: Arc<dyn LlmExecutor> = Failing::empty();
        let old_members: Vec<PoolMember> = weights
            .iter()
            .enumerate()
            .map(|(i, w)| member(&format!("m{i}"), dummy.clone()).with_weight(*w))
            .collect();
        let mut newcomer = member("new", dummy).with_weight(new_weight);
        if new_is_fallback {
            newcomer = newcomer.fallback_only();
        }
        let old = make_pool(old_members.clone(), BreakerPolicy::default());
        let mut grown_members = old_members;
        grown_members.push(newcomer);
        let grown = make_pool(grown_members, BreakerPolicy::default());
        for key in &keys {
            let before = old.member_order(Some(key));
            let after = grown.member_order(Some(key));
            let without_new: Vec<&str> = after.iter().copied().filter(|m| *m != "new").collect();
            prop_assert_eq!(&without_new, &before, "key {:?}", key);
            if after[0] != before[0] {
                prop_assert_eq!(after[0], "new", "key {:?} moved between old members", key);
                prop_assert!(!new_is_fallback);
            }
        }
    }
}

/// What a span layer saw, as a log: spans opened (with their parent and fields), fields
/// recorded later, and spans closed, by name and pool member.
#[derive(Clone, Default)]
struct SpanLog(Arc<Mutex<Vec<String>>>);

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        let _ = write!(self.0, " {}={value}", field.name());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

impl SpanLog {
    fn push(&self, line: String) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(line);
    }

    fn render(&self) -> String {
        let lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().map(|l| format!("{l}\n")).collect()
    }
}

/// Names a span by its name and, for an attempt, its member.
fn label<S>(span: &tracing_subscriber::registry::SpanRef<'_, S>) -> String
where
    S: for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let member = span.extensions().get::<Member>().map(|m| m.0.clone());
    match member {
        Some(m) => format!("{} ({m})", span.name()),
        None => span.name().to_owned(),
    }
}

/// The pool member an attempt span is for.
struct Member(String);

impl<S> tracing_subscriber::Layer<S> for SpanLog
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Fields(String::new());
        attrs.record(&mut fields);
        let Some(span) = ctx.span(id) else { return };
        if let Some(m) = fields.0.split(" awaken.pool.member=").nth(1) {
            let m = m.split(' ').next().unwrap_or_default().to_owned();
            span.extensions_mut().insert(Member(m));
        }
        let parent = span.parent().map_or("-".to_owned(), |p| label(&p));
        self.push(format!("open {} <- {parent}:{}", span.name(), fields.0));
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Fields(String::new());
        values.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            self.push(format!("record {}:{}", label(&span), fields.0));
        }
    }

    fn on_close(&self, id: tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            self.push(format!("close {}", label(&span)));
        }
    }
}

/// Drains `pool`'s answer to `req` inside a `caller` span with [`SpanLog`] as the default
/// subscriber; the items rendered, then the span log.
async fn traced_run(pool: &ModelPool, req: InferenceRequest) -> String {
    use tracing::Instrument;
    use tracing_subscriber::layer::SubscriberExt;
    let log = SpanLog::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::Registry::default().with(log.clone()));
    // A call site first reached by a test beside this one while the subscriber was being set
    // may be cached as disabled: asked again, it is enabled for this thread.
    tracing::callsite::rebuild_interest_cache();
    let items = render_run(pool, req)
        .instrument(tracing::info_span!("caller"))
        .await;
    format!("{items}--\n{}", log.render())
}

#[tokio::test]
async fn each_attempt_of_a_pool_of_several_members_is_a_child_span() {
    let limited = Failing::new(rate_limited_429);
    let members = vec![
        member("a", limited),
        scripted_member("b", &texts("answer", 1)).fallback_only(),
    ];
    let pool = make_pool(members, BreakerPolicy::default());
    expect_test::expect![[r#"
        routed b model=b-model | passed a: Retryable rate limited by the provider: slow down
        text "answer"
        stop EndTurn
        --
        open caller <- -:
        open chat <- caller: otel.name=chat a-model gen_ai.operation.name=chat gen_ai.provider.name=failing gen_ai.request.model=a-model awaken.pool.member=a
        record chat (a): error.type=rate_limited
        close chat (a)
        open chat <- caller: otel.name=chat b-model gen_ai.operation.name=chat gen_ai.provider.name=scripted gen_ai.request.model=b-model awaken.pool.member=b
        close chat (b)
        close caller
    "#]]
    .assert_eq(&traced_run(&pool, keyed("thread-1")).await);
}

#[tokio::test]
async fn a_pool_of_one_member_adds_no_span() {
    let pool = make_pool(
        vec![scripted_member("only", &texts("answer", 1))],
        BreakerPolicy::default(),
    );
    expect_test::expect![[r#"
        routed only model=only-model
        text "answer"
        stop EndTurn
        --
        open caller <- -:
        close caller
    "#]]
    .assert_eq(&traced_run(&pool, keyed("thread-1")).await);
}
