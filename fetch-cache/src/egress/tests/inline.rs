//! Requests sent on the caller's runtime with its thread's pool (`send_here`), the way a
//! task thread sends them: a current_thread runtime that runs only inside `block_on`.

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::client::{MIB, Server, request};
use super::policy;
use super::resolver::Scripted;
use crate::egress::{
    ByteBudget, EgressClient, EgressError, EgressRefusal, EgressResponse, close_abandoned,
};

fn budget() -> Arc<ByteBudget> {
    Arc::new(ByteBudget::new(MIB))
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Sends on `runtime`, as a task thread's `http_send` does: one `block_on` per request.
fn send_here(
    runtime: &tokio::runtime::Runtime,
    client: &EgressClient,
    policy: &crate::egress::EgressPolicy,
    url: &str,
) -> Result<EgressResponse, EgressError> {
    let send = client.send_here(policy, request("GET", url, &[], b""), budget());
    runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), send).await })
        .expect("not stalled")
}

/// The thread's pool keeps its connection between runs of the runtime: the thread's
/// next requests reuse it, with nothing running it in between.
#[test]
fn requests_sent_here_reuse_the_threads_connection_between_block_ons() {
    let server = Server::start();
    let client = EgressClient::new().unwrap();
    let runtime = current_thread();
    for _ in 0..3 {
        let got = send_here(&runtime, &client, &server.policy(), &server.url("/hello"));
        assert_eq!(got.unwrap().body, b"hello");
    }
    assert_eq!(server.counts(), (1, 3));
}

/// The address check is the same here: a name resolving to loopback is refused at
/// connect unless the operator lists the address.
#[test]
fn a_name_resolving_to_loopback_is_refused_here_too() {
    let server = Server::start();
    let lookup = Scripted::new(vec![vec![server.addr.ip()]]);
    let client = EgressClient::with_lookup(lookup).unwrap();
    let named = format!("http://rebind.test:{}", server.addr.port());
    let url = format!("{named}/hello");
    let runtime = current_thread();
    let refused = send_here(&runtime, &client, &policy(&[&named], None, &[&named]), &url);
    assert!(
        matches!(
            refused,
            Err(EgressError::Denied(EgressRefusal::Resolved { .. }))
        ),
        "{:?}",
        refused.map(|r| r.status)
    );
    assert_eq!(server.counts(), (0, 0), "refused before connecting");
}

/// What a kill relies on: a request dropped in flight leaves its connection to the
/// runtime, which runs it only inside `block_on`; `close_abandoned` is that run, and the
/// server sees the connection closed at once.
#[test]
fn a_request_dropped_here_is_closed_by_close_abandoned() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let (arrived_tx, arrived_rx) = tokio::sync::oneshot::channel();
    let (closed_tx, closed_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4096];
        let n = socket.read(&mut buf).unwrap();
        arrived_tx.send(buf[..n].to_vec()).unwrap();
        while socket.read(&mut buf).is_ok_and(|n| n > 0) {}
        closed_tx.send(Instant::now()).unwrap();
    });
    let policy = policy(&[&origin], None, &[&origin]);
    let client = EgressClient::new().unwrap();
    let runtime = current_thread();
    let url = format!("{origin}/never");
    let arrived = runtime.block_on(async {
        let send = client.send_here(&policy, request("GET", &url, &[], b""), budget());
        // `select!` drops the losing branch: the request, once the server holds it.
        tokio::select! {
            sent = send => panic!("the server never answers, yet: {:?}", sent.map(|r| r.status)),
            arrived = arrived_rx => arrived.unwrap(),
        }
    });
    assert!(arrived.starts_with(b"GET /never HTTP/1.1"), "{arrived:?}");
    // Why `close_abandoned` exists: nothing runs the connection's task meanwhile.
    let early = closed_rx.recv_timeout(Duration::from_millis(100));
    assert!(early.is_err(), "closed with no runtime running");
    let dropped = Instant::now();
    runtime.block_on(close_abandoned());
    let closed = (closed_rx.recv_timeout(Duration::from_secs(5))).expect("the connection closed");
    assert!(closed.duration_since(dropped) < Duration::from_millis(100));
    // The thread's pool went with it: the next request opens a new one and is answered.
    let server = Server::start();
    let got = send_here(&runtime, &client, &server.policy(), &server.url("/hello"));
    assert_eq!(got.unwrap().body, b"hello");
}
