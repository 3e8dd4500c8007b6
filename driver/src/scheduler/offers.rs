//! Offers: how deep each executor's queue may be, what the placement policy is given
//! and what its placements become (launches, and a job's definition before its first
//! launch on a connection); jobs no executor may run; speculative copies.

use super::*;

impl ClusterState {
    /// The longest moving-average run time among jobs with work to launch, or `None` if
    /// one of them has had no attempt end yet (it may be slow: queue as little as ever).
    fn slowest_queued_run_time(&self) -> Option<f64> {
        let mut slowest = 0.0f64;
        for job in self.queue.iter().filter_map(|id| self.jobs.get(id)) {
            slowest = slowest.max(job.run_time_us?);
        }
        Some(slowest)
    }

    /// Tasks to keep queued on an executor of `cores` cores beyond its free ones:
    /// `launch_ahead` while the queued jobs' run times are unknown, then as many as
    /// `queue_budget` of run time per core, between `launch_ahead` and
    /// `launch_ahead_max`. Short tasks are bound by the round trip to the driver, not the
    /// guest, and only a deep queue hides it. While tenants share the cluster (`shared`)
    /// nothing beyond the budget queues, not even `launch_ahead`: a task queued on an
    /// executor runs before whatever another tenant is owed, so long tasks (and tasks
    /// of unknown length) queue none.
    fn queue_depth(&self, cores: u32, slowest_us: Option<f64>, shared: bool) -> u32 {
        let c = &self.config;
        let least = if shared { 0 } else { c.launch_ahead };
        let (Some(slowest), false) = (slowest_us, c.launch_ahead == 0) else {
            return least;
        };
        let fits = c.queue_budget.as_micros() as f64 * f64::from(cores) / slowest.max(1.0);
        (fits as u32).clamp(least, c.launch_ahead_max.max(least))
    }

    /// What each queued job asks of these offers, in the queue's order.
    fn demands(&self, ids: &[ExecutorId], offers: &[Offer], now: Instant) -> Vec<Demand> {
        let position = |id: &ExecutorId| ids.iter().position(|e| e == id);
        self.queue
            .iter()
            .map(|job_id| {
                let job = &self.jobs[job_id];
                let constrained = job
                    .constrained
                    .iter()
                    .map(|&i| {
                        let task = &job.tasks[i as usize];
                        ids.iter()
                            .enumerate()
                            .filter(|(_, e)| {
                                excluded_for_task(&self.config.exclusion, &task.failed_on, e)
                            })
                            .map(|(k, _)| k)
                            .collect()
                    })
                    .chain(job.speculative.iter().map(|&i| {
                        let task = TaskId {
                            job: job_id.clone(),
                            index: i,
                        };
                        ids.iter()
                            .filter(|e| self.executors[*e].running.contains_key(&task))
                            .filter_map(position)
                            .collect()
                    }))
                    .collect();
                let warm: Vec<bool> = ids
                    .iter()
                    .zip(offers)
                    .map(|(id, o)| o.usable && self.executors[id].modules.contains(&job.locality))
                    .collect();
                let waited = job.locality_wait_since.is_some_and(|since| {
                    now.saturating_duration_since(since) >= self.config.locality_wait
                });
                let cold_allowed = self.config.locality_wait.is_zero() || waited;
                let warm_elsewhere =
                    !cold_allowed && !warm.contains(&true) && self.warm_without_room(job, ids);
                Demand {
                    cores: job.def.resources.cores,
                    count: job.pending.len(),
                    constrained,
                    needs_fuel: job.def.needs_fuel(),
                    cold_allowed: cold_allowed || (!warm.contains(&true) && !warm_elsewhere),
                    warm_elsewhere,
                    warm,
                }
            })
            .collect()
    }

    /// How long an attempt may have been out (queued, then running) on an executor before
    /// nothing more is queued behind it there: twice the queue budget, plus four times
    /// the run time of the slowest queued job when that is known. An attempt queued
    /// behind others waits about one queue budget; a run of several times the average is
    /// a straggler, and what queues behind it waits for it.
    fn straggler_age(&self, slowest_us: Option<f64>) -> Duration {
        let budget = self.config.queue_budget * 2;
        match slowest_us {
            Some(us) => budget + Duration::from_secs_f64(us.max(0.0) * 4.0 / 1e6),
            None => budget,
        }
    }

    /// Every live executor offers its free cores; pending tasks are placed by the policy.
    /// Jobs it fails end at the time of the clock the service set.
    pub fn make_offers(&mut self) -> Vec<Action> {
        self.make_offers_at(self.wall, None)
    }

    /// [`Self::make_offers`], with `wall` as the end time of any job it fails; with
    /// `only`, a round for what that one executor gave back. Executors without room are
    /// never offered: at a thousand executors a round that looked at every executor (and
    /// every attempt it runs) for each burst of task ends was the driver's ceiling. A
    /// round for one executor is enough after its tasks end, unless they put work back
    /// (the caller asks for a full round then); the service's tick makes a full round at
    /// least every locality wait, which also picks up whatever a partial one left.
    pub(super) fn make_offers_at(
        &mut self,
        wall: SystemTime,
        only: Option<&ExecutorId>,
    ) -> Vec<Action> {
        let now = self.now;
        let mut actions = Vec::new();
        if only.is_none() {
            // Jobs no executor may run change only with failures and with executors
            // coming and going, which all make full rounds.
            self.fail_excluded_jobs(wall, &mut actions);
            self.preempt(&mut actions);
        }
        self.queue
            .retain(|id| self.jobs.get(id).is_some_and(Job::has_work));
        if self.queue.is_empty() {
            return actions;
        }
        let slowest = self.slowest_queued_run_time();
        let straggler = self.straggler_age(slowest);
        let shared = self.shared();
        let has_room = |e: &ExecutorData| {
            e.takes_tasks()
                && !e.health.is_excluded(now)
                && (e.free_cores > 0 || self.queue_depth(e.cores, slowest, shared) > e.queued_ahead)
        };
        let ids: Vec<ExecutorId> = match only {
            Some(id) => self
                .executors
                .get(id)
                .filter(|e| has_room(e))
                .map(|_| vec![id.clone()])
                .unwrap_or_default(),
            None => self
                .executors
                .iter()
                .filter(|(_, e)| has_room(e))
                .map(|(id, _)| id.clone())
                .collect(),
        };
        if ids.is_empty() {
            return actions;
        }
        if self.config.mode == SchedulingMode::Fair {
            // Keys grow with submission: the oldest wins a tie.
            let jobs = &self.jobs;
            self.queue
                .make_contiguous()
                .sort_by_cached_key(|id| jobs.get(id).map(|j| (j.counts.running, j.key)));
        }
        let offers: Vec<Offer> = ids
            .iter()
            .map(|id| {
                let e = &self.executors[id];
                // Queued tasks and a multi-core task would run side by side; tasks queued
                // behind a straggler would wait for it (and hold back the quantile that
                // speculation waits for).
                let no_queue = e
                    .running
                    .values()
                    .any(|r| r.cores > 1 || now.saturating_duration_since(r.since) > straggler);
                Offer {
                    free_cores: e.free_cores,
                    meters_fuel: e.meters_fuel,
                    usable: true,
                    ahead: if no_queue {
                        0
                    } else {
                        self.queue_depth(e.cores, slowest, shared)
                            .saturating_sub(e.queued_ahead)
                    },
                }
            })
            .collect();
        if offers.iter().all(|o| o.free_cores == 0 && o.ahead == 0) {
            return actions;
        }
        let plan = match shared {
            true => self.place_shared(&offers, |s| s.demands(&ids, &offers, now)),
            false => policy::place(&offers, &self.demands(&ids, &offers, now)),
        };
        for (d, waiting) in plan.waiting_for_locality.iter().enumerate() {
            let job = self
                .jobs
                .get_mut(&self.queue[d])
                .expect("queued jobs exist");
            if !*waiting {
                // A round for one executor does not see the cold ones a job may be
                // holding back from: only a full round ends the wait.
                if only.is_none() {
                    job.locality_wait_since = None;
                }
            } else if job.locality_wait_since.is_none() {
                job.locality_wait_since = Some(now);
            }
        }
        // Constrained tasks are taken out by position, so they go last-first.
        let mut taken: Vec<(usize, usize)> = Vec::new();
        for placement in plan.placements {
            let job_id = self.queue[placement.demand].clone();
            let executor_id = &ids[placement.offer];
            let job = self.jobs.get_mut(&job_id).expect("queued jobs exist");
            let index = match placement.constrained {
                None => job.pending.pop_front().expect("policy respects counts"),
                Some(c) if c < job.constrained.len() => {
                    taken.push((placement.demand, c));
                    job.constrained[c]
                }
                Some(c) => {
                    taken.push((placement.demand, c));
                    let index = job.speculative[c - job.constrained.len()];
                    if job.tasks[index as usize].state != TaskState::Running {
                        continue;
                    }
                    index
                }
            };
            let executor = self
                .executors
                .get_mut(executor_id)
                .expect("offers come from executors");
            if executor.free_cores >= job.def.resources.cores {
                executor.free_cores -= job.def.resources.cores;
            } else {
                executor.queued_ahead += 1;
            }
            executor.remember_module(job.locality);
            if job.state == JobState::Queued {
                job.state = JobState::Running;
            }
            let task = &mut job.tasks[index as usize];
            // A running task launched again is a speculative copy.
            let speculative = task.state == TaskState::Running;
            set_state(&mut job.counts, task, TaskState::Running);
            task.attempts += 1;
            task.executor = Some(executor_id.clone());
            let span = job.open_span(index, executor_id, speculative, wall);
            executor.running.insert(
                TaskId {
                    job: job_id.clone(),
                    index,
                },
                RunningAttempt {
                    attempt: job.tasks[index as usize].attempts,
                    since: now,
                    span,
                    cores: job.def.resources.cores,
                    preempted: false,
                },
            );
            if executor.defined.insert(job.key) {
                actions.push(Action::Define {
                    executor: executor_id.clone(),
                    template: Box::new(template(job)),
                });
            }
            actions.push(Action::Launch {
                executor: executor_id.clone(),
                job: job_id.clone(),
                launch: Box::new(launch(job, index, executor.generation)),
            });
        }
        taken.sort_unstable_by(|a, b| b.cmp(a));
        for (d, c) in taken {
            let job = self
                .jobs
                .get_mut(&self.queue[d])
                .expect("queued jobs exist");
            if c < job.constrained.len() {
                job.constrained.remove(c);
            } else {
                job.speculative.remove(c - job.constrained.len());
            }
        }
        actions
    }

    /// Whether an executor that could take the job's tasks but has no room now (so it is
    /// not among `offered`) already has the job's module: then the job waits for it, up
    /// to the locality wait, rather than going to a cold one. Looked at only when no
    /// offered executor is warm, so it costs a walk over the executors only while a job
    /// is about to start cold.
    fn warm_without_room(&self, job: &Job, offered: &[ExecutorId]) -> bool {
        let module = job.locality;
        let now = self.now;
        self.executors.iter().any(|(id, e)| {
            e.takes_tasks()
                && !e.health.is_excluded(now)
                && e.modules.contains(&module)
                && !offered.contains(id)
        })
    }

    /// Fails every job with a task that no live executor may run: each is excluded for
    /// the task (it failed there twice with host errors) or for a period. Without this
    /// such a job would wait forever. With no live executor at all, jobs wait for one to
    /// register. Fetch errors never get here: they exclude nothing, and a task failing
    /// only with them ends when its job's `max_failures` is spent.
    fn fail_excluded_jobs(&mut self, now: SystemTime, actions: &mut Vec<Action>) {
        let clock = self.now;
        let exclusion = self.config.exclusion;
        let live: Vec<(&ExecutorId, &ExecutorData)> = self
            .executors
            .iter()
            .filter(|(_, e)| e.takes_tasks())
            .collect();
        if live.is_empty() {
            return;
        }
        let mut doomed = Vec::new();
        for job_id in &self.queue {
            let Some(job) = self.jobs.get(job_id).filter(|j| !j.state.is_final()) else {
                continue;
            };
            let candidates = job
                .constrained
                .iter()
                .copied()
                .chain(job.pending.front().copied());
            for index in candidates {
                let task = &job.tasks[index as usize];
                let why: Option<Vec<String>> = live
                    .iter()
                    .map(|(id, e)| {
                        if excluded_for_task(&exclusion, &task.failed_on, id) {
                            Some(format!(
                                "{id} (failed this task {} times)",
                                exclusion.task_failures_per_executor
                            ))
                        } else if e.health.is_excluded(clock) {
                            Some(format!(
                                "{id} (excluded for {:?} after {} task failures within {:?})",
                                exclusion.period, exclusion.executor_failures, exclusion.window
                            ))
                        } else {
                            None
                        }
                    })
                    .collect();
                if let Some(why) = why {
                    let last = task
                        .failure
                        .as_ref()
                        .map(|f| format!("; last failure: {}: {}", f.kind, f.message))
                        .unwrap_or_default();
                    doomed.push((
                        job_id.clone(),
                        format!(
                            "task {index} cannot run: every live executor is excluded for it: {}{last}",
                            why.join(", ")
                        ),
                    ));
                    break;
                }
            }
        }
        for (job_id, reason) in doomed {
            let job = self.jobs.get_mut(&job_id).expect("doomed jobs exist");
            actions.extend(Self::end_job(job, JobState::Failed, Some(reason), now));
            self.clear_running(&job_id, actions);
        }
    }

    /// Finds running tasks slow enough to copy (see [`SpeculationConfig`]) and launches
    /// copies where cores are free. Nothing when speculation is off.
    pub fn speculate(&mut self) -> Vec<Action> {
        let Some(config) = self.config.speculation else {
            return Vec::new();
        };
        let now = self.now;
        // Attempts that have run long enough to be worth a look, by job.
        let mut slow: HashMap<JobId, Vec<(u32, Duration)>> = HashMap::new();
        let mut copies: HashMap<&TaskId, usize> = HashMap::new();
        for e in self.executors.values() {
            for (task, running) in &e.running {
                *copies.entry(task).or_default() += 1;
                let ran = now.saturating_duration_since(running.since);
                if ran > config.min_runtime {
                    slow.entry(task.job.clone())
                        .or_default()
                        .push((task.index, ran));
                }
            }
        }
        let copies: HashMap<TaskId, usize> =
            copies.into_iter().map(|(t, n)| (t.clone(), n)).collect();
        let mut any = false;
        for (job_id, attempts) in slow {
            let Some(job) = self.jobs.get_mut(&job_id).filter(|j| !j.state.is_final()) else {
                continue;
            };
            let mut durations: Vec<Duration> = job
                .tasks
                .iter()
                .filter(|t| t.state == TaskState::Succeeded)
                .filter_map(|t| Some(t.finished_at_us?.saturating_sub(t.started_at_us?)))
                .map(Duration::from_micros)
                .collect();
            let Some(threshold) = config.threshold(job.tasks.len(), &mut durations) else {
                continue;
            };
            for (index, ran) in attempts {
                let task_id = TaskId {
                    job: job_id.clone(),
                    index,
                };
                if ran > threshold
                    && copies.get(&task_id) == Some(&1)
                    && job.tasks[index as usize].state == TaskState::Running
                    && !job.speculative.contains(&index)
                {
                    tracing::info!(task = %task_id, ?ran, ?threshold, "speculating a slow task");
                    job.speculative.push(index);
                    any = true;
                }
            }
            if any && !self.queue.contains(&job_id) {
                self.queue.push_back(job_id);
            }
        }
        if any { self.make_offers() } else { Vec::new() }
    }
}

/// What the job's tasks share, for the executors that run them.
fn template(job: &Job) -> JobTemplate {
    JobTemplate {
        key: job.key,
        job: job.def.id.clone(),
        task_count: job.tasks.len() as u32,
        name: job.def.name.clone(),
        module: job.def.module.clone(),
        files: job.def.files.clone(),
        args: job.def.args.clone(),
        env: job.def.env.clone(),
        resources: job.def.resources,
        determinism: job.def.options.determinism,
    }
}

fn launch(job: &Job, index: u32, generation: u64) -> TaskLaunch {
    let task = &job.tasks[index as usize];
    TaskLaunch {
        job: job.key,
        index,
        attempt: task.attempts,
        generation,
        args: task.args.clone(),
        env: task.env.clone(),
        input: task.input.clone(),
        // An escalated retry's budget; the job's goes with the job's template.
        resources: job.budgets.get(&index).copied(),
        pins: pinned(job, index),
    }
}

/// What an earlier attempt of a deterministic task ran, by digest, which every later
/// attempt (a retry, a speculative copy) must run too: a URL without a `sha256` may
/// serve other bytes by then. The first of its attempts that reported pins decides.
fn pinned(job: &Job, index: u32) -> Option<Box<Pins>> {
    if job.pins.is_empty() {
        return None;
    }
    (job.attempts.iter().enumerate())
        .filter(|(_, span)| span.task == index)
        .find_map(|(at, _)| job.pins.get(&(at as u32)))
        .map(|pins| Box::new(pins.clone()))
}
