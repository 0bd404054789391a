//! EXECUTE: rounds, the round limit, actions for other phases, dead letters.

use std::sync::Arc;

use async_trait::async_trait;
use awaken_phase::*;
use awaken_state::{StateCommand, StateError};

use crate::support::*;

/// A same-phase chain: handling `n` adds 1 to the counter and schedules `n - 1` until 0.
pub struct Countdown;
impl ScheduledActionSpec for Countdown {
    const KEY: &'static str = "test.countdown";
    const PHASE: Phase = Phase::BeforeInference;
    type Payload = u32;
}
pub struct CountdownHandler;
#[async_trait]
impl ActionHandler<Countdown> for CountdownHandler {
    async fn handle(&self, _ctx: &PhaseContext, n: u32) -> Result<StateCommand, HookError> {
        let mut cmd = StateCommand::new().with_update::<Counter>(1);
        if n > 0 {
            cmd.schedule_action::<Countdown>(n - 1)?;
        }
        Ok(cmd)
    }
}

/// An action for `StepEnd` that sets `b` to its payload, or fails on a negative one.
pub struct SetB;
impl ScheduledActionSpec for SetB {
    const KEY: &'static str = "test.set_b";
    const PHASE: Phase = Phase::StepEnd;
    type Payload = i64;
}
pub struct SetBHandler;
#[async_trait]
impl ActionHandler<SetB> for SetBHandler {
    async fn handle(&self, ctx: &PhaseContext, v: i64) -> Result<StateCommand, HookError> {
        if v < 0 {
            return Err(HookError::failed(format!("refusing {v}")));
        }
        if v == 99 {
            panic!("ninety-nine");
        }
        assert_eq!(ctx.phase, Phase::StepEnd);
        Ok(StateCommand::new().with_update::<B>(v))
    }
}

fn env() -> PhaseEnv {
    let mut env = PhaseEnv::new();
    env.add_action("p", erase_action::<Countdown, _>(CountdownHandler))
        .expect("countdown");
    env.add_action("p", erase_action::<SetB, _>(SetBHandler))
        .expect("set_b");
    env
}

async fn start_chain(engine: &PhaseEngine, n: u32) {
    let mut cmd = StateCommand::new();
    cmd.schedule_action::<Countdown>(n).expect("schedule");
    engine.submit_command(cmd).await.expect("submit");
}

#[tokio::test]
async fn a_chain_needing_16_rounds_converges() {
    let engine = engine(env());
    start_chain(&engine, 15).await;
    let report = engine
        .run_phase(&ctx(&engine, Phase::BeforeInference))
        .await
        .expect("converges");
    assert_eq!(
        (report.rounds, report.actions_processed, report.actions_left),
        (16, 16, 0)
    );
    // rev 1 = the submit, then one commit per processed action.
    assert_eq!(
        dump(&engine),
        "rev=17 a=0 b=0 c=0 d=0 counter=16 applied={}"
    );
}

#[tokio::test]
async fn a_chain_needing_17_rounds_fails_with_phase_run_loop_exceeded() {
    let engine = engine(env());
    start_chain(&engine, 16).await;
    let err = engine
        .run_phase(&ctx(&engine, Phase::BeforeInference))
        .await
        .expect_err("17 rounds");
    match err {
        PhaseError::State(StateError::PhaseRunLoopExceeded { phase, max_rounds }) => {
            assert_eq!(
                (phase.as_str(), max_rounds),
                ("before_inference", DEFAULT_MAX_PHASE_ROUNDS)
            );
        }
        other => panic!("unexpected {other}"),
    }
    // A smaller, per-call limit.
    let engine = self::engine(env());
    start_chain(&engine, 3).await;
    assert!(
        engine
            .run_phase_with(&ctx(&engine, Phase::BeforeInference), 3)
            .await
            .is_err()
    );
    let engine = self::engine(env());
    start_chain(&engine, 2).await;
    assert!(
        engine
            .run_phase_with(&ctx(&engine, Phase::BeforeInference), 3)
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn actions_for_another_phase_stay_queued_until_it_runs() {
    let engine = engine(env());
    let mut cmd = StateCommand::new();
    cmd.schedule_action::<SetB>(7).expect("schedule");
    engine.submit_command(cmd).await.expect("submit");
    let report = engine
        .run_phase(&ctx(&engine, Phase::BeforeInference))
        .await
        .expect("phase");
    assert_eq!(
        (report.rounds, report.actions_processed, report.actions_left),
        (0, 0, 1)
    );
    assert_eq!(dump(&engine), "rev=1 a=0 b=0 c=0 d=0 counter=0 applied={}");
    let report = engine
        .run_phase(&ctx(&engine, Phase::StepEnd))
        .await
        .expect("phase");
    assert_eq!(
        (report.rounds, report.actions_processed, report.actions_left),
        (1, 1, 0)
    );
    assert_eq!(dump(&engine), "rev=2 a=0 b=7 c=0 d=0 counter=0 applied={}");
}

#[tokio::test]
async fn failing_panicking_and_undecodable_actions_are_dead_lettered_and_the_phase_goes_on() {
    let engine = engine(env());
    let mut cmd = StateCommand::new();
    cmd.schedule_action::<SetB>(-1).expect("schedule");
    cmd.schedule_action::<SetB>(99).expect("schedule");
    cmd.schedule_json("step_end", SetB::KEY, serde_json::json!("not a number"));
    cmd.schedule_action::<SetB>(4).expect("schedule");
    engine.submit_command(cmd).await.expect("submit");
    let report = engine
        .run_phase(&ctx(&engine, Phase::StepEnd))
        .await
        .expect("phase goes on");
    let reasons: Vec<String> = report
        .dead_lettered
        .iter()
        .map(|d| d.reason.clone())
        .collect();
    assert_eq!(reasons, vec![
        "plugin `p`: handler of `test.set_b` failed: refusing -1".to_owned(),
        "plugin `p`: handler of `test.set_b` panicked: ninety-nine".to_owned(),
        "plugin `p`: payload of `test.set_b` does not decode: invalid type: string \"not a number\", expected i64".to_owned(),
    ]);
    assert_eq!(report.actions_processed, 1);
    let snapshot = engine.store().snapshot();
    assert_eq!(*snapshot.get::<B>().expect("b"), 4);
    assert_eq!(
        snapshot.get::<DeadLettersKey>().expect("letters").len(),
        3,
        "dead letters are state"
    );
    assert!(
        snapshot
            .get::<ActionQueueKey>()
            .expect("queue")
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn remaining_and_unhandled_actions_are_dead_lettered_with_the_reason() {
    let engine = engine(env());
    let mut cmd = StateCommand::new();
    cmd.schedule_action::<SetB>(1).expect("schedule");
    cmd.schedule_action::<Countdown>(0).expect("schedule");
    engine.submit_command(cmd).await.expect("submit");
    // A resumed run whose plugins no longer handle `test.countdown`.
    let mut narrower = PhaseEnv::new();
    narrower
        .add_action("p", erase_action::<SetB, _>(SetBHandler))
        .expect("set_b");
    let resumed = PhaseEngine::new(engine.store().clone(), Arc::new(narrower));
    let orphans = resumed
        .dead_letter_unhandled("handler gone after resume")
        .expect("dead letters");
    assert_eq!(orphans.len(), 1);
    assert_eq!(orphans[0].action.key, Countdown::KEY);
    let rest = resumed
        .dead_letter_remaining("run ended")
        .expect("dead letters");
    assert_eq!(
        rest.iter()
            .map(|d| (d.action.key.as_str(), d.reason.as_str()))
            .collect::<Vec<_>>(),
        vec![(SetB::KEY, "run ended")]
    );
    assert!(
        resumed
            .dead_letter_remaining("again")
            .expect("nothing left")
            .is_empty()
    );
    let letters = engine
        .store()
        .snapshot()
        .get::<DeadLettersKey>()
        .expect("letters")
        .len();
    assert_eq!(letters, 2);
}

/// The queue update that schedules `SetB(value)` for `StepEnd`.
fn enqueue_step_end(value: i64) -> QueueUpdate {
    QueueUpdate::Enqueue {
        actions: vec![(
            "step_end".into(),
            SetB::KEY.into(),
            serde_json::json!(value),
        )],
    }
}

/// Runs `StepEnd` (its queued actions), then says whether the phase is idle again.
async fn step_end_then_idle(engine: &PhaseEngine) -> bool {
    engine
        .run_phase(&ctx(engine, Phase::StepEnd))
        .await
        .expect("phase");
    engine.is_idle(Phase::StepEnd)
}

#[tokio::test]
async fn a_phase_is_idle_only_while_nothing_is_queued_for_it_however_the_queue_was_written() {
    let engine = engine(env());
    // Nothing queued: idle, asked twice at one revision (the second answer is the remembered
    // one) and again after an unrelated change.
    assert!(engine.is_idle(Phase::StepEnd));
    assert!(engine.is_idle(Phase::StepEnd));
    engine
        .store()
        .update::<Counter>(1)
        .expect("unrelated change");
    assert!(engine.is_idle(Phase::StepEnd));
    // Through the engine: an action for `StepEnd` makes that phase busy, not another one.
    let mut cmd = StateCommand::new();
    cmd.schedule_action::<SetB>(7).expect("schedule");
    engine.submit_command(cmd).await.expect("submit");
    assert!(!engine.is_idle(Phase::StepEnd));
    assert!(engine.is_idle(Phase::BeforeInference));
    // An idle answer for another phase, with the queue not empty, is not remembered.
    assert!(!engine.is_idle(Phase::StepEnd));
    assert!(step_end_then_idle(&engine).await);
    // Past the engine: a queue written straight into the store (a typed update in place, then
    // a command) is seen at once, though the queue was last seen empty.
    engine
        .store()
        .update::<ActionQueueKey>(enqueue_step_end(3))
        .expect("enqueue in place");
    assert!(!engine.is_idle(Phase::StepEnd));
    assert!(step_end_then_idle(&engine).await);
    engine
        .store()
        .commit(StateCommand::new().with_update::<ActionQueueKey>(enqueue_step_end(4)))
        .expect("enqueue by command");
    assert!(!engine.is_idle(Phase::StepEnd));
    assert_eq!(
        engine.store().revision(),
        engine.store().snapshot().revision()
    );
}

#[tokio::test]
async fn the_engines_own_typed_updates_keep_an_empty_queue_known_and_a_queued_action_seen() {
    let engine = engine(env());
    assert!(engine.is_idle(Phase::StepEnd));
    // Updates of another key through the engine: each one revision on, the queue still empty.
    for n in 1..=3 {
        let before = engine.store().revision();
        let revision = engine.update::<Counter>(n).expect("update");
        assert_eq!(revision, before + 1);
        assert_eq!(revision, engine.store().revision());
        assert!(engine.is_idle(Phase::StepEnd));
    }
    assert_eq!(
        *engine.store().snapshot().get::<Counter>().expect("counter"),
        6
    );
    // An action queued between two of them (by a command past the engine) is seen after both.
    engine
        .store()
        .commit(StateCommand::new().with_update::<ActionQueueKey>(enqueue_step_end(5)))
        .expect("enqueue by command");
    engine.update::<Counter>(1).expect("update");
    assert!(!engine.is_idle(Phase::StepEnd));
    engine.update::<Counter>(1).expect("update");
    assert!(!engine.is_idle(Phase::StepEnd));
    assert!(step_end_then_idle(&engine).await);
    // The queue itself, written through the engine's update: seen at once.
    engine
        .update::<ActionQueueKey>(enqueue_step_end(6))
        .expect("enqueue through the engine");
    assert!(!engine.is_idle(Phase::StepEnd));
    assert!(step_end_then_idle(&engine).await);
    // Through a handle: the same revision steps, the same queue seen.
    let counter = engine
        .store()
        .registry()
        .handle::<Counter>()
        .expect("registered");
    let queue = engine
        .store()
        .registry()
        .handle::<ActionQueueKey>()
        .expect("registered");
    let before = engine.store().revision();
    assert_eq!(engine.update_by(counter, 1).expect("update"), before + 1);
    assert!(engine.is_idle(Phase::StepEnd));
    engine
        .update_by(queue, enqueue_step_end(7))
        .expect("enqueue through a handle");
    assert!(!engine.is_idle(Phase::StepEnd));
    assert!(step_end_then_idle(&engine).await);
}
