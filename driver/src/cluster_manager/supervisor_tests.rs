use super::*;

fn ids(v: &[ExecutorId]) -> Vec<&str> {
    v.iter().map(|i| i.0.as_str()).collect()
}

fn overdue_ids(v: &[Overdue]) -> Vec<&str> {
    v.iter().map(|o| o.id.0.as_str()).collect()
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
        overdue_ids(&s.overdue(t0 + timeout, timeout, registered)),
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

#[test]
fn an_executor_its_resource_manager_has_not_started_waits_then_gets_the_whole_timeout() {
    let t0 = Instant::now();
    let timeout = Duration::from_secs(60);
    let recheck = Duration::from_secs(1);
    let mut s = Supervisor::new(1, 2, Duration::from_secs(600), 1);
    let id = s.launches_due(t0).pop().unwrap();
    // Overdue at the launch timeout; its manager says it is pending: no failure, and
    // looked at again at the recheck, not a timeout later.
    let late = s.overdue(t0 + timeout, timeout, |_| false);
    assert_eq!(
        late,
        [Overdue {
            id: id.clone(),
            pending_since: None
        }]
    );
    s.still_pending(&id, t0, t0 + timeout + recheck);
    assert_eq!(s.pending(), 1);
    assert_eq!(s.next_overdue(timeout), Some(t0 + timeout + recheck));
    assert!(s.overdue(t0 + timeout, timeout, |_| false).is_empty());
    let again = s.overdue(t0 + timeout + recheck, timeout, |_| false);
    assert_eq!(
        again,
        [Overdue {
            id: id.clone(),
            pending_since: Some(t0)
        }]
    );
    // Still pending three minutes on: never a failure, nothing launched in its place.
    let three_minutes = t0 + Duration::from_secs(180);
    s.still_pending(&id, t0, three_minutes);
    assert!(s.launches_due(three_minutes).is_empty());
    assert_eq!(s.recent_failures(three_minutes), 0);
    // Started then: the whole launch timeout from that moment, no sooner.
    let late = s.overdue(three_minutes, timeout, |_| false);
    assert_eq!(late.len(), 1);
    s.started_late(&id, three_minutes);
    assert_eq!(s.pending(), 0);
    assert_eq!(s.next_overdue(timeout), Some(three_minutes + timeout));
    assert!(
        s.overdue(three_minutes + timeout / 2, timeout, |_| false)
            .is_empty()
    );
    // One gone meanwhile is never looked at again.
    s.gone(&id, None, three_minutes);
    s.still_pending(&id, t0, three_minutes);
    s.started_late(&id, three_minutes);
    assert_eq!(s.next_overdue(timeout), None);
}
