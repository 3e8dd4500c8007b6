//! A standalone worker's connection, after its `RegisterWorker`: its messages go to the
//! worker registry, the registry's orders (launch, kill, shutdown) come back out. A
//! closed connection is a lost worker, and its executors with it.

use std::sync::Arc;

use flint_protocol::codec::FrameCodec;
use flint_protocol::messages::{DriverToWorker, WorkerMessage, WorkerRegistration};
use futures_util::SinkExt;
use tokio::net::TcpStream;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

use super::{Connection, Ended, pump};
use crate::service::Driver;

pub(super) async fn serve(
    conn: Connection,
    driver: Arc<Driver>,
    registration: WorkerRegistration,
    stop: CancellationToken,
) -> Ended {
    let mut conn: Framed<TcpStream, FrameCodec<WorkerMessage, DriverToWorker>> =
        conn.map_codec(|c| c.retype());
    let id = registration.worker_id.clone();
    let (outbox, orders) = tokio::sync::mpsc::unbounded_channel();
    let generation = match driver.cluster.workers.register(
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
            return Ended::Refused(reason);
        }
    };
    tracing::info!(worker = %id, generation, "worker registered");
    let workers = &driver.cluster.workers;
    let reason = pump(conn, orders, &stop, |message, _| {
        workers.message(&id, generation, message);
        None
    })
    .await;
    tracing::warn!(worker = %id, generation, reason, "worker lost");
    driver.cluster.workers.lost(&id, generation, &reason);
    Ended::Lost(reason)
}
