//! [`FleetListener`]: the run queue's notifications, heard on a connection of their own.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_postgres::{AsyncMessage, NoTls};

use super::queue::{FleetWake, JOBS_CHANNEL, RUNS_CHANNEL, RunQueue};

/// Which of the fleet's notifications a [`FleetListener`] hears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Hear {
    /// Jobs to claim, cancels and steering messages ([`FleetWake::Job`],
    /// [`FleetWake::Cancel`], [`FleetWake::Steer`]): a worker's.
    Jobs,
    /// Runs' new events and ends, and steering answers ([`FleetWake::Events`],
    /// [`FleetWake::Done`], [`FleetWake::Steered`]): a front end's.
    Runs,
    /// Both.
    All,
}

impl Hear {
    /// The statement that listens on its channels.
    fn statement(self) -> String {
        match self {
            Hear::Jobs => format!("LISTEN {JOBS_CHANNEL}"),
            Hear::Runs => format!("LISTEN {RUNS_CHANNEL}"),
            Hear::All => format!("LISTEN {JOBS_CHANNEL}; LISTEN {RUNS_CHANNEL}"),
        }
    }
}

impl RunQueue {
    /// Listens for the fleet's notifications that `hear` names on a connection of its own (reconnected when
    /// lost, with [`FleetWake::Lost`] after each reconnection), from when
    /// [`FleetListener::ready`] returns. The listening ends when the listener is dropped. The
    /// connection's `application_name` is `awaken-fleet-listener:` and the schema's name (to
    /// tell it among the database's connections). Must be called within a tokio runtime.
    pub fn listen(&self, hear: Hear) -> FleetListener {
        let (tx, rx) = mpsc::channel(LISTEN_BUFFER);
        let (ready_tx, ready) = watch::channel(false);
        let schema = self.pool.schema.clone().unwrap_or_default();
        let mut config = self.pool.config.clone();
        config.application_name(format!("{LISTENER_NAME}:{schema}"));
        tokio::spawn(listen_loop(config, hear, schema, tx, ready_tx));
        FleetListener { rx, ready }
    }
}

/// The `application_name` of listening connections (before a colon and the schema).
const LISTENER_NAME: &str = "awaken-fleet-listener";

/// Notifications held for a slow listener before they are dropped (and reported as `Lost`).
const LISTEN_BUFFER: usize = 1024;

/// The fleet's notifications, from [`RunQueue::listen`].
#[derive(Debug)]
pub struct FleetListener {
    rx: mpsc::Receiver<FleetWake>,
    ready: watch::Receiver<bool>,
}

impl FleetListener {
    /// Waits until the listener's connection listens: every notification sent from then on is
    /// received (or, if the connection is lost, stands behind a [`FleetWake::Lost`]). Waits
    /// through failed connection attempts; call it before the first look at the queue, so that
    /// nothing announced after that look is missed.
    pub async fn ready(&mut self) {
        // An error means the listening task is gone, which it is not while the receiver lives.
        let _ = self.ready.wait_for(|listening| *listening).await;
    }

    /// The next notification.
    pub async fn recv(&mut self) -> FleetWake {
        // The listening task only stops once this receiver is gone.
        self.rx.recv().await.unwrap_or(FleetWake::Lost)
    }
}

/// Connects, listens, forwards this schema's notifications to `tx`; on a lost connection
/// reconnects (100 ms doubling to 5 s) and sends `Lost`. Ends when `tx` is closed.
async fn listen_loop(
    config: tokio_postgres::Config,
    hear: Hear,
    schema: String,
    tx: mpsc::Sender<FleetWake>,
    ready: watch::Sender<bool>,
) {
    let mut backoff = Duration::from_millis(100);
    let mut first = true;
    while !tx.is_closed() {
        match listen_once(&config, hear, &schema, &tx, &ready, first).await {
            Ok(()) => backoff = Duration::from_millis(100),
            Err(e) => tracing::warn!(error = %e, "run queue: cannot listen; retrying"),
        }
        first = false;
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = tx.closed() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// One listening connection, until it is lost (`Ok`) or cannot be set up (`Err`).
async fn listen_once(
    config: &tokio_postgres::Config,
    hear: Hear,
    schema: &str,
    tx: &mpsc::Sender<FleetWake>,
    ready: &watch::Sender<bool>,
    first: bool,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(NoTls).await?;
    // The connection is polled on its own task (for the LISTEN to complete and notifications
    // to arrive), which hands notifications over and ends with the connection.
    let (ntx, mut nrx) = mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if ntx.send(n).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "run queue: the listening connection failed");
                    return;
                }
            }
        }
    });
    let _stop_driver = AbortOnDrop(driver);
    client.batch_execute(&hear.statement()).await?;
    ready.send_replace(true);
    let mut missed = false;
    if !first {
        tracing::info!("run queue: listening again after a lost connection");
        missed = forward(tx, true, FleetWake::Lost);
    }
    loop {
        let notification = tokio::select! {
            n = nrx.recv() => n,
            () = tx.closed() => return Ok(()),
        };
        let Some(n) = notification else {
            return Ok(());
        };
        let mut parts = n.payload().splitn(3, '\t');
        if let (Some(s), Some(kind), Some(thread)) = (parts.next(), parts.next(), parts.next())
            && s == schema
            && let Some(wake) = FleetWake::parse(kind, thread)
        {
            missed = forward(tx, missed, wake);
        }
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Sends `wake` (after a `Lost` when notifications were dropped before); whether some are
/// missed now.
fn forward(tx: &mpsc::Sender<FleetWake>, missed: bool, wake: FleetWake) -> bool {
    if missed && tx.try_send(FleetWake::Lost).is_err() {
        return true;
    }
    if wake == FleetWake::Lost {
        return false;
    }
    tx.try_send(wake).is_err()
}
