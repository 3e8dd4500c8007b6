//! `--egress`'s server and its native client: a keep-alive HTTP/1.1 server in this
//! process answering every request with [`BODY`], counting requests and connections, and
//! a pooled reqwest client making the same requests the tasks make.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use futures_util::StreamExt;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// What the server answers: small, so that the figure is the cost of a request rather
/// than of moving bytes, and UTF-8 under testkit's limit, so that the guest prints it.
pub const BODY: &str = "flint bench --egress: one small fixed answer\n";

/// The path every request asks for.
const PATH: &str = "/x";

/// What the server has seen so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    pub requests: u64,
    pub connections: u64,
}

impl std::ops::Sub for Served {
    type Output = Served;

    fn sub(self, earlier: Served) -> Served {
        Served {
            requests: self.requests - earlier.requests,
            connections: self.connections - earlier.connections,
        }
    }
}

#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    connections: AtomicU64,
}

/// The server; it stops, its connections with it, when dropped.
pub struct Origin {
    addr: SocketAddr,
    counts: Arc<Counts>,
    accept: JoinHandle<()>,
}

impl Origin {
    pub async fn start() -> anyhow::Result<Origin> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let accept = tokio::spawn(accept(listener, counts.clone()));
        Ok(Origin {
            addr,
            counts,
            accept,
        })
    }

    /// `http://127.0.0.1:PORT`: what the operator and the job allow.
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What every task and the native client ask for.
    pub fn url(&self) -> String {
        format!("{}{PATH}", self.origin())
    }

    pub fn served(&self) -> Served {
        Served {
            requests: self.counts.requests.load(Ordering::SeqCst),
            connections: self.counts.connections.load(Ordering::SeqCst),
        }
    }

    /// `n` GETs of [`Self::url`] from one pooled client with `in_flight` under way at
    /// once, each answer checked: the time they took, each one's (sorted), and what the
    /// server saw of them. A warm-up opens the pool's connections first, as the tasks'
    /// warm-up opens the executors'.
    pub async fn native(
        &self,
        n: u32,
        in_flight: u32,
    ) -> anyhow::Result<(Duration, Vec<Duration>, Served)> {
        let http = reqwest::Client::builder().no_proxy().build()?;
        gets(&http, &self.url(), in_flight * 4, in_flight).await?;
        let before = self.served();
        let t0 = Instant::now();
        let mut each = gets(&http, &self.url(), n, in_flight).await?;
        let wall = t0.elapsed();
        each.sort();
        Ok((wall, each, self.served() - before))
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Serves every connection until aborted; the connections live in a set the loop owns,
/// so that aborting it closes them too.
async fn accept(listener: TcpListener, counts: Arc<Counts>) {
    let mut connections = JoinSet::new();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of descriptors, most likely: the clients see it; wait for some.
                tracing::warn!(%error, "bench server accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        while connections.try_join_next().is_some() {}
        // As reqwest and the executors' client do on their side: an answer is one write,
        // and it must not wait for an acknowledgement.
        let _ = stream.set_nodelay(true);
        counts.connections.fetch_add(1, Ordering::SeqCst);
        let counts = counts.clone();
        connections.spawn(async move {
            let answer = service_fn(move |_request| {
                counts.requests.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Infallible>(hyper::Response::new(BODY.to_owned())) }
            });
            // A client that goes away mid-request ends its connection; nothing to tell.
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), answer)
                .await;
        });
    }
}

/// `n` GETs of `url` with `in_flight` under way at once, each a 200 with [`BODY`]: each
/// one's time from send to its whole body.
pub(super) async fn gets(
    http: &reqwest::Client,
    url: &str,
    n: u32,
    in_flight: u32,
) -> anyhow::Result<Vec<Duration>> {
    let one = || async {
        let t = Instant::now();
        let response = http.get(url).send().await?;
        let status = response.status();
        let body = response.bytes().await?;
        if status != reqwest::StatusCode::OK || body != BODY.as_bytes() {
            bail!("the native client got {status} with {body:?}");
        }
        anyhow::Ok(t.elapsed())
    };
    futures_util::stream::iter(0..n)
        .map(|_| one())
        .buffer_unordered(in_flight as usize)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}
