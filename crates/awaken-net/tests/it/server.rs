//! A loopback HTTP/1.1 server: each accepted connection reads one request and plays the next
//! reply; every request's head is reported, so a test can tell which requests arrived.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// What a connection answers.
pub(crate) enum Reply {
    /// These bytes, then close.
    Raw(String),
    /// A chunked body that never ends: chunks until the client goes away.
    Endless,
    /// Nothing until the test says so (or drops the sender), then close.
    Silent(oneshot::Receiver<()>),
}

/// The running server.
pub(crate) struct Server {
    /// `127.0.0.1:<port>`.
    pub(crate) addr: std::net::SocketAddr,
    requests: mpsc::UnboundedReceiver<String>,
}

impl Server {
    /// Starts a server whose connections play `replies` in order.
    pub(crate) async fn start(replies: Vec<Reply>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("bound address");
        let replies = Arc::new(Mutex::new(VecDeque::from(replies)));
        let (tx, requests) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let reply = replies
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .pop_front();
                tokio::spawn(serve(socket, reply, tx.clone()));
            }
        });
        Server { addr, requests }
    }

    /// `http://127.0.0.1:<port>` followed by `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The request lines received so far, each with its `host` header and whether it carried
    /// an `authorization` header.
    pub(crate) fn received(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(head) = self.requests.try_recv() {
            let line = head.lines().next().unwrap_or_default().to_owned();
            let header = |name: &str| {
                head.lines().find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
                })
            };
            let host = header("host").unwrap_or_default();
            let auth = match header("authorization") {
                Some(_) => ", authorization",
                None => "",
            };
            out.push(format!("{line} (host {host}{auth})"));
        }
        out
    }
}

/// A whole `200 OK` response with `body`.
pub(crate) fn ok(body: &str) -> Reply {
    Reply::Raw(format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    ))
}

/// A `status` redirect to `location`.
pub(crate) fn redirect(status: u16, location: &str) -> Reply {
    Reply::Raw(format!(
        "HTTP/1.1 {status} Redirect\r\nlocation: {location}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    ))
}

async fn serve(mut socket: TcpStream, reply: Option<Reply>, tx: mpsc::UnboundedSender<String>) {
    let mut buf = Vec::new();
    let mut piece = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match socket.read(&mut piece).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&piece[..n]),
        }
    }
    let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
    match reply {
        None => {}
        Some(Reply::Raw(bytes)) => {
            let _ = socket.write_all(bytes.as_bytes()).await;
        }
        Some(Reply::Endless) => {
            let head =
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n";
            if socket.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let chunk = format!("400\r\n{}\r\n", "x".repeat(0x400));
            while socket.write_all(chunk.as_bytes()).await.is_ok() {}
        }
        Some(Reply::Silent(until)) => {
            let _ = until.await;
        }
    }
    let _ = socket.shutdown().await;
}
