//! An executor's connection after its hello: registration, then frames in (task ends,
//! heartbeats) become the driver's state changes while its outbox is written out,
//! batched, and the task ends are acknowledged once the job store has committed them.

use std::sync::Arc;

use flint_protocol::{DriverMessage, ExecutorId, ExecutorMessage, HeldAttempt, JobId, TaskStatus};
use futures_util::SinkExt;
use tokio::sync::mpsc::{self, UnboundedReceiver, WeakUnboundedSender};
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
    /// The attempts it kept through the loss of its last connection.
    pub held: Vec<HeldAttempt>,
}

/// A registered executor: which one, which of its registrations, and its outbox (read
/// by the connection's writer, and written weakly by its acknowledgements).
pub(super) struct Link {
    id: ExecutorId,
    generation: u64,
    outbox: UnboundedReceiver<DriverMessage>,
    acks: WeakUnboundedSender<DriverMessage>,
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
        _ => driver.register_executor(r.id.clone(), r.host, r.cores, r.pid, r.meters_fuel, r.held),
    };
    match registered {
        Ok((generation, outbox, acks)) => {
            tracing::info!(executor = %r.id, cores = r.cores, generation, "executor registered");
            Ok(Link {
                id: r.id,
                generation,
                outbox,
                acks,
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
/// driver gave up on it) or the driver stops; then it is lost, unless the driver is
/// stopping: an executor keeps its tasks through a driver's restart, and the next driver
/// waits for it (see `scheduler::reactor::adoption`).
pub(super) async fn serve(
    conn: Connection,
    driver: &Arc<Driver>,
    link: Link,
    stop: CancellationToken,
) -> Ended {
    let Link {
        id,
        generation,
        outbox,
        acks,
    } = link;
    let (applied, to_ack) = mpsc::unbounded_channel();
    let acker = tokio::spawn(acknowledge(driver.clone(), to_ack, acks));
    let reason = pump(conn, outbox, &stop, |message, frames| {
        apply_burst(driver, &id, generation, message, frames, &applied)
    })
    .await;
    acker.abort();
    if !stop.is_cancelled() {
        driver.executor_lost(&id, generation, &reason);
    }
    Ended::Lost(reason)
}

/// Ends applied together, by the highest number among them and the jobs they belong to.
struct Applied {
    up_to: u64,
    jobs: Vec<JobId>,
}

/// Tells the executor which of its task ends are durable, in the order they were
/// applied: each batch once the store has committed every write made up to its
/// application. Batches applied while a commit is awaited are acknowledged together.
/// Holds the outbox weakly, so that replacing the connection's link still ends it.
async fn acknowledge(
    driver: Arc<Driver>,
    mut applied: UnboundedReceiver<Applied>,
    outbox: WeakUnboundedSender<DriverMessage>,
) {
    while let Some(mut batch) = applied.recv().await {
        while let Ok(more) = applied.try_recv() {
            batch.up_to = batch.up_to.max(more.up_to);
            batch.jobs.extend(more.jobs);
        }
        batch.jobs.sort_unstable();
        batch.jobs.dedup();
        let mark = loop {
            match driver.end_mark(&batch.jobs) {
                Some(mark) => break mark,
                None => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            }
        };
        driver.durable(mark).await;
        let Some(outbox) = outbox.upgrade() else {
            return;
        };
        if outbox
            .send(DriverMessage::EndsDurable { up_to: batch.up_to })
            .is_err()
        {
            return;
        }
    }
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
    applied: &mpsc::UnboundedSender<Applied>,
) -> Option<String> {
    let mut statuses = Statuses::default();
    let mut next = Some(first);
    let mut ended = None;
    while let Some(message) = next.take() {
        match message {
            ExecutorMessage::StatusUpdate { seq, status } => statuses.push(seq, status),
            ExecutorMessage::Heartbeat(report) => {
                statuses.apply(driver, id, generation, applied);
                driver.heartbeat(id, generation, report);
            }
            other => {
                tracing::warn!(executor = %id, ?other, "unexpected message after registration")
            }
        }
        if statuses.list.len() >= STATUS_BATCH {
            break;
        }
        match ended_meanwhile(frames) {
            Ok(message) => next = message,
            Err(reason) => ended = Some(reason),
        }
    }
    statuses.apply(driver, id, generation, applied);
    ended
}

/// Task ends read and not yet applied, with the highest number among them.
#[derive(Default)]
struct Statuses {
    list: Vec<TaskStatus>,
    up_to: u64,
}

impl Statuses {
    fn push(&mut self, seq: u64, status: TaskStatus) {
        self.up_to = self.up_to.max(seq);
        self.list.push(status);
    }

    /// Applies them, and queues their acknowledgement (numbered ones only: 0 asks for
    /// none).
    fn apply(
        &mut self,
        driver: &Driver,
        id: &ExecutorId,
        generation: u64,
        applied: &mpsc::UnboundedSender<Applied>,
    ) {
        if self.list.is_empty() {
            return;
        }
        let up_to = std::mem::take(&mut self.up_to);
        let mut jobs: Vec<JobId> = Vec::new();
        if up_to > 0 {
            for status in &self.list {
                if jobs.last() != Some(&status.task.job) {
                    jobs.push(status.task.job.clone());
                }
            }
        }
        driver.status_updates(id, generation, std::mem::take(&mut self.list));
        if up_to > 0 {
            let _ = applied.send(Applied { up_to, jobs });
        }
    }
}
