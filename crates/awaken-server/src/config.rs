//! [`ServerConfig`]: the server's limits, its token and its CORS origins.

use std::time::Duration;

/// How the server admits requests and keeps live runs (its `Debug` form hides the token).
#[derive(Clone)]
pub struct ServerConfig {
    /// The bearer token every `/v1` request must carry (`Authorization: Bearer …`); `None`:
    /// no authentication (allowed on a loopback address, or with `insecure_no_auth`).
    pub auth_token: Option<String>,
    /// The agent a run that names none gets (`None`: the server's only agent, else the request
    /// must name one).
    pub default_agent: Option<String>,
    /// Serve without a token on an address other than loopback.
    pub insecure_no_auth: bool,
    /// The largest request body, in bytes (larger: 413).
    pub max_body_bytes: usize,
    /// The largest total size of a request's headers, in bytes (larger: 431).
    pub max_header_bytes: usize,
    /// At most this many runs in flight in this server at once (more: 503 with
    /// `Retry-After`).
    pub max_runs_in_flight: usize,
    /// What a refused start is told to wait before trying again.
    pub retry_after: Duration,
    /// Committed events a live run keeps for clients that attach late or reconnect (the
    /// oldest go first; the frames since the last commit are all kept, as the store cannot
    /// give them back); a client further behind reads the stored events.
    pub replay_events: usize,
    /// Events a live run's broadcast holds for a client that reads slower than the run writes;
    /// a client further behind catches up from the replay buffer or the store.
    pub broadcast_capacity: usize,
    /// How long a finished run's events stay in memory for a client that reconnects (after
    /// that, the stored events answer alone).
    pub finished_linger: Duration,
    /// At most this many ended runs are kept in memory for reconnecting clients (the oldest go
    /// first).
    pub max_lingering: usize,
    /// How often an idle stream sends a keep-alive comment.
    pub keep_alive: Duration,
    /// How long a stream answering a cancel waits for the run to end.
    pub cancel_wait: Duration,
    /// Origins allowed by CORS (`*` allows any); empty: no CORS headers.
    pub cors_origins: Vec<String>,
    /// Serve the chat page at `/` (its API calls need the token like any other client's).
    pub chat_page: bool,
    /// On shutdown, how long runs in flight get to end by themselves before they are stopped
    /// at their last checkpoint.
    pub shutdown_grace: Duration,
    /// The worker id recovery claims unfinished runs under.
    pub worker_id: String,
    /// How long a recovered run's lease lasts without a heartbeat.
    pub lease_duration: Duration,
    /// How often the server looks for unfinished runs whose process went away.
    pub recover_interval: Duration,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Every field named, so a new one cannot be left out unseen.
        let Self {
            auth_token,
            default_agent,
            insecure_no_auth,
            max_body_bytes,
            max_header_bytes,
            max_runs_in_flight,
            retry_after,
            replay_events,
            broadcast_capacity,
            finished_linger,
            max_lingering,
            keep_alive,
            cancel_wait,
            cors_origins,
            chat_page,
            shutdown_grace,
            worker_id,
            lease_duration,
            recover_interval,
        } = self;
        f.debug_struct("ServerConfig")
            .field("auth_token", &auth_token.as_ref().map(|_| "<redacted>"))
            .field("default_agent", default_agent)
            .field("insecure_no_auth", insecure_no_auth)
            .field("max_body_bytes", max_body_bytes)
            .field("max_header_bytes", max_header_bytes)
            .field("max_runs_in_flight", max_runs_in_flight)
            .field("retry_after", retry_after)
            .field("replay_events", replay_events)
            .field("broadcast_capacity", broadcast_capacity)
            .field("finished_linger", finished_linger)
            .field("max_lingering", max_lingering)
            .field("keep_alive", keep_alive)
            .field("cancel_wait", cancel_wait)
            .field("cors_origins", cors_origins)
            .field("chat_page", chat_page)
            .field("shutdown_grace", shutdown_grace)
            .field("worker_id", worker_id)
            .field("lease_duration", lease_duration)
            .field("recover_interval", recover_interval)
            .finish()
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            auth_token: None,
            default_agent: None,
            insecure_no_auth: false,
            max_body_bytes: 1 << 20,
            max_header_bytes: 16 << 10,
            max_runs_in_flight: 1024,
            retry_after: Duration::from_secs(1),
            replay_events: 4096,
            broadcast_capacity: 32,
            finished_linger: Duration::from_secs(60),
            max_lingering: 1024,
            keep_alive: Duration::from_secs(15),
            cancel_wait: Duration::from_secs(30),
            cors_origins: Vec::new(),
            chat_page: true,
            shutdown_grace: Duration::from_secs(10),
            worker_id: awaken_runtime::process_worker_id("awaken-server"),
            lease_duration: Duration::from_secs(30),
            recover_interval: Duration::from_secs(10),
        }
    }
}

impl ServerConfig {
    /// Requires `token` on every `/v1` request.
    pub fn with_auth_token(mut self, token: impl Into<String>) -> Self {
        self.auth_token = Some(token.into());
        self
    }

    /// Sets the agent of runs that name none.
    pub fn with_default_agent(mut self, agent: impl Into<String>) -> Self {
        self.default_agent = Some(agent.into());
        self
    }

    /// Sets the limit of runs in flight.
    pub fn with_max_runs_in_flight(mut self, limit: usize) -> Self {
        self.max_runs_in_flight = limit;
        self
    }

    /// Sets the largest request body.
    pub fn with_max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    /// Sets the origins CORS allows.
    pub fn with_cors_origins(mut self, origins: impl IntoIterator<Item = String>) -> Self {
        self.cors_origins = origins.into_iter().collect();
        self
    }

    /// Sets the worker id and lease duration of recovered runs.
    pub fn with_worker(mut self, worker_id: impl Into<String>, lease: Duration) -> Self {
        self.worker_id = worker_id.into();
        self.lease_duration = lease;
        self
    }

    /// Turns the chat page at `/` on or off.
    pub fn with_chat_page(mut self, on: bool) -> Self {
        self.chat_page = on;
        self
    }

    /// Sets the shutdown grace period.
    pub fn with_shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }
}
