//! How many executors to launch and when: the target held, unasked exits replaced with
//! a backoff, and a limit on failures within an interval after which the driver stops
//! asking (Spark's `spark.executor.maxNumFailures` and its validity interval). Pure: the
//! caller passes the time and carries out the launches.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use flint_protocol::ExecutorId;

/// The first replacement after a failure is immediate (a SIGKILLed executor is back
/// within its start time); each further failure within the interval doubles the wait.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

pub struct Supervisor {
    target: u32,
    max_failures: u32,
    interval: Duration,
    next_id: u64,
    /// Launched and not yet exited.
    live: BTreeSet<ExecutorId>,
    /// Of those, the ones not known to have registered yet, with their launch time.
    unregistered: HashMap<ExecutorId, Instant>,
    /// Asked by the driver to go (killed, decommissioned): their exits are no failures.
    asked_to_stop: HashSet<ExecutorId>,
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
            self.unregistered.insert(id.clone(), now);
            due.push(id);
        }
        due
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
    /// (`registered(id)` says whether one has; those are not asked about again). The
    /// caller kills them and reports them [`Self::gone`] as failures: a process that
    /// hangs before dialling, a pod that stays pending.
    pub fn overdue(
        &mut self,
        now: Instant,
        timeout: Duration,
        registered: impl Fn(&ExecutorId) -> bool,
    ) -> Vec<ExecutorId> {
        self.unregistered.retain(|id, _| !registered(id));
        let mut late: Vec<ExecutorId> = self
            .unregistered
            .iter()
            .filter(|(_, at)| now.saturating_duration_since(**at) >= timeout)
            .map(|(id, _)| id.clone())
            .collect();
        late.sort();
        for id in &late {
            self.unregistered.remove(id);
        }
        late
    }

    /// When the oldest unregistered executor runs out of time, if any waits.
    pub fn next_overdue(&self, timeout: Duration) -> Option<Instant> {
        self.unregistered.values().min().map(|at| *at + timeout)
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
mod tests {
    use super::*;

    fn ids(v: &[ExecutorId]) -> Vec<&str> {
        v.iter().map(|i| i.0.as_str()).collect()
    }

    #[test]
    fn it_launches_the_target_and_replaces_an_exit_at_once() {
        let t0 = Instant::now();
        let mut s = Supervisor::new(2, 4, Duration::from_secs(600), 1);
        assert_eq!(ids(&s.launches_due(t0)), ["exec-1", "exec-2"]);
        assert!(s.launches_due(t0).is_empty(), "the target is met");
        // A clean exit nobody asked for is replaced, not counted.
        assert_eq!(s.gone(&ExecutorId("exec-1".into()), None, t0), None);
        assert_eq!(s.recent_failures(t0), 0);
        assert_eq!(ids(&s.launches_due(t0)), ["exec-3"]);
        // The first failure is replaced at once too.
        s.gone(&ExecutorId("exec-2".into()), Some("killed by signal 9"), t0);
        assert_eq!(s.recent_failures(t0), 1);
        assert_eq!(ids(&s.launches_due(t0)), ["exec-4"]);
        // An exit of an id it never launched, or twice, changes nothing.
        assert_eq!(s.gone(&ExecutorId("exec-2".into()), Some("x"), t0), None);
        assert_eq!(s.gone(&ExecutorId("other".into()), Some("x"), t0), None);
        assert_eq!(s.recent_failures(t0), 1);
    }

    #[test]
    fn an_executor_that_never_registers_is_overdue_once_after_the_launch_timeout() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(60);
        let mut s = Supervisor::new(2, 4, Duration::from_secs(600), 1);
        s.launches_due(t0);
        assert_eq!(s.next_overdue(timeout), Some(t0 + timeout));
        let registered = |id: &ExecutorId| id.0 == "exec-1";
        assert!(s.overdue(t0 + timeout / 2, timeout, registered).is_empty());
        assert_eq!(
            ids(&s.overdue(t0 + timeout, timeout, registered)),
            ["exec-2"]
        );
        // Told once; a registered one is never overdue.
        assert!(s.overdue(t0 + timeout * 3, timeout, |_| false).is_empty());
        assert_eq!(s.next_overdue(timeout), None);
        // Reported gone as a failure, it is replaced like any other.
        let late = ExecutorId("exec-2".into());
        assert_eq!(s.gone(&late, Some("did not register"), t0 + timeout), None);
        assert_eq!(s.recent_failures(t0 + timeout), 1);
        assert_eq!(ids(&s.launches_due(t0 + timeout)), ["exec-3"]);
        // One that is gone before its time is forgotten.
        s.gone(&ExecutorId("exec-3".into()), None, t0 + timeout);
        assert_eq!(s.next_overdue(timeout), None);
        assert_eq!(ids(&s.launches_due(t0 + timeout)), ["exec-4"]);
        assert_eq!(s.next_overdue(timeout), Some(t0 + timeout * 2));
    }

    #[test]
    fn failures_back_off_then_give_up_at_the_limit() {
        let t0 = Instant::now();
        let mut s = Supervisor::new(1, 4, Duration::from_secs(600), 1);
        let mut now = t0;
        let mut launched = s.launches_due(now);
        let mut waits = Vec::new();
        let mut gave_up = None;
        for _ in 0..10 {
            let id = launched.pop().expect("one launched");
            if let Some(why) = s.gone(&id, Some("exited with code 2: bad command line"), now) {
                gave_up = Some(why);
                break;
            }
            let wake = s.next_wake(now).unwrap_or(now);
            waits.push(wake - now);
            if wake > now {
                assert!(
                    s.launches_due(now).is_empty(),
                    "no launch before the backoff"
                );
                assert!(s.launches_due(wake - Duration::from_millis(1)).is_empty());
            }
            now = wake;
            launched = s.launches_due(now);
            assert_eq!(launched.len(), 1);
        }
        assert_eq!(
            waits,
            [
                Duration::ZERO,
                Duration::from_millis(500),
                Duration::from_secs(1)
            ]
        );
        let why = gave_up.expect("it gave up");
        assert!(why.contains("4 failed within 600 s"), "{why}");
        assert!(why.contains("--max-executor-failures 4"), "{why}");
        assert!(
            why.contains("exec-4") && why.contains("bad command line"),
            "{why}"
        );
        assert_eq!(s.gave_up(), Some(why.as_str()));
        assert!(s.launches_due(now + Duration::from_secs(3600)).is_empty());
        assert_eq!(s.next_wake(now), None);
    }

    #[test]
    fn old_failures_fall_out_of_the_interval_and_asked_exits_do_not_count() {
        let t0 = Instant::now();
        let interval = Duration::from_secs(60);
        let mut s = Supervisor::new(1, 2, interval, 0);
        let first = s.launches_due(t0).pop().unwrap();
        s.gone(&first, Some("killed"), t0);
        let later = t0 + interval + Duration::from_secs(1);
        assert_eq!(s.recent_failures(later), 0);
        let second = s.launches_due(later).pop().unwrap();
        // Killed on the driver's word: a kill, not a failure.
        s.asked_to_stop(&second);
        assert_eq!(s.gone(&second, Some("killed by signal 9"), later), None);
        assert_eq!(s.recent_failures(later), 0);
        let third = s.launches_due(later).pop().unwrap();
        assert_eq!(s.gone(&third, Some("killed"), later), None);
        assert_eq!(s.recent_failures(later), 1);
        assert!(s.gave_up().is_none());
    }

    #[test]
    fn the_backoff_doubles_and_stops_at_its_cap() {
        assert_eq!(backoff(1), Duration::ZERO);
        assert_eq!(backoff(2), Duration::from_millis(500));
        assert_eq!(backoff(4), Duration::from_secs(2));
        assert_eq!(backoff(12), MAX_BACKOFF);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}
