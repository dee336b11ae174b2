//! The agent's one HTTP client: reqwest's async client, driven on the
//! calling thread by one current-thread tokio runtime for the whole process
//! (no thread of its own). Every request the agent makes goes through it:
//! the CA certificate, enrollment, the manifest, the boot events, `ready`,
//! and the image stream.
//!
//! Why async on a blocking program: reqwest's blocking client reads on a
//! thread of its own and hands each chunk (about 100 KiB) over, two wake-ups
//! per chunk, which paced the image stream on a busy machine; here the body
//! is read on the thread that hashes it ([`Client::wait`] on each chunk).
//!
//! Any thread may use a client (the stream's reader, and the boot events it
//! reports, run on a thread of the stream's own); were two to wait at once,
//! tokio lets one of them drive the runtime while the other waits its turn.

use std::future::Future;
use std::io;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::runtime::Runtime;

/// How long a connection may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The process's one runtime; made on first use.
static RUNTIME: OnceLock<Runtime> = OnceLock::new();

fn runtime() -> io::Result<&'static Runtime> {
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let made = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Two threads racing here: one runtime wins, the other is dropped
    // unused.
    Ok(RUNTIME.get_or_init(|| made))
}

/// The settings every client of the agent shares: [`CONNECT_TIMEOUT`], no
/// proxy from the environment, the agent's `User-Agent`, rustls with ring.
/// The caller adds its timeouts and trust.
pub fn builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .no_proxy()
        .user_agent(concat!("mprov-agent/", env!("CARGO_PKG_VERSION")))
}

/// Why a client could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// reqwest refused its settings (a bad CA certificate, say).
    #[error("making the HTTP client")]
    Http(#[from] reqwest::Error),
    /// The runtime could not start (no memory, no file descriptors).
    #[error("starting the HTTP client's runtime")]
    Runtime(#[from] io::Error),
}

/// A reqwest client and the runtime that drives it; cheap to clone (the
/// connection pool is shared).
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    runtime: &'static Runtime,
}

impl Client {
    /// Builds `builder` (from [`builder`]) into a client.
    pub fn new(builder: reqwest::ClientBuilder) -> Result<Client, ClientError> {
        let runtime = runtime()?;
        // Built inside the runtime: its connections belong to it.
        let http = runtime.block_on(async { builder.build() })?;
        Ok(Client { http, runtime })
    }

    /// A `GET` of `url`, to finish with [`Client::send`].
    pub fn get(&self, url: &str) -> reqwest::RequestBuilder {
        self.http.get(url)
    }

    /// A `POST` to `url`, to finish with [`Client::send`].
    pub fn post(&self, url: &str) -> reqwest::RequestBuilder {
        self.http.post(url)
    }

    /// Sends `request` and waits for the reply's head.
    pub fn send(&self, request: reqwest::RequestBuilder) -> reqwest::Result<reqwest::Response> {
        // The request's future is made inside the runtime: its timers need
        // one.
        self.runtime.block_on(async { request.send().await })
    }

    /// Waits on this thread for `future` (a body, a chunk of one).
    pub fn wait<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};

    use super::*;

    /// A one-shot HTTP server on loopback: answers the first request with
    /// `reply` and returns what it was sent.
    fn serve_once(reply: &'static [u8]) -> (String, std::thread::JoinHandle<String>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accepts");
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).expect("reads");
                assert!(n > 0, "the request ended early");
                got.extend_from_slice(&buf[..n]);
            }
            conn.write_all(reply).expect("writes");
            String::from_utf8_lossy(&got).into_owned()
        });
        (url, server)
    }

    #[test]
    fn a_request_from_two_threads_shares_the_one_runtime() {
        let client = Client::new(builder()).expect("client");
        let (url, server) =
            serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
        // Sent from another thread than the one that made the client, as
        // the stream's reader does.
        let other = client.clone();
        let body = std::thread::spawn(move || {
            let response = other.send(other.get(&format!("{url}/x"))).expect("sends");
            assert_eq!(response.status().as_u16(), 200);
            other.wait(response.text()).expect("body")
        })
        .join()
        .expect("thread");
        assert_eq!(body, "hello");
        let request = server.join().expect("server");
        assert!(request.starts_with("GET /x HTTP/1.1\r\n"), "{request}");
        assert!(
            request.to_ascii_lowercase().contains(concat!(
                "user-agent: mprov-agent/",
                env!("CARGO_PKG_VERSION")
            )),
            "{request}"
        );
    }
}
