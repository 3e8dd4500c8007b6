//! The executor port: the one listener that executors and standalone workers dial, one
//! long-lived connection each.
//!
//! Hello (the protocol crate's [`welcome`]: version, cluster secret), then either an
//! executor (RetrieveConfig, RegisterExecutor, then [`executor`]'s frames in and outbox
//! out) or a worker (RegisterWorker, then [`worker`]'s). A closed connection is an
//! executor (or a worker) lost. Launching executors is `cluster_manager`'s part.

use std::sync::Arc;

use flint_protocol::codec::{FrameCodec, FrameError, write_batched};
use flint_protocol::handshake::{HelloError, welcome};
use flint_protocol::{DriverMessage, ExecutorMessage};
use futures_util::{Stream, StreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc::UnboundedReceiver;
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
                attempts,
            } => {
                let registration = executor::Registration {
                    id: executor_id,
                    host: if hostname.is_empty() { host } else { hostname },
                    cores,
                    app_id,
                    pid,
                    meters_fuel,
                    held: attempts,
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

/// Serves a registered peer, executor or worker alike: its outbox written out batched
/// while its frames are read and handed to `on_frame` (which may read more of them, and
/// may end the connection with a reason), until the connection ends, the outbox closes
/// (the driver gave up on the peer, or the socket cannot be written) or the driver
/// stops. Why it ended.
async fn pump<In, Out>(
    conn: Framed<TcpStream, FrameCodec<In, Out>>,
    mut outbox: UnboundedReceiver<Out>,
    stop: &CancellationToken,
    mut on_frame: impl FnMut(In, &mut Frames<In, Out>) -> Option<String>,
) -> String
where
    In: DeserializeOwned + Send + 'static,
    Out: Serialize + Send + 'static,
{
    let (sink, mut frames) = conn.split();
    let mut writer = tokio::spawn(async move { write_batched(sink, &mut outbox).await });
    let reason = loop {
        tokio::select! {
            frame = frames.next() => match frame {
                Some(Ok(message)) => {
                    if let Some(reason) = on_frame(message, &mut frames) {
                        break reason;
                    }
                }
                Some(Err(e)) => break format!("reading: {e}"),
                None => break "connection closed".to_owned(),
            },
            _ = &mut writer => break "outbox closed".to_owned(),
            () = stop.cancelled() => {
                // Let the Shutdown already queued go out before the socket is dropped.
                let _ = tokio::time::timeout(std::time::Duration::from_secs(1), &mut writer).await;
                break "driver stopped".to_owned();
            }
        }
    };
    writer.abort();
    reason
}

/// The read half of a registered peer's connection.
type Frames<In, Out> = futures_util::stream::SplitStream<Framed<TcpStream, FrameCodec<In, Out>>>;

/// Whether `frames` says the connection ended, read without waiting.
fn ended_meanwhile<In>(
    frames: &mut (impl Stream<Item = Result<In, FrameError>> + Unpin),
) -> Result<Option<In>, String> {
    use futures_util::FutureExt;
    match frames.next().now_or_never() {
        Some(Some(Ok(message))) => Ok(Some(message)),
        Some(Some(Err(e))) => Err(format!("reading: {e}")),
        Some(None) => Err("connection closed".to_owned()),
        None => Ok(None),
    }
}
