//! An activation from its request to its outcome: what it starts from (`start`), the stored
//! thread loaded and its latest run classified (`load`), a new run, a resume or a recovery
//! decided on (`decide`), and the run built (`build`), which `Run::run_to_end` then drives.

use awaken_event::EventSink;
use tracing::Instrument;

use crate::error::RunError;
use crate::inner::RuntimeInner;
use crate::outcome::RunOutcome;

mod build;
mod decide;
mod load;
mod start;

use build::{Built, build};
pub(crate) use start::{Start, Unfinished};

/// Runs an activation from `start` to its outcome, streaming its events to `sink`. Not an
/// `async fn`: what it starts from is boxed before the future is made, so the run's future
/// keeps a pointer to it, not the request itself. The span and the active-run entry are made
/// when the future is first polled, as an `async fn` would.
pub(crate) fn activate<'a>(
    rt: &'a RuntimeInner,
    start: Start,
    sink: &'a dyn EventSink,
) -> impl Future<Output = Result<RunOutcome, RunError>> + Send + 'a {
    let start = Box::new(start);
    async move {
        let span = start.span();
        // Closed whichever way the activation ends (a refusal, an endpoint-backed agent, the
        // run's end): no steering message waits for a run that is gone.
        let steering = start.steering().clone();
        let Some(_active) = rt.active.enter(start.cancel()) else {
            steering.close();
            return Err(RunError::ShuttingDown);
        };
        let ended = async move {
            let (run, opening) = match build(rt, start, sink).await? {
                Built::Done(outcome) => return Ok(outcome),
                Built::Run(run, opening) => (run, opening),
            };
            run.run_to_end(rt, opening).await
        }
        .instrument(span)
        .await;
        steering.close();
        ended
    }
}
