//! Lifecycle hooks: plugin order, failures and timeouts counted, never stopping the others.

use std::sync::Arc;
use std::time::Duration;

use awaken_event::{RunId, TerminationReason, ThreadId};
use awaken_phase::RunIdentity;
use awaken_plugin::*;

use crate::support::*;

fn run() -> RunLifecycle {
    RunLifecycle {
        run: Arc::new(RunIdentity {
            thread_id: ThreadId::new("t").expect("id"),
            run_id: RunId::new("r").expect("id"),
            agent_id: "a".into(),
            profile_id: None,
        }),
        resumed: false,
        parent_run_id: None,
    }
}

/// A test plugin writing its calls to `log`.
fn logging(id: &str, log: &Log) -> TestPlugin {
    let mut p = TestPlugin::new(id);
    p.log = log.clone();
    p
}

/// Dispatches a run's start, then its natural end.
async fn start_and_complete(dispatcher: &LifecycleDispatcher, plugins: &[Arc<dyn Plugin>]) {
    let run = run();
    dispatcher
        .dispatch(plugins, LifecycleEvent::RunStart(&run))
        .await;
    dispatcher
        .dispatch(
            plugins,
            LifecycleEvent::RunComplete(&run, &TerminationReason::NaturalEnd),
        )
        .await;
}

#[tokio::test(start_paused = true)]
async fn hooks_run_in_order_and_failures_and_timeouts_are_counted() {
    let log = Log::default();
    let plugin = |id: &str, how: Behaviour| {
        let mut p = logging(id, &log);
        p.lifecycle = how;
        p.arc()
    };
    let plugins = vec![
        plugin("first", Behaviour::Ok),
        plugin("failing", Behaviour::Fail),
        plugin("hanging", Behaviour::Hang),
        plugin("last", Behaviour::Ok),
    ];
    let dispatcher = LifecycleDispatcher::new(Duration::from_secs(2));
    start_and_complete(&dispatcher, &plugins).await;
    assert_eq!(
        log.lines(),
        vec![
            "first on_run_start",
            "failing on_run_start",
            "hanging on_run_start",
            "last on_run_start",
            "first on_run_complete(natural_end)",
            "failing on_run_complete(natural_end)",
            "hanging on_run_complete(natural_end)",
            "last on_run_complete(natural_end)",
        ]
    );
    let s = dispatcher.stats("failing", LifecycleHook::RunStart);
    assert_eq!((s.calls, s.failures, s.timeouts), (1, 1, 0));
    let s = dispatcher.stats("hanging", LifecycleHook::RunComplete);
    assert_eq!((s.calls, s.failures, s.timeouts), (1, 0, 1));
    assert!(
        s.total_time >= Duration::from_secs(2),
        "the timeout elapsed on the paused clock: {:?}",
        s.total_time
    );
    let s = dispatcher.stats("last", LifecycleHook::RunStart);
    assert_eq!((s.calls, s.failures, s.timeouts), (1, 0, 0));
    assert_eq!(dispatcher.all_stats().len(), 8);
}

#[tokio::test]
async fn default_hooks_are_no_ops_that_count_as_calls() {
    let plugins = vec![TestPlugin::new("quiet").arc()];
    let dispatcher = LifecycleDispatcher::default();
    dispatcher
        .dispatch(&plugins, LifecycleEvent::RuntimeStart)
        .await;
    dispatcher
        .dispatch(&plugins, LifecycleEvent::RuntimeShutdown)
        .await;
    assert_eq!(
        dispatcher.stats("quiet", LifecycleHook::RuntimeStart).calls,
        1
    );
    assert_eq!(
        dispatcher
            .stats("quiet", LifecycleHook::RuntimeShutdown)
            .failures,
        0
    );
}

#[tokio::test]
async fn only_the_plugins_implementing_a_hook_are_called_and_counted() {
    let log = Log::default();
    let plugin = |id: &str, hooks: LifecycleHooks| {
        let mut p = logging(id, &log);
        p.hooks = hooks;
        p.arc()
    };
    let plugins = vec![
        plugin("none", LifecycleHooks::NONE),
        plugin("end", LifecycleHooks::of(&[LifecycleHook::RunComplete])),
        plugin("all", LifecycleHooks::ALL),
    ];
    let dispatcher = LifecycleDispatcher::default();
    start_and_complete(&dispatcher, &plugins).await;
    assert_eq!(
        log.lines(),
        vec![
            "all on_run_start",
            "end on_run_complete(natural_end)",
            "all on_run_complete(natural_end)",
        ]
    );
    let calls = |id, hook| dispatcher.stats(id, hook).calls;
    assert_eq!(calls("none", LifecycleHook::RunStart), 0);
    assert_eq!(calls("none", LifecycleHook::RunComplete), 0);
    assert_eq!(calls("end", LifecycleHook::RunStart), 0);
    assert_eq!(calls("end", LifecycleHook::RunComplete), 1);
    assert_eq!(calls("all", LifecycleHook::RunStart), 1);
    // A dispatch no plugin implements calls nothing and counts nothing.
    let quiet = LifecycleDispatcher::default();
    quiet
        .dispatch(&plugins[..2], LifecycleEvent::RunStart(&run()))
        .await;
    assert!(quiet.all_stats().is_empty());
}

#[test]
fn a_hook_set_holds_exactly_its_hooks() {
    let set = LifecycleHooks::of(&[LifecycleHook::RunStart, LifecycleHook::DelegateReturnError]);
    for hook in LifecycleHook::ALL {
        let expected = matches!(
            hook,
            LifecycleHook::RunStart | LifecycleHook::DelegateReturnError
        );
        assert_eq!(set.contains(hook), expected, "{}", hook.as_str());
        assert!(LifecycleHooks::ALL.contains(hook));
        assert!(!LifecycleHooks::NONE.contains(hook));
    }
}

#[test]
fn every_hook_is_listed_once_at_its_own_index() {
    for (i, hook) in LifecycleHook::ALL.iter().enumerate() {
        assert_eq!(*hook as usize, i, "{}", hook.as_str());
    }
    let names: std::collections::BTreeSet<&str> =
        LifecycleHook::ALL.iter().map(|h| h.as_str()).collect();
    assert_eq!(names.len(), LifecycleHook::ALL.len());
}

#[tokio::test]
async fn a_timeout_too_long_to_add_means_no_timeout() {
    let plugins = vec![TestPlugin::new("quiet").arc()];
    let dispatcher = LifecycleDispatcher::new(Duration::MAX);
    dispatcher
        .dispatch(&plugins, LifecycleEvent::RuntimeStart)
        .await;
    let s = dispatcher.stats("quiet", LifecycleHook::RuntimeStart);
    assert_eq!((s.calls, s.failures, s.timeouts), (1, 0, 0));
}
