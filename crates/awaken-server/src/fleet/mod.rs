//! The fleet: front ends that queue their runs in PostgreSQL ([`AgentServer::queued`]) and
//! [`Worker`]s that claim and drive them, any number of each on one database.
//!
//! A front end validates a request as it would for a run of its own, enqueues the activation
//! as a job (the run's id chosen there, so whoever drives it drives that run), and follows the
//! thread's stored events into a live run of its own: its clients get the same streams, ids and
//! reconnection as for a run in process (stored events only; the text deltas stay on the
//! worker). A worker claims jobs under a lease, drives each through its runtime, announces the
//! commits to the front ends, and ends the job in the queue; a job whose worker stopped is
//! claimed again once its lease expires and continued from its run's last checkpoint.
//!
//! [`AgentServer::queued`]: crate::AgentServer::queued

mod announce;
pub(crate) mod front;
mod job;
pub(crate) mod queued;
mod steer;
mod worker;

pub(crate) use front::live_or_follow;
pub use queued::QueueConfig;
pub use worker::{Worker, WorkerConfig, WorkerError, WorkerReport};
