//! A client's Server-Sent Event stream of a thread: the stored events after its position,
//! the live run's buffered events, then the live ones as they come, each once and in order.
//! A client that falls behind the broadcast catches up the same way it would by reconnecting.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use awaken_event::{AgentEvent, CancellationToken, ThreadId};
use awaken_store::{StoreError, ThreadStore};
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use tokio::sync::broadcast;

use crate::live::{EventId, Frame, LiveRun, frame};

/// Turns a thread's event stream into a wire protocol's bytes: the native stream sends each
/// frame as it is; a protocol edge translates the frames' events.
pub(crate) trait Encoder: Send + Sync + 'static {
    /// The bytes for one event of the thread's log.
    fn frame(&mut self, frame: &Frame, out: &mut VecDeque<Bytes>);
    /// A notice outside the log (`lagged`, `shutdown`, `error`) with its JSON data.
    fn notice(&mut self, kind: &str, data: &serde_json::Value, out: &mut VecDeque<Bytes>);
    /// Once, when the stream ends: a last chunk such as `data: [DONE]`.
    fn end(&mut self, out: &mut VecDeque<Bytes>) {
        let _ = out;
    }
    /// Whether the stream is complete (checked after each frame and notice): then `end`, and
    /// nothing more.
    fn complete(&self) -> bool {
        false
    }
}

impl Encoder for Box<dyn Encoder> {
    fn frame(&mut self, frame: &Frame, out: &mut VecDeque<Bytes>) {
        (**self).frame(frame, out);
    }
    fn notice(&mut self, kind: &str, data: &serde_json::Value, out: &mut VecDeque<Bytes>) {
        (**self).notice(kind, data, out);
    }
    fn end(&mut self, out: &mut VecDeque<Bytes>) {
        (**self).end(out);
    }
    fn complete(&self) -> bool {
        (**self).complete()
    }
}

/// The native stream: each event's frame as it is (`id`, `event`, `data`).
pub(crate) struct Native;

impl Encoder for Native {
    fn frame(&mut self, frame: &Frame, out: &mut VecDeque<Bytes>) {
        out.push_back(frame.bytes.clone());
    }
    fn notice(&mut self, kind: &str, data: &serde_json::Value, out: &mut VecDeque<Bytes>) {
        out.push_back(notice(kind, data));
    }
}

/// What a stream needs besides its thread and position.
#[derive(Clone)]
pub(crate) struct StreamContext {
    pub(crate) store: Arc<dyn ThreadStore>,
    pub(crate) keep_alive: Duration,
    pub(crate) closing: CancellationToken,
}

/// The native stream of `thread_id` for a client positioned after `after` (`None`: from the
/// live run's activation start, or from the thread's first event when none is live).
pub(crate) async fn event_stream(
    ctx: StreamContext,
    thread_id: ThreadId,
    live: Option<Arc<LiveRun>>,
    after: Option<EventId>,
) -> Result<Response, StoreError> {
    encoded_stream(ctx, thread_id, live, after, Native).await
}

/// The stream of `thread_id` for a client positioned after `after`, as `encoder` writes it.
pub(crate) async fn encoded_stream<E: Encoder>(
    ctx: StreamContext,
    thread_id: ThreadId,
    live: Option<Arc<LiveRun>>,
    after: Option<EventId>,
    encoder: E,
) -> Result<Response, StoreError> {
    let keep_alive = ctx.keep_alive;
    let mut stream = EventStream {
        ctx,
        thread_id,
        live,
        queue: VecDeque::new(),
        last: after,
        rx: None,
        idle: Box::pin(tokio::time::sleep(keep_alive)),
        sent: false,
        encoder,
        ended: false,
    };
    stream.catch_up(after).await?;
    let body = Body::from_stream(futures_util::stream::unfold(stream, |mut s| async move {
        s.next().await.map(|bytes| (Ok::<_, Infallible>(bytes), s))
    }));
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Proxies that buffer responses would hold the events back.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

struct EventStream<E> {
    ctx: StreamContext,
    thread_id: ThreadId,
    live: Option<Arc<LiveRun>>,
    queue: VecDeque<Bytes>,
    /// The id of the last event queued.
    last: Option<EventId>,
    rx: Option<broadcast::Receiver<Frame>>,
    /// Ticks every `keep_alive`: a stream that sent nothing since the last tick sends a
    /// keep-alive comment (one timer per stream, not one per event).
    idle: Pin<Box<tokio::time::Sleep>>,
    /// Whether something was sent since the last tick.
    sent: bool,
    encoder: E,
    /// Whether the encoder's `end` was queued.
    ended: bool,
}

impl<E: Encoder> EventStream<E> {
    /// Queues what the client misses after `after`, and attaches it to the live run.
    async fn catch_up(&mut self, after: Option<EventId>) -> Result<(), StoreError> {
        let Some(live) = self.live.clone() else {
            let from = match after {
                Some(a) => self.settle(a).await?,
                None => EventId::default(),
            };
            self.last = Some(from);
            self.queue_stored(from, None).await?;
            return Ok(());
        };
        // Attached once its first event is out: the buffer then holds every event of the
        // activation not yet stored, and the store every one dropped from the buffer. A run
        // that has not started by the server's shutdown (a queued one no worker claimed) is
        // not waited for.
        tokio::select! {
            _ = live.started() => {}
            () = self.ctx.closing.cancelled() => {
                self.shut();
                return Ok(());
            }
        }
        let positioned = after.is_some();
        // A position sent before its event was stored, in another activation than the live
        // one, is checked against the store.
        // Without a position, the client starts at the activation's first event (a start's own
        // stream attaches after it: the buffer may have dropped stored events by then).
        let after = match after {
            Some(a) if a.activation.is_some() && a.activation != live.activation_start() => {
                Some(self.settle(a).await?)
            }
            Some(a) => Some(a),
            None => live
                .activation_start()
                .map(|start| EventId::stored(start.saturating_sub(1))),
        };
        if after.is_some() {
            self.last = after;
        }
        let attached = live.attach(after);
        let mut read_to_end = false;
        if let Some(a) = after {
            match attached.first {
                Some(first) if a.key() < first.key() => {
                    if attached.lost.is_some_and(|d| d.key() > a.key()) {
                        self.notice("lagged", &lagged(a, first));
                    }
                    // (No stored event lies between a position and the buffer's first event
                    // when that is the next stored one: the store is not asked.)
                    if first.sub > 0 || first.seq > a.seq + 1 {
                        self.queue_stored(a, Some(first)).await?;
                    }
                }
                Some(_) => {}
                None => {
                    self.queue_stored(a, None).await?;
                    read_to_end = true;
                }
            }
        }
        for f in attached.backlog {
            self.push(f);
        }
        self.rx = attached.rx;
        // A client reconnecting to an ended run (a start's own stream comes with no position)
        // may be behind the store: another process may have run the thread since. (A frame
        // of the run sent before its commit names a stored event only up to what it stored.)
        if positioned
            && !read_to_end
            && !self.ended
            && self.rx.is_none()
            && let Some(last) = self
                .last
                .filter(|l| l.activation.is_none() || l.seq <= attached.durable)
        {
            let last = EventId {
                activation: None,
                ..last
            };
            self.queue_stored(last, None).await?;
        }
        Ok(())
    }

    /// Where a client at `after` stands in the store. A position sent before its event was
    /// stored may name an event that never was: its process stopped first, and the numbers went
    /// to the events of a later activation. Then the client resumes before that activation's
    /// first event (or at the store's last event, if none was stored since).
    async fn settle(&self, after: EventId) -> Result<EventId, StoreError> {
        let Some(start) = after.activation else {
            return Ok(after);
        };
        let stored = self.ctx.store.load_events(&self.thread_id, start).await?;
        let mut last = start;
        for e in stored.iter().take_while(|e| e.seq <= after.seq) {
            if matches!(e.event, AgentEvent::RunStart { .. }) {
                return Ok(EventId::stored(e.seq - 1));
            }
            last = e.seq;
        }
        Ok(if last < after.seq {
            EventId::stored(last)
        } else {
            EventId {
                activation: None,
                ..after
            }
        })
    }

    /// Queues the stored events after `after` and before `before`.
    async fn queue_stored(
        &mut self,
        after: EventId,
        before: Option<EventId>,
    ) -> Result<(), StoreError> {
        let stored = self
            .ctx
            .store
            .load_events(&self.thread_id, after.seq)
            .await?;
        for e in stored {
            let id = EventId::stored(e.seq);
            if id.key() > after.key() && before.is_none_or(|b| id.key() < b.key()) {
                self.push(frame(id, &e.event));
            }
        }
        Ok(())
    }

    fn push(&mut self, f: Frame) {
        if self.ended {
            return;
        }
        if self.last.is_none_or(|l| f.id.key() > l.key()) {
            self.last = Some(f.id);
            self.encoder.frame(&f, &mut self.queue);
            self.check_complete();
        }
    }

    fn notice(&mut self, kind: &str, data: &serde_json::Value) {
        if !self.ended {
            self.encoder.notice(kind, data, &mut self.queue);
            self.check_complete();
        }
    }

    /// Ends the stream once the encoder says it is complete.
    fn check_complete(&mut self) {
        if self.encoder.complete() {
            self.finish();
        }
    }

    /// Queues the encoder's end; nothing is received after it.
    fn finish(&mut self) {
        if !self.ended {
            self.ended = true;
            self.rx = None;
            self.encoder.end(&mut self.queue);
        }
    }

    /// Tells the client of the server's shutdown and ends the stream.
    fn shut(&mut self) {
        self.rx = None;
        self.notice(
            "shutdown",
            &serde_json::json!({
                "message": "the server is shutting down; the run goes on from its last checkpoint when it restarts: reconnect with Last-Event-ID",
            }),
        );
        self.finish();
    }

    /// The next bytes to send; `None` ends the stream.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            // Checked first: a client slower than its run always has a frame waiting, and
            // the select below would take that frame every time.
            if self.rx.is_some() && self.ctx.closing.is_cancelled() {
                self.shut();
            }
            if let Some(b) = self.queue.pop_front() {
                self.sent = true;
                return Some(b);
            }
            let Some(rx) = self.rx.as_mut() else {
                if self.ended {
                    return None;
                }
                self.finish();
                continue;
            };
            tokio::select! {
                biased;
                received = rx.recv() => match received {
                    Ok(f) => self.push(f),
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        self.rx = None;
                        // Boxed: every idle stream's future would otherwise hold room for
                        // this rare path's store reads (about 440 bytes).
                        if let Err(e) = Box::pin(self.catch_up(self.last)).await {
                            self.notice(
                                "error",
                                &serde_json::json!({"message": format!("the stream cannot catch up: {e}")}),
                            );
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => self.rx = None,
                },
                () = self.ctx.closing.cancelled() => self.shut(),
                () = self.idle.as_mut() => {
                    let next = tokio::time::Instant::now() + self.ctx.keep_alive;
                    self.idle.as_mut().reset(next);
                    // A stream that sent something since the last tick is not idle.
                    if !std::mem::take(&mut self.sent) {
                        return Some(Bytes::from_static(b": keep-alive\n\n"));
                    }
                }
            }
        }
    }
}

/// One SSE event of `value`'s JSON in a `data` line alone (the protocol edges' form).
pub(crate) fn data(value: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// An SSE event outside the thread's event log (no `id`, so a reconnect is not moved by it).
fn notice(event: &str, data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

/// Tells a client that the streamed deltas between `after` and `first` are gone from memory:
/// it gets the stored events of that stretch, not its text deltas.
fn lagged(after: EventId, first: EventId) -> serde_json::Value {
    serde_json::json!({
        "message": "the client fell behind: the streamed deltas between these events are gone; the stored events follow",
        "after": after.to_string(),
        "resumed_at": first.to_string(),
    })
}
