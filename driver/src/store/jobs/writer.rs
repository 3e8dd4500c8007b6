//! The job store's writer thread: task and job ends, group-committed. Commits are at
//! least a commit interval apart (5 ms by default): each costs a sync of the file and a
//! few page writes whatever it holds, and at 100,000 task ends a second committing as
//! fast as the disk allows spent more CPU than the tasks.
//!
//! A commit that fails (a full disk, most likely) loses nothing: its writes stay queued
//! and are tried again, a second later at first and at most every 30 s, with whatever
//! arrived meanwhile. The driver serves them from memory until then.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flint_protocol::records::{AttemptRecord, JobEndRecord, JobSummaryRecord, TaskEndRecord};
use flint_protocol::{Digest, JobId};
use redb::{Database, ReadableTable};

use super::faults::Faults;
use super::fold::set_mark;
use super::handle::Handle;
use super::journal::record::Journaled;
use super::journal::{Journal, Position};
use super::rows::{end_job, insert_encoded};
use super::schema::{
    EXECUTORS, JOB_ATTEMPTS, JOBS, MEMO, MEMO_BY_JOB, META, NEXT_SEQUENCE, TASK_ENDS,
};
use super::{StoreError, db_error};

/// Ends written per commit at most; a bound on how long one commit holds the writer.
const GROUP_COMMIT: usize = 4096;
/// About this many bytes of one job's task ends (inline results and logs, mostly) per
/// stored value: a commit of 4,096 ends with 1 MiB inline results each is split, not one
/// 4 GiB value.
const VALUE_BYTES: usize = 1 << 20;
/// The wait before retrying a failed commit, doubling up to the second.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

pub(super) enum Write {
    /// An accepted job as synced to the journal, ending at this position.
    Job(Box<Journaled>, Position),
    TaskEnd(JobId, u32, TaskEndRecord),
    JobEnd(JobId, JobEndRecord, Box<JobSummaryRecord>),
    Attempts(JobId, Vec<AttemptRecord>),
    /// A memoize job's task succeeded with an inline result under this key.
    Memo(Digest, JobId, u32),
    /// An executor registered (`true`) or left (`false`).
    Executor(String, bool),
    /// Try to commit what came before now, then answer.
    Flush(mpsc::SyncSender<()>),
}

pub(super) struct Writer {
    /// The queue, and the number of the latest write sent: numbered and sent under one
    /// lock, so numbers reach the writer in order and "committed up to n" means every
    /// write up to n.
    writes: Mutex<(u64, mpsc::Sender<(u64, Write)>)>,
    state: Arc<WriterState>,
    /// The writer thread, woken early by a flush.
    thread: std::thread::Thread,
}

/// What the writer thread shares with the store's callers.
struct WriterState {
    /// The number of the latest write committed (every one before it is too).
    committed: AtomicU64,
    /// The same, for those who wait for a write to be durable (an executor's task ends
    /// are acknowledged once they are).
    durable: tokio::sync::watch::Sender<u64>,
    /// Group commits of task and job ends so far.
    commits: AtomicU64,
    /// A flush is waiting: stop waiting out the commit interval.
    flush: AtomicBool,
}

impl Writer {
    pub(super) fn start(
        db: Arc<Handle>,
        journal: Arc<Journal>,
        faults: Arc<Faults>,
        next_sequence: u64,
        commit_interval: Duration,
    ) -> Result<Self, StoreError> {
        let (writes, queue) = mpsc::channel();
        let state = Arc::new(WriterState {
            committed: AtomicU64::new(0),
            durable: tokio::sync::watch::Sender::new(0),
            commits: AtomicU64::new(0),
            flush: AtomicBool::new(false),
        });
        let shared = state.clone();
        let thread = std::thread::Builder::new()
            .name("flint-job-store".into())
            .spawn(move || {
                let mut loop_ = WriteLoop {
                    db: &db,
                    journal: &journal,
                    faults: &faults,
                    queue: &queue,
                    next_sequence,
                    commit_interval,
                    state: &shared,
                    held: VecDeque::new(),
                };
                loop_.run();
            })
            .map_err(db_error)?;
        Ok(Writer {
            writes: Mutex::new((0, writes)),
            state,
            thread: thread.thread().clone(),
        })
    }

    /// Queues a write; returns its number.
    pub(super) fn send(&self, write: Write) -> u64 {
        let mut writes = self.writes.lock().expect("no panic while sending");
        writes.0 += 1;
        // The writer thread lives as long as the store; a send fails only while the
        // process is going down, when the end is re-run after restart anyway.
        let _ = writes.1.send((writes.0, write));
        writes.0
    }

    pub(super) fn committed(&self) -> u64 {
        self.state.committed.load(Ordering::Acquire)
    }

    /// The number of the latest write sent: once it is committed, so is everything
    /// sent before this call.
    pub(super) fn last_sent(&self) -> u64 {
        self.writes.lock().expect("no panic while sending").0
    }

    /// Changes whenever a commit lands, to the number of the latest write committed.
    pub(super) fn durable(&self) -> tokio::sync::watch::Receiver<u64> {
        self.state.durable.subscribe()
    }

    pub(super) fn commits(&self) -> u64 {
        self.state.commits.load(Ordering::Relaxed)
    }

    pub(super) fn flush(&self) {
        let (done, wait) = mpsc::sync_channel(1);
        self.send(Write::Flush(done));
        self.state.flush.store(true, Ordering::Release);
        self.thread.unpark();
        // Err: the writer is gone (the process is stopping).
        let _ = wait.recv();
    }
}

struct WriteLoop<'a> {
    db: &'a Handle,
    journal: &'a Journal,
    faults: &'a Faults,
    queue: &'a mpsc::Receiver<(u64, Write)>,
    next_sequence: u64,
    commit_interval: Duration,
    state: &'a WriterState,
    /// Writes whose commit failed, oldest first, to be tried again.
    held: VecDeque<(u64, Write)>,
}

impl WriteLoop<'_> {
    fn run(&mut self) {
        let mut last_commit: Option<Instant> = None;
        let mut retry = RETRY_FIRST;
        loop {
            let first = match self.held.pop_front() {
                Some(held) => held,
                None => match self.queue.recv() {
                    Ok(write) => write,
                    Err(_) => return,
                },
            };
            // Ends arriving within the interval join this commit. A backlog (the last
            // commit was full) is written without waiting, and a flush stops the wait.
            // Parked, not blocked in `recv`: a task end sent meanwhile wakes nobody.
            if let Some(last) = last_commit {
                let deadline = last + self.commit_interval;
                loop {
                    let now = Instant::now();
                    if now >= deadline
                        || matches!(first.1, Write::Flush(_))
                        || self.state.flush.load(Ordering::Acquire)
                    {
                        break;
                    }
                    std::thread::park_timeout(deadline - now);
                }
            }
            self.state.flush.store(false, Ordering::Release);
            let mut batch = vec![first];
            while batch.len() < GROUP_COMMIT {
                match self
                    .held
                    .pop_front()
                    .map(Ok)
                    .unwrap_or_else(|| self.queue.try_recv())
                {
                    Ok(next) => batch.push(next),
                    Err(_) => break,
                }
            }
            let full = batch.len() >= GROUP_COMMIT;
            let committed = {
                let _alone = self
                    .journal
                    .syncs
                    .lock()
                    .expect("no panic under the sync lock");
                self.faults.commit().and_then(|()| {
                    let db = self.db.get()?;
                    commit(&db, &batch, &mut self.next_sequence)
                })
            };
            self.state.commits.fetch_add(1, Ordering::Relaxed);
            if let Ok(folded) = &committed {
                let last = batch.last().map_or(0, |(n, _)| *n);
                self.state.committed.fetch_max(last, Ordering::AcqRel);
                self.state.durable.send_if_modified(|at| {
                    let moved = last > *at;
                    *at = (*at).max(last);
                    moved
                });
                if let Some(mark) = folded {
                    self.journal.folded(*mark);
                    self.journal.prepare();
                }
            }
            // Answered once `committed` says what the commit did.
            for (_, write) in &batch {
                if let Write::Flush(done) = write {
                    let _ = done.try_send(());
                }
            }
            match committed {
                Ok(_) => {
                    last_commit = (!full).then(Instant::now);
                    retry = RETRY_FIRST;
                }
                Err(e) => {
                    if Handle::needs_reopen(&e)
                        && let Err(reopen) = self.db.reopen()
                    {
                        tracing::error!(error = %reopen, "job store: reopening after a failed commit");
                    }
                    tracing::error!(
                        error = %e, writes = batch.len(), retry_in_ms = retry.as_millis() as u64,
                        "job store commit failed; the ends are kept in memory and tried again"
                    );
                    // Flushes were answered above; the rest go back in front, in
                    // order, ahead of anything that came since.
                    let unwritten = batch
                        .into_iter()
                        .filter(|(_, w)| !matches!(w, Write::Flush(_)));
                    for write in unwritten.rev() {
                        self.held.push_front(write);
                    }
                    if !self.wait_before_retry(retry) {
                        // The store is gone: what is held is lost, as in a crash (the
                        // journal keeps its jobs), rather than retried forever.
                        return;
                    }
                    retry = (retry * 2).min(RETRY_MAX);
                    last_commit = None;
                }
            }
        }
    }

    /// Waits `retry`, answering flushes meanwhile (they would otherwise wait as long as
    /// the disk stays full): a clean stop on a full disk loses the ends it could not
    /// write, as a crash would, and their tasks run again. False once the store is
    /// dropped.
    fn wait_before_retry(&mut self, retry: Duration) -> bool {
        let until = Instant::now() + retry;
        loop {
            let now = Instant::now();
            if now >= until {
                return true;
            }
            match self.queue.recv_timeout(until - now) {
                Ok((_, Write::Flush(done))) => {
                    let _ = done.try_send(());
                }
                Ok(write) => self.held.push_back(write),
                Err(mpsc::RecvTimeoutError::Timeout) => return true,
                Err(mpsc::RecvTimeoutError::Disconnected) => return false,
            }
        }
    }
}

/// One job's ends in a commit: the job, its (index, end) pairs, their bytes so far.
type JobValue<'a> = (&'a JobId, Vec<(u32, &'a TaskEndRecord)>, usize);

/// Commits a batch; returns the journal position it folded up to, if it held jobs.
/// Task ends, memo entries and timelines are stored only for a job the database holds
/// (once the batch's own jobs are in): those of a job never stored (its record was
/// refused) or deleted meanwhile would outlive it, as nothing would ever delete them.
fn commit(
    db: &Database,
    batch: &[(u64, Write)],
    next_sequence: &mut u64,
) -> Result<Option<Position>, StoreError> {
    let txn = db.begin_write().map_err(db_error)?;
    // Jobs first: the rest of the batch may end them.
    let mut folded = None;
    for (_, write) in batch {
        if let Write::Job(job, position) = write {
            insert_encoded(&txn, &job.job, job.record_bytes(), job.ends_bytes(), None)?;
            folded = Some(*position);
        }
    }
    if let Some(mark) = folded {
        set_mark(&txn, mark)?;
    }
    let sequence = put_task_ends(&txn, batch, *next_sequence)?;
    // After the task ends: a job's end is stored with (or after) its tasks'.
    for (_, write) in batch {
        if let Write::JobEnd(job, end, summary) = write {
            end_job(&txn, &job.0, end, summary)?;
        }
    }
    put_timelines_and_memos(&txn, batch)?;
    put_executors(&txn, batch)?;
    txn.open_table(META)
        .map_err(db_error)?
        .insert(NEXT_SEQUENCE, sequence)
        .map_err(db_error)?;
    txn.commit().map_err(db_error)?;
    *next_sequence = sequence;
    Ok(folded)
}

/// The batch's task ends, one value per job per commit (split when large), in the
/// order they came, numbered from `sequence`; returns the next number.
fn put_task_ends(
    txn: &redb::WriteTransaction,
    batch: &[(u64, Write)],
    mut sequence: u64,
) -> Result<u64, StoreError> {
    let jobs = txn.open_table(JOBS).map_err(db_error)?;
    let mut ends = txn.open_table(TASK_ENDS).map_err(db_error)?;
    let mut values: Vec<JobValue> = Vec::new();
    let mut value_of: HashMap<&JobId, Option<usize>> = HashMap::new();
    let mut put = |job: &JobId, value: &[(u32, &TaskEndRecord)]| {
        let bytes = postcard::to_stdvec(value)?;
        ends.insert((job.0.as_str(), sequence), bytes.as_slice())
            .map_err(db_error)?;
        sequence += 1;
        Ok::<_, StoreError>(())
    };
    for (_, write) in batch {
        let Write::TaskEnd(job, index, end) = write else {
            continue;
        };
        let at = match value_of.get(job) {
            Some(at) => *at,
            None => {
                let stored = jobs.get(job.0.as_str()).map_err(db_error)?.is_some();
                let at = stored.then(|| {
                    values.push((job, Vec::new(), 0));
                    values.len() - 1
                });
                value_of.insert(job, at);
                at
            }
        };
        let Some(at) = at else { continue };
        let (_, value, bytes) = &mut values[at];
        value.push((*index, end));
        *bytes += 64 + end.log.len() + end.result.as_ref().map_or(0, |r| r.len() as usize);
        if *bytes >= VALUE_BYTES {
            put(job, value)?;
            value.clear();
            *bytes = 0;
        }
    }
    for (job, value, _) in &values {
        if !value.is_empty() {
            put(job, value)?;
        }
    }
    Ok(sequence)
}

/// The executors that registered or left, in the order they did.
fn put_executors(txn: &redb::WriteTransaction, batch: &[(u64, Write)]) -> Result<(), StoreError> {
    let mut table = txn.open_table(EXECUTORS).map_err(db_error)?;
    for (_, write) in batch {
        if let Write::Executor(id, present) = write {
            match present {
                true => table.insert(id.as_str(), ()).map_err(db_error)?,
                false => table.remove(id.as_str()).map_err(db_error)?,
            };
        }
    }
    Ok(())
}

/// The batch's timelines and memo entries, each of a job the database holds.
fn put_timelines_and_memos(
    txn: &redb::WriteTransaction,
    batch: &[(u64, Write)],
) -> Result<(), StoreError> {
    let mut attempts = txn.open_table(JOB_ATTEMPTS).map_err(db_error)?;
    let jobs = txn.open_table(JOBS).map_err(db_error)?;
    let stored = |job: &str| Ok::<_, StoreError>(jobs.get(job).map_err(db_error)?.is_some());
    let mut memo = txn.open_table(MEMO).map_err(db_error)?;
    let mut memo_by_job = txn.open_table(MEMO_BY_JOB).map_err(db_error)?;
    for (_, write) in batch {
        match write {
            Write::Attempts(job, value) if stored(&job.0)? => {
                let bytes = postcard::to_stdvec(value)?;
                attempts
                    .insert(job.0.as_str(), bytes.as_slice())
                    .map_err(db_error)?;
            }
            Write::Memo(key, job, index) if stored(&job.0)? => {
                // The first computation keeps the entry while its job is stored; an
                // entry whose job was deleted meanwhile gives way to the next one.
                let held = memo
                    .get(key.0.as_slice())
                    .map_err(db_error)?
                    .map(|v| v.value().0.to_owned());
                if let Some(holder) = held
                    && stored(&holder)?
                {
                    continue;
                }
                memo.insert(key.0.as_slice(), (job.0.as_str(), *index))
                    .map_err(db_error)?;
                memo_by_job
                    .insert((job.0.as_str(), *index), key.0.as_slice())
                    .map_err(db_error)?;
            }
            _ => {}
        }
    }
    Ok(())
}
