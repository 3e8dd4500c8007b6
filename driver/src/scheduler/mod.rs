//! The scheduler's state machine: executors, jobs and tasks, changed only through the
//! methods below, each of which returns the [`Action`]s the service layer must carry out.
//! No sockets, no clock reads: the service sets the clock ([`ClusterState::set_clock`])
//! before each change, so it is tested directly.
//!
//! A task runs as at most one attempt, or two when speculation copied it; the first
//! success wins and the other attempt is killed. Where an attempt runs is in its
//! executor's `running` map, which is the only record of running attempts.
//!
//! Here: the state and its queries. `reactor`: one function per event (an executor
//! registering or lost, a job submitted or killed, an attempt's end and its outcomes, the
//! tick), sharing one `requeue`. `offers`: a round of placement onto free cores and
//! queues, as its phases. [`policy`] places demands on offers; [`fair_share`] and
//! `preemption` share the cluster between tenants; [`speculation`] copies slow tasks;
//! `waits` holds tasks back until the results they read have succeeded.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use flint_protocol::api::{ErrorBody, ExecutorState, JobState, TaskCounts, TaskEvent, TaskState};
use flint_protocol::{
    ExecutorId, FailureKind, JobId, JobTemplate, Pins, TaskFailure, TaskId, TaskInput, TaskLaunch,
    TaskResult, TaskStatus, Upstream, Usage,
};

use exclusion::excluded_for_task;
use policy::{Demand, Offer};

pub mod escalation;
pub mod exclusion;
pub mod fair_share;
pub mod latency;
pub mod memo;
mod model;
mod offers;
pub mod policy;
mod preemption;
mod reactor;
mod settings;
pub mod speculation;
#[cfg(test)]
pub(crate) mod tests;
mod waits;

pub use model::*;
pub use reactor::Dropped;
pub use settings::*;

pub struct ClusterState {
    pub executors: BTreeMap<ExecutorId, ExecutorData>,
    /// The live jobs: accepted and not yet ended. A job that ends is taken out by the
    /// service ([`Self::remove_job`]) once its end is handed to the job store.
    pub jobs: FastMap<JobId, Job>,
    /// Jobs that may still have tasks to launch, oldest first.
    pub(crate) queue: VecDeque<JobId>,
    /// Final jobs with attempts still running (being killed): they leave the state once
    /// the last of those reports its end ([`Self::take_drained`]), so that its times and
    /// log are the task's.
    retiring: std::collections::HashSet<JobId>,
    /// Executors alive and being decommissioned (an upper bound: counted down as
    /// [`Self::stop_drained`] finds them gone).
    decommissioning: usize,
    next_generation: u64,
    next_job_key: u64,
    pub config: SchedulingConfig,
    /// The time of the change being made, set by the caller.
    now: Instant,
    /// The same moment by the wall clock: the end time of jobs a change fails.
    wall: SystemTime,
    /// Every attempt's launch-to-status time.
    pub launch_to_status: latency::LatencyHistogram,
    /// What every attempt that reported its end used, summed since the driver started
    /// (`/metrics`), and how many those were.
    pub usage: Usage,
    pub attempts_measured: u64,
    /// The same by tenant (`None`: the admin's jobs), since the driver started.
    pub tenant_spent: FastMap<Option<String>, Spent>,
    /// Tenants' weights and core limits, as the tenants file last said.
    pub shares: fair_share::Shares,
    /// Since when each tenant below its share with work waiting has been so (see
    /// [`preemption`]).
    starving: FastMap<Option<String>, Instant>,
    /// Each tenant with work: the cores it was given over its weight (see [`fair_share`]).
    vtime: FastMap<Option<String>, f64>,
    /// Tasks waiting for results, and what they wait for.
    pub waits: waits::Waits,
    /// After a restart, the wait for the executors the last driver knew (see
    /// `reactor::adoption`).
    adopting: Option<reactor::Adopting>,
    /// Executors that wait ended without (see [`Self::take_given_up`]).
    given_up: Vec<ExecutorId>,
}

/// What one tenant's attempts used since the driver started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spent {
    pub attempts: u64,
    pub preempted: u64,
    pub succeeded: u64,
    pub cpu_us: u64,
    pub wall_us: u64,
    pub output_bytes: u64,
    pub egress_requests: u64,
    pub egress_bytes_sent: u64,
    pub egress_bytes_received: u64,
}

impl ClusterState {
    /// A state whose registrations are numbered from `first_generation` on. The driver
    /// starts from the wall clock in microseconds, so that generations keep increasing
    /// across its restarts and a status from before a restart is never taken for one of
    /// a new registration.
    pub fn new(
        first_generation: u64,
        config: SchedulingConfig,
        now: Instant,
        wall: SystemTime,
    ) -> Self {
        ClusterState {
            executors: BTreeMap::new(),
            jobs: FastMap::default(),
            queue: VecDeque::new(),
            retiring: Default::default(),
            decommissioning: 0,
            next_generation: first_generation,
            next_job_key: 0,
            config,
            now,
            wall,
            launch_to_status: latency::LatencyHistogram::default(),
            usage: Usage::default(),
            attempts_measured: 0,
            tenant_spent: FastMap::default(),
            shares: fair_share::Shares::default(),
            starving: FastMap::default(),
            vtime: FastMap::default(),
            waits: waits::Waits::default(),
            adopting: None,
            given_up: Vec::new(),
        }
    }

    /// Sets the time of the changes that follow, by the monotonic clock (which never
    /// goes back here) and the wall clock.
    pub fn set_clock(&mut self, now: Instant, wall: SystemTime) {
        self.now = self.now.max(now);
        self.wall = wall;
    }

    pub fn now(&self) -> Instant {
        self.now
    }

    /// Whether any live executor meters fuel (runs tasks with fuel budgets).
    pub fn any_executor_meters_fuel(&self) -> bool {
        self.executors
            .values()
            .any(|e| e.state == ExecutorState::Alive && e.meters_fuel)
    }

    /// The largest executor, for refusing jobs that could never be placed.
    pub fn max_executor_cores(&self) -> Option<u32> {
        self.executors
            .values()
            .filter(|e| e.state == ExecutorState::Alive)
            .map(|e| e.cores)
            .max()
    }

    /// Attempts of a task running on live executors.
    fn attempts_running(&self, task: &TaskId) -> usize {
        self.executors
            .values()
            .filter(|e| e.running.contains_key(task))
            .count()
    }

    fn live_executor(&mut self, id: &ExecutorId, generation: u64) -> Option<&mut ExecutorData> {
        self.executors
            .get_mut(id)
            .filter(|e| e.generation == generation && e.state == ExecutorState::Alive)
    }
}
