//! GATHER: frozen snapshot, merge, the serial fallback, failure atomicity, effects.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use awaken_phase::*;
use awaken_state::{StateCommand, StateError};

use crate::support::*;

/// An action for `BeforeInference` that records its payload.
pub struct Mark;
impl ScheduledActionSpec for Mark {
    const KEY: &'static str = "test.mark";
    const PHASE: Phase = Phase::BeforeInference;
    type Payload = String;
}

pub struct RecordMark(pub Log);
#[async_trait]
impl ActionHandler<Mark> for RecordMark {
    async fn handle(
        &self,
        _ctx: &PhaseContext,
        payload: String,
    ) -> Result<StateCommand, HookError> {
        self.0.push(format!("mark {payload}"));
        Ok(StateCommand::new())
    }
}

#[tokio::test]
async fn sibling_hooks_do_not_see_each_others_writes() {
    let mut env = PhaseEnv::new();
    env.add_hook(
        Phase::StepStart,
        "p1",
        "write_a",
        hook(|_| Ok(StateCommand::new().with_update::<A>(1))),
    )
    .expect("hook");
    env.add_hook(
        Phase::StepStart,
        "p2",
        "copy_a_to_b",
        hook(|c| Ok(StateCommand::new().with_update::<B>(read::<A>(c) + 10))),
    )
    .expect("hook");
    let engine = engine(env);
    let report = engine
        .run_phase(&ctx(&engine, Phase::StepStart))
        .await
        .expect("phase");
    assert!(!report.fallback);
    assert_eq!(
        dump(&engine),
        "rev=1 a=1 b=10 c=0 d=0 counter=0 applied={}",
        "b saw a=0, not its sibling's write"
    );
}

#[tokio::test]
async fn disjoint_keys_give_one_commit() {
    let mut env = PhaseEnv::new();
    env.add_hook(
        Phase::StepStart,
        "p",
        "a",
        hook(|_| Ok(StateCommand::new().with_update::<A>(1))),
    )
    .expect("hook");
    env.add_hook(
        Phase::StepStart,
        "p",
        "b",
        hook(|_| Ok(StateCommand::new().with_update::<B>(2))),
    )
    .expect("hook");
    env.add_hook(
        Phase::StepStart,
        "p",
        "c",
        hook(|_| Ok(StateCommand::new().with_update::<C>(3))),
    )
    .expect("hook");
    let engine = engine(env);
    let report = engine
        .run_phase(&ctx(&engine, Phase::StepStart))
        .await
        .expect("phase");
    assert!(report.gather_committed && !report.fallback && report.deferred_hooks.is_empty());
    assert_eq!(dump(&engine), "rev=1 a=1 b=2 c=3 d=0 counter=0 applied={}");
}

fn increment_a(id: u32, calls: Arc<AtomicUsize>) -> Arc<dyn PhaseHook> {
    hook(move |c| {
        calls.fetch_add(1, Ordering::SeqCst);
        let mut cmd = StateCommand::new();
        cmd.update::<A>(read::<A>(c) + 1).update::<Applied>(id);
        Ok(cmd)
    })
}

#[tokio::test]
async fn exclusive_conflict_runs_batch_then_serial_rerun_in_one_commit() {
    let (c1, c3) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut env = PhaseEnv::new();
    env.add_hook(Phase::StepEnd, "p1", "inc_a", increment_a(1, c1.clone()))
        .expect("hook");
    env.add_hook(
        Phase::StepEnd,
        "p2",
        "set_b",
        hook(|_| {
            Ok(StateCommand::new()
                .with_update::<B>(5)
                .with_update::<Applied>(2))
        }),
    )
    .expect("hook");
    env.add_hook(
        Phase::StepEnd,
        "p3",
        "inc_a_again",
        increment_a(3, c3.clone()),
    )
    .expect("hook");
    let engine = engine(env);
    let report = engine
        .run_phase(&ctx(&engine, Phase::StepEnd))
        .await
        .expect("phase");
    assert!(report.fallback);
    assert_eq!(report.deferred_hooks, vec!["p3/inc_a_again".to_owned()]);
    assert_eq!(
        (c1.load(Ordering::SeqCst), c3.load(Ordering::SeqCst)),
        (1, 2),
        "only the deferred hook re-runs"
    );
    // The re-run saw a=1 (the batch's write) and wrote 2; one published commit; each output once.
    assert_eq!(
        dump(&engine),
        "rev=1 a=2 b=5 c=0 d=0 counter=0 applied={1: 1, 2: 1, 3: 1}"
    );
}

#[tokio::test]
async fn deferred_hooks_first_actions_and_effects_never_appear() {
    let log = Log::default();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut env = PhaseEnv::new();
    env.add_action("p", erase_action::<Mark, _>(RecordMark(log.clone())))
        .expect("action");
    env.add_effect("p", erase_effect::<Note, _>(RecordNote(log.clone())))
        .expect("effect");
    env.add_hook(
        Phase::BeforeInference,
        "p1",
        "a",
        hook(|_| Ok(StateCommand::new().with_update::<A>(1))),
    )
    .expect("hook");
    let r = runs.clone();
    env.add_hook(
        Phase::BeforeInference,
        "p2",
        "a_too",
        hook(move |c| {
            let label = if r.fetch_add(1, Ordering::SeqCst) == 0 {
                "first"
            } else {
                "second"
            };
            let mut cmd = StateCommand::new().with_update::<A>(read::<A>(c) + 1);
            cmd.schedule_action::<Mark>(label.into())?
                .emit::<Note>(label.into())?;
            Ok(cmd)
        }),
    )
    .expect("hook");
    let engine = engine(env);
    let report = engine
        .run_phase(&ctx(&engine, Phase::BeforeInference))
        .await
        .expect("phase");
    assert!(report.fallback);
    assert_eq!(
        log.lines(),
        vec!["note second a=2 rev=1".to_owned(), "mark second".to_owned()]
    );
    assert_eq!(report.actions_processed, 1);
    assert_eq!(
        report.effects,
        EffectStats {
            attempted: 1,
            failed: 0,
            failures: Vec::new(),
        }
    );
}

#[tokio::test]
async fn commutative_writers_do_not_trigger_the_fallback() {
    let mut env = PhaseEnv::new();
    for (i, n) in [(1u32, 3i64), (2, 4), (3, 5)] {
        env.add_hook(
            Phase::StepStart,
            "p",
            &format!("add{i}"),
            hook(move |_| {
                Ok(StateCommand::new()
                    .with_update::<Counter>(n)
                    .with_update::<Applied>(i))
            }),
        )
        .expect("hook");
    }
    let engine = engine(env);
    let report = engine
        .run_phase(&ctx(&engine, Phase::StepStart))
        .await
        .expect("phase");
    assert!(!report.fallback);
    assert_eq!(
        dump(&engine),
        "rev=1 a=0 b=0 c=0 d=0 counter=12 applied={1: 1, 2: 1, 3: 1}"
    );
}

#[tokio::test]
async fn failing_deferred_hook_publishes_nothing_of_the_phase() {
    let runs = Arc::new(AtomicUsize::new(0));
    let mut env = PhaseEnv::new();
    env.add_hook(
        Phase::StepStart,
        "p1",
        "a",
        hook(|_| Ok(StateCommand::new().with_update::<A>(1).with_update::<B>(1))),
    )
    .expect("hook");
    let r = runs.clone();
    env.add_hook(
        Phase::StepStart,
        "p2",
        "flaky",
        hook(move |_| {
            if r.fetch_add(1, Ordering::SeqCst) == 0 {
                Ok(StateCommand::new().with_update::<A>(7))
            } else {
                Err(HookError::failed("second run refuses"))
            }
        }),
    )
    .expect("hook");
    let engine = engine(env);
    let err = engine
        .run_phase(&ctx(&engine, Phase::StepStart))
        .await
        .expect_err("fails");
    assert_eq!(
        err.to_string(),
        "hook `flaky` of plugin `p2` failed in step_start: second run refuses"
    );
    assert_eq!(dump(&engine), "rev=0 a=0 b=0 c=0 d=0 counter=0 applied={}");
}

#[tokio::test]
async fn panicking_hook_fails_the_phase_with_its_name() {
    let mut env = PhaseEnv::new();
    env.add_hook(
        Phase::StepStart,
        "p1",
        "a",
        hook(|_| Ok(StateCommand::new().with_update::<A>(1))),
    )
    .expect("hook");
    env.add_hook(
        Phase::StepStart,
        "p2",
        "boom",
        hook(|_| panic!("hook exploded")),
    )
    .expect("hook");
    let engine = engine(env);
    let err = engine
        .run_phase(&ctx(&engine, Phase::StepStart))
        .await
        .expect_err("fails");
    assert!(
        matches!(&err, PhaseError::HookPanicked { plugin_id, hook, message, .. }
        if plugin_id == "p2" && hook == "boom" && message == "hook exploded"),
        "{err}"
    );
    assert_eq!(dump(&engine), "rev=0 a=0 b=0 c=0 d=0 counter=0 applied={}");
}

/// A hook without a synchronous path: the engine awaits its future.
struct AsyncOnly<F>(F);

#[async_trait]
impl<F> PhaseHook for AsyncOnly<F>
where
    F: Fn(&PhaseContext) -> Result<StateCommand, HookError> + Send + Sync + 'static,
{
    async fn run(&self, ctx: &PhaseContext) -> Result<StateCommand, HookError> {
        tokio::task::yield_now().await;
        (self.0)(ctx)
    }
}

#[tokio::test]
async fn the_first_failing_hook_in_registration_order_names_the_error() {
    let fails = |msg: &'static str| {
        move |_: &PhaseContext| -> Result<StateCommand, HookError> { Err(HookError::failed(msg)) }
    };
    let writes_a = |_: &PhaseContext| Ok(StateCommand::new().with_update::<A>(1));
    let mut lines = Vec::new();
    // (awaited?, fails?) per hook, in registration order.
    for hooks in [
        [(true, true), (false, true), (false, false)],
        [(false, false), (false, true), (true, true)],
        [(true, false), (false, true), (true, true)],
    ] {
        let mut env = PhaseEnv::new();
        for (i, (awaited, failing)) in hooks.into_iter().enumerate() {
            let name = format!("h{i}");
            let h: Arc<dyn PhaseHook> = match (awaited, failing) {
                (true, true) => Arc::new(AsyncOnly(fails("awaited hook refuses"))),
                (true, false) => Arc::new(AsyncOnly(writes_a)),
                (false, true) => hook(fails("sync hook refuses")),
                (false, false) => hook(writes_a),
            };
            env.add_hook(Phase::StepStart, "p", &name, h).expect("hook");
        }
        let engine = engine(env);
        let err = engine
            .run_phase(&ctx(&engine, Phase::StepStart))
            .await
            .expect_err("fails");
        lines.push(format!("{err} / {}", dump(&engine)));
    }
    assert_eq!(
        lines.join("\n"),
        "hook `h0` of plugin `p` failed in step_start: awaited hook refuses / rev=0 a=0 b=0 c=0 d=0 counter=0 applied={}\n\
         hook `h1` of plugin `p` failed in step_start: sync hook refuses / rev=0 a=0 b=0 c=0 d=0 counter=0 applied={}\n\
         hook `h1` of plugin `p` failed in step_start: sync hook refuses / rev=0 a=0 b=0 c=0 d=0 counter=0 applied={}"
    );
}

#[tokio::test]
async fn unknown_effect_action_or_phase_is_rejected_at_submit_with_nothing_written() {
    let log = Log::default();
    let mut env = PhaseEnv::new();
    env.add_action("p", erase_action::<Mark, _>(RecordMark(log.clone())))
        .expect("action");
    let engine = engine(env);
    let cases: Vec<(StateCommand, &str)> = vec![
        (
            {
                let mut c = StateCommand::new().with_update::<A>(1);
                c.emit_json("nobody.listens", serde_json::json!(1));
                c
            },
            "no handler is registered for effect `nobody.listens`",
        ),
        (
            {
                let mut c = StateCommand::new().with_update::<A>(1);
                c.schedule_json("step_start", "nobody.handles", serde_json::json!(1));
                c
            },
            "no handler is registered for scheduled action `nobody.handles`",
        ),
        (
            {
                let mut c = StateCommand::new().with_update::<A>(1);
                c.schedule_json("after_lunch", Mark::KEY, serde_json::json!("x"));
                c
            },
            "scheduled action `test.mark` targets phase `after_lunch`, which cannot run actions",
        ),
        (
            {
                let mut c = StateCommand::new().with_update::<A>(1);
                c.schedule_json("tool_gate", Mark::KEY, serde_json::json!("x"));
                c
            },
            "scheduled action `test.mark` targets phase `tool_gate`, which cannot run actions",
        ),
    ];
    for (cmd, expected) in cases {
        let err = engine.submit_command(cmd).await.expect_err(expected);
        assert_eq!(err.to_string(), expected);
    }
    assert_eq!(dump(&engine), "rev=0 a=0 b=0 c=0 d=0 counter=0 applied={}");
    assert!(matches!(
        engine.run_phase(&ctx(&engine, Phase::ToolGate)).await,
        Err(PhaseError::ToolGatePhase)
    ));
    let mut env = PhaseEnv::new();
    assert!(matches!(
        env.add_hook(
            Phase::ToolGate,
            "p",
            "gate",
            hook(|_| Ok(StateCommand::new()))
        ),
        Err(PhaseEnvError::ToolGateHook { .. })
    ));
    env.add_action("p1", erase_action::<Mark, _>(RecordMark(log.clone())))
        .expect("first");
    let dup = env
        .add_action("p2", erase_action::<Mark, _>(RecordMark(log)))
        .expect_err("duplicate");
    assert_eq!(
        dup.to_string(),
        "scheduled action `test.mark` is handled by both `p1` and `p2`"
    );
}

#[tokio::test]
async fn effects_run_after_the_commit_and_failures_do_not_roll_back() {
    let log = Log::default();
    let mut env = PhaseEnv::new();
    env.add_effect("p", erase_effect::<Note, _>(RecordNote(log.clone())))
        .expect("effect");
    let engine = engine(env);
    let mut cmd = StateCommand::new().with_update::<A>(41);
    cmd.emit::<Note>("fail".into())
        .expect("emit")
        .emit::<Note>("after".into())
        .expect("emit");
    let report = engine
        .submit_command(cmd)
        .await
        .expect("committed despite the failing handler");
    assert_eq!(
        report.effects,
        EffectStats {
            attempted: 2,
            failed: 1,
            failures: vec![EffectFailure {
                effect: "test.note".to_owned(),
                plugin_id: Some(Arc::from("p")),
                reason: "note handler refuses".to_owned(),
            }],
        }
    );
    assert_eq!(
        report.effects.failures[0].to_string(),
        "the handler of effect `test.note` (plugin `p`) failed: note handler refuses"
    );
    assert_eq!(
        log.lines(),
        vec![
            "note fail a=41 rev=1".to_owned(),
            "note after a=41 rev=1".to_owned()
        ]
    );
    assert_eq!(dump(&engine), "rev=1 a=41 b=0 c=0 d=0 counter=0 applied={}");
}

/// An effect whose handler submits another command through the engine.
pub struct Chain;
impl EffectSpec for Chain {
    const KEY: &'static str = "test.chain";
    type Payload = i64;
}
pub struct SubmitFromEffect;
#[async_trait]
impl EffectHandler<Chain> for SubmitFromEffect {
    async fn handle(&self, ctx: &EffectContext, n: i64) -> Result<(), HookError> {
        let mut cmd = StateCommand::new().with_update::<Counter>(n);
        if n > 1 {
            cmd.emit::<Chain>(n - 1)?;
        }
        ctx.engine
            .submit_command(cmd)
            .await
            .map_err(|e| HookError::Other(Box::new(e)))?;
        Ok(())
    }
}

#[tokio::test]
async fn an_effect_handler_that_submits_a_command_does_not_deadlock() {
    let mut env = PhaseEnv::new();
    env.add_effect("p", erase_effect::<Chain, _>(SubmitFromEffect))
        .expect("effect");
    env.add_hook(
        Phase::StepEnd,
        "p",
        "start_chain",
        hook(|_| {
            let mut cmd = StateCommand::new();
            cmd.emit::<Chain>(3)?;
            Ok(cmd)
        }),
    )
    .expect("hook");
    let engine = engine(env);
    let report = engine
        .run_phase(&ctx(&engine, Phase::StepEnd))
        .await
        .expect("phase");
    assert_eq!(
        report.effects,
        EffectStats {
            attempted: 1,
            failed: 0,
            failures: Vec::new(),
        }
    );
    // 3 + 2 + 1 added by three nested submits, each its own commit after the phase's.
    assert_eq!(dump(&engine), "rev=4 a=0 b=0 c=0 d=0 counter=6 applied={}");
}

#[tokio::test]
async fn cancellation_is_checked_at_entry() {
    let engine = engine(PhaseEnv::new());
    let c = ctx(&engine, Phase::StepStart);
    c.cancel.cancel();
    assert!(matches!(
        engine.run_phase(&c).await,
        Err(PhaseError::Cancelled {
            phase: Phase::StepStart
        })
    ));
}

#[test]
fn phases_parse_and_classify() {
    for p in Phase::ALL {
        assert_eq!(p.as_str().parse::<Phase>().expect("round trip"), p);
        assert_eq!(serde_json::to_value(p).expect("ser"), p.as_str());
        assert_ne!(p.is_run_level(), p.is_step_level());
    }
    assert_eq!(Phase::ALL.iter().filter(|p| p.is_run_level()).count(), 2);
    let err = "before_lunch".parse::<Phase>().expect_err("unknown");
    assert!(err.to_string().contains("before_lunch"));
    let _: StateError = StateError::InvalidActionPhase {
        phase: "x".into(),
        key: "y".into(),
    };
}

#[test]
fn the_engine_key_count_is_what_it_registers() {
    let mut keys = awaken_state::KeyRegistry::new();
    awaken_phase::register_engine_keys(&mut keys).expect("registers");
    assert_eq!(keys.len(), awaken_phase::ENGINE_KEY_COUNT);
}

#[test]
fn a_command_without_effects_commits_at_once_and_one_with_effects_comes_back() {
    let log = Log::default();
    let mut env = PhaseEnv::new();
    env.add_effect("p", erase_effect::<Note, _>(RecordNote(log.clone())))
        .expect("effect");
    let engine = engine(env);
    let SubmitNow::Committed(committed) = engine
        .submit_now(StateCommand::new().with_update::<A>(2))
        .expect("valid")
    else {
        panic!("no effects: committed at once");
    };
    assert_eq!(committed.revision, 1);
    assert_eq!(dump(&engine), "rev=1 a=2 b=0 c=0 d=0 counter=0 applied={}");
    // Invalid: the same error as submit_command, nothing written.
    let mut bad = StateCommand::new().with_update::<A>(1);
    bad.schedule_json("after_lunch", Mark::KEY, serde_json::json!("x"));
    let err = engine.submit_now(bad).expect_err("invalid phase");
    assert!(err.to_string().contains("after_lunch"), "{err}");
    // With an effect: handed back unchanged, nothing written, no handler run.
    let mut with_effect = StateCommand::new().with_update::<A>(40);
    with_effect.emit::<Note>("n".into()).expect("emit");
    let SubmitNow::HasEffects(back) = engine.submit_now(with_effect).expect("valid") else {
        panic!("effects need submit_command");
    };
    assert_eq!(back.effects().len(), 1);
    assert_eq!(dump(&engine), "rev=1 a=2 b=0 c=0 d=0 counter=0 applied={}");
    assert!(log.lines().is_empty());
}
