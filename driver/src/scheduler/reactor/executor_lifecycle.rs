//! Executors coming and going: registration, heartbeats and expiry, loss, what a
//! cluster manager launched and saw exit, decommissioning, and the demand dynamic
//! allocation reads. Apart from jobs and tasks because each change here starts from an
//! executor; what it does to tasks (re-queueing what a lost one ran) follows from that.

use flint_protocol::HeldAttempt;
use flint_protocol::exit::ProcessExit;
use flint_protocol::messages::Heartbeat;

use super::*;

impl ClusterState {
    /// Registers an executor; a second live executor with the same id is refused. The
    /// same process (host and pid) registering again replaces its old registration: it
    /// reconnected before its old connection was seen to close, and that generation is
    /// lost (its tasks run again; the returned actions launch them).
    /// The attempts it lists (it kept them running through a lost connection or a
    /// driver's restart) are adopted or dropped (see `adoption`) before any placement,
    /// so that none of them is launched a second time.
    pub fn register_executor(
        &mut self,
        id: ExecutorId,
        host: String,
        cores: u32,
        pid: u32,
        meters_fuel: bool,
        held: Vec<HeldAttempt>,
    ) -> Result<(u64, Vec<Action>), String> {
        if cores == 0 {
            return Err("an executor needs at least one core".into());
        }
        let mut actions = Vec::new();
        if let Some(existing) = self.executors.get(&id)
            && existing.state == ExecutorState::Alive
        {
            if existing.pid != Some(pid) || existing.host != host {
                return Err(format!(
                    "executor id {id} is already registered (host {}, pid {})",
                    existing.host,
                    existing.pid.map_or("?".into(), |p| p.to_string())
                ));
            }
            let old = existing.generation;
            self.lose_executor(&id, old, &mut actions);
        }
        self.next_generation += 1;
        let generation = self.next_generation;
        // An exclusion outlives the process, and so does where it was launched; what the
        // last process had compiled does not.
        let (health, launched_by) = self
            .executors
            .remove(&id)
            .map(|old| (old.health, old.launched_by))
            .unwrap_or_default();
        let mut executor = ExecutorData::new(host, cores, self.now);
        executor.generation = generation;
        executor.pid = Some(pid);
        executor.meters_fuel = meters_fuel;
        executor.health = health;
        executor.launched_by = launched_by;
        self.executors.insert(id.clone(), executor);
        self.adopt(&id, held, &mut actions);
        self.adopting_registered(&id);
        Ok((generation, actions))
    }

    /// The executor is alive; with `report`, its figures are new too.
    pub fn heartbeat(&mut self, id: &ExecutorId, generation: u64, report: Option<Heartbeat>) {
        let now = self.now;
        if let Some(e) = self.live_executor(id, generation) {
            e.last_heartbeat = now;
            if let Some(report) = report {
                e.reported = report;
            }
        }
    }

    /// The executor's connection is gone: its running tasks go back to pending without
    /// counting as failures of the task (unless a copy still runs elsewhere).
    pub fn executor_lost(&mut self, id: &ExecutorId, generation: u64) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.lose_executor(id, generation, &mut actions) {
            actions.extend(self.make_offers());
        }
        actions
    }

    /// [`Self::executor_lost`] without the round of offers; whether it was live.
    fn lose_executor(
        &mut self,
        id: &ExecutorId,
        generation: u64,
        actions: &mut Vec<Action>,
    ) -> bool {
        let Some(executor) = self.live_executor(id, generation) else {
            return false;
        };
        // The process may already have been seen exiting (a cluster manager's report).
        executor.state = match executor.exit {
            Some(_) => ExecutorState::Exited,
            None => ExecutorState::Lost,
        };
        executor.free_cores = 0;
        executor.queued_ahead = 0;
        let running: Vec<(TaskId, RunningAttempt)> = executor.running.drain().collect();
        let now = self.wall;
        for (task_id, attempt) in running {
            if let Some(job) = self.jobs.get_mut(&task_id.job) {
                job.close_span(attempt.span, Outcome::Lost, None, now);
            }
            if self.attempts_running(&task_id) > 0 {
                continue;
            }
            let Some(job) = self.jobs.get_mut(&task_id.job) else {
                continue;
            };
            if job.tasks[task_id.index as usize].state == TaskState::Running {
                let why = ErrorBody {
                    kind: "executor_lost".into(),
                    message: format!("executor {id} was lost; the task runs again"),
                };
                let queue = &mut self.queue;
                actions.push(requeue(queue, job, task_id.index, Rejoin::Front, why));
            }
        }
        true
    }

    /// Live executors whose last heartbeat is older than `timeout`: hung (SIGSTOP) or cut
    /// off without their connection closing. Each is lost as if its connection had closed.
    pub fn expire_executors(&mut self, timeout: Duration) -> (Vec<(ExecutorId, u64)>, Vec<Action>) {
        let now = self.now;
        let expired: Vec<(ExecutorId, u64)> = self
            .executors
            .iter()
            .filter(|(_, e)| {
                e.state == ExecutorState::Alive
                    && now.saturating_duration_since(e.last_heartbeat) > timeout
            })
            .map(|(id, e)| (id.clone(), e.generation))
            .collect();
        let mut actions = Vec::new();
        for (id, generation) in &expired {
            actions.extend(self.executor_lost(id, *generation));
        }
        (expired, actions)
    }

    /// A cluster manager launched this executor: it is listed as `launching` until it
    /// registers (or its process exits), with where it came from.
    pub fn executor_launched(&mut self, id: &ExecutorId, by: LaunchedBy, pid: Option<u32>) {
        let now = self.now;
        let executor = self.executors.entry(id.clone()).or_insert_with(|| {
            let mut e = ExecutorData::new(String::new(), 0, now);
            e.state = ExecutorState::Launching;
            e
        });
        executor.launched_by = Some(by);
        if executor.state != ExecutorState::Alive {
            executor.state = ExecutorState::Launching;
            executor.pid = pid;
            executor.free_cores = 0;
            executor.exit = None;
            executor.end_note = None;
        }
    }

    /// Decommissions an executor (Spark's DecommissionExecutor): no new task goes to
    /// it; once what it runs has ended, or at `deadline`, it is sent StopExecutor (its
    /// attempts still running then are killed there and run again elsewhere, not
    /// counted against their tasks).
    /// With `only_if_idle`, one that runs or holds a task is left alone (dynamic
    /// allocation never removes a busy executor).
    pub fn decommission_executor(
        &mut self,
        id: &ExecutorId,
        deadline: Instant,
        only_if_idle: bool,
    ) -> Result<Vec<Action>, String> {
        let executor = self
            .executors
            .get_mut(id)
            .ok_or_else(|| format!("no executor {id}"))?;
        if executor.state != ExecutorState::Alive {
            return Err(format!("executor {id} is {}", executor.state.as_str()));
        }
        if only_if_idle && !executor.running.is_empty() {
            return Err(format!("executor {id} is busy"));
        }
        if executor.decommission_by.is_none() {
            executor.decommission_by = Some(deadline);
            self.decommissioning += 1;
        }
        Ok(self.stop_drained())
    }

    /// Decommissioned executors with nothing left to run, or out of time: StopExecutor,
    /// once per registration.
    pub fn stop_drained(&mut self) -> Vec<Action> {
        if self.decommissioning == 0 {
            return Vec::new();
        }
        let now = self.now;
        let mut actions = Vec::new();
        let mut left = 0;
        for (id, e) in &mut self.executors {
            let Some(deadline) = e
                .decommission_by
                .filter(|_| e.state == ExecutorState::Alive)
            else {
                continue;
            };
            if !e.stop_sent && (e.running.is_empty() || now >= deadline) {
                e.stop_sent = true;
                actions.push(Action::Stop {
                    executor: id.clone(),
                });
            }
            left += 1;
        }
        self.decommissioning = left;
        actions
    }

    /// Cores the live jobs' pending tasks ask for, and cores running attempts hold:
    /// what dynamic allocation sizes the executors by.
    pub fn demand(&self) -> (u64, u64) {
        let pending = self
            .jobs
            .values()
            .filter(|j| !j.state.is_final())
            .map(|j| u64::from(j.counts.pending) * u64::from(j.def.resources.cores))
            .sum();
        let running = self
            .executors
            .values()
            .filter(|e| e.state == ExecutorState::Alive)
            .flat_map(|e| e.running.values())
            .map(|r| u64::from(r.cores))
            .sum();
        (pending, running)
    }

    /// Executors a cluster manager launched that take tasks and run none now.
    pub fn idle_launched_executors(&self) -> Vec<ExecutorId> {
        self.executors
            .iter()
            .filter(|(_, e)| e.takes_tasks() && e.launched_by.is_some() && e.running.is_empty())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Its cluster manager lost it with its host, or could not launch it. One that
    /// registered is lost when its connection closes; one that never did is lost now.
    pub fn executor_gone(&mut self, id: &ExecutorId, note: Option<(&str, &str)>) {
        if let Some(e) = self.executors.get_mut(id) {
            if e.state == ExecutorState::Launching {
                e.state = ExecutorState::Lost;
            }
            if let Some((reason, description)) = note {
                e.end_note = Some((reason.to_owned(), description.to_owned()));
            }
        }
    }

    /// A process a cluster manager launched has exited. One that never registered is
    /// listed too, so its exit is visible; a registered one is `exited` once its
    /// connection closes too (its tasks are re-queued then).
    pub fn executor_exited(&mut self, id: &ExecutorId, exit: ProcessExit, cause: Option<&str>) {
        let now = self.now;
        let executor = self.executors.entry(id.clone()).or_insert_with(|| {
            let mut e = ExecutorData::new(String::new(), 0, now);
            e.state = ExecutorState::Exited;
            e
        });
        executor.exit = Some(exit);
        // A note the driver made first (it gave up on the launch, and killed it for
        // that) says more than the SIGKILL that followed.
        if let Some(cause) = cause {
            executor.end_note = Some(match cause {
                "OOMKilled" => (
                    "oom_killed".to_owned(),
                    format!("{}: OOMKilled, over its memory limit", exit.describe()),
                ),
                other => (
                    exit.reason().to_owned(),
                    format!("{} ({other})", exit.describe()),
                ),
            });
        }
        if executor.state != ExecutorState::Alive {
            executor.state = ExecutorState::Exited;
        }
    }
}
