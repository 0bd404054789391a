//! A loopback HTTP/1.1 server speaking raw bytes, so tests control every write, split and
//! dropped connection. Each accepted connection plays the next plan of actions.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// One step of a connection's plan.
pub(crate) enum Action {
    /// Write these bytes as they are (and flush).
    Raw(Vec<u8>),
    /// Write these bytes as one HTTP chunk (chunked transfer encoding).
    Chunk(Vec<u8>),
    /// Write the last chunk, ending the body.
    EndChunks,
    /// Wait until the test says go.
    WaitFor(oneshot::Receiver<()>),
    /// Read until the client closes the connection, then tell the test.
    SignalClientClose(oneshot::Sender<()>),
}

/// A request the server received.
#[derive(Debug)]
pub(crate) struct Recorded {
    /// The request line and headers, lower-cased header names.
    pub(crate) head: String,
    /// The JSON body (`Null` when it was not JSON).
    pub(crate) body: serde_json::Value,
}

impl Recorded {
    /// The value of a header (name in lower case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (n, v) = line.split_once(':')?;
            (n.trim().eq_ignore_ascii_case(name)).then_some(v.trim())
        })
    }
}

/// The running server.
pub(crate) struct TestServer {
    /// `http://127.0.0.1:<port>/v1`.
    pub(crate) base_url: String,
    /// The requests received, in order.
    pub(crate) requests: mpsc::UnboundedReceiver<Recorded>,
}

impl TestServer {
    /// Starts a server whose connections play `plans` in order.
    pub(crate) async fn start(plans: Vec<Vec<Action>>) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("bound address");
        let plans = Arc::new(Mutex::new(VecDeque::from(plans)));
        let (tx, requests) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let plan = plans.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
                let tx = tx.clone();
                tokio::spawn(serve(socket, plan, tx));
            }
        });
        TestServer {
            base_url: format!("http://{addr}/v1"),
            requests,
        }
    }

    /// The requests received so far.
    pub(crate) fn received(&mut self) -> Vec<Recorded> {
        let mut out = Vec::new();
        while let Ok(r) = self.requests.try_recv() {
            out.push(r);
        }
        out
    }
}

async fn read_request(socket: &mut TcpStream) -> Option<Recorded> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = socket.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())
                .flatten()
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = socket.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    let body = serde_json::from_slice(&buf[head_end..head_end + length]).unwrap_or_default();
    Some(Recorded { head, body })
}

async fn serve(
    mut socket: TcpStream,
    plan: Option<Vec<Action>>,
    requests: mpsc::UnboundedSender<Recorded>,
) {
    let _ = socket.set_nodelay(true);
    let Some(recorded) = read_request(&mut socket).await else {
        return;
    };
    let _ = requests.send(recorded);
    let plan = plan.unwrap_or_else(|| {
        vec![Action::Raw(response(
            599,
            &[],
            "the test server has no plan left",
        ))]
    });
    for action in plan {
        let ok = match action {
            Action::Raw(bytes) => write(&mut socket, &bytes).await,
            Action::Chunk(bytes) => {
                let mut framed = format!("{:x}\r\n", bytes.len()).into_bytes();
                framed.extend_from_slice(&bytes);
                framed.extend_from_slice(b"\r\n");
                write(&mut socket, &framed).await
            }
            Action::EndChunks => write(&mut socket, b"0\r\n\r\n").await,
            Action::WaitFor(rx) => rx.await.is_ok(),
            Action::SignalClientClose(tx) => {
                let mut tmp = [0u8; 1024];
                loop {
                    match socket.read(&mut tmp).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                let _ = tx.send(());
                true
            }
        };
        if !ok {
            return;
        }
    }
    // The plan is over: the connection is closed here (the response said `connection: close`).
}

async fn write(socket: &mut TcpStream, bytes: &[u8]) -> bool {
    socket.write_all(bytes).await.is_ok() && socket.flush().await.is_ok()
}

/// A complete response with a body and `content-length`.
pub(crate) fn response(status: u16, headers: &[(&str, &str)], body: &str) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (n, v) in headers {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(body);
    out.into_bytes()
}

/// The head of a chunked SSE response.
pub(crate) fn sse_head() -> Action {
    Action::Raw(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
            .to_vec(),
    )
}

/// A complete SSE response whose body is written as one chunk per piece.
pub(crate) fn sse_plan(pieces: &[&[u8]]) -> Vec<Action> {
    let mut plan = vec![sse_head()];
    plan.extend(pieces.iter().map(|p| Action::Chunk(p.to_vec())));
    plan.push(Action::EndChunks);
    plan
}
