//! The simulator's connections: an accept loop of its own (axum's `serve` cannot drop
//! its listener and its open connections on demand), so that an API outage refuses
//! connections on the port (the listener closed, every open connection cut, watches
//! too) until it ends (the same port bound again), as an API server that is restarting
//! or unreachable does.

use std::net::SocketAddr;

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Serves `app` on `listener` for as long as it runs; `down` says when the API is out.
pub(super) async fn serve(listener: TcpListener, app: Router, down: watch::Receiver<bool>) {
    let addr = listener.local_addr().unwrap();
    let mut listener = Some(listener);
    let mut outage = down.clone();
    loop {
        match &listener {
            Some(open) => tokio::select! {
                accepted = open.accept() => {
                    if let Ok((stream, _)) = accepted {
                        tokio::spawn(connection(stream, app.clone(), down.clone()));
                    }
                }
                changed = outage.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if *outage.borrow_and_update() {
                        // Closed: a connection now is refused (RST), as to a port
                        // nothing listens on.
                        listener = None;
                    }
                }
            },
            None => {
                if outage.changed().await.is_err() {
                    return;
                }
                if !*outage.borrow_and_update() {
                    listener = Some(rebind(addr).await);
                }
            }
        }
    }
}

/// The port again, once the outage is over (a connection in TIME_WAIT does not keep
/// it: the listener has SO_REUSEADDR).
async fn rebind(addr: SocketAddr) -> TcpListener {
    let mut tries = 0;
    loop {
        match TcpListener::bind(addr).await {
            Ok(listener) => return listener,
            Err(e) if tries < 100 => {
                tries += 1;
                eprintln!("kube-sim: binding {addr} again: {e}; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => panic!("kube-sim: binding {addr} again: {e}"),
        }
    }
}

/// One HTTP/1 connection, cut (dropped, unanswered) when an outage starts.
async fn connection(stream: TcpStream, app: Router, mut down: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let service = TowerToHyperService::new(app);
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = conn => {}
        _ = down.wait_for(|down| *down) => {}
    }
}
