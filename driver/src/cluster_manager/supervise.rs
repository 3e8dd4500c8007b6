//! The loop that keeps the executors a cluster manager launches: what is due launched,
//! each event handed to the driver's state and the supervisor, executors that never
//! register given up on, dynamic allocation followed, and, at the start, what an
//! earlier run of the driver left running adopted or waited for.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_protocol::ExecutorId;
use flint_protocol::api::{AllocationView, ExecutorState};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::allocation::{Allocation, AllocationLimits, Demand};
use super::supervisor::{Overdue, Supervisor};
use super::{ClusterManager, ExecutorEvent, LaunchRequest};
use crate::scheduler::LaunchedBy;
use crate::service::{AllocationCommand, Driver};

/// Keeps the target of executors launched until `stop`: launches what is due, hands
/// each event to the driver's state, replaces what exits unasked.
pub async fn supervise(
    driver: Arc<Driver>,
    manager: Arc<dyn ClusterManager>,
    mut events: mpsc::UnboundedReceiver<ExecutorEvent>,
    stop: CancellationToken,
) {
    let allocation = &driver.config.allocation;
    let (commands, mut commanded) = mpsc::unbounded_channel();
    driver.set_commands(commands);
    let counter = driver.config.data_dir.join("work").join(NEXT_EXECUTOR_FILE);
    let mut supervisor = Supervisor::new(
        allocation.initial_executors,
        allocation.max_failures(),
        allocation.executor_failures_interval,
        match manager.executors_outlive_driver() {
            true => read_counter(&counter),
            false => 1,
        },
    );
    let mut dynamic = allocation.dynamic.map(|d| Dynamic::new(&driver, d));
    if let Some(d) = &dynamic {
        supervisor.set_target(d.allocation.target());
    }
    adopt_at_start(&driver, manager.as_ref(), &mut events, &mut supervisor);
    loop {
        let now = Instant::now();
        let registered = |id: &ExecutorId| {
            driver.read(|s| (s.executors.get(id)).is_some_and(|e| e.state == ExecutorState::Alive))
        };
        for id in supervisor.expectations_over(now, registered) {
            tracing::warn!(executor = %id, "an executor of the last run did not come back \
                with its worker; launching another in its place");
        }
        if let Some(d) = &mut dynamic {
            d.follow(&driver, &mut supervisor, now);
        }
        launch_due(&driver, manager.as_ref(), &mut supervisor, &counter, now);
        kill_overdue(&driver, manager.as_ref(), &mut supervisor, now);
        driver.set_allocation(view(&mut supervisor, manager.name(), now));
        let wake = [
            supervisor.next_wake(now),
            supervisor.next_overdue(allocation.executor_launch_timeout),
            supervisor.next_expectation_end(),
        ]
        .into_iter()
        .flatten()
        .min();
        tokio::select! {
            event = events.recv() => match event {
                Some(event) => on_event(&driver, manager.name(), &mut supervisor, event),
                None => return,
            },
            Some(command) = commanded.recv() => match command {
                AllocationCommand::Kill(id) => {
                    tracing::info!(executor = %id, "killing executor, as asked");
                    supervisor.asked_to_stop(&id);
                    manager.kill(&id);
                }
                AllocationCommand::Release(id) => {
                    // Declared lost (no heartbeat): its host may be gone with it, so no
                    // exit may ever be heard. Released (the pod deleted, the batch job
                    // cancelled) and replaced now, not counted as its failure.
                    tracing::warn!(executor = %id, "releasing a lost executor and replacing it");
                    supervisor.asked_to_stop(&id);
                    manager.kill(&id);
                    // Said first: the kill's own end (a SIGKILL) follows and says less.
                    let why = "no heartbeat within --executor-timeout-ms: released through \
                        its cluster manager and replaced";
                    driver.executor_gone(&id, Some(("lost", why)));
                    supervisor.gone(&id, None, Instant::now());
                }
            },
            () = sleep_until(wake) => {}
            () = tick(dynamic.as_ref().map(|d| d.every)) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Launches what is due, the next id saved first where ids go on across restarts.
fn launch_due(
    driver: &Driver,
    manager: &dyn ClusterManager,
    supervisor: &mut Supervisor,
    counter: &Path,
    now: Instant,
) {
    let due = supervisor.launches_due(now);
    if !due.is_empty()
        && manager.executors_outlive_driver()
        && let Err(e) = write_counter(counter, supervisor.next_id())
    {
        tracing::warn!(error = %e, path = %counter.display(), "saving the next executor id");
    }
    let allocation = &driver.config.allocation;
    for id in due {
        tracing::info!(executor = %id, cluster_manager = manager.name(), "launching executor");
        manager.launch(LaunchRequest {
            id,
            app_id: driver.config.app_id.clone(),
            cores: allocation.executor_cores,
            memory_mb: allocation.executor_memory_mb,
        });
    }
}

/// How often an executor its resource manager has not started is asked about again.
const RECHECK_PENDING: Duration = Duration::from_secs(1);

/// Kills what was launched and has not registered within the launch timeout, as a
/// failure that says why (with the manager's reason when it has one); what its resource
/// manager has not started yet waits, up to the pending timeout, and is then given up
/// on without a failure.
fn kill_overdue(
    driver: &Driver,
    manager: &dyn ClusterManager,
    supervisor: &mut Supervisor,
    now: Instant,
) {
    let allocation = &driver.config.allocation;
    let timeout = allocation.executor_launch_timeout;
    let pending_timeout =
        (allocation.executor_pending_timeout).unwrap_or_else(|| manager.default_pending_timeout());
    // Waiting is noticed when it begins, not at the launch timeout: one that starts just
    // before it must still get the whole timeout from its start.
    for (id, since) in supervisor.unstarted() {
        if manager.waiting(&id).is_some() {
            supervisor.still_pending(&id, since, now + RECHECK_PENDING);
        }
    }
    let started = |id: &ExecutorId| {
        driver.read(|s| (s.executors.get(id)).is_some_and(|e| e.state != ExecutorState::Launching))
    };
    for Overdue { id, pending_since } in supervisor.overdue(now, timeout, started) {
        if let Some(waiting) = manager.waiting(&id) {
            let since = pending_since.unwrap_or_else(|| now.checked_sub(timeout).unwrap_or(now));
            let until = since + pending_timeout;
            if now < until {
                supervisor.still_pending(&id, since, (now + RECHECK_PENDING).min(until));
                continue;
            }
            // Back-pressure from the resource manager, not the executor's doing: given
            // up on, not counted, and launched again.
            let why = format!(
                "not started by its resource manager within {} ms of its launch \
                 (--executor-pending-timeout-ms): {waiting}",
                pending_timeout.as_millis()
            );
            tracing::warn!(executor = %id, why, "giving up on a pending executor");
            supervisor.asked_to_stop(&id);
            manager.kill(&id);
            driver.executor_gone(&id, Some(("pending_timeout", &why)));
            supervisor.gone(&id, None, now);
            continue;
        }
        if pending_since.is_some() {
            supervisor.started_late(&id, now);
            continue;
        }
        let mut why = format!(
            "did not register within {} ms of its launch (--executor-launch-timeout-ms)",
            timeout.as_millis()
        );
        if let Some(pending) = manager.pending_reason(&id) {
            why = format!("{why}: {pending}");
        }
        tracing::warn!(executor = %id, why, "killing executor");
        manager.kill(&id);
        driver.executor_gone(&id, Some(("launch_timeout", &why)));
        if let Some(why) = supervisor.gone(&id, Some(&why), now) {
            tracing::error!(reason = why, "executor supervision gave up");
        }
    }
}

/// Before the first launch: what the manager found at its start (the pods of an earlier
/// run) is taken, and what it can only find later is waited for.
fn adopt_at_start(
    driver: &Driver,
    manager: &dyn ClusterManager,
    events: &mut mpsc::UnboundedReceiver<ExecutorEvent>,
    supervisor: &mut Supervisor,
) {
    while let Ok(event) = events.try_recv() {
        on_event(driver, manager.name(), supervisor, event);
    }
    if !manager.finds_executors_late() || driver.config.adopt_wait.is_zero() {
        return;
    }
    let known = driver.executors_known();
    if !known.is_empty() {
        tracing::info!(executors = ?known, wait_ms = driver.config.adopt_wait.as_millis() as u64,
            "waiting for the last run's executors to come back with their workers");
        supervisor.expect(known, Instant::now() + driver.config.adopt_wait);
    }
}

fn on_event(
    driver: &Driver,
    manager: &'static str,
    supervisor: &mut Supervisor,
    event: ExecutorEvent,
) {
    let now = Instant::now();
    let (id, failure) = match event {
        ExecutorEvent::Launched {
            id,
            worker,
            pid,
            log,
        } => {
            tracing::info!(executor = %id, pid, worker, "executor launched");
            if let Some(log) = log {
                driver.cluster.executor_logs.set(id.clone(), log);
            }
            let by = LaunchedBy {
                cluster_manager: manager,
                worker,
            };
            driver.executor_launched(&id, by, pid);
            return;
        }
        ExecutorEvent::Adopted { id, worker } => {
            tracing::info!(executor = %id, worker, "executor of an earlier run adopted");
            supervisor.adopted(&id, now);
            let by = LaunchedBy {
                cluster_manager: manager,
                worker,
            };
            driver.executor_launched(&id, by, None);
            return;
        }
        ExecutorEvent::LaunchFailed { id, reason } => {
            tracing::error!(executor = %id, reason, "could not launch executor");
            let failure = format!("could not be launched: {reason}");
            // One the driver gave up on first keeps the driver's reason.
            let note = supervisor
                .is_live(&id)
                .then_some(("launch_failed", failure.as_str()));
            driver.executor_gone(&id, note);
            (id, Some(failure))
        }
        ExecutorEvent::Exited { id, exit, cause } => {
            let mut description = exit.describe();
            if let Some(cause) = &cause {
                description = format!("{description} ({cause})");
            }
            if exit.is_clean() {
                tracing::info!(executor = %id, exit = description, "executor exited");
            } else {
                tracing::warn!(executor = %id, exit = description, "executor exited");
            }
            driver.executor_exited(&id, exit, cause.as_deref());
            (id, (!exit.is_clean()).then_some(description))
        }
        // Not the executor's doing: replaced, not counted.
        ExecutorEvent::Lost { id, reason } => {
            tracing::warn!(executor = %id, reason, "executor lost with its host");
            let note = supervisor.is_live(&id).then_some(("lost", reason.as_str()));
            driver.executor_gone(&id, note);
            driver.end_if_alive(&id, &reason);
            (id, None)
        }
    };
    if let Some(why) = supervisor.gone(&id, failure.as_deref(), now) {
        tracing::error!(reason = why, "executor supervision gave up");
    }
}

fn view(supervisor: &mut Supervisor, manager: &str, now: Instant) -> AllocationView {
    AllocationView {
        cluster_manager: manager.to_owned(),
        target: supervisor.target(),
        // Counted from the executors' states when the view is read.
        launching: 0,
        running: 0,
        decommissioning: 0,
        idle: 0,
        recent_failures: supervisor.recent_failures(now),
        max_failures: supervisor.max_failures(),
        failures_interval_ms: supervisor.interval().as_millis() as u64,
        backoff_ms: supervisor.backoff_left(now).as_millis() as u64,
        gave_up: supervisor.gave_up().map(str::to_owned),
    }
}

/// The next executor id's number, kept in the data dir across driver restarts.
const NEXT_EXECUTOR_FILE: &str = "next-executor-id";

fn read_counter(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1)
}

fn write_counter(path: &Path, next: u64) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{next}\n"))?;
    std::fs::rename(tmp, path)
}

/// Dynamic allocation's state in the supervising loop: the arithmetic, and since when
/// each launched executor has been idle (sampled every `every`).
struct Dynamic {
    allocation: Allocation,
    idle_since: HashMap<ExecutorId, Instant>,
    every: Duration,
}

impl Dynamic {
    fn new(driver: &Driver, d: crate::config::DynamicAllocation) -> Dynamic {
        let allocation = &driver.config.allocation;
        Dynamic {
            allocation: Allocation::new(AllocationLimits {
                min: d.min_executors,
                max: d.max_executors,
                initial: allocation.initial_executors,
                executor_cores: allocation.executor_cores,
                backlog_timeout: d.backlog_timeout,
                idle_timeout: d.idle_timeout,
            }),
            idle_since: HashMap::new(),
            every: (d.backlog_timeout / 4)
                .clamp(Duration::from_millis(10), Duration::from_millis(250)),
        }
    }

    /// Moves the target with the work, and decommissions what has been idle too long
    /// above it (only if still idle under the scheduler's lock).
    fn follow(&mut self, driver: &Driver, supervisor: &mut Supervisor, now: Instant) {
        let ((pending_cores, running_cores), idle) =
            driver.read(|s| (s.demand(), s.idle_launched_executors()));
        let before = supervisor.target();
        let target = self.allocation.update(
            Demand {
                pending_cores,
                running_cores,
            },
            now,
        );
        if target != before {
            tracing::info!(
                from = before,
                to = target,
                pending_cores,
                running_cores,
                "executor target changed"
            );
        }
        supervisor.set_target(target);
        self.idle_since.retain(|id, _| idle.contains(id));
        for id in idle {
            self.idle_since.entry(id).or_insert(now);
        }
        let idle_for: Vec<(ExecutorId, Duration)> = self
            .idle_since
            .iter()
            .map(|(id, since)| (id.clone(), now.saturating_duration_since(*since)))
            .collect();
        for id in self.allocation.removals(supervisor.staying(), &idle_for) {
            if driver.decommission_executor(&id, true).is_ok() {
                tracing::info!(executor = %id, "decommissioning an idle executor");
                supervisor.asked_to_stop(&id);
                self.idle_since.remove(&id);
            }
        }
    }
}

async fn tick(every: Option<Duration>) {
    match every {
        Some(every) => tokio::time::sleep(every).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
