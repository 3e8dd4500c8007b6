//! The task runner (Spark's Executor with its TaskRunner threads): resolves each task's
//! module (fetch-cache, then compiled-module cache), queues it for a pool of task threads
//! sized to the executor's cores, and reports every attempt's end exactly once.
//!
//! Guests run only on the pool's own threads, never on the async runtime: a guest that
//! spins cannot delay heartbeats, launches or kills.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flint_fetch_cache::{Blame, CacheKey, FetchCache, FetchError, Fetched, Trust};
use flint_protocol::messages::Heartbeat;
use flint_protocol::{
    Digest, ExecutorMessage, FailureKind, InputPart, JobId, TaskDescription, TaskEnd, TaskFailure,
    TaskId, TaskInput, TaskStatus, defaults,
};
use lru::LruCache;
use tokio::sync::{OnceCell, mpsc};

use crate::compiler::{ModuleCompiler, Source};
use crate::results::{BlockWriter, ResultTarget};
use crate::sandbox::{Compiled, Kill, Sandbox, TASK_THREAD_STACK, TaskEnv, TaskRun};

/// Compiled modules kept in memory.
const MODULE_CACHE_ENTRIES: usize = 64;

/// The attempts of one task held here: almost always one, more only when an old
/// generation's attempt is still winding down beside its replacement.
type Attempts = smallvec::SmallVec<[(u32, Arc<Kill>); 1]>;

/// Keyed by task alone so that the per-task path looks it up by reference (no cloned
/// `TaskId`), with a fast hasher: this map is touched twice per task.
type AttemptMap = HashMap<TaskId, Attempts, foldhash::fast::RandomState>;

pub struct TaskRunner {
    sandbox: Arc<Sandbox>,
    fetcher: FetchCache,
    compiler: ModuleCompiler,
    modules: Mutex<LruCache<Digest, Arc<OnceCell<Arc<Compiled>>>>>,
    job_files: Mutex<LruCache<JobId, Arc<OnceCell<Arc<JobFiles>>>>>,
    /// Where jobs' file directories live.
    files_root: PathBuf,
    queue: crossbeam_channel::Sender<Work>,
    /// Kill flags of the attempts this executor holds, from launch to final status.
    attempts: Mutex<AttemptMap>,
    updates: mpsc::UnboundedSender<ExecutorMessage>,
    held: Held,
    max_log_bytes: usize,
    modules_compiled: AtomicU64,
    module_cache_hits: AtomicU64,
    fetch_hits: AtomicU64,
    fetch_misses: AtomicU64,
    compile_cache_hits: AtomicU64,
    /// Bytes downloaded into the fetch cache, results' bytes, and attempts reported.
    bytes_fetched: AtomicU64,
    result_bytes: AtomicU64,
    tasks_completed: AtomicU64,
    /// Each task thread's `/proc/self/task/<tid>/schedstat`, whose first figure is the
    /// CPU time the thread has had (read at heartbeats, not timed per task: a clock read
    /// per attempt would cost a system call on every no-op task).
    task_threads: Mutex<Vec<PathBuf>>,
    blocks: Option<Arc<dyn BlockWriter>>,
    inline_result_bytes: usize,
}

/// How a runner is set up.
pub struct RunnerSettings {
    /// Where jobs' file directories live.
    pub files_root: PathBuf,
    /// Task threads: the executor's cores.
    pub threads: usize,
    pub max_log_bytes: usize,
    /// Where results larger than `inline_result_bytes` go; without it they stay inline
    /// up to the task's output cap.
    pub blocks: Option<Arc<dyn BlockWriter>>,
    pub inline_result_bytes: usize,
}

struct Work {
    desc: TaskDescription,
    compiled: Arc<Compiled>,
    files: Option<Arc<JobFiles>>,
    kill: Arc<Kill>,
}

/// A job's files, fetched once per executor and hard-linked under one directory that
/// every task of the job gets as `/files`, read-only. Removed when the last task holding
/// it is done and the job has left the cache.
struct JobFiles {
    dir: PathBuf,
    /// Keep the cached blobs from eviction while the job may still run here.
    _pins: Vec<Fetched>,
}

impl Drop for JobFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Status updates held back while task threads have more work queued, so that a burst
/// of short tasks wakes the connection's writer once per batch instead of once per task
/// (that wake-up, a futex call, cost as much as running a no-op task). A status is held
/// at most [`HOLD_FOR`] (the flusher thread sends it then) and never when its thread's
/// queue is empty, so a lone task's status goes out at once.
#[derive(Default)]
struct Held {
    statuses: Mutex<Vec<ExecutorMessage>>,
    /// Signalled when the first status is held, to start the flusher's clock.
    first: Condvar,
}

/// The most statuses held before they are sent anyway.
const HOLD_MAX: usize = 64;
/// The longest a status is held.
const HOLD_FOR: Duration = Duration::from_millis(1);

/// Jobs whose files are kept ready.
const JOB_FILES_ENTRIES: usize = 64;

impl TaskRunner {
    /// Starts the task threads. Status updates go to `updates`.
    pub fn start(
        sandbox: Arc<Sandbox>,
        fetcher: FetchCache,
        compiler: ModuleCompiler,
        settings: RunnerSettings,
        updates: mpsc::UnboundedSender<ExecutorMessage>,
    ) -> Arc<Self> {
        let RunnerSettings {
            files_root,
            threads,
            max_log_bytes,
            blocks,
            inline_result_bytes,
        } = settings;
        // Unbounded is safe here: the driver never launches more than our cores' worth.
        let (queue, work) = crossbeam_channel::unbounded::<Work>();
        let runner = Arc::new(TaskRunner {
            sandbox,
            fetcher,
            compiler,
            modules: Mutex::new(LruCache::new(
                NonZeroUsize::new(MODULE_CACHE_ENTRIES).expect("non-zero"),
            )),
            job_files: Mutex::new(LruCache::new(
                NonZeroUsize::new(JOB_FILES_ENTRIES).expect("non-zero"),
            )),
            files_root,
            queue,
            attempts: Mutex::new(AttemptMap::default()),
            updates,
            held: Held::default(),
            max_log_bytes,
            modules_compiled: AtomicU64::new(0),
            module_cache_hits: AtomicU64::new(0),
            fetch_hits: AtomicU64::new(0),
            fetch_misses: AtomicU64::new(0),
            compile_cache_hits: AtomicU64::new(0),
            bytes_fetched: AtomicU64::new(0),
            result_bytes: AtomicU64::new(0),
            tasks_completed: AtomicU64::new(0),
            task_threads: Mutex::new(Vec::with_capacity(threads)),
            blocks,
            inline_result_bytes,
        });
        for i in 0..threads {
            let work = work.clone();
            // Threads hold a weak handle so that dropping the runner ends them.
            let runner = Arc::downgrade(&runner);
            std::thread::Builder::new()
                .name(format!("flint-task-{i}"))
                .stack_size(TASK_THREAD_STACK)
                .spawn(move || {
                    if let (Some(runner), Some(stat)) = (runner.upgrade(), thread_schedstat()) {
                        runner
                            .task_threads
                            .lock()
                            .expect("task threads lock poisoned")
                            .push(stat);
                    }
                    while let Ok(item) = work.recv() {
                        let Some(runner) = runner.upgrade() else {
                            break;
                        };
                        runner.run(item, !work.is_empty());
                    }
                })
                .expect("spawning a task thread");
        }
        let weak = Arc::downgrade(&runner);
        std::thread::Builder::new()
            .name("flint-status-flush".into())
            .spawn(move || flush_held(weak))
            .expect("spawning the status flusher");
        runner
    }

    /// Accepts a task; its status will be reported when it ends, however it ends.
    pub fn launch(self: &Arc<Self>, desc: TaskDescription) {
        let kill = Kill::new();
        {
            let mut attempts = self.lock_attempts();
            match attempts.get_mut(&desc.task) {
                Some(held) => held.push((desc.attempt, kill.clone())),
                None => {
                    let held = smallvec::smallvec![(desc.attempt, kill.clone())];
                    attempts.insert(desc.task.clone(), held);
                }
            }
        }
        let cell = {
            let mut modules = self.modules.lock().expect("module cache lock poisoned");
            modules
                // A module by URL with no digest is known by its cache key until fetched.
                .get_or_insert(desc.job.module.locality_key(), || Arc::new(OnceCell::new()))
                .clone()
        };
        if desc.job.files.is_empty()
            && matches!(desc.input, TaskInput::Inline(_))
            && let Some(compiled) = cell.get()
        {
            self.module_cache_hits.fetch_add(1, Ordering::Relaxed);
            self.enqueue(desc, compiled.clone(), None, kill);
            return;
        }
        let runner = self.clone();
        tokio::spawn(async move {
            let mut desc = desc;
            let ready = async {
                match &desc.input {
                    TaskInput::Inline(_) => {}
                    TaskInput::Fetch(input) => {
                        let fetched = runner
                            .fetch(
                                &input.url,
                                input.timestamp_ms,
                                input.digest,
                                trust(input.served_by_driver()),
                            )
                            .await?;
                        let bytes = tokio::fs::read(&fetched.path).await.map_err(|e| {
                            TaskFailure::new(
                                FailureKind::HostError,
                                format!(
                                    "reading the fetched input {}: {e}",
                                    fetched.path.display()
                                ),
                            )
                        })?;
                        desc.input = TaskInput::Inline(bytes);
                    }
                    TaskInput::Parts(parts) => {
                        desc.input = TaskInput::Inline(runner.assemble(parts).await?);
                    }
                }
                let compiled = cell
                    .get_or_try_init(|| runner.load_module(&desc))
                    .await?
                    .clone();
                let files = match desc.job.files.is_empty() {
                    true => None,
                    false => Some(runner.job_files(&desc).await?),
                };
                Ok::<_, TaskFailure>((compiled, files))
            };
            // A kill reaches the attempt while its module, input and files are still
            // being fetched (each up to the fetch deadline): the fetches are dropped and
            // its core is given back at once.
            let ready = tokio::select! {
                biased;
                ready = ready => ready.map(Some),
                () = kill.killed() => Ok(None),
            };
            match ready {
                Ok(Some((compiled, files))) => runner.enqueue(desc, compiled, files, kill),
                Ok(None) => {
                    let failure = TaskFailure::new(
                        FailureKind::Killed,
                        "killed while its module and inputs were being fetched",
                    );
                    runner.report(desc, 0, Err(failure), Vec::new(), false, false)
                }
                Err(failure) => runner.report(desc, 0, Err(failure), Vec::new(), false, false),
            }
        });
    }

    /// A `results` input as one stdin: the parts in order, fetched a few at a time (each
    /// through the fetch cache, verified by digest), never past
    /// [`defaults::MAX_TASK_INPUT_BYTES`] (the driver checked the sizes it knew; this
    /// holds whatever arrives to it).
    async fn assemble(&self, parts: &[InputPart]) -> Result<Vec<u8>, TaskFailure> {
        use futures_util::StreamExt;
        use futures_util::stream::FuturesOrdered;
        /// Fetches in flight for one task: enough to hide round trips to the driver,
        /// few enough not to crowd out other tasks' fetches.
        const PARTS_IN_FLIGHT: usize = 8;
        let max = defaults::MAX_TASK_INPUT_BYTES;
        // The parts' sizes are the job's doing, not this executor's.
        let too_large = || {
            TaskFailure::new(
                FailureKind::FetchError,
                format!("the input's parts come to more than {max} bytes (MAX_TASK_INPUT_BYTES)"),
            )
        };
        // In order, at most PARTS_IN_FLIGHT ahead of the part being copied.
        let mut fetches = FuturesOrdered::new();
        let mut ahead = parts.iter();
        for part in ahead.by_ref().take(PARTS_IN_FLIGHT) {
            fetches.push_back(self.fetch_part(part));
        }
        let mut input = Vec::new();
        for part in parts {
            let blob = fetches.next().await.expect("one fetch per part")?;
            if let Some(next) = ahead.next() {
                fetches.push_back(self.fetch_part(next));
            }
            match (part, blob) {
                (InputPart::Inline(bytes), _) => {
                    if input.len() as u64 + bytes.len() as u64 > max {
                        return Err(too_large());
                    }
                    input.extend_from_slice(bytes);
                }
                (InputPart::Fetch(_), blob) => {
                    let blob = blob.expect("a fetched part");
                    let host = |e: std::io::Error| {
                        TaskFailure::new(
                            FailureKind::HostError,
                            format!("reading the input part {}: {e}", blob.path.display()),
                        )
                    };
                    let mut file = tokio::fs::File::open(&blob.path).await.map_err(host)?;
                    let len = file.metadata().await.map_err(host)?.len();
                    if input.len() as u64 + len > max {
                        return Err(too_large());
                    }
                    input.reserve(len as usize);
                    tokio::io::AsyncReadExt::read_to_end(&mut file, &mut input)
                        .await
                        .map_err(host)?;
                }
            }
        }
        Ok(input)
    }

    async fn fetch_part(&self, part: &InputPart) -> Result<Option<Fetched>, TaskFailure> {
        match part {
            InputPart::Inline(_) => Ok(None),
            InputPart::Fetch(r) => self
                .fetch(
                    &r.url,
                    r.timestamp_ms,
                    r.digest,
                    trust(r.served_by_driver()),
                )
                .await
                .map(Some),
        }
    }

    /// The job's files, ready under one directory (fetched and linked by the first task
    /// of the job to need them; the others wait for that).
    async fn job_files(&self, desc: &TaskDescription) -> Result<Arc<JobFiles>, TaskFailure> {
        let cell = {
            let mut jobs = self.job_files.lock().expect("job files lock poisoned");
            jobs.get_or_insert(desc.task.job.clone(), || Arc::new(OnceCell::new()))
                .clone()
        };
        cell.get_or_try_init(|| async {
            let dir = self.files_root.join(&desc.task.job.0);
            let host = |what: &str, e: std::io::Error| {
                TaskFailure::new(
                    FailureKind::HostError,
                    format!("{what} {}: {e}", dir.display()),
                )
            };
            // A directory from an earlier run of this executor is stale: start afresh.
            let _ = tokio::fs::remove_dir_all(&dir).await;
            tokio::fs::create_dir_all(&dir)
                .await
                .map_err(|e| host("creating", e))?;
            let mut pins = Vec::with_capacity(desc.job.files.len());
            for file in &desc.job.files {
                let fetched = self
                    .fetch(
                        &file.url,
                        file.timestamp_ms,
                        file.digest,
                        trust(file.served_by_driver()),
                    )
                    .await?;
                // The driver checked the name: one path component, never `.` or `..`.
                let target = dir.join(&file.name);
                if tokio::fs::hard_link(&fetched.path, &target).await.is_err() {
                    tokio::fs::copy(&fetched.path, &target)
                        .await
                        .map_err(|e| host("copying a file into", e))?;
                }
                pins.push(fetched);
            }
            Ok(Arc::new(JobFiles { dir, _pins: pins }))
        })
        .await
        .cloned()
    }

    /// Puts an already compiled module in the in-memory cache, as if a task had loaded
    /// it: for embedders that compile ahead of time, and for benchmarks of the per-task
    /// path alone.
    pub fn preload(&self, digest: Digest, compiled: Compiled) {
        let cell = Arc::new(OnceCell::new_with(Some(Arc::new(compiled))));
        self.modules
            .lock()
            .expect("module cache lock poisoned")
            .put(digest, cell);
    }

    /// Interrupts an attempt. A queued one ends as killed when its turn comes; a running
    /// one at the next epoch tick.
    pub fn kill(&self, task: &TaskId, attempt: u32) {
        if let Some(held) = self.lock_attempts().get(task) {
            for (_, kill) in held.iter().filter(|(a, _)| *a == attempt) {
                kill.kill();
            }
        }
    }

    pub fn kill_all(&self) {
        for (_, kill) in self.lock_attempts().values().flatten() {
            kill.kill();
        }
    }

    pub fn heartbeat(&self) -> Heartbeat {
        Heartbeat {
            running: self.attempts_in_flight() as u32,
            modules_compiled: self.modules_compiled.load(Ordering::Relaxed),
            module_cache_hits: self.module_cache_hits.load(Ordering::Relaxed),
            fetch_hits: self.fetch_hits.load(Ordering::Relaxed),
            fetch_misses: self.fetch_misses.load(Ordering::Relaxed),
            compile_cache_hits: self.compile_cache_hits.load(Ordering::Relaxed),
            task_cpu_us: self.task_cpu_us(),
            bytes_fetched: self.bytes_fetched.load(Ordering::Relaxed),
            result_bytes: self.result_bytes.load(Ordering::Relaxed),
            tasks_completed: self.tasks_completed.load(Ordering::Relaxed),
        }
    }

    /// CPU time of the task threads since they started, in microseconds; 0 where the
    /// kernel does not say (no `/proc`, no schedstat).
    fn task_cpu_us(&self) -> u64 {
        let threads = self
            .task_threads
            .lock()
            .expect("task threads lock poisoned")
            .clone();
        threads
            .iter()
            .filter_map(|path| std::fs::read_to_string(path).ok())
            .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
            .sum::<u64>()
            / 1_000
    }

    pub fn attempts_in_flight(&self) -> usize {
        self.lock_attempts().values().map(|held| held.len()).sum()
    }

    /// A blob the driver referred to, through the fetch cache; it must hash to `digest`.
    /// Only what the driver made itself is fetched as [`Trust::Driver`] (with the cluster
    /// secret): a URL a job named goes through the operator's policy alone, wherever it
    /// points.
    async fn fetch(
        &self,
        url: &str,
        timestamp_ms: u64,
        digest: Option<Digest>,
        trust: Trust,
    ) -> Result<Fetched, TaskFailure> {
        let key = CacheKey {
            url: url.to_owned(),
            timestamp_ms,
        };
        let (fetched, hit) = self.fetcher.fetch(&key, digest, trust).await.map_err(|e| {
            // The source's fault fails the task on the job's budget; only the executor's
            // own (its cache's disk) may count against this executor.
            let kind = match (e.blame(), trust) {
                (Blame::Executor, _) => FailureKind::HostError,
                // What the driver handed out is there to be had: not reaching it, or
                // being refused it, is this executor's network or credentials.
                (Blame::Source, Trust::Driver) if driver_unreachable(&e) => FailureKind::HostError,
                (Blame::Source, _) => FailureKind::FetchError,
            };
            TaskFailure::new(kind, with_causes(&e))
        })?;
        if hit {
            self.fetch_hits.fetch_add(1, Ordering::Relaxed);
        } else {
            self.fetch_misses.fetch_add(1, Ordering::Relaxed);
            self.bytes_fetched
                .fetch_add(fetched.size, Ordering::Relaxed);
        }
        Ok(fetched)
    }

    async fn load_module(&self, desc: &TaskDescription) -> Result<Arc<Compiled>, TaskFailure> {
        let module = &desc.job.module;
        let fetched = self
            .fetch(
                &module.url,
                module.timestamp_ms,
                module.digest,
                trust(module.served_by_driver()),
            )
            .await?;
        // The digest of the bytes fetched (equal to the expected one when there was one):
        // the compiled-module cache on disk is keyed by what was compiled.
        let digest = fetched.digest;
        self.check_module(&fetched.path).await?;
        let (compiled, source) = self.compiler.load(digest, &fetched.path).await?;
        let counter = match source {
            Source::Compiled => &self.modules_compiled,
            Source::DiskCache => &self.compile_cache_hits,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::info!(module = %digest, url = %module.url, ?source, "module ready");
        Ok(Arc::new(compiled))
    }

    /// The module rules the driver checks uploads with, against this executor's engine: a
    /// module by URL reaches the executor unchecked, and one the engine cannot take must
    /// fail as the module's fault (never retried, never counted against the executor).
    async fn check_module(&self, path: &std::path::Path) -> Result<(), TaskFailure> {
        let wasm = tokio::fs::read(path).await.map_err(|e| {
            TaskFailure::new(
                FailureKind::HostError,
                format!("reading the fetched module {}: {e}", path.display()),
            )
        })?;
        let limits = flint_module_rules::Limits {
            max_memory_bytes: self.sandbox.max_memory_bytes() as u64,
            ..flint_module_rules::Limits::DEFAULT
        };
        let checked =
            tokio::task::spawn_blocking(move || flint_module_rules::check_limits(&wasm, &limits))
                .await
                .map_err(|e| {
                    TaskFailure::new(FailureKind::HostError, format!("checking the module: {e}"))
                })?;
        checked.map(drop).map_err(|rejection| {
            let kind = match rejection.limit {
                flint_module_rules::Limit::InitialMemory => FailureKind::MemoryLimit,
                _ => FailureKind::InvalidModule,
            };
            TaskFailure::new(kind, rejection.message)
        })
    }

    fn enqueue(
        &self,
        desc: TaskDescription,
        compiled: Arc<Compiled>,
        files: Option<Arc<JobFiles>>,
        kill: Arc<Kill>,
    ) {
        let work = Work {
            desc,
            compiled,
            files,
            kill,
        };
        if let Err(crossbeam_channel::SendError(work)) = self.queue.send(work) {
            let failure = TaskFailure::new(FailureKind::HostError, "executor is shutting down");
            self.report(work.desc, 0, Err(failure), Vec::new(), false, false);
        }
    }

    /// Runs one task; `more_queued` says whether this thread has another waiting.
    fn run(&self, work: Work, more_queued: bool) {
        let Work {
            mut desc,
            compiled,
            files,
            kill,
        } = work;
        if kill.is_killed() {
            let failure = TaskFailure::new(FailureKind::Killed, "killed before it started");
            return self.report(desc, 0, Err(failure), Vec::new(), false, more_queued);
        }
        let started_at_us = now_us();
        // The job's variables under the task's, except the `FLINT_*` ones, which a job
        // cannot set. Borrowed, not copied: a launch's strings go to WASI as they are.
        let job = desc.job.clone();
        let (task_args, task_env) = (
            std::mem::take(&mut desc.args),
            std::mem::take(&mut desc.env),
        );
        let env: smallvec::SmallVec<[(&str, &str); 8]> = job
            .env
            .iter()
            .chain(&task_env)
            .filter(|(k, _)| !k.starts_with("FLINT_"))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let args: smallvec::SmallVec<[&str; 8]> = std::iter::once(job.name.as_str())
            .chain(job.args.iter().chain(&task_args).map(String::as_str))
            .collect();
        let stdin = match std::mem::replace(&mut desc.input, TaskInput::Inline(Vec::new())) {
            TaskInput::Inline(bytes) => bytes,
            // `launch` fetches such inputs before a task is queued.
            input @ (TaskInput::Fetch(_) | TaskInput::Parts(_)) => {
                let failure = TaskFailure::new(
                    FailureKind::HostError,
                    format!("input {input:?} was not fetched before the task ran"),
                );
                return self.report(desc, 0, Err(failure), Vec::new(), false, more_queued);
            }
        };
        let resources = job.resources;
        let run = || {
            self.sandbox.run(
                &compiled,
                TaskRun {
                    args: &args,
                    env: &env,
                    task: TaskEnv {
                        job: &desc.task.job.0,
                        index: desc.task.index,
                        count: job.task_count,
                        attempt: desc.attempt,
                    },
                    stdin,
                    memory_bytes: (resources.memory_mb as usize) << 20,
                    timeout: Duration::from_millis(resources.timeout_ms),
                    max_output_bytes: usize::try_from(resources.max_output_bytes)
                        .unwrap_or(usize::MAX),
                    max_log_bytes: self.max_log_bytes,
                    kill,
                    fuel: resources.fuel,
                    files_dir: files.as_ref().map(|f| f.dir.as_path()),
                    result_target: self.blocks.as_ref().map(|writer| ResultTarget {
                        writer: writer.clone(),
                        task: desc.task.clone(),
                        attempt: desc.attempt,
                        generation: desc.generation,
                        inline_max: self.inline_result_bytes,
                    }),
                },
            )
        };
        // A bug of ours must cost one attempt (retried elsewhere), never the task thread
        // and with it every status this thread would have sent.
        let report =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                crate::sandbox::RunReport {
                    outcome: Err(TaskFailure::new(
                        FailureKind::HostError,
                        format!("the executor failed running the task: {what}"),
                    )),
                    log: Vec::new(),
                    log_truncated: false,
                }
            });
        self.report(
            desc,
            started_at_us,
            report.outcome,
            report.log,
            report.log_truncated,
            more_queued,
        );
    }

    fn report(
        &self,
        desc: TaskDescription,
        started_at_us: u64,
        outcome: Result<flint_protocol::TaskResult, TaskFailure>,
        log: Vec<u8>,
        log_truncated: bool,
        more_queued: bool,
    ) {
        {
            let mut attempts = self.lock_attempts();
            if let Some(held) = attempts.get_mut(&desc.task) {
                held.retain(|(a, _)| *a != desc.attempt);
                if held.is_empty() {
                    attempts.remove(&desc.task);
                }
            }
        }
        let finished_at_us = now_us();
        self.tasks_completed.fetch_add(1, Ordering::Relaxed);
        if let Ok(result) = &outcome {
            self.result_bytes.fetch_add(result.len(), Ordering::Relaxed);
        }
        let status = TaskStatus {
            task: desc.task,
            attempt: desc.attempt,
            generation: desc.generation,
            end: TaskEnd {
                started_at_us: if started_at_us == 0 {
                    finished_at_us
                } else {
                    started_at_us
                },
                finished_at_us,
                outcome,
                log,
                log_truncated,
            },
        };
        let message = ExecutorMessage::StatusUpdate(status);
        let mut held = self
            .held
            .statuses
            .lock()
            .expect("held statuses lock poisoned");
        if more_queued && held.len() < HOLD_MAX {
            held.push(message);
            if held.len() == 1 {
                self.held.first.notify_one();
            }
            return;
        }
        for earlier in held.drain(..) {
            self.send(earlier);
        }
        drop(held);
        self.send(message);
    }

    fn send(&self, message: ExecutorMessage) {
        // A closed channel means the connection is gone and the driver will treat the
        // attempt as lost with this executor; nothing else to do with the status.
        let _ = self.updates.send(message);
    }

    fn lock_attempts(&self) -> std::sync::MutexGuard<'_, AttemptMap> {
        self.attempts.lock().expect("attempts lock poisoned")
    }
}

/// Sends held statuses no later than [`HOLD_FOR`] after the first of them was held. Ends
/// with the runner.
fn flush_held(runner: Weak<TaskRunner>) {
    while let Some(runner) = runner.upgrade() {
        let held = runner
            .held
            .statuses
            .lock()
            .expect("held statuses lock poisoned");
        // Wakes now and then to notice that the runner is gone.
        let (held, _) = runner
            .held
            .first
            .wait_timeout_while(held, Duration::from_millis(200), |h| h.is_empty())
            .expect("held statuses lock poisoned");
        if held.is_empty() {
            continue;
        }
        drop(held);
        std::thread::sleep(HOLD_FOR);
        let batch = std::mem::take(
            &mut *runner
                .held
                .statuses
                .lock()
                .expect("held statuses lock poisoned"),
        );
        for message in batch {
            runner.send(message);
        }
    }
}

/// A failure to reach the driver's own routes at all, or to be let in.
fn driver_unreachable(e: &FetchError) -> bool {
    match e {
        FetchError::Request { .. } | FetchError::Resolve { .. } | FetchError::Deadline { .. } => {
            true
        }
        FetchError::Status { status, .. } => matches!(status, 401 | 403),
        _ => false,
    }
}

fn trust(served_by_driver: bool) -> Trust {
    match served_by_driver {
        true => Trust::Driver,
        false => Trust::Job,
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// An error's message followed by each of its causes not already in it: the fetch cache's
/// messages name the URL and the direct cause, but what went wrong underneath (a body
/// cut short, a connection reset) is only further down the chain.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = c.source();
    }
    message
}

/// The calling thread's schedstat file, by its own id (`/proc/thread-self` names the
/// thread as `<pid>/task/<tid>`).
fn thread_schedstat() -> Option<PathBuf> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    let path = std::path::Path::new("/proc").join(link).join("schedstat");
    path.exists().then_some(path)
}
