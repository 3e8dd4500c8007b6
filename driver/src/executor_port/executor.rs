//! An executor's connection after its hello: registration, then frames in (task ends,
//! heartbeats) become the driver's state changes while its outbox is written out,
//! batched.

use flint_protocol::{DriverMessage, ExecutorId, ExecutorMessage};
use futures_util::SinkExt;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use super::{Connection, Ended, Frames, ended_meanwhile, pump};
use crate::service::Driver;

/// Task ends applied together at most, so that one busy executor cannot hold the
/// scheduler's lock for long.
const STATUS_BATCH: usize = 256;

/// What a `RegisterExecutor` says, with the host it connected from when it names none.
pub(super) struct Registration {
    pub id: ExecutorId,
    pub host: String,
    pub cores: u32,
    pub app_id: Option<String>,
    pub pid: u32,
    pub meters_fuel: bool,
}

/// A registered executor: which one, which of its registrations, and its outbox.
pub(super) struct Link {
    id: ExecutorId,
    generation: u64,
    outbox: UnboundedReceiver<DriverMessage>,
}

/// Registers the executor with the driver; a refusal is told to the executor before
/// the connection ends.
pub(super) async fn register(
    conn: &mut Connection,
    driver: &Driver,
    r: Registration,
) -> Result<Link, Ended> {
    let registered = match r.app_id {
        // An executor launched for another app (another driver's work dir, a stale pod)
        // must not take this app's tasks.
        Some(theirs) if theirs != driver.config.app_id => Err(format!(
            "executor {} belongs to app {theirs:?}; this driver runs app {:?}",
            r.id, driver.config.app_id
        )),
        _ => driver.register_executor(r.id.clone(), r.host, r.cores, r.pid, r.meters_fuel),
    };
    match registered {
        Ok((generation, outbox)) => {
            tracing::info!(executor = %r.id, cores = r.cores, generation, "executor registered");
            Ok(Link {
                id: r.id,
                generation,
                outbox,
            })
        }
        Err(reason) => {
            tracing::warn!(executor = %r.id, reason, "registration refused");
            let refusal = DriverMessage::RegisterExecutorFailed {
                reason: reason.clone(),
            };
            conn.send(refusal).await.map_err(Ended::broken)?;
            Err(Ended::Refused(reason))
        }
    }
}

/// Serves a registered executor until its connection ends, its outbox closes (the
/// driver gave up on it) or the driver stops; then it is lost.
pub(super) async fn serve(
    conn: Connection,
    driver: &Driver,
    link: Link,
    stop: CancellationToken,
) -> Ended {
    let Link {
        id,
        generation,
        outbox,
    } = link;
    let reason = pump(conn, outbox, &stop, |message, frames| {
        apply_burst(driver, &id, generation, message, frames)
    })
    .await;
    driver.executor_lost(&id, generation, &reason);
    Ended::Lost(reason)
}

/// Applies `first` and every frame already read behind it, so that a burst of task ends
/// is applied under one lock with one round of placement; anything but a status goes
/// through in its turn. The reason the connection ended, if it did meanwhile.
fn apply_burst(
    driver: &Driver,
    id: &ExecutorId,
    generation: u64,
    first: ExecutorMessage,
    frames: &mut Frames<ExecutorMessage, DriverMessage>,
) -> Option<String> {
    let mut statuses = Vec::new();
    let mut next = Some(first);
    let mut ended = None;
    while let Some(message) = next.take() {
        match message {
            ExecutorMessage::StatusUpdate(status) => statuses.push(status),
            other => {
                driver.status_updates(id, generation, std::mem::take(&mut statuses));
                on_message(driver, id, generation, other);
            }
        }
        if statuses.len() >= STATUS_BATCH {
            break;
        }
        match ended_meanwhile(frames) {
            Ok(message) => next = message,
            Err(reason) => ended = Some(reason),
        }
    }
    driver.status_updates(id, generation, statuses);
    ended
}

fn on_message(driver: &Driver, id: &ExecutorId, generation: u64, message: ExecutorMessage) {
    match message {
        ExecutorMessage::StatusUpdate(status) => {
            driver.status_updates(id, generation, vec![status]);
        }
        ExecutorMessage::Heartbeat(report) => driver.heartbeat(id, generation, report),
        other => tracing::warn!(executor = %id, ?other, "unexpected message after registration"),
    }
}
