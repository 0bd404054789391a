//! Runs on a model pool: each thread answered by its member, failover on a rate limit and
//! never on a refused request, and a suspended or interrupted run continued by a runtime whose
//! pool has other members since: the run keeps the members it started with, and the stored
//! events say which member answered each step. A context policy summarises on a pool too.

use std::sync::Arc;

use awaken_event::{
    AgentEvent, NullSink, ResumeMode, Role, SuspendTicket, TerminationReason, ThreadId,
    ToolCallResume, VecSink, check_activation,
};
use awaken_llm::{
    BreakerPolicy, InferenceExecutionError, InferenceRequest, LlmEventStream, LlmExecutor,
    ModelPool, PoolMember,
};
use awaken_phase::PhaseContext;
use awaken_plugin::{FnGate, Plugin, PluginError, PluginManifest, PluginRegistrar};
use awaken_resolver::{ModelPoolError, ResolveError};
use awaken_runtime::{
    AgentRuntime, IdSource, ModelPoolKey, Resume, RunActivation, RunError, SequentialIds, SystemIds,
};
use awaken_spec::{AgentSpec, ModelPoolSpec, ModelSpec, PoolMemberSpec};
use awaken_state::StateKey;
use awaken_store::{MemoryStore, SqliteConfig, SqliteStore, ThreadStore};
use awaken_tool::{ToolInterceptPayload, pending_call};
use futures_util::StreamExt;

use crate::support::*;

/// How a member answers.
#[derive(Clone, Copy)]
enum Answer {
    /// A text naming the member.
    Text,
    /// An `echo` call until the thread holds a tool result, then a text naming the member.
    EchoThenText,
    /// HTTP 429.
    RateLimited,
    /// HTTP 400.
    BadRequest,
}

/// A member's executor: logs `<member> <upstream model>` for each request, then answers.
struct Member {
    id: &'static str,
    answer: Answer,
    log: Log,
}

impl LlmExecutor for Member {
    fn name(&self) -> &str {
        "member"
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        self.log
            .push(format!("{} {}", self.id, request.upstream_model));
        let text = || text_answer(format!("answered by {}", self.id));
        let fail = |e: InferenceExecutionError| futures_util::stream::iter([Err(e)]).boxed();
        match self.answer {
            Answer::Text => text(),
            Answer::EchoThenText if request.messages.iter().any(|m| m.role == Role::Tool) => text(),
            Answer::EchoThenText => call_answer("c1", "echo", r#"{"text":"x"}"#.into()),
            Answer::RateLimited => fail(InferenceExecutionError::RateLimited {
                retry_after: None,
                message: "slow down".into(),
            }),
            Answer::BadRequest => fail(InferenceExecutionError::InvalidRequest {
                status: Some(400),
                message: "messages[0] is malformed".into(),
            }),
        }
    }
}

/// Asks a human before every `echo` call that carries no decision yet.
struct Approval(PluginManifest);

impl Plugin for Approval {
    fn manifest(&self) -> &PluginManifest {
        &self.0
    }
    fn register(&self, r: &mut PluginRegistrar) -> Result<(), PluginError> {
        r.register_tool_gate_hook(
            "ask",
            Arc::new(FnGate(|ctx: &PhaseContext| {
                let tool = ctx.tool.as_ref().expect("a tool phase");
                if tool.resume.is_some() {
                    return Ok(None);
                }
                Ok(Some(ToolInterceptPayload::Suspend(SuspendTicket {
                    suspension_id: format!("ask-{}", tool.call.id),
                    call: pending_call(&tool.call),
                    message: "Run echo?".into(),
                    response_schema: None,
                    resume_mode: ResumeMode::Replay,
                })))
            })),
        )
    }
}

/// One "process": a runtime over `store` whose agent `agent` runs on the pool `smart` of
/// `pool` (member model ids, the last one fallback-only when `fallback_last`), every model of
/// `models` (id, upstream model, answer) registered on a provider of its own.
struct Setup<'a> {
    store: Arc<dyn ThreadStore>,
    models: &'a [(&'static str, &'static str, Answer)],
    pool: &'a [&'static str],
    fallback_last: bool,
    approval: bool,
    log: Log,
}

impl Setup<'_> {
    fn runtime(&self) -> AgentRuntime {
        self.runtime_with(Arc::new(SequentialIds::default()))
    }

    fn runtime_with(&self, ids: Arc<dyn IdSource>) -> AgentRuntime {
        let members = self.pool.iter().enumerate().map(|(i, m)| {
            let member = PoolMemberSpec::new(*m);
            if self.fallback_last && i + 1 == self.pool.len() {
                member.fallback_only()
            } else {
                member
            }
        });
        let mut agent = AgentSpec::new("agent", "smart");
        let mut builder = AgentRuntime::builder()
            .with_ids(ids)
            .with_store(self.store.clone())
            .with_model_pool(ModelPoolSpec::new("smart", members))
            .with_tool(Arc::new(Echo));
        for &(id, upstream, answer) in self.models {
            let provider = format!("provider-{id}");
            builder = builder
                .with_model(ModelSpec::new(id, provider.clone(), upstream))
                .with_provider(
                    provider,
                    Arc::new(Member {
                        id,
                        answer,
                        log: self.log.clone(),
                    }),
                );
        }
        if self.approval {
            builder = builder.with_plugin(Arc::new(Approval(PluginManifest::new("approval"))));
            agent = agent.with_plugin("approval");
        }
        builder.with_agent_spec(agent).build().expect("runtime")
    }
}

fn thread(id: &str) -> ThreadId {
    ThreadId::new(id).expect("id")
}

/// Runs `agent` on `thread` to its end; the events rendered.
async fn run(rt: &AgentRuntime, thread_id: &str) -> String {
    let sink = VecSink::new();
    rt.run(
        RunActivation::new(thread(thread_id), "agent").with_user_message("hi"),
        &sink,
    )
    .await
    .expect("the run starts");
    let events = sink.events();
    if let Err(v) = check_activation(&events) {
        panic!("event grammar violated: {v}\n{}", render(&events));
    }
    render(&events)
}

/// What the store holds of thread `t`: each stored event that says which model answered (the
/// step it belongs to, by its `StepStart`), and the members the run recorded.
async fn stored(store: &dyn ThreadStore) -> String {
    let mut out = Vec::new();
    let mut step = 0;
    for stored in store.load_events(&thread("t"), 0).await.expect("events") {
        match &stored.event {
            AgentEvent::StepStart { step: s } => step = *s,
            AgentEvent::InferenceComplete { model, .. } => {
                out.push(format!(
                    "{} step {step}: answered by {model}",
                    stored.run_id
                ));
            }
            _ => {}
        }
    }
    let checkpoint = store
        .load_checkpoint(&thread("t"))
        .await
        .expect("load")
        .expect("stored");
    out.push(format!(
        "recorded {}",
        checkpoint.run_state.values[<ModelPoolKey as StateKey>::KEY]
    ));
    out.join("\n")
}

fn memory() -> Arc<dyn ThreadStore> {
    Arc::new(MemoryStore::new())
}

#[tokio::test]
async fn each_thread_is_answered_by_its_member_of_the_pool() {
    let log = Log::default();
    let setup = Setup {
        store: memory(),
        models: &[
            ("a", "up-a", Answer::Text),
            ("b", "up-b", Answer::Text),
            ("c", "up-c", Answer::Text),
        ],
        pool: &["a", "b", "c"],
        fallback_last: false,
        approval: false,
        log: log.clone(),
    };
    let rt = setup.runtime();
    // The order the pool's rendezvous hash gives each thread id (the run's routing key).
    let reference = ModelPool::new(
        "smart",
        ["a", "b", "c"].map(|id| {
            PoolMember::new(
                id,
                Arc::new(Member {
                    id,
                    answer: Answer::Text,
                    log: Log::default(),
                }),
                id,
            )
        }),
        BreakerPolicy::default(),
    )
    .expect("pool");
    let threads = ["t1", "t2", "t3", "t4", "t5", "t6"];
    let mut answered = Vec::new();
    for t in threads {
        let events = run(&rt, t).await;
        let first = reference.member_order(Some(t))[0];
        assert!(
            events.contains(&format!("inference up-{first}\n")),
            "{t} is answered by `{first}`, as its routing key ranks the members:\n{events}"
        );
        assert!(
            events.contains(&format!("response=Some(\"answered by {first}\")")),
            "{events}"
        );
        answered.push(first);
    }
    // One request per run, each to the thread's member, and the threads spread over members.
    let expected: Vec<String> = answered.iter().map(|m| format!("{m} up-{m}")).collect();
    assert_eq!(log.lines(), expected);
    answered.sort_unstable();
    answered.dedup();
    assert!(
        answered.len() > 1,
        "six threads on one member: {answered:?}"
    );
    // The same thread again: the same member.
    run(&rt, "t1").await;
    assert_eq!(
        log.lines().last().map(String::as_str),
        Some(format!("{0} up-{0}", reference.member_order(Some("t1"))[0]).as_str())
    );
}

#[tokio::test]
async fn a_rate_limited_member_fails_over_and_the_next_answers() {
    let log = Log::default();
    let rt = Setup {
        store: memory(),
        models: &[
            ("a", "up-a", Answer::RateLimited),
            ("b", "up-b", Answer::Text),
        ],
        pool: &["a", "b"],
        fallback_last: true,
        approval: false,
        log: log.clone(),
    }
    .runtime();
    let events = run(&rt, "t").await;
    expect_test::expect![[r#"
        run_start run-1 resumed=false
        step_start 1
        text "answered by b"
        inference up-b
        step_end 1
        run_finish natural_end response=Some("answered by b") tokens=0
    "#]]
    .assert_eq(&events);
    assert_eq!(log.lines(), ["a up-a", "b up-b"]);
}

#[tokio::test]
async fn a_refused_request_never_fails_over() {
    let log = Log::default();
    let rt = Setup {
        store: memory(),
        models: &[
            ("a", "up-a", Answer::BadRequest),
            ("b", "up-b", Answer::Text),
        ],
        pool: &["a", "b"],
        fallback_last: true,
        approval: false,
        log: log.clone(),
    }
    .runtime();
    let events = run(&rt, "t").await;
    expect_test::expect![[r#"
        run_start run-1 resumed=false
        step_start 1
        error inference failed: the provider rejected the request (HTTP 400): messages[0] is malformed
        step_end 1
        run_finish error: inference failed: the provider rejected the request (HTTP 400): messages[0] is malformed response=None tokens=0
    "#]].assert_eq(&events);
    assert_eq!(log.lines(), ["a up-a"], "`b` is never asked");
}

/// A SQLite store in a fresh folder, removed when the guard is dropped (bound first, it is
/// dropped after the store).
async fn sqlite(name: &str) -> (TestDir, Arc<dyn ThreadStore>) {
    let dir = fresh_dir(&format!("pools-{name}"));
    let store = Arc::new(
        SqliteStore::open(SqliteConfig::file(dir.join("threads.db")))
            .await
            .expect("sqlite"),
    );
    (dir, store)
}

/// The models of the pool before and after the change: `a` (its upstream model renamed in
/// the second process), `b` and `c`.
const BEFORE: &[(&str, &str, Answer)] = &[
    ("a", "up-a", Answer::EchoThenText),
    ("b", "up-b", Answer::EchoThenText),
    ("c", "up-c", Answer::EchoThenText),
];
const AFTER: &[(&str, &str, Answer)] = &[
    ("a", "up-a-v2", Answer::EchoThenText),
    ("b", "up-b", Answer::EchoThenText),
    ("c", "up-c", Answer::EchoThenText),
];

#[tokio::test]
async fn a_resumed_run_keeps_the_pool_members_it_started_with() {
    let (_dir, store) = sqlite("resume").await;
    let log = Log::default();
    // The run starts on `a` first and `b` as fallback: `a` answers with a call that waits.
    let first = Setup {
        store: store.clone(),
        models: BEFORE,
        pool: &["a", "b"],
        fallback_last: true,
        approval: true,
        log: log.clone(),
    };
    let out = first
        .runtime()
        .run_to_completion(RunActivation::new(thread("t"), "agent").with_user_message("hi"))
        .await
        .expect("run");
    assert_eq!(out.termination, TerminationReason::Suspended);
    assert_eq!(log.lines(), ["a up-a"]);

    // Another process, whose pool is now `c` first and `a` as fallback, and whose `a` has a
    // new upstream model: the resumed run still asks `a` first, under the name it started with.
    let second = Setup {
        pool: &["c", "a"],
        models: AFTER,
        ..first
    };
    let rt = second.runtime();
    let tickets = rt.waiting_calls(&thread("t")).await.expect("read");
    let sink = VecSink::new();
    let done = rt
        .resume(
            Resume::new(thread("t")).with_decision(ToolCallResume::approve(&tickets[0].call)),
            &sink,
        )
        .await
        .expect("resumed");
    assert_eq!(done.termination, TerminationReason::NaturalEnd);
    assert_eq!(done.response.as_deref(), Some("answered by a"));
    assert_eq!(log.lines(), ["a up-a", "a up-a"], "`c` is never asked");
    let events = render(&sink.events());
    assert!(
        !events.contains("SpecChanged"),
        "the run's pool is the one it started with:\n{events}"
    );

    // The stored events name the member that answered each step.
    expect_test::expect![[r#"
        run-1 step 1: answered by up-a
        run-1 step 3: answered by up-a
        recorded {"members":[{"model":"a","upstream_model":"up-a","weight":1},{"fallback_only":true,"model":"b","upstream_model":"up-b","weight":1}],"pool":"smart"}"#]].assert_eq(&stored(store.as_ref()).await);

    // A new run takes the pool as it is now: `c` (in a process whose ids do not repeat the
    // stored run's).
    second
        .runtime_with(Arc::new(SystemIds::default()))
        .run_to_completion(RunActivation::new(thread("t2"), "agent").with_user_message("again"))
        .await
        .expect("run");
    assert_eq!(log.lines().last().map(String::as_str), Some("c up-c"));
}

#[tokio::test]
async fn a_resumed_run_whose_member_is_gone_is_refused_naming_it() {
    let (_dir, store) = sqlite("gone").await;
    let first = Setup {
        store: store.clone(),
        models: BEFORE,
        pool: &["a", "b"],
        fallback_last: true,
        approval: true,
        log: Log::default(),
    };
    first
        .runtime()
        .run_to_completion(RunActivation::new(thread("t"), "agent").with_user_message("hi"))
        .await
        .expect("run");
    // `b` is no model any more.
    let second = Setup {
        pool: &["c", "a"],
        models: &[
            ("a", "up-a", Answer::EchoThenText),
            ("c", "up-c", Answer::EchoThenText),
        ],
        ..first
    };
    let rt = second.runtime();
    let tickets = rt.waiting_calls(&thread("t")).await.expect("read");
    let refused = rt
        .resume(
            Resume::new(thread("t")).with_decision(ToolCallResume::approve(&tickets[0].call)),
            &NullSink,
        )
        .await
        .expect_err("refused");
    let RunError::Resolve(ResolveError::ModelPool {
        source: ModelPoolError::RecordedMemberNotFound { pool_id, member },
        ..
    }) = &refused
    else {
        panic!("not the missing member: {refused}")
    };
    assert_eq!((pool_id.as_str(), member.as_str()), ("smart", "b"));
    assert_eq!(
        refused.to_string(),
        "agent `agent`: model pool `smart`: the run started with member `b`, which is no longer a registered model"
    );
    // Nothing was written: the run still waits.
    assert_eq!(rt.waiting_calls(&thread("t")).await.expect("read"), tickets);
}

#[tokio::test]
async fn a_recovered_run_keeps_the_pool_members_it_started_with() {
    let store = memory();
    let log = Log::default();
    // The first process writes the run's start (with its members), then dies.
    let first = Setup {
        store: Arc::new(Intercepted::dies_after(store.clone(), 1)),
        models: BEFORE,
        pool: &["a", "b"],
        fallback_last: true,
        approval: false,
        log: log.clone(),
    };
    crate::support::unwritten_end(
        first
            .runtime()
            .run_to_completion(RunActivation::new(thread("t"), "agent").with_user_message("hi"))
            .await,
    );
    assert_eq!(log.lines(), ["a up-a"]);

    let second = Setup {
        store: store.clone(),
        pool: &["c", "a"],
        models: AFTER,
        ..first
    };
    recover_the_run(&second.runtime()).await;
    assert_eq!(
        log.lines(),
        ["a up-a", "a up-a", "a up-a"],
        "`c` is never asked"
    );
    expect_test::expect![[r#"
        run-1 step 1: answered by up-a
        run-1 step 2: answered by up-a
        recorded {"members":[{"model":"a","upstream_model":"up-a","weight":1},{"fallback_only":true,"model":"b","upstream_model":"up-b","weight":1}],"pool":"smart"}"#]].assert_eq(&stored(store.as_ref()).await);
}

#[tokio::test]
async fn a_context_policy_summarises_on_a_pool() {
    let log = Log::default();
    let member = |id: &'static str| {
        Arc::new(Member {
            id,
            answer: Answer::Text,
            log: log.clone(),
        })
    };
    let compacting = |summary: Option<&str>| awaken_spec::ContextPolicy {
        compaction_threshold: Some(0.75),
        summary_model: summary.map(str::to_owned),
        ..awaken_spec::ContextPolicy::default()
    };
    // One agent on the pool (its own model summarises), one on `a` summarising on the pool.
    let rt = AgentRuntime::builder()
        .with_model(ModelSpec::new("a", "pa", "up-a").with_context_window(32_000))
        .with_model(ModelSpec::new("b", "pb", "up-b").with_context_window(16_000))
        .with_provider("pa", member("a"))
        .with_provider("pb", member("b"))
        .with_model_pool(ModelPoolSpec::new(
            "smart",
            [PoolMemberSpec::new("a"), PoolMemberSpec::new("b")],
        ))
        .with_agent_spec(AgentSpec::new("pooled", "smart").with_context_policy(compacting(None)))
        .with_agent_spec(
            AgentSpec::new("direct", "a").with_context_policy(compacting(Some("smart"))),
        )
        .build()
        .expect("both summary models resolve");
    for agent in ["pooled", "direct"] {
        let resolved = rt.resolver().resolve(agent).expect("resolves");
        assert!(
            resolved
                .env
                .plugin_ids()
                .contains(&awaken_context::COMPACTION_PLUGIN),
            "{agent}: {:?}",
            resolved.env.plugin_ids()
        );
    }
    // The pooled agent's budget comes from the pool's window: the smallest member's.
    let pooled = rt.resolver().resolve("pooled").expect("resolves");
    assert_eq!(pooled.model.context_window, Some(16_000));
}
