//! A job's events for `GET /v1/jobs/{id}/events` (server-sent events, streamed by
//! `http::events`): task state changes as the state machine makes them, then the job's
//! end.
//!
//! The driver publishes while it holds its state lock, so publishing never waits: each
//! watched job has a bounded broadcast channel ([`EVENTS_PER_JOB`] events), a subscriber
//! that falls that far behind loses the oldest and is told so with a `lagged` event,
//! and a job nobody watches costs one atomic load per event. The end is the last event
//! on a job's channel, so even a lagging subscriber gets it before its stream closes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use flint_protocol::JobId;
use flint_protocol::api::{AttemptNote, EgressDenial, JobView, TaskEvent};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast};

use crate::scheduler::Task;

/// Events kept for a job's slowest subscriber before it lags.
pub const EVENTS_PER_JOB: usize = 1024;

/// One event of a job's stream.
#[derive(Clone, Debug)]
pub enum JobEvent {
    Task(TaskEvent),
    /// An attempt kept by its executor through a driver's restart (or a broken
    /// connection) was taken back as its task's running attempt.
    Adopted(AttemptNote),
    /// ... or killed (or its end ignored), `reason` saying why.
    Dropped(AttemptNote),
    /// Outbound requests of an attempt that its executor refused.
    EgressDenied(EgressDenial),
    /// The job reached a final state: the stream's last event.
    End(Box<JobView>),
}

/// The channels of the jobs someone watches, and the bounds on open streams: the
/// driver's, and each holder's share of it.
pub struct JobEvents {
    channels: Mutex<HashMap<JobId, broadcast::Sender<Arc<JobEvent>>>>,
    /// Jobs with a channel: publishing skips the lock while it is 0.
    watched: AtomicUsize,
    streams: Arc<Semaphore>,
    pub max_streams: usize,
    /// Streams open per holder (holders with none are not kept).
    held: Mutex<HashMap<Holder, usize>>,
}

/// Whose a stream is: a tenant's (by name), or the admin's (`None`).
pub type Holder = Option<Arc<str>>;

/// Why a stream was not opened.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The holder has its share open already (the share it was given).
    Share(usize),
    /// The driver serves `max_streams` already.
    Driver,
}

/// A subscriber's receiver; its channel goes when the last subscriber does, and its
/// place in its holder's share with it.
pub struct Subscription {
    events: Arc<JobEvents>,
    job: JobId,
    holder: Holder,
    pub receiver: broadcast::Receiver<Arc<JobEvent>>,
    _permit: OwnedSemaphorePermit,
}

impl JobEvents {
    pub fn new(max_streams: usize) -> Arc<Self> {
        Arc::new(JobEvents {
            channels: Mutex::new(HashMap::new()),
            watched: AtomicUsize::new(0),
            streams: Arc::new(Semaphore::new(max_streams)),
            max_streams,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// Each holder's share when `tenants` tenants and the admin share the driver's
    /// streams: an equal part, so that no one of them opening streams can keep another
    /// from opening one (at least 1; all of them on a driver without tenants).
    pub fn share(&self, tenants: usize) -> usize {
        (self.max_streams / (tenants + 1)).max(1)
    }

    /// Starts receiving a job's events for `holder`, who may have `share` streams open
    /// at once; refused past that share, or when the driver's `max_streams` are open.
    pub fn subscribe(
        self: &Arc<Self>,
        job: &JobId,
        holder: Holder,
        share: usize,
    ) -> Result<Subscription, Refused> {
        {
            let mut held = self.held();
            let open = held.entry(holder.clone()).or_default();
            if *open >= share {
                return Err(Refused::Share(share));
            }
            *open += 1;
        }
        let Ok(permit) = self.streams.clone().try_acquire_owned() else {
            self.release(&holder);
            return Err(Refused::Driver);
        };
        let mut channels = self.lock();
        let receiver = channels
            .entry(job.clone())
            .or_insert_with(|| {
                self.watched.fetch_add(1, Ordering::Relaxed);
                broadcast::channel(EVENTS_PER_JOB).0
            })
            .subscribe();
        Ok(Subscription {
            events: self.clone(),
            job: job.clone(),
            holder,
            receiver,
            _permit: permit,
        })
    }

    /// Streams `holder` has open.
    pub fn held_by(&self, holder: &Holder) -> usize {
        self.held().get(holder).copied().unwrap_or(0)
    }

    fn release(&self, holder: &Holder) {
        let mut held = self.held();
        if let Some(open) = held.get_mut(holder) {
            *open -= 1;
            if *open == 0 {
                held.remove(holder);
            }
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<Holder, usize>> {
        self.held
            .lock()
            .expect("event stream holders lock poisoned")
    }

    /// Whether anyone watches `job`; callers build events only then.
    pub fn is_watched(&self, job: &JobId) -> bool {
        self.watched.load(Ordering::Relaxed) > 0 && self.lock().contains_key(job)
    }

    /// Sends an event to the job's subscribers, if it has any. Never waits.
    pub fn publish(&self, job: &JobId, event: JobEvent) {
        if self.watched.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut channels = self.lock();
        let end = matches!(event, JobEvent::End(_));
        if let Some(sender) = channels.get(job) {
            let _ = sender.send(Arc::new(event));
        }
        // Nothing follows the end: dropping the sender closes the subscribers' streams
        // once they have read what is buffered.
        if end && channels.remove(job).is_some() {
            self.watched.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<JobId, broadcast::Sender<Arc<JobEvent>>>> {
        self.channels.lock().expect("job events lock poisoned")
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.events.release(&self.holder);
        let mut channels = self.events.lock();
        // This subscription's receiver still counts until the fields drop.
        if channels
            .get(&self.job)
            .is_some_and(|sender| sender.receiver_count() <= 1)
        {
            channels.remove(&self.job);
            self.events.watched.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A task's state as a `task` event.
pub fn task_event(index: u32, task: &Task) -> TaskEvent {
    TaskEvent {
        index,
        state: task.state,
        attempt: task.attempts,
        executor: task.executor.clone(),
        error: task.error_body(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flint_protocol::api::{JobState, TaskCounts, TaskState};

    fn task(index: u32) -> JobEvent {
        JobEvent::Task(TaskEvent {
            index,
            state: TaskState::Running,
            attempt: 1,
            executor: None,
            error: None,
        })
    }

    fn end(job: &JobId) -> JobEvent {
        JobEvent::End(Box::new(JobView {
            id: job.clone(),
            name: "j".into(),
            state: JobState::Succeeded,
            created_at: String::new(),
            finished_at: None,
            tasks: 1,
            counts: TaskCounts::default(),
            error: None,
            usage: None,
            seed: None,
            tenant: None,
            priority: 0,
            waits_for: Vec::new(),
        }))
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_told_how_much_it_missed_and_still_gets_the_end() {
        let events = JobEvents::new(8);
        let job = JobId("job-1".into());
        let mut slow = events.subscribe(&job, None, 8).unwrap();
        // The publisher never waits for the subscriber, however far behind it is.
        for index in 0..(EVENTS_PER_JOB as u32 * 3) {
            events.publish(&job, task(index));
        }
        events.publish(&job, end(&job));
        let missed = match slow.receiver.recv().await {
            Err(broadcast::error::RecvError::Lagged(missed)) => missed,
            other => panic!("expected a lag, got {other:?}"),
        };
        assert_eq!(missed as usize, EVENTS_PER_JOB * 2 + 1);
        let mut last = None;
        while let Ok(event) = slow.receiver.recv().await {
            last = Some(event);
        }
        assert!(
            matches!(last.as_deref(), Some(JobEvent::End(_))),
            "{last:?}"
        );
        // The end removed the channel: the job is no longer watched.
        assert!(!events.is_watched(&job));
    }

    #[tokio::test]
    async fn streams_are_bounded_and_a_closed_one_gives_its_place_back() {
        let events = JobEvents::new(2);
        let job = JobId("job-1".into());
        let first = events.subscribe(&job, None, 2).unwrap();
        let second = events.subscribe(&JobId("job-2".into()), None, 2).unwrap();
        assert_eq!(
            events.subscribe(&job, None, 2).err(),
            Some(Refused::Share(2))
        );
        drop(second);
        assert!(!events.is_watched(&JobId("job-2".into())));
        let third = events.subscribe(&job, None, 2).unwrap();
        drop(first);
        // Another subscriber of job-1 is still there.
        assert!(events.is_watched(&job));
        drop(third);
        assert!(!events.is_watched(&job));
        assert_eq!(events.held_by(&None), 0);
        // Unwatched jobs' events go nowhere and cost nothing.
        events.publish(&job, task(0));
    }

    #[tokio::test]
    async fn a_holder_at_its_share_keeps_no_other_from_opening_one() {
        let events = JobEvents::new(7);
        // Two tenants and the admin: 7 / 3 = 2 each.
        let share = events.share(2);
        assert_eq!(share, 2);
        assert_eq!(JobEvents::new(1024).share(0), 1024);
        assert_eq!(JobEvents::new(2).share(5), 1);
        let (a, b): (Holder, Holder) = (Some("a".into()), Some("b".into()));
        let job = JobId("job-1".into());
        let held: Vec<_> = (0..share)
            .map(|_| events.subscribe(&job, a.clone(), share).unwrap())
            .collect();
        assert_eq!(
            events.subscribe(&job, a.clone(), share).err(),
            Some(Refused::Share(2))
        );
        let bs = events.subscribe(&job, b.clone(), share).unwrap();
        let admins = events.subscribe(&job, None, share).unwrap();
        assert_eq!((events.held_by(&a), events.held_by(&b)), (2, 1));
        drop(held);
        assert_eq!(events.held_by(&a), 0);
        assert!(events.subscribe(&job, a.clone(), share).is_ok());
        // The driver's own bound still holds over the shares.
        let tight = JobEvents::new(1);
        let _one = tight.subscribe(&job, a.clone(), 1).unwrap();
        assert_eq!(
            tight.subscribe(&job, b.clone(), 1).err(),
            Some(Refused::Driver)
        );
        assert_eq!(tight.held_by(&b), 0, "a refused stream holds no place");
        drop((bs, admins));
    }
}
