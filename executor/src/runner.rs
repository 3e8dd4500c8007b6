//! The task runner (Spark's Executor with its TaskRunner threads): resolves each task's
//! module (fetch-cache, then compiled-module cache), queues it for a pool of task threads
//! sized to the executor's cores, and reports every attempt's end exactly once.
//!
//! Guests run only on the pool's own threads, never on the async runtime: a guest that
//! spins cannot delay heartbeats, launches or kills.
//!
//! [`prepare`] holds the async side before a task queues (module, input, files);
//! [`reporting`] the one way an attempt's end is reported (into the [`EndBuffer`]).

mod counters;
mod egress;
mod modules;
mod prepare;
mod reporting;
mod tape;

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flint_fetch_cache::FetchCache;
use flint_fetch_cache::egress::AllowList;
use flint_protocol::{FailureKind, JobId, Pins, TaskDescription, TaskFailure, TaskId, TaskInput};
use lru::LruCache;
use tokio::sync::OnceCell;

use self::counters::{AttemptCpu, thread_schedstat};
use self::egress::Networks;
use self::modules::ModuleCache;
pub use self::prepare::DriverLink;
use self::prepare::{JobFiles, trust};
use self::reporting::now_us;
use crate::compiler::ModuleCompiler;
use crate::ends::EndBuffer;
use crate::results::{BlockWriter, ResultTarget};
use crate::sandbox::{Compiled, EngineKind, Kill, Sandbox, TASK_THREAD_STACK, TaskEnv, TaskRun};

/// One attempt held here, from its launch to its end: what stops it, and what a
/// registration lists it by.
struct Live {
    attempt: u32,
    generation: u64,
    kill: Arc<Kill>,
    /// When its guest started (Unix microseconds); 0 while it waits.
    started_at_us: AtomicU64,
}

/// The attempts of one task held here: almost always one, more only when an old
/// generation's attempt is still winding down beside its replacement.
type Attempts = smallvec::SmallVec<[Arc<Live>; 1]>;

/// Keyed by task alone so that the per-task path looks it up by reference (no cloned
/// `TaskId`), with a fast hasher: this map is touched twice per task.
type AttemptMap = HashMap<TaskId, Attempts, foldhash::fast::RandomState>;

pub struct TaskRunner {
    sandbox: Arc<Sandbox>,
    fetcher: FetchCache,
    compiler: ModuleCompiler,
    /// What module references resolved to here, and the compiled modules.
    modules: Mutex<ModuleCache>,
    job_files: Mutex<LruCache<JobId, Arc<OnceCell<Arc<JobFiles>>>>>,
    /// Where jobs' file directories live.
    files_root: PathBuf,
    queue: crossbeam_channel::Sender<Work>,
    /// The attempts this executor holds, from launch until their end is in `ends`.
    attempts: Mutex<AttemptMap>,
    ends: Arc<EndBuffer>,
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
    /// The connection to the driver as the backend sees it, for fetches from the driver
    /// to wait out its restart (see `prepare::DriverLink`); none outside an executor.
    driver_link: Option<tokio::sync::watch::Receiver<DriverLink>>,
    networks: Networks,
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
    /// The executor's connection to its driver, as the backend publishes it.
    pub driver_link: Option<tokio::sync::watch::Receiver<DriverLink>>,
    /// The operator's ceiling over tasks' outbound HTTP (`--egress-allow`).
    pub egress_allow: Arc<AllowList>,
}

struct Work {
    desc: TaskDescription,
    compiled: Arc<Compiled>,
    files: Option<Arc<JobFiles>>,
    live: Arc<Live>,
    /// Bytes downloaded to get it ready (its usage's `fetched_bytes`).
    fetched: u64,
    /// What a deterministic task runs, by digest (checked against its launch's pins).
    pins: Option<Box<Pins>>,
}

tokio::task_local! {
    /// Bytes the fetches of one attempt's preparation downloaded: every fetch adds what
    /// it did not find in the cache, whichever of the attempt's module, files and input
    /// it was for (a job's files are fetched once, by the attempt that needed them first).
    static FETCHED: std::cell::Cell<u64>;
}

/// Counts `bytes` against the attempt being prepared, if any.
fn count_fetched(bytes: u64) {
    let _ = FETCHED.try_with(|fetched| fetched.set(fetched.get() + bytes));
}

/// Jobs whose files are kept ready.
const JOB_FILES_ENTRIES: usize = 64;

impl TaskRunner {
    /// Starts the task threads. Attempts' ends go to `ends`.
    pub fn start(
        sandbox: Arc<Sandbox>,
        fetcher: FetchCache,
        compiler: ModuleCompiler,
        settings: RunnerSettings,
        ends: Arc<EndBuffer>,
    ) -> Arc<Self> {
        let RunnerSettings {
            files_root,
            threads,
            max_log_bytes,
            blocks,
            inline_result_bytes,
            driver_link,
            egress_allow,
        } = settings;
        // Unbounded is safe here: the driver never launches more than our cores' worth.
        let (queue, work) = crossbeam_channel::unbounded::<Work>();
        let runner = Arc::new(TaskRunner {
            sandbox,
            fetcher,
            compiler,
            modules: Mutex::default(),
            job_files: Mutex::new(LruCache::new(
                NonZeroUsize::new(JOB_FILES_ENTRIES).expect("non-zero"),
            )),
            files_root,
            queue,
            attempts: Mutex::new(AttemptMap::default()),
            ends,
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
            driver_link,
            networks: Networks::new(egress_allow),
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
        runner
    }

    /// Accepts a task; its status will be reported when it ends, however it ends.
    pub fn launch(self: &Arc<Self>, desc: TaskDescription) {
        let live = Arc::new(Live {
            attempt: desc.attempt,
            generation: desc.generation,
            kill: Kill::new(),
            started_at_us: AtomicU64::new(0),
        });
        {
            let mut attempts = self.lock_attempts();
            match attempts.get_mut(&desc.task) {
                Some(held) => held.push(live.clone()),
                None => {
                    attempts.insert(desc.task.clone(), smallvec::smallvec![live.clone()]);
                }
            }
        }
        // A deterministic task's pins are gathered on the way (below).
        if desc.job.files.is_empty()
            && desc.job.determinism.is_none()
            && matches!(desc.input, TaskInput::Inline(_))
            && let Some(compiled) = self.ready_module(&desc.job.module)
        {
            self.enqueue(desc, compiled, None, live, (0, None));
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
                    // The driver makes a waiting task's input before launching it; a
                    // driver that did not is the host's fault, not the guest's.
                    TaskInput::Upstream(upstream) => {
                        return Err(TaskFailure::new(
                            FailureKind::HostError,
                            format!("the input {upstream:?} is results still to come"),
                        ));
                    }
                }
                let kind = EngineKind::of(desc.job.determinism.is_some());
                let (digest, compiled) = runner.resolve_module(&desc.job.module, kind).await?;
                let files = match desc.job.files.is_empty() {
                    true => None,
                    false => Some(runner.job_files(&desc).await?),
                };
                let pins = match desc.job.determinism {
                    None => None,
                    Some(_) => Some(prepare::pins(&desc, digest, files.as_deref())?),
                };
                Ok::<_, TaskFailure>((compiled, files, pins))
            };
            // A kill reaches the attempt while its module, input and files are still
            // being fetched (each up to the fetch deadline): the fetches are dropped and
            // its core is given back at once.
            let (ready, fetched) = FETCHED
                .scope(std::cell::Cell::new(0), async {
                    let ready = tokio::select! {
                        biased;
                        ready = ready => ready.map(Some),
                        () = live.kill.killed() => Ok(None),
                    };
                    (ready, FETCHED.with(std::cell::Cell::get))
                })
                .await;
            match ready {
                Ok(Some((compiled, files, pins))) => {
                    runner.enqueue(desc, compiled, files, live, (fetched, pins))
                }
                Ok(None) => {
                    let failure = TaskFailure::new(
                        FailureKind::Killed,
                        "killed while its module and inputs were being fetched",
                    );
                    runner.report_unrun_async(desc, failure, fetched).await
                }
                Err(failure) => runner.report_unrun_async(desc, failure, fetched).await,
            }
        });
    }

    /// Interrupts an attempt. A queued one ends as killed when its turn comes; a running
    /// one at the next epoch tick.
    pub fn kill(&self, task: &TaskId, attempt: u32) {
        if let Some(held) = self.lock_attempts().get(task) {
            for live in held.iter().filter(|live| live.attempt == attempt) {
                live.kill.kill();
            }
        }
    }

    pub fn kill_all(&self) {
        for live in self.lock_attempts().values().flatten() {
            live.kill.kill();
        }
    }

    pub fn attempts_in_flight(&self) -> usize {
        self.lock_attempts().values().map(|held| held.len()).sum()
    }

    fn enqueue(
        &self,
        desc: TaskDescription,
        compiled: Arc<Compiled>,
        files: Option<Arc<JobFiles>>,
        live: Arc<Live>,
        (fetched, pins): (u64, Option<Box<Pins>>),
    ) {
        let work = Work {
            desc,
            compiled,
            files,
            live,
            fetched,
            pins,
        };
        if let Err(crossbeam_channel::SendError(work)) = self.queue.send(work) {
            let failure = TaskFailure::new(FailureKind::HostError, "executor is shutting down");
            self.report_unrun(work.desc, failure, work.fetched, false);
        }
    }

    /// Runs one task; `more_queued` says whether this thread has another waiting.
    fn run(&self, work: Work, more_queued: bool) {
        let Work {
            mut desc,
            compiled,
            files,
            live,
            fetched,
            pins,
        } = work;
        if live.kill.is_killed() {
            let failure = TaskFailure::new(FailureKind::Killed, "killed before it started");
            return self.report_unrun(desc, failure, fetched, more_queued);
        }
        let egress = match self.networks.egress(desc.job.network.as_ref()) {
            Ok(egress) => egress,
            Err(failure) => return self.report_unrun(desc, failure, fetched, more_queued),
        };
        let started_at_us = now_us();
        live.started_at_us.store(started_at_us, Ordering::Relaxed);
        let cpu = AttemptCpu::start();
        // The job's variables under the task's, except the `FLINT_*` ones, which a job
        // cannot set. Borrowed, not copied: a launch's strings go to WASI as they are.
        let job = desc.job.clone();
        let (task_args, task_env) = (
            std::mem::take(&mut desc.args),
            std::mem::take(&mut desc.env),
        );
        // A name the task sets too is given once, with the task's value: a guest's
        // `getenv` takes the first of two, which was the job's.
        let overridden: Option<std::collections::HashSet<&str>> =
            (!task_env.is_empty()).then(|| task_env.iter().map(|(k, _)| k.as_str()).collect());
        let env: smallvec::SmallVec<[(&str, &str); 8]> = (job.env.iter())
            .filter(|(k, _)| overridden.as_ref().is_none_or(|o| !o.contains(k.as_str())))
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
            input @ (TaskInput::Fetch(_) | TaskInput::Parts(_) | TaskInput::Upstream(_)) => {
                let failure = TaskFailure::new(
                    FailureKind::HostError,
                    format!("input {input:?} was not fetched before the task ran"),
                );
                return self.report_unrun(desc, failure, fetched, more_queued);
            }
        };
        let resources = desc.resources;
        let input_bytes = stdin.len() as u64;
        let seed = job.determinism.map(|d| d.task_seed(desc.task.index));
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
                    kill: live.kill.clone(),
                    fuel: resources.fuel,
                    seed,
                    files_dir: files.as_ref().map(|f| f.dir.as_path()),
                    result_target: self.blocks.as_ref().map(|writer| ResultTarget {
                        writer: writer.clone(),
                        task: desc.task.clone(),
                        attempt: desc.attempt,
                        generation: desc.generation,
                        inline_max: self.inline_result_bytes,
                    }),
                    egress,
                },
            )
        };
        let report = reporting::caught(run);
        let mut report = report;
        report.usage.cpu_us = cpu.spent_us();
        report.usage.input_bytes = input_bytes;
        report.usage.fetched_bytes = fetched;
        report.pins = pins;
        self.keep_tape(&desc, &mut report, &|| live.kill.is_killed());
        self.report(desc, started_at_us, report, more_queued);
    }

    fn lock_attempts(&self) -> std::sync::MutexGuard<'_, AttemptMap> {
        self.attempts.lock().expect("attempts lock poisoned")
    }
}
