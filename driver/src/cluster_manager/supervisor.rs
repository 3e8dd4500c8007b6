//! How many executors to launch and when: the target held, unasked exits replaced with
//! a backoff, and a limit on failures within an interval after which the driver stops
//! asking (Spark's `spark.executor.maxNumFailures` and its validity interval); executors
//! of an earlier driver run adopted, and those expected back waited for instead of
//! replaced. Pure: the caller passes the time and carries out the launches.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use flint_protocol::ExecutorId;

/// The first replacement after a failure is immediate (a SIGKILLed executor is back
/// within its start time); each further failure within the interval doubles the wait.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How often an executor expected back that registered on its own (its host has not)
/// is checked for still being there, and for how long past the wait: a worker tries to
/// reach a lost driver at least every 5 s, so one that is not back by then has another
/// reason (or the executor is no worker's).
const RECHECK_EXPECTED: Duration = Duration::from_secs(1);
const LATE_HOST: Duration = Duration::from_secs(30);

/// A launched executor not registered yet.
#[derive(Clone, Copy, Debug)]
struct Unstarted {
    /// When it was launched (adopted), or when its resource manager started it after a
    /// wait: the launch timeout counts from here.
    since: Instant,
    /// When to look at it again while its resource manager has not started it (pending in
    /// a queue, refused for now): set by [`Supervisor::still_pending`].
    recheck: Option<Instant>,
    /// When it began waiting for its resource manager, while it waits.
    pending_since: Option<Instant>,
}

impl Unstarted {
    fn at(since: Instant) -> Unstarted {
        Unstarted {
            since,
            recheck: None,
            pending_since: None,
        }
    }

    fn due(&self, timeout: Duration) -> Instant {
        self.recheck.unwrap_or(self.since + timeout)
    }
}

/// A launched executor whose time to register ran out ([`Supervisor::overdue`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overdue {
    pub id: ExecutorId,
    /// Since when it has waited for its resource manager, if it was waiting when last
    /// looked at.
    pub pending_since: Option<Instant>,
}

pub struct Supervisor {
    target: u32,
    max_failures: u32,
    interval: Duration,
    next_id: u64,
    /// Launched and not yet exited.
    live: BTreeSet<ExecutorId>,
    /// Of those, the ones not known to have registered yet.
    unregistered: HashMap<ExecutorId, Unstarted>,
    /// Asked by the driver to go (killed, decommissioned): their exits are no failures.
    asked_to_stop: HashSet<ExecutorId>,
    /// Of the live, executors of an earlier driver run expected back (their worker has
    /// not registered again yet): when to stop waiting for one that has not registered
    /// either, and for one that has (its host still not reporting it).
    expected: HashMap<ExecutorId, (Instant, Instant)>,
    /// When each unclean, unasked exit within the interval happened, oldest first.
    failures: VecDeque<Instant>,
    not_before: Option<Instant>,
    gave_up: Option<String>,
}

impl Supervisor {
    /// Ids start at `exec-{first_id}`: a driver restarted over its data dir goes on
    /// from where the last run stopped, so that no id is used twice (an executor of
    /// the last run may still be on its way out).
    pub fn new(target: u32, max_failures: u32, interval: Duration, first_id: u64) -> Self {
        Supervisor {
            target,
            max_failures: max_failures.max(1),
            interval,
            next_id: first_id.max(1),
            live: BTreeSet::new(),
            unregistered: HashMap::new(),
            asked_to_stop: HashSet::new(),
            expected: HashMap::new(),
            failures: VecDeque::new(),
            not_before: None,
            gave_up: None,
        }
    }

    /// The executors to launch now, with their ids, counted as live from here on.
    pub fn launches_due(&mut self, now: Instant) -> Vec<ExecutorId> {
        if self.gave_up.is_some() || self.not_before.is_some_and(|at| at > now) {
            return Vec::new();
        }
        let mut due = Vec::new();
        while (self.live.len() as u32) < self.target {
            let id = ExecutorId(format!("exec-{}", self.next_id));
            self.next_id += 1;
            self.live.insert(id.clone());
            self.unregistered.insert(id.clone(), Unstarted::at(now));
            due.push(id);
        }
        due
    }

    /// Executors of an earlier driver run that may come back (their hosts report them
    /// late): counted as live, so that none is launched in their place, until they are
    /// [`Self::adopted`] or [`Self::expectations_over`] gives up on them at `until`.
    pub fn expect(&mut self, ids: impl IntoIterator<Item = ExecutorId>, until: Instant) {
        for id in ids {
            self.skip_id(&id);
            // One adopted already is no longer waited for.
            if self.live.insert(id.clone()) {
                self.expected.insert(id, (until, until + LATE_HOST));
            }
        }
    }

    /// Its cluster manager found this executor of an earlier driver run still running:
    /// live from now on, as if launched now (it has the launch timeout to register, if
    /// it has not). An executor nobody expected is taken too, above the target if need
    /// be: it may run tasks, and an idle one is what dynamic allocation removes first.
    pub fn adopted(&mut self, id: &ExecutorId, now: Instant) {
        self.skip_id(id);
        self.expected.remove(id);
        self.live.insert(id.clone());
        self.unregistered.insert(id.clone(), Unstarted::at(now));
    }

    /// The executors expected back that are given up on now: not registered by their
    /// deadline; registered but gone since, or still not reported by their host
    /// [`LATE_HOST`] later (`registered(id)` says whether one is registered now).
    /// Forgotten: this run never launched them, and their places are launched again.
    pub fn expectations_over(
        &mut self,
        now: Instant,
        registered: impl Fn(&ExecutorId) -> bool,
    ) -> Vec<ExecutorId> {
        let mut over: Vec<ExecutorId> = Vec::new();
        for (id, (until, last)) in &mut self.expected {
            if now >= *last {
                over.push(id.clone());
            } else if registered(id) {
                // Back on its own, its host not yet: asked again in a while.
                *until = (now + RECHECK_EXPECTED).min(*last);
            } else if now >= *until {
                over.push(id.clone());
            }
        }
        over.sort();
        for id in &over {
            self.expected.remove(id);
            self.live.remove(id);
        }
        over
    }

    /// When an executor expected back is next to be given up on, if any is.
    pub fn next_expectation_end(&self) -> Option<Instant> {
        self.expected.values().map(|(until, _)| *until).min()
    }

    /// An id of an earlier run (`exec-N`) is never given out again.
    fn skip_id(&mut self, id: &ExecutorId) {
        if let Some(n) =
            id.0.strip_prefix("exec-")
                .and_then(|n| n.parse::<u64>().ok())
        {
            self.next_id = self.next_id.max(n.saturating_add(1));
        }
    }

    /// The driver asked this executor to go: its exit is not a failure.
    pub fn asked_to_stop(&mut self, id: &ExecutorId) {
        if self.live.contains(id) {
            self.asked_to_stop.insert(id.clone());
        }
    }

    /// An executor it launched has gone: exited, failed to launch, or lost with its
    /// host. `failure` says how, when it counts as one (not clean, not asked). Returns
    /// the reason it gave up, when this failure made it give up.
    pub fn gone(&mut self, id: &ExecutorId, failure: Option<&str>, now: Instant) -> Option<String> {
        if !self.live.remove(id) {
            return None;
        }
        self.unregistered.remove(id);
        self.expected.remove(id);
        let asked = self.asked_to_stop.remove(id);
        let failure = failure.filter(|_| !asked)?;
        self.prune(now);
        self.failures.push_back(now);
        let recent = self.failures.len() as u32;
        if recent >= self.max_failures && self.gave_up.is_none() {
            let why = format!(
                "stopped launching executors: {recent} failed within {} s \
                 (--max-executor-failures {}); the last, {id}, {failure}",
                self.interval.as_secs(),
                self.max_failures
            );
            self.gave_up = Some(why.clone());
            return Some(why);
        }
        self.not_before = Some(now + backoff(recent));
        None
    }

    /// Executors launched more than `timeout` ago that have not registered
    /// (`registered(id)` says whether one has; those are not asked about again), and
    /// those waiting for their resource manager whose recheck is due. The caller asks
    /// the manager whether each is still pending ([`Self::still_pending`]), started late
    /// ([`Self::started_late`]), or else kills it and reports it [`Self::gone`] as a
    /// failure: a process that hangs before dialling.
    pub fn overdue(
        &mut self,
        now: Instant,
        timeout: Duration,
        registered: impl Fn(&ExecutorId) -> bool,
    ) -> Vec<Overdue> {
        self.unregistered.retain(|id, _| !registered(id));
        let mut late: Vec<Overdue> = self
            .unregistered
            .iter()
            .filter(|(_, unstarted)| now >= unstarted.due(timeout))
            .map(|(id, unstarted)| Overdue {
                id: id.clone(),
                pending_since: unstarted.pending_since,
            })
            .collect();
        late.sort_by(|a, b| a.id.cmp(&b.id));
        for overdue in &late {
            self.unregistered.remove(&overdue.id);
        }
        late
    }

    /// Its resource manager has not started this overdue executor yet (a pod pending, a
    /// batch job queued, a launch refused for now): waiting since `since`, not a
    /// failure; looked at again at `recheck`.
    pub fn still_pending(&mut self, id: &ExecutorId, since: Instant, recheck: Instant) {
        if self.live.contains(id) {
            self.unregistered.insert(
                id.clone(),
                Unstarted {
                    since,
                    recheck: Some(recheck),
                    pending_since: Some(since),
                },
            );
        }
    }

    /// This overdue executor waited for its resource manager, which has started it
    /// since: it has the whole launch timeout from `now` to register.
    pub fn started_late(&mut self, id: &ExecutorId, now: Instant) {
        if self.live.contains(id) {
            self.unregistered.insert(id.clone(), Unstarted::at(now));
        }
    }

    /// When the next unregistered executor runs out of time or is to be looked at
    /// again, if any waits.
    pub fn next_overdue(&self, timeout: Duration) -> Option<Instant> {
        self.unregistered.values().map(|u| u.due(timeout)).min()
    }

    /// Unregistered executors not known to wait for their resource manager, with when
    /// they were launched.
    pub fn unstarted(&self) -> Vec<(ExecutorId, Instant)> {
        (self.unregistered.iter())
            .filter(|(_, u)| u.pending_since.is_none())
            .map(|(id, u)| (id.clone(), u.since))
            .collect()
    }

    /// Whether it launched this executor and has not heard it go.
    pub fn is_live(&self, id: &ExecutorId) -> bool {
        self.live.contains(id)
    }

    /// Executors launched and waiting for their resource manager to start them.
    pub fn pending(&self) -> u32 {
        self.unregistered
            .values()
            .filter(|u| u.pending_since.is_some())
            .count() as u32
    }

    /// When the next launch may happen, if one is wanted and waits.
    pub fn next_wake(&self, now: Instant) -> Option<Instant> {
        if self.gave_up.is_some() || self.live.len() as u32 >= self.target {
            return None;
        }
        self.not_before.filter(|at| *at > now)
    }

    /// Dynamic allocation moved the target. Nothing is killed for a lower one: the
    /// caller decommissions idle executors, and their clean exits are not replaced.
    pub fn set_target(&mut self, target: u32) {
        self.target = target;
    }

    /// Launched, not yet gone, and not asked to go.
    pub fn staying(&self) -> u32 {
        (self.live.len() - self.asked_to_stop.len()) as u32
    }

    /// The number the next executor's id will have.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    pub fn target(&self) -> u32 {
        self.target
    }

    pub fn recent_failures(&mut self, now: Instant) -> u32 {
        self.prune(now);
        self.failures.len() as u32
    }

    pub fn max_failures(&self) -> u32 {
        self.max_failures
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    pub fn backoff_left(&self, now: Instant) -> Duration {
        self.not_before
            .map_or(Duration::ZERO, |at| at.saturating_duration_since(now))
    }

    pub fn gave_up(&self) -> Option<&str> {
        self.gave_up.as_deref()
    }

    fn prune(&mut self, now: Instant) {
        while self
            .failures
            .front()
            .is_some_and(|at| now.saturating_duration_since(*at) >= self.interval)
        {
            self.failures.pop_front();
        }
    }
}

/// The wait before the next launch after the `recent`-th failure in the interval.
fn backoff(recent: u32) -> Duration {
    if recent <= 1 {
        return Duration::ZERO;
    }
    let doublings = (recent - 2).min(16);
    (FIRST_BACKOFF * 2u32.pow(doublings)).min(MAX_BACKOFF)
}

#[cfg(test)]
#[path = "supervisor_tests.rs"]
mod tests;
