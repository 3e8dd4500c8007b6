//! The executor port: the one listener that executors and standalone workers dial, one
//! long-lived connection each.
//!
//! Hello (the protocol crate's [`welcome`]: version, cluster secret), then either an
//! executor (RetrieveConfig, RegisterExecutor, then [`executor`]'s frames in and outbox
//! out) or a worker (RegisterWorker, then [`worker`]'s). A closed connection is an
//! executor (or a worker) lost. Launching executors is `cluster_manager`'s part.

use std::sync::Arc;

use flint_protocol::codec::FrameCodec;
use flint_protocol::handshake::{HelloError, welcome};
use flint_protocol::{DriverMessage, ExecutorMessage};
use futures_util::StreamExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

use crate::service::Driver;

mod executor;
mod worker;

type Connection = Framed<TcpStream, FrameCodec<ExecutorMessage, DriverMessage>>;

/// Why a connection ended before it served anything, or how it ended after.
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error(transparent)]
    Hello(#[from] HelloError),
    /// The driver refused the registration, and said why on the connection.
    #[error("registration refused: {0}")]
    Refused(String),
    #[error("{0}")]
    Broken(String),
    /// Served until it closed, was given up on, or the driver stopped.
    #[error("{0}")]
    Lost(String),
}

impl Ended {
    fn broken(e: impl std::fmt::Display) -> Self {
        Ended::Broken(e.to_string())
    }
}

/// Serves executors' and workers' connections on `listener` until `stop` is cancelled.
pub async fn serve(listener: TcpListener, driver: Arc<Driver>, stop: CancellationToken) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let driver = driver.clone();
                    let stop = stop.clone();
                    tokio::spawn(async move {
                        // A lost executor or worker has been logged as such.
                        match handle(stream, driver, stop).await {
                            Ended::Lost(_) => {}
                            ended => tracing::info!(%peer, reason = %ended, "executor connection ended"),
                        }
                    });
                }
                // Out of file descriptors and the like: keep serving the ones we have.
                Err(e) => {
                    tracing::warn!(error = %e, "accepting an executor connection");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            () = stop.cancelled() => return,
        }
    }
}

/// One connection from its hello to its end: whichever of an executor or a worker the
/// peer registers as.
async fn handle(stream: TcpStream, driver: Arc<Driver>, stop: CancellationToken) -> Ended {
    let _ = stream.set_nodelay(true);
    let host = stream
        .peer_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    let secret = driver.config.cluster_secret.as_deref();
    let mut conn: Connection = match welcome(stream, secret).await {
        Ok(conn) => conn,
        Err(e) => return e.into(),
    };
    loop {
        let message = match conn.next().await {
            Some(Ok(message)) => message,
            Some(Err(e)) => return Ended::broken(e),
            None => return Ended::Broken("closed before registering".into()),
        };
        let registered = match message {
            ExecutorMessage::RetrieveConfig => {
                let config = DriverMessage::ExecutorConfig(driver.executor_config());
                if let Err(e) = futures_util::SinkExt::send(&mut conn, config).await {
                    return Ended::broken(e);
                }
                continue;
            }
            ExecutorMessage::RegisterExecutor {
                executor_id,
                hostname,
                cores,
                app_id,
                pid,
                meters_fuel,
            } => {
                let registration = executor::Registration {
                    id: executor_id,
                    host: if hostname.is_empty() { host } else { hostname },
                    cores,
                    app_id,
                    pid,
                    meters_fuel,
                };
                executor::register(&mut conn, &driver, registration).await
            }
            ExecutorMessage::RegisterWorker(registration) => {
                return worker::serve(conn, driver, *registration, stop).await;
            }
            other => return Ended::Broken(format!("unexpected before registration: {other:?}")),
        };
        return match registered {
            Ok(link) => executor::serve(conn, &driver, link, stop).await,
            Err(ended) => ended,
        };
    }
}
