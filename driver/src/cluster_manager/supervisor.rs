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
            self.unregistered.insert(id.clone(), now);
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
        self.unregistered.insert(id.clone(), now);
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
    fn executors_expected_back_are_not_replaced_until_given_up_on() {
        let t0 = Instant::now();
        let wait = Duration::from_secs(5);
        let mut s = Supervisor::new(3, 4, Duration::from_secs(600), 1);
        let (one, seven) = (ExecutorId("exec-1".into()), ExecutorId("exec-7".into()));
        s.expect([one.clone(), seven.clone()], t0 + wait);
        // Only the third place is launched, with an id past theirs.
        assert_eq!(ids(&s.launches_due(t0)), ["exec-8"]);
        assert_eq!(s.next_expectation_end(), Some(t0 + wait));
        // exec-1's worker reports it: adopted, no longer waited for.
        s.adopted(&one, t0);
        assert_eq!(s.next_expectation_end(), Some(t0 + wait));
        assert!(s.expectations_over(t0, |_| false).is_empty());
        // exec-7 never came back: given up on at the deadline, and its place launched.
        let over = s.expectations_over(t0 + wait, |_| false);
        assert_eq!(ids(&over), ["exec-7"]);
        assert_eq!(s.next_expectation_end(), None);
        assert_eq!(ids(&s.launches_due(t0 + wait)), ["exec-9"]);
        // Expected after its adoption (its worker was back first): not waited for.
        s.expect([one.clone()], t0 + wait);
        assert_eq!(s.next_expectation_end(), None);
        // An adopted executor nobody expected is taken, above the target.
        s.adopted(&ExecutorId("exec-20".into()), t0);
        assert_eq!(s.staying(), 4);
        assert_eq!(ids(&s.launches_due(t0 + wait)), Vec::<&str>::new());
        s.gone(&ExecutorId("exec-20".into()), None, t0 + wait);
        s.gone(&one, None, t0 + wait);
        assert_eq!(ids(&s.launches_due(t0 + wait)), ["exec-21"]);
    }

    #[test]
    fn an_expected_executor_that_registered_on_its_own_is_waited_for_while_it_stays() {
        let t0 = Instant::now();
        let wait = Duration::from_secs(5);
        let mut s = Supervisor::new(1, 4, Duration::from_secs(600), 1);
        let one = ExecutorId("exec-1".into());
        s.expect([one.clone()], t0 + wait);
        // Registered (its worker has not come back yet): still counted past the wait.
        assert!(s.expectations_over(t0 + wait, |_| true).is_empty());
        assert!(s.launches_due(t0 + wait).is_empty());
        let recheck = s.next_expectation_end().unwrap();
        assert!(recheck > t0 + wait, "checked again later");
        // Gone again without its worker reporting it: given up on then.
        assert_eq!(ids(&s.expectations_over(recheck, |_| false)), ["exec-1"]);
        assert_eq!(ids(&s.launches_due(recheck)), ["exec-2"]);
        // One that stays registered and is never reported is given up on at last.
        let two = ExecutorId("exec-2".into());
        s.gone(&two, None, recheck);
        s.expect([one.clone()], t0 + wait);
        assert!(s.expectations_over(t0 + wait, |_| true).is_empty());
        let last = t0 + wait + LATE_HOST;
        assert_eq!(ids(&s.expectations_over(last, |_| true)), ["exec-1"]);
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
