//! The executor listener: one long-lived connection per executor.
//!
//! Hello (version, cluster secret), then RetrieveConfig and RegisterExecutor; after that,
//! frames in (StatusUpdate, Heartbeat) become state changes and the executor's outbox is
//! written out, batched. A closed connection is an executor lost.

use std::sync::Arc;

use flint_protocol::codec::{FrameCodec, write_batched};
use flint_protocol::messages::{DriverToWorker, WorkerMessage, WorkerRegistration};
use flint_protocol::{
    DriverMessage, ExecutorId, ExecutorMessage, Hello, HelloReply, PROTOCOL_VERSION,
};
use futures_util::{FutureExt, SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

use crate::service::Driver;

mod hello;

use hello::check_hello;

type Connection = Framed<TcpStream, FrameCodec<ExecutorMessage, DriverMessage>>;

/// Serves executors' connections on `listener` until `stop` is cancelled.
pub async fn serve(listener: TcpListener, driver: Arc<Driver>, stop: CancellationToken) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let driver = driver.clone();
                    let stop = stop.clone();
                    tokio::spawn(async move {
                        if let Err(reason) = handle(stream, driver, stop).await {
                            tracing::info!(%peer, reason, "executor connection ended");
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

async fn handle(
    stream: TcpStream,
    driver: Arc<Driver>,
    stop: CancellationToken,
) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    let host = stream
        .peer_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    let mut hello = Framed::new(stream, FrameCodec::<Hello, HelloReply>::default());
    let greeting = match hello.next().await {
        Some(Ok(h)) => h,
        Some(Err(e)) => return Err(format!("bad hello: {e}")),
        None => return Err("closed before hello".into()),
    };
    let verdict = check_hello(&greeting, driver.config.cluster_secret.as_deref());
    let refused = verdict.clone().err();
    hello
        .send(HelloReply {
            version: PROTOCOL_VERSION,
            accepted: verdict,
        })
        .await
        .map_err(|e| e.to_string())?;
    if let Some(reason) = refused {
        return Err(reason);
    }
    let mut conn: Connection = hello.map_codec(|c| c.retype());

    let (id, generation, outbox) = loop {
        match conn.next().await {
            Some(Ok(ExecutorMessage::RetrieveConfig)) => {
                send(
                    &mut conn,
                    DriverMessage::ExecutorConfig(driver.executor_config()),
                )
                .await?;
            }
            Some(Ok(ExecutorMessage::RegisterExecutor {
                executor_id,
                hostname,
                cores,
                pid,
                meters_fuel,
                app_id,
            })) => {
                let host = if hostname.is_empty() { host } else { hostname };
                let registered = match app_id {
                    // An executor launched for another app (another driver's work dir,
                    // a stale pod) must not take this app's tasks.
                    Some(theirs) if theirs != driver.config.app_id => Err(format!(
                        "executor {executor_id} belongs to app {theirs:?}; this driver runs app {:?}",
                        driver.config.app_id
                    )),
                    _ => {
                        driver.register_executor(executor_id.clone(), host, cores, pid, meters_fuel)
                    }
                };
                match registered {
                    Ok((generation, outbox)) => {
                        tracing::info!(executor = %executor_id, cores, generation, "executor registered");
                        break (executor_id, generation, outbox);
                    }
                    Err(reason) => {
                        tracing::warn!(executor = %executor_id, reason, "registration refused");
                        send(
                            &mut conn,
                            DriverMessage::RegisterExecutorFailed {
                                reason: reason.clone(),
                            },
                        )
                        .await?;
                        return Err(reason);
                    }
                }
            }
            Some(Ok(ExecutorMessage::RegisterWorker(registration))) => {
                return serve_worker(conn, driver, *registration, stop).await;
            }
            Some(Ok(other)) => return Err(format!("unexpected before registration: {other:?}")),
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err("closed before registering".into()),
        }
    };

    let (sink, mut frames) = conn.split();
    let mut outbox = outbox;
    let mut writer = tokio::spawn(async move { write_batched(sink, &mut outbox).await });
    let reason = loop {
        tokio::select! {
            frame = frames.next() => match frame {
                Some(Ok(message)) => {
                    // Take every frame already read along with this one, so that a
                    // burst of task ends is applied under one lock with one round of
                    // placement; anything but a status goes through in its turn.
                    let mut statuses = Vec::new();
                    let mut next = Some(message);
                    let mut ended = None;
                    while let Some(message) = next.take() {
                        match message {
                            ExecutorMessage::StatusUpdate(status) => statuses.push(status),
                            other => {
                                driver.status_updates(&id, generation, std::mem::take(&mut statuses));
                                on_message(&driver, &id, generation, other);
                            }
                        }
                        if statuses.len() >= STATUS_BATCH {
                            break;
                        }
                        match frames.next().now_or_never() {
                            Some(Some(Ok(message))) => next = Some(message),
                            Some(Some(Err(e))) => ended = Some(format!("reading: {e}")),
                            Some(None) => ended = Some("connection closed".to_owned()),
                            None => {}
                        }
                    }
                    driver.status_updates(&id, generation, statuses);
                    if let Some(reason) = ended {
                        break reason;
                    }
                }
                Some(Err(e)) => break format!("reading: {e}"),
                None => break "connection closed".to_owned(),
            },
            // The outbox closes when the driver gives up on this executor (heartbeat
            // timeout) or the socket cannot be written.
            _ = &mut writer => break "outbox closed".to_owned(),
            () = stop.cancelled() => {
                // Let the Shutdown already queued go out before the socket is dropped.
                let _ = tokio::time::timeout(std::time::Duration::from_secs(1), &mut writer).await;
                break "driver stopped".to_owned();
            }
        }
    };
    writer.abort();
    driver.executor_lost(&id, generation, &reason);
    Ok(())
}

/// A standalone worker's connection, after its `RegisterWorker`: its messages go to the
/// worker registry, the registry's orders (launch, kill, shutdown) come back out. A
/// closed connection is a lost worker, and its executors with it.
async fn serve_worker(
    conn: Connection,
    driver: Arc<Driver>,
    registration: WorkerRegistration,
    stop: CancellationToken,
) -> Result<(), String> {
    let mut conn: Framed<TcpStream, FrameCodec<WorkerMessage, DriverToWorker>> =
        conn.map_codec(|c| c.retype());
    let id = registration.worker_id.clone();
    let (outbox, mut orders) = tokio::sync::mpsc::unbounded_channel();
    let generation = match driver.workers.register(
        registration,
        outbox,
        &driver.config.app_id,
        driver.config.heartbeat_interval,
    ) {
        Ok(generation) => generation,
        Err(reason) => {
            tracing::warn!(worker = %id, reason, "worker registration refused");
            let _ = conn
                .send(DriverToWorker::RegisterWorkerFailed {
                    reason: reason.clone(),
                })
                .await;
            return Err(reason);
        }
    };
    tracing::info!(worker = %id, generation, "worker registered");
    let (sink, mut frames) = conn.split();
    let mut writer = tokio::spawn(async move { write_batched(sink, &mut orders).await });
    let reason = loop {
        tokio::select! {
            frame = frames.next() => match frame {
                Some(Ok(message)) => driver.workers.message(&id, generation, message),
                Some(Err(e)) => break format!("reading: {e}"),
                None => break "connection closed".to_owned(),
            },
            _ = &mut writer => break "outbox closed".to_owned(),
            () = stop.cancelled() => {
                let _ = tokio::time::timeout(std::time::Duration::from_secs(1), &mut writer).await;
                break "driver stopped".to_owned();
            }
        }
    };
    writer.abort();
    tracing::warn!(worker = %id, generation, reason, "worker lost");
    driver.workers.lost(&id, generation, &reason);
    Ok(())
}

/// Task ends applied together at most, so that one busy executor cannot hold the
/// scheduler's lock for long.
const STATUS_BATCH: usize = 256;

fn on_message(driver: &Driver, id: &ExecutorId, generation: u64, message: ExecutorMessage) {
    match message {
        ExecutorMessage::StatusUpdate(status) => {
            driver.status_updates(id, generation, vec![status]);
        }
        ExecutorMessage::Heartbeat(report) => driver.heartbeat(id, generation, report),
        other => tracing::warn!(executor = %id, ?other, "unexpected message after registration"),
    }
}

async fn send(conn: &mut Connection, message: DriverMessage) -> Result<(), String> {
    conn.send(message).await.map_err(|e| e.to_string())
}
