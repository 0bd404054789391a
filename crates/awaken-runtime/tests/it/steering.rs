//! Steering a run in flight: a message sent while a tool runs is committed at the next step,
//! before the inference that sees it; one waiting when the model answers without calls keeps
//! the run going for another step; one the run cannot take any more is refused, never dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use awaken_event::{
    AgentEvent, Message, Role, TerminationReason, ThreadId, ToolDescriptor, check_activation,
};
use awaken_llm::{ScriptToolCall, ScriptTurn};
use awaken_runtime::{NotTaken, RunError, RunStats, Steering, SteeringReceipt, Taken};
use awaken_store::{
    MemoryStore, PostgresConfig, PostgresStore, SqliteConfig, SqliteStore, StoreError, ThreadStore,
};
use awaken_tool::{Tool, ToolCallContext, ToolError, ToolOutput};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::interrupted::strictly_alternating;
use crate::support::{Intercepted, Scenario, render};

/// What a steering message's sender was told, once it was.
type Answer = Arc<Mutex<Option<JoinHandle<Result<Taken, NotTaken>>>>>;

/// Sends `text` to `steering` on a task of its own, keeping its answer in `answer`.
fn send(steering: &Steering, text: &str, answer: &Answer) {
    let sent = tokio::spawn(steering.send(Message::user(text)));
    *answer.lock().expect("answer") = Some(sent);
}

/// [`send`] with the receipt `41`.
fn send_with_receipt(steering: &Steering, text: &str, answer: &Answer) {
    let sent = tokio::spawn(steering.send_with_receipt(Message::user(text), "41"));
    *answer.lock().expect("answer") = Some(sent);
}

async fn answer_of(answer: &Answer) -> Result<Taken, NotTaken> {
    let sent = answer
        .lock()
        .expect("answer")
        .take()
        .expect("a message was sent");
    sent.await.expect("the sender's task")
}

/// `steer`: sends the message "Also buy eggs." (receipt `41`) to the run's steering while it
/// runs.
struct Steers(Steering, Answer);

#[async_trait]
impl Tool for Steers {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new("steer", "Steers the run while it runs")
    }
    async fn execute(
        &self,
        _args: &Value,
        _ctx: &ToolCallContext,
    ) -> Result<ToolOutput, ToolError> {
        send_with_receipt(&self.0, "Also buy eggs.", &self.1);
        Ok(ToolOutput::success(json!({"steered": true})))
    }
}

fn thread() -> ThreadId {
    ThreadId::new("thread").expect("id")
}

fn texts(messages: &[Message]) -> Vec<(Role, String)> {
    messages.iter().map(|m| (m.role, m.text())).collect()
}

/// A message sent while a tool runs, on `store`: taken at the next step.
async fn taken_at_the_next_step(store: Arc<dyn ThreadStore>) {
    let steering = Steering::new();
    let answer = Answer::default();
    let mut scenario = Scenario::new(vec![
        ScriptTurn::default().with_tool_call(ScriptToolCall::new("steer", json!({})).with_id("c1")),
        ScriptTurn::text("Noted: milk and eggs."),
    ]);
    scenario
        .tools
        .push(Arc::new(Steers(steering.clone(), answer.clone())));
    let inbox = steering.clone();
    let done = scenario
        .store(store)
        .activation(move |a| a.with_steering(inbox))
        .run()
        .await;
    assert_eq!(done.outcome.termination, TerminationReason::NaturalEnd);
    assert_eq!(answer_of(&answer).await, Ok(Taken { step: 2 }));

    // The second request ends with the message, after the call's result, and is one the
    // strictest providers accept.
    let requests = done.executor.requests();
    assert_eq!(requests.len(), 2);
    let second = requests[1].messages.to_vec();
    assert_eq!(
        second.last().map(|m| (m.role, m.text())),
        Some((Role::User, "Also buy eggs.".to_owned()))
    );
    strictly_alternating(&second).expect("a request the strictest providers accept");
    // Stored in that order.
    let stored = done.runtime.history(&thread()).await.expect("history");
    let roles: Vec<Role> = stored.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::User,
            Role::Assistant
        ]
    );
    assert_eq!(texts(&stored)[3].1, "Also buy eggs.");
    // Its event comes between the steps, emitted and stored alike, and names the step.
    let added = |events: &[AgentEvent]| -> Vec<String> {
        events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    AgentEvent::MessageAdded { .. }
                        | AgentEvent::StepStart { .. }
                        | AgentEvent::StepEnd { .. }
                )
            })
            .map(|e| match e {
                AgentEvent::MessageAdded { step, message } => {
                    format!("added {step}: {:?} {}", message.role, message.text())
                }
                other => other.type_name().to_owned(),
            })
            .collect()
    };
    let expected = [
        "step_start",
        "step_end",
        "added 2: User Also buy eggs.",
        "step_start",
        "step_end",
    ];
    assert_eq!(added(&done.events), expected);
    check_activation(&done.events).expect("the emitted events' grammar");
    let stored_events = crate::support::stored_events(&done.runtime, &thread()).await;
    assert_eq!(added(&stored_events), expected);
    check_activation(&stored_events).expect("the stored events' grammar");
    // Its receipt is stored with the run, with the step that took it.
    let checkpoint = done
        .runtime
        .store()
        .load_checkpoint(&thread())
        .await
        .expect("load")
        .expect("stored");
    let receipts = RunStats::of_stored(&checkpoint.run_state).steering_receipts;
    assert_eq!(
        receipts,
        [SteeringReceipt {
            receipt: "41".into(),
            step: 2
        }]
    );
    // The run is over: a later message is refused at once.
    assert_eq!(
        steering.send(Message::user("late")).await,
        Err(NotTaken::Ended)
    );
    assert!(steering.is_closed());
}

#[tokio::test]
async fn a_message_sent_while_a_tool_runs_is_taken_at_the_next_step() {
    taken_at_the_next_step(Arc::new(MemoryStore::new())).await;
}

#[tokio::test]
async fn a_message_is_taken_at_the_next_step_on_sqlite() {
    let dir = crate::support::fresh_dir("steering-sqlite");
    let store = SqliteStore::open(SqliteConfig::file(dir.join("threads.db")))
        .await
        .expect("sqlite");
    taken_at_the_next_step(Arc::new(store)).await;
}

#[tokio::test]
async fn a_message_is_taken_at_the_next_step_on_postgres() {
    let Some((url, schema)) = crate::leases::postgres_schema("steering") else {
        return;
    };
    let store = PostgresStore::connect(PostgresConfig::new(&url).with_schema(&schema))
        .await
        .expect("postgres");
    taken_at_the_next_step(Arc::new(store)).await;
}

#[tokio::test]
async fn a_message_whose_commits_fail_is_refused_and_not_announced() {
    let steering = Steering::new();
    let answer = Answer::default();
    let mut scenario = Scenario::new(vec![
        ScriptTurn::default().with_tool_call(ScriptToolCall::new("steer", json!({})).with_id("c1")),
        ScriptTurn::text("Noted."),
    ]);
    scenario
        .tools
        .push(Arc::new(Steers(steering.clone(), answer.clone())));
    // From the commit that would store the message on, every commit fails: the run's last
    // one too.
    let failing = AtomicBool::new(false);
    let store = Intercepted::new(Arc::new(MemoryStore::new()), move |commit| {
        if commit.messages.iter().any(|m| m.text() == "Also buy eggs.") {
            failing.store(true, Ordering::SeqCst);
        }
        if failing.load(Ordering::SeqCst) {
            return Err(StoreError::Task {
                detail: "the disk is gone".into(),
            }
            .into());
        }
        Ok(())
    });
    let inbox = steering.clone();
    let (result, events, _, _) = scenario
        .store(Arc::new(store))
        .activation(move |a| a.with_steering(inbox))
        .attempt()
        .await;
    assert!(
        matches!(result, Err(RunError::EndNotWritten { .. })),
        "{result:?}"
    );
    assert_eq!(answer_of(&answer).await, Err(NotTaken::Ended));
    // The run's end is shown, but no event says the message it never stored was added.
    assert!(
        matches!(events.last(), Some(AgentEvent::RunFinish { .. })),
        "{}",
        render(&events)
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, AgentEvent::MessageAdded { .. })),
        "{}",
        render(&events)
    );
}

/// Two text answers (`First.`, `Second.`), with "One more thing." sent to the run as the
/// first answer comes in (so it waits when the run would end), the run cancelled then too when
/// `cancel`; the outcome and the message's answer.
async fn steered_at_the_first_answer(
    max_rounds: Option<u32>,
    cancel: bool,
) -> (crate::support::Outcome, Result<Taken, NotTaken>) {
    let steering = Steering::new();
    let answer = Answer::default();
    let (inbox, sender, sent) = (steering.clone(), steering.clone(), answer.clone());
    let mut scenario = Scenario::new(vec![
        ScriptTurn::text("First."),
        ScriptTurn::text("Second."),
    ]);
    if let Some(n) = max_rounds {
        scenario = scenario.spec(|s| s.with_max_rounds(n));
    }
    let done = scenario
        .activation(move |a| a.with_steering(inbox))
        .cancel_when(move |event| {
            if matches!(event, AgentEvent::InferenceComplete { .. })
                && sent.lock().expect("answer").is_none()
            {
                send(&sender, "One more thing.", &sent);
                return cancel;
            }
            false
        })
        .run()
        .await;
    let taken = answer_of(&answer).await;
    (done, taken)
}

#[tokio::test]
async fn a_message_waiting_at_the_final_answer_keeps_the_run_going() {
    let (done, taken) = steered_at_the_first_answer(None, false).await;
    assert_eq!(done.outcome.termination, TerminationReason::NaturalEnd);
    assert_eq!(done.outcome.steps, 2);
    assert_eq!(done.outcome.response.as_deref(), Some("Second."));
    assert_eq!(taken, Ok(Taken { step: 2 }));
    let stored = done.runtime.history(&thread()).await.expect("history");
    assert_eq!(
        texts(&stored),
        [
            (Role::User, "hi".to_owned()),
            (Role::Assistant, "First.".to_owned()),
            (Role::User, "One more thing.".to_owned()),
            (Role::Assistant, "Second.".to_owned()),
        ]
    );
}

#[tokio::test]
async fn a_message_the_round_limit_leaves_no_step_for_is_refused() {
    let (done, taken) = steered_at_the_first_answer(Some(1), false).await;
    assert_eq!(done.outcome.termination, TerminationReason::NaturalEnd);
    assert_eq!(done.outcome.steps, 1);
    assert_eq!(taken, Err(NotTaken::Ended));
    let stored = done.runtime.history(&thread()).await.expect("history");
    assert_eq!(stored.len(), 2, "{:?}", texts(&stored));
}

#[tokio::test]
async fn a_run_cancelled_with_a_message_waiting_takes_none() {
    let (done, taken) = steered_at_the_first_answer(None, true).await;
    assert_eq!(done.outcome.steps, 1);
    assert_eq!(taken, Err(NotTaken::Ended));
    let stored = done.runtime.history(&thread()).await.expect("history");
    assert!(
        !stored.iter().any(|m| m.text() == "One more thing."),
        "{:?}",
        texts(&stored)
    );
}
