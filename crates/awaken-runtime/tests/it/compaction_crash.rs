//! Compaction and crashes: a child process (this test binary, re-run on one test) drives an
//! agent with a context policy against SQLite and is killed with SIGKILL inside its one
//! compaction — after the summariser answered but before the summary is committed
//! (`compaction_summarized`, awaken-context's failpoint), or right after the commit that
//! carries it (`after_compaction_commit`, the runtime's) — after writing a marker proving it
//! got there; then a fresh runtime in this process recovers the run.
//!
//! Both models answer from what they are sent, so a recovery gets the same answers wherever
//! the crash was: the agent's model reads the step number of the newest `echo` result (the
//! newest unit is always sent) and calls `echo` for the next step until [`STEPS`] results are
//! in; the summary model reads the range from the transcript's message numbers and appends
//! `<who> <from>..<to>` to `summaries.log` in the test's folder before answering, so the calls
//! of both processes are counted in one place.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use awaken_context::{CompactionKey, CompactionState};
use awaken_event::{Message, Role, TerminationReason, ThreadId};
use awaken_llm::{InferenceRequest, LlmEventStream, LlmExecutor};
use awaken_runtime::{AgentRuntime, RunActivation, SequentialIds};
use awaken_spec::{AgentSpec, ContextPolicy, ModelSpec};
use awaken_state::StateKey;
use awaken_store::{SqliteConfig, SqliteStore, ThreadStore};

use crate::support::{
    Echo, TestDir, append_line, call_answer, fresh_dir, kill_child_at, lines, recover_the_run,
    text_answer,
};

/// The `echo` results the agent collects before it answers. The budget below makes the run
/// compact once, at step [`COMPACTION_STEP`], over messages [`RANGE`], and never again before
/// it ends (checked on the uninterrupted reference run).
const STEPS: usize = 40;

/// The step whose `BeforeInference` compacts.
const COMPACTION_STEP: usize = 26;

/// The range that compaction summarises: the user message and the first 21 steps.
const RANGE: &str = "0..43";

/// The messages in the store when step [`COMPACTION_STEP`] begins: the user message and two
/// per earlier step.
const BEFORE_COMPACTION_STEP: usize = 1 + 2 * (COMPACTION_STEP - 1);

/// Calls `echo` for the step after the newest result's, until [`STEPS`] are in; then answers.
struct StepModel;

/// The step number in an `echo` result (`{"echoed":"step 0007"}`).
fn step_of(result: &Message) -> Option<usize> {
    let text = result.content_as_text();
    text.split("step ").nth(1)?.get(..4)?.parse().ok()
}

impl LlmExecutor for StepModel {
    fn name(&self) -> &str {
        "step-model"
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        let done = request
            .messages
            .iter()
            .rev()
            .find(|m| m.role == Role::Tool)
            .and_then(step_of)
            .unwrap_or(0);
        if done < STEPS {
            let next = done + 1;
            call_answer(
                &format!("c{next}"),
                "echo",
                format!("{{\"text\":\"step {next:04}\"}}"),
            )
        } else {
            text_answer("done")
        }
    }
}

/// Summarises by naming the range: `summary of messages <from>..<to>`, read from the
/// transcript's message numbers (`[n] role: ...`, n counted from 1); logs each call as
/// `<who> <from>..<to>` to `log` (synced before it answers, so a kill after it keeps it).
struct SummaryModel {
    who: &'static str,
    log: PathBuf,
}

/// `<from>..<to>` of a summary request.
fn range_of(request: &InferenceRequest) -> String {
    let transcript = request
        .messages
        .last()
        .map(Message::text)
        .unwrap_or_default();
    let numbers: Vec<usize> = transcript
        .lines()
        .filter_map(|l| l.strip_prefix('[')?.split_once(']')?.0.parse().ok())
        .collect();
    let first = numbers.first().copied().unwrap_or(1);
    let last = numbers.last().copied().unwrap_or(0);
    format!("{}..{last}", first.saturating_sub(1))
}

impl LlmExecutor for SummaryModel {
    fn name(&self) -> &str {
        "summary-model"
    }

    fn execute_stream(&self, request: InferenceRequest) -> LlmEventStream {
        let range = range_of(&request);
        append_line(&self.log, &format!("{} {range}", self.who));
        text_answer(format!("summary of messages {range}"))
    }
}

fn thread() -> ThreadId {
    ThreadId::new("t").expect("id")
}

/// The agent on SQLite in `dir`, its summaries logged as `who`.
async fn runtime(dir: &Path, who: &'static str) -> AgentRuntime {
    let store: Arc<dyn ThreadStore> = Arc::new(
        SqliteStore::open(SqliteConfig::file(dir.join("threads.db")))
            .await
            .expect("sqlite"),
    );
    let mut spec = AgentSpec::new("agent", "model")
        .with_system_prompt("Be brief.")
        .with_context_policy(ContextPolicy {
            budget_tokens: Some(1_500),
            compaction_threshold: Some(0.5),
            summary_model: Some("summarizer".into()),
            ..ContextPolicy::default()
        });
    spec.max_rounds = 2 * STEPS as u32;
    AgentRuntime::builder()
        .with_ids(Arc::new(SequentialIds::default()))
        .with_store(store)
        .with_model(ModelSpec::new("model", "steps", "upstream"))
        .with_provider("steps", Arc::new(StepModel))
        .with_model(ModelSpec::new("summarizer", "summaries", "small"))
        .with_provider(
            "summaries",
            Arc::new(SummaryModel {
                who,
                log: dir.join("summaries.log"),
            }),
        )
        .with_tool(Arc::new(Echo))
        .with_agent_spec(spec)
        .build()
        .expect("runtime")
}

/// The thread's compaction state in the store (default when the key was never committed).
async fn stored_compaction(store: &dyn ThreadStore) -> CompactionState {
    let checkpoint = store
        .load_checkpoint(&thread())
        .await
        .expect("store")
        .expect("thread");
    checkpoint
        .thread_state
        .values
        .get(CompactionKey::KEY)
        .map(|v| serde_json::from_value(v.clone()).expect("compaction state"))
        .unwrap_or_default()
}

/// The child: runs the agent until a failpoint kills it. In the parent's test run (without
/// `AWAKEN_COMPACTION_CRASH_DIR`) it has nothing to do.
#[tokio::test]
async fn compaction_crash_child() {
    let Some(dir) = std::env::var_os("AWAKEN_COMPACTION_CRASH_DIR") else {
        return;
    };
    let rt = runtime(Path::new(&dir), "child").await;
    let outcome = rt
        .run_to_completion(RunActivation::new(thread(), "agent").with_user_message("go"))
        .await;
    panic!("the failpoint should have killed this process; the run ended: {outcome:?}");
}

/// What the tests compare: the history, the stored compaction state, the summary calls.
struct Thread {
    history: Vec<Message>,
    compaction: CompactionState,
    summaries: Vec<String>,
}

impl Thread {
    /// The thread of `rt`, whose folder is `dir`.
    async fn of(rt: &AgentRuntime, dir: &Path) -> Self {
        Thread {
            history: rt.history(&thread()).await.expect("history"),
            compaction: stored_compaction(rt.store().as_ref()).await,
            summaries: lines(&dir.join("summaries.log")),
        }
    }
}

/// The same agent, uninterrupted (in a folder of its own, named `name`).
async fn reference(name: &str) -> Thread {
    let dir = fresh_dir(&format!("compaction-{name}"));
    let rt = runtime(&dir, "reference").await;
    let outcome = rt
        .run_to_completion(RunActivation::new(thread(), "agent").with_user_message("go"))
        .await
        .expect("run");
    assert_eq!(outcome.termination, TerminationReason::NaturalEnd);
    Thread::of(&rt, &dir).await
}

/// Kills a child at `at`; returns the folder, and the compaction state and the number of
/// messages the crash left in the store.
async fn crash(at: &str) -> (TestDir, CompactionState, usize) {
    let dir = fresh_dir(&format!("compaction-{at}"));
    kill_child_at(
        "compaction_crash::compaction_crash_child",
        "AWAKEN_COMPACTION_CRASH_DIR",
        &dir,
        at,
    );
    let store = SqliteStore::open(SqliteConfig::file(dir.join("threads.db")))
        .await
        .expect("sqlite");
    let left = stored_compaction(&store).await;
    let messages = store
        .load_checkpoint(&thread())
        .await
        .expect("store")
        .expect("thread")
        .messages
        .len();
    (dir, left, messages)
}

/// Recovers the run in `dir` here, to its natural end; returns the thread.
async fn recover(dir: &Path) -> Thread {
    let rt = runtime(dir, "parent").await;
    recover_the_run(&rt).await;
    Thread::of(&rt, dir).await
}

/// The reference compacts exactly once, at [`COMPACTION_STEP`], over [`RANGE`]: what the
/// crash tests count against.
fn check_reference(reference: &Thread) {
    assert_eq!(reference.summaries, [format!("reference {RANGE}")]);
    assert_eq!(
        reference.compaction,
        CompactionState {
            summary: Some(format!("summary of messages {RANGE}")),
            covers: 43,
            summaries: 1,
            ..CompactionState::default()
        }
    );
    assert_eq!(reference.history.len(), 1 + 2 * STEPS + 1);
}

/// Killed after the summariser answered, before anything of the summary was committed: the
/// store holds no summary, and the recovery compacts again, exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_summary_before_its_commit_leaves_none_and_compacts_again_once() {
    let reference = reference("reference-before").await;
    check_reference(&reference);
    let (dir, left, messages) = crash("compaction_summarized").await;
    // The child's summariser answered, in step `COMPACTION_STEP`, and nothing of it reached
    // the store: the last commit is the step before's end.
    assert_eq!(
        lines(&dir.join("summaries.log")),
        [format!("child {RANGE}")]
    );
    assert_eq!(messages, BEFORE_COMPACTION_STEP);
    assert_eq!(left, CompactionState::default());

    let recovered = recover(&dir).await;
    // Compaction ran again, exactly once, over the same range as the child's (the thread
    // keeps the tokens of the system prompt and tools, so the recovered process plans it in
    // the same step), and the thread ends in the uninterrupted run's compaction state.
    assert_eq!(
        recovered.summaries,
        [format!("child {RANGE}"), format!("parent {RANGE}")]
    );
    let parent_calls = recovered
        .summaries
        .iter()
        .filter(|l| l.starts_with("parent "))
        .count();
    assert_eq!(recovered.compaction.summaries as usize, parent_calls);
    assert_eq!(recovered.compaction, reference.compaction);
    // No message lost or duplicated.
    assert_eq!(recovered.history, reference.history);
}

/// Killed right after the commit that carries the summary: the store holds exactly that one
/// summary, and the recovery never summarises again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_summary_commit_keeps_that_one_summary_and_never_summarises_again() {
    let reference = reference("reference-after").await;
    check_reference(&reference);
    let (dir, left, messages) = crash("after_compaction_commit").await;
    // The summary went in with step `COMPACTION_STEP`'s next commit: its call, `Requested`.
    assert_eq!(
        lines(&dir.join("summaries.log")),
        [format!("child {RANGE}")]
    );
    assert_eq!(messages, BEFORE_COMPACTION_STEP + 1);
    assert_eq!(
        left, reference.compaction,
        "exactly the child's one summary"
    );

    let recovered = recover(&dir).await;
    // The child's call is the only one: the recovery did not summarise again.
    assert_eq!(recovered.summaries, [format!("child {RANGE}")]);
    assert_eq!(recovered.compaction, left);
    // No message lost or duplicated.
    assert_eq!(recovered.history, reference.history);
}
