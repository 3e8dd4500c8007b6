//! The client against servers on loopback. Every policy here lists `127.0.0.1:PORT`
//! with the operator: the one way a loopback server is reachable at all.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::policy;
use super::resolver::Scripted;
use crate::egress::{EgressClient, EgressError, EgressPolicy, EgressRefusal, EgressRequest};

/// A server counting connections and requests: `/hello`, `/echo` (POST: the body back),
/// `/redirect` (302 to `/landing`), `/chunked/{n}` (n chunks of 1,000 bytes, no length).
pub(super) struct Server {
    pub(super) addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

impl Server {
    pub(super) fn start() -> Server {
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        let app = Router::new()
            .route("/hello", get(|| async { "hello" }))
            .route("/echo", post(|body: Bytes| async move { body }))
            .route(
                "/redirect",
                get(|| async {
                    (StatusCode::FOUND, [(header::LOCATION, "/landing")]).into_response()
                }),
            )
            .route("/landing", get(|| async { "landed" }))
            .route(
                "/chunked/{n}",
                get(
                    |axum::extract::Path(n): axum::extract::Path<usize>| async move {
                        let chunks =
                            (0..n).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 1000])));
                        Body::from_stream(futures_util::stream::iter(chunks))
                    },
                ),
            )
            .layer(axum::middleware::from_fn(
                move |req: axum::extract::Request, next: axum::middleware::Next| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    next.run(req)
                },
            ));
        let connections = Arc::new(AtomicUsize::new(0));
        let accepted = connections.clone();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        // A thread and runtime of its own, so that the server outlives the runtimes
        // tests start and drop.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let listener = listener.tap_io(move |_| {
                    accepted.fetch_add(1, Ordering::SeqCst);
                });
                axum::serve(listener, app).await.unwrap();
            });
        });
        Server {
            addr,
            connections,
            requests,
        }
    }

    pub(super) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Operator and job both listing this server's origin.
    pub(super) fn policy(&self) -> EgressPolicy {
        let origin = format!("http://{}", self.addr);
        policy(&[&origin], None, &[&origin])
    }

    pub(super) fn counts(&self) -> (usize, usize) {
        (
            self.connections.load(Ordering::SeqCst),
            self.requests.load(Ordering::SeqCst),
        )
    }
}

pub(super) fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> EgressRequest {
    EgressRequest {
        method: method.to_owned(),
        url: url.to_owned(),
        headers: headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect(),
        body: body.to_vec(),
    }
}

pub(super) const MIB: u64 = 1 << 20;

#[tokio::test]
async fn get_and_post_reach_the_server_and_their_bytes_are_counted() {
    let server = Server::start();
    let client = EgressClient::new().unwrap();
    let url = server.url("/hello");
    let got = client
        .send(
            &server.policy(),
            request("GET", &url, &[("accept", "text/plain")], b""),
            MIB,
        )
        .await
        .unwrap();
    assert_eq!((got.status, got.body.as_slice()), (200, &b"hello"[..]));
    assert_eq!(got.bytes_sent, (3 + url.len() + 6 + 10) as u64);
    let header_bytes: usize = got.headers.iter().map(|(n, v)| n.len() + v.len()).sum();
    assert!(
        got.headers
            .iter()
            .any(|(n, v)| n == "content-length" && v == "5")
    );
    assert_eq!(got.bytes_received, (header_bytes + 5) as u64);

    let body = vec![b'p'; 10_000];
    let url = server.url("/echo");
    let echoed = client
        .send(&server.policy(), request("POST", &url, &[], &body), MIB)
        .await
        .unwrap();
    assert_eq!(echoed.body, body);
    assert_eq!(echoed.bytes_sent, (4 + url.len() + body.len()) as u64);
    assert!(echoed.bytes_received > body.len() as u64);
    assert_eq!(
        server.counts(),
        (1, 2),
        "one pooled connection, two requests"
    );
}

#[tokio::test]
async fn a_proxy_named_by_the_environment_is_never_used() {
    let server = Server::start();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    for var in ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"] {
        // SAFETY: nextest runs each test in a process of its own, so no other thread
        // reads the environment meanwhile.
        unsafe { std::env::set_var(var, &proxy) };
    }
    let client = EgressClient::new().unwrap();
    let got = client
        .send(
            &server.policy(),
            request("GET", &server.url("/hello"), &[], b""),
            MIB,
        )
        .await
        .unwrap();
    assert_eq!(got.body, b"hello");
}

#[tokio::test]
async fn a_redirect_goes_back_to_the_caller_unfollowed() {
    let server = Server::start();
    let client = EgressClient::new().unwrap();
    let got = client
        .send(
            &server.policy(),
            request("GET", &server.url("/redirect"), &[], b""),
            MIB,
        )
        .await
        .unwrap();
    assert_eq!(got.status, 302);
    assert!(
        got.headers
            .iter()
            .any(|(n, v)| n == "location" && v == "/landing")
    );
    assert_eq!(server.counts().1, 1, "/landing was requested");
}

/// Writes a response head declaring a body far past the cap, then sends none of it:
/// reading the body first would hang.
#[tokio::test]
async fn a_content_length_past_what_is_left_is_refused_before_the_body() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 4096];
        let _ = socket.read(&mut buf).await.unwrap();
        socket
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
    let origin = format!("http://{addr}");
    let policy = policy(&[&origin], None, &[&origin]);
    let url = format!("{origin}/big");
    let sent = tokio::time::timeout(
        Duration::from_secs(10),
        EgressClient::new()
            .unwrap()
            .send(&policy, request("GET", &url, &[], b""), 100_000),
    )
    .await
    .expect("refused on the header, not after waiting for the body");
    match sent {
        Err(EgressError::Limit(message, _)) => {
            assert!(
                message.starts_with(&format!("GET {url}: max_bytes 100000")),
                "{message}"
            );
            assert!(message.contains("Content-Length is 1000000"), "{message}");
        }
        other => panic!("{:?}", other.map(|r| r.status)),
    }
}

#[tokio::test]
async fn a_chunked_body_is_cut_at_the_cap() {
    let server = Server::start();
    let client = EgressClient::new().unwrap();
    let url = server.url("/chunked/100");
    match client
        .send(&server.policy(), request("GET", &url, &[], b""), 20_000)
        .await
    {
        Err(error @ EgressError::Limit(..)) => {
            let message = error.to_string();
            assert!(message.contains("max_bytes 20000"), "{message}");
            assert!(message.contains("body was cut"), "{message}");
            // What crossed the wire before the cut is counted, within the cap: a guest
            // whose requests fail does not exchange bytes for free.
            let (sent, received) = (error.bytes_sent(), error.bytes_received());
            assert_eq!(sent, ("GET".len() + url.len()) as u64, "{error:?}");
            assert!(received > 10_000 && sent + received <= 20_000, "{error:?}");
        }
        other => panic!("{:?}", other.map(|r| r.body.len())),
    }
    let small = server.url("/chunked/5");
    let whole = client
        .send(&server.policy(), request("GET", &small, &[], b""), 20_000)
        .await
        .unwrap();
    assert_eq!(whole.body.len(), 5000);
    assert!(!whole.headers.iter().any(|(n, _)| n == "content-length"));
}

#[tokio::test]
async fn a_request_past_max_bytes_or_refused_or_invalid_is_never_sent() {
    let server = Server::start();
    let client = EgressClient::new().unwrap();
    let url = server.url("/echo");
    let too_big = client
        .send(
            &server.policy(),
            request("POST", &url, &[], &[0; 2000]),
            1000,
        )
        .await;
    assert!(
        matches!(&too_big, Err(EgressError::Limit(m, _)) if m.contains("max_bytes 1000")),
        "{:?}",
        too_big.err()
    );
    let elsewhere = client
        .send(
            &server.policy(),
            request(
                "GET",
                &server.url("/hello").replace("127.0.0.1", "127.0.0.2"),
                &[],
                b"",
            ),
            MIB,
        )
        .await;
    assert!(matches!(
        elsewhere,
        Err(EgressError::Denied(EgressRefusal::NotListed { .. }))
    ));
    for (method, headers, body) in [
        (
            "GET",
            vec![("x-smuggle", "a\r\nGET /hello HTTP/1.1")],
            &b""[..],
        ),
        ("GET", vec![("bad name", "1")], b""),
        ("G ET", vec![], b""),
        ("POST", vec![("content-length", "1")], b"two"),
    ] {
        let sent = client
            .send(&server.policy(), request(method, &url, &headers, body), MIB)
            .await;
        let Err(EgressError::Invalid(message)) = sent else {
            panic!("{method} {headers:?}: not invalid");
        };
        assert!(
            message.starts_with(&format!("{method} {url}: ")),
            "{message}"
        );
    }
    let unparsed = client
        .send(
            &server.policy(),
            request("GET", "http://[::1/", &[], b""),
            MIB,
        )
        .await;
    assert!(matches!(unparsed, Err(EgressError::Invalid(m)) if m.contains("does not parse")));
    assert_eq!(server.counts(), (0, 0));
}

#[tokio::test]
async fn a_name_resolving_to_loopback_is_refused_at_connect_unless_the_address_is_listed() {
    let server = Server::start();
    let lookup = Scripted::new(vec![vec![server.addr.ip()]]);
    let client = EgressClient::with_lookup(lookup.clone()).unwrap();
    let named = format!("http://rebind.test:{}", server.addr.port());
    let url = format!("{named}/hello");
    let by_name = policy(&[&named], None, &[&named]);
    match client
        .send(&by_name, request("GET", &url, &[], b""), MIB)
        .await
    {
        Err(EgressError::Denied(refusal @ EgressRefusal::Resolved { .. })) => assert_eq!(
            refusal.to_string(),
            format!(
                "GET {url}: rebind.test resolves to 127.0.0.1, a loopback address (127.0.0.0/8) the operator did not list (--egress-allow)"
            )
        ),
        other => panic!("{:?}", other.map(|r| r.status)),
    }
    assert_eq!(server.counts(), (0, 0), "refused before connecting");
    let address_too = policy(
        &[&named, &format!("http://{}", server.addr)],
        None,
        &[&named],
    );
    let got = client
        .send(&address_too, request("GET", &url, &[], b""), MIB)
        .await
        .unwrap();
    assert_eq!(got.body, b"hello");
    let threads = lookup.threads.lock().unwrap().clone();
    assert_eq!(threads, vec!["flint-egress", "flint-egress"]);
}

/// The case the egress runtime exists for: a pooled connection opened from one task
/// thread's runtime serves the next request after that runtime is gone.
#[test]
fn a_pooled_connection_outlives_the_runtime_that_opened_it() {
    let server = Server::start();
    let client = EgressClient::new().unwrap();
    for _ in 0..2 {
        let (client, policy, url) = (client.clone(), server.policy(), server.url("/hello"));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let send = client.send(&policy, request("GET", &url, &[], b""), MIB);
            let sent = runtime
                .block_on(async { tokio::time::timeout(Duration::from_secs(10), send).await });
            assert_eq!(sent.expect("not stalled").unwrap().body, b"hello");
        })
        .join()
        .unwrap();
    }
    assert_eq!(server.counts(), (1, 2));
}

/// A server that never answers: dropping `send`'s future once the request is in must
/// close the connection, seen by the server as end of stream.
#[tokio::test]
async fn dropping_send_closes_the_servers_connection_promptly() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (arrived_tx, arrived_rx) = tokio::sync::oneshot::channel();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 4096];
        let n = socket.read(&mut buf).await.unwrap();
        arrived_tx.send(buf[..n].to_vec()).unwrap();
        while let Ok(n) = socket.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
        closed_tx.send(Instant::now()).unwrap();
    });
    let origin = format!("http://{addr}");
    let policy = policy(&[&origin], None, &[&origin]);
    let client = EgressClient::new().unwrap();
    let send = client.send(
        &policy,
        request("GET", &format!("{origin}/never"), &[], b""),
        MIB,
    );
    // `select!` drops the losing branch: `send`, once the server holds the request.
    let arrived = tokio::select! {
        sent = send => panic!("the server never answers, yet: {:?}", sent.map(|r| r.status)),
        arrived = arrived_rx => arrived.unwrap(),
    };
    let dropped = Instant::now();
    assert!(arrived.starts_with(b"GET /never HTTP/1.1"), "{arrived:?}");
    let closed = tokio::time::timeout(Duration::from_secs(5), closed_rx)
        .await
        .expect("the connection was closed")
        .unwrap();
    assert!(closed.duration_since(dropped) < Duration::from_secs(1));
}

#[tokio::test]
async fn a_failed_connection_names_the_request() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let url = format!("{origin}/x");
    let policy = policy(&[&origin], None, &[&origin]);
    let sent = EgressClient::new()
        .unwrap()
        .send(&policy, request("PUT", &url, &[], b"body"), MIB)
        .await;
    match sent {
        Err(EgressError::Io(message, _)) => {
            assert!(message.starts_with(&format!("PUT {url}: ")), "{message}");
            assert!(message.to_lowercase().contains("refused"), "{message}");
        }
        other => panic!("{:?}", other.map(|r| r.status)),
    }
}

/// TLS is compiled in (reqwest's rustls, with the system's roots): an https request
/// opens with a TLS handshake record rather than failing on its scheme.
#[tokio::test]
async fn https_egress_speaks_tls() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let first_byte = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        socket.read_u8().await.unwrap()
    });
    let origin = format!("https://{addr}");
    let policy = policy(&[&origin], None, &[&origin]);
    let sent = EgressClient::new()
        .unwrap()
        .send(
            &policy,
            request("GET", &format!("{origin}/"), &[], b""),
            MIB,
        )
        .await;
    assert!(
        matches!(sent, Err(EgressError::Io(..))),
        "no TLS server there"
    );
    assert_eq!(first_byte.await.unwrap(), 0x16, "a TLS handshake record");
}

#[test]
fn the_client_is_shared_and_its_requests_can_be_spawned() {
    fn assert_send_sync<T: Send + Sync>(_: &T) {}
    fn assert_send<T: Send>(_: &T) {}
    let client = EgressClient::new().unwrap();
    assert_send_sync(&client);
    let policy = policy(&[], None, &[]);
    assert_send(&client.send(&policy, request("GET", "http://a.test/", &[], b""), 0));
}
