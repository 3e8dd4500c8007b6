//! Finished jobs in memory: the ones whose end is not committed yet (they cannot be read
//! back from the job store until it is), and a small cache of recently read or finished
//! ones, bounded in bytes. Everything else about a finished job is read from the store
//! when asked for, so the driver's memory follows what runs, not what has run.

use std::collections::HashMap;
use std::sync::Arc;

use flint_protocol::{JobId, TaskResult};
use lru::LruCache;

use crate::scheduler::Job;

/// Bytes of finished jobs kept in memory beyond those not yet committed.
pub const CACHE_BYTES: usize = 16 << 20;

pub(super) struct Archive {
    /// Finished jobs whose end is queued for the store, with its write's number.
    unsaved: HashMap<JobId, (u64, Arc<Job>)>,
    recent: LruCache<JobId, (usize, Arc<Job>)>,
    recent_bytes: usize,
    budget: usize,
    /// Bumped by every deletion: a job read from the store while one ran may be the
    /// deleted one, and is not cached.
    pub(super) deletions: u64,
}

impl Archive {
    pub(super) fn new(budget: usize) -> Self {
        Archive {
            unsaved: HashMap::new(),
            recent: LruCache::unbounded(),
            recent_bytes: 0,
            budget,
            deletions: 0,
        }
    }

    /// A job that just ended, whose end is write `write` of the store.
    pub(super) fn finished(&mut self, write: u64, job: Job) {
        self.unsaved
            .insert(job.def.id.clone(), (write, Arc::new(job)));
    }

    /// Moves jobs whose end is committed (per `is_durable`) to the cache, and trims it.
    pub(super) fn settle(&mut self, is_durable: impl Fn(u64) -> bool) {
        let saved: Vec<JobId> = self
            .unsaved
            .iter()
            .filter(|(_, (write, _))| is_durable(*write))
            .map(|(id, _)| id.clone())
            .collect();
        for id in saved {
            if let Some((_, job)) = self.unsaved.remove(&id) {
                self.cache(id, job);
            }
        }
    }

    pub(super) fn get(&mut self, id: &JobId) -> Option<Arc<Job>> {
        if let Some((_, job)) = self.unsaved.get(id) {
            return Some(job.clone());
        }
        self.recent.get(id).map(|(_, job)| job.clone())
    }

    /// The write that stores a job's end, learnt after the job was archived.
    pub(super) fn set_write(&mut self, id: &JobId, write: u64) {
        if let Some((at, _)) = self.unsaved.get_mut(id) {
            *at = write;
        }
    }

    pub(super) fn has_unsaved(&self) -> bool {
        !self.unsaved.is_empty()
    }

    pub(super) fn is_unsaved(&self, id: &JobId) -> bool {
        self.unsaved.contains_key(id)
    }

    /// Keeps a job read from the store for the next reads.
    pub(super) fn cache(&mut self, id: JobId, job: Arc<Job>) {
        let bytes = footprint(&job);
        if let Some((old, _)) = self.recent.put(id, (bytes, job)) {
            self.recent_bytes -= old;
        }
        self.recent_bytes += bytes;
        while self.recent_bytes > self.budget {
            match self.recent.pop_lru() {
                Some((_, (bytes, _))) => self.recent_bytes -= bytes,
                None => break,
            }
        }
    }

    pub(super) fn remove(&mut self, id: &JobId) {
        self.unsaved.remove(id);
        if let Some((bytes, _)) = self.recent.pop(id) {
            self.recent_bytes -= bytes;
        }
    }

    /// Jobs held, not yet committed and cached, for `/metrics`.
    pub(super) fn sizes(&self) -> (usize, usize, usize) {
        (self.unsaved.len(), self.recent.len(), self.recent_bytes)
    }
}

/// About how much memory a finished job holds.
fn footprint(job: &Job) -> usize {
    let tasks: usize = job
        .tasks
        .iter()
        .map(|t| {
            std::mem::size_of_val(t)
                + t.log.len()
                + t.failure.as_ref().map_or(0, |f| f.message.len())
                + match &t.result {
                    Some(TaskResult::Inline(bytes)) => bytes.len(),
                    Some(TaskResult::Block(_)) => 128,
                    None => 0,
                }
        })
        .sum();
    let attempts = job.attempts.capacity() * std::mem::size_of::<crate::scheduler::AttemptSpan>();
    std::mem::size_of::<Job>() + 512 + tasks + attempts
}

/// A finished job stripped of what nothing reads once it is over: its tasks' inputs.
pub(super) fn strip(mut job: Job) -> Job {
    for task in &mut job.tasks {
        task.input = flint_protocol::TaskInput::Inline(Vec::new());
        task.args = Vec::new();
        task.env = Vec::new();
    }
    job.tasks.shrink_to_fit();
    job.attempts.shrink_to_fit();
    job
}
