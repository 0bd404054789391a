//! A loopback HTTP/1.1 server for the client's tests: each connection carries one request, which
//! is recorded and answered by the test's handler (a JSON body, or an event stream that ends or
//! is held open until the client closes the connection).

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("{} {}: body is not JSON: {e}", self.method, self.path))
    }
}

/// How the server answers a request.
pub enum Reply {
    /// A status and a JSON body.
    Json(u16, String),
    /// An event stream of these raw bytes, then the end of the body.
    Sse(String),
    /// An event stream of these raw bytes, held open until the client closes the connection.
    SseHeld(String),
}

/// One `data:` event of an event stream.
pub fn event(data: &serde_json::Value) -> String {
    format!("data: {data}\n\n")
}

type Handler = Arc<dyn Fn(&Recorded) -> Reply + Send + Sync>;

/// The running server.
pub struct Loopback {
    pub url: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Loopback {
    pub async fn start(handler: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("local address: {e}"));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let recorded = requests.clone();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve(socket, handler.clone(), recorded.clone()));
            }
        });
        Self {
            url: format!("http://{addr}"),
            requests,
            task,
        }
    }

    /// The requests received so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut socket: TcpStream, handler: Handler, requests: Arc<Mutex<Vec<Recorded>>>) {
    let Some(request) = read_request(&mut socket).await else {
        return;
    };
    requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(request.clone());
    let (head, body, hold) = match handler(&request) {
        Reply::Json(status, body) => (
            format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            ),
            body,
            false,
        ),
        Reply::Sse(body) => (sse_head(), body, false),
        Reply::SseHeld(body) => (sse_head(), body, true),
    };
    if socket.write_all(head.as_bytes()).await.is_err()
        || socket.write_all(body.as_bytes()).await.is_err()
        || socket.flush().await.is_err()
    {
        return;
    }
    if hold {
        // Held until the client closes its side.
        let mut rest = [0u8; 256];
        while matches!(socket.read(&mut rest).await, Ok(n) if n > 0) {}
    }
    let _ = socket.shutdown().await;
}

fn sse_head() -> String {
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n".to_owned()
}

async fn read_request(socket: &mut TcpStream) -> Option<Recorded> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let path = first.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Some(Recorded {
        method,
        path,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}
