//! The executor's task path without its connection: a [`TaskRunner`] fed in-process,
//! module compiled and preloaded, ends drained as the executor's writer drains them and
//! acknowledged a batch at a time, as a driver does after its commit.
//! It is the executor-only floor that `flint bench` prints beside the whole system, and
//! the runner figure of the `task_cost` bench.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_fetch_cache::{FetchCache, FetchOptions};
use flint_protocol::{
    Digest, ExecutorMessage, JobId, JobTemplate, ModuleRef, Resources, TaskDescription, TaskInput,
    TaskLaunch,
};
use tokio::sync::mpsc;

use crate::compiler::{CompilerMode, ModuleCompiler};
use crate::ends::{Budgets, EndBuffer};
use crate::runner::{RunnerSettings, TaskRunner};
use crate::sandbox::{Sandbox, SandboxConfig};

/// Launches kept ahead of finished tasks in [`LocalRunner::throughput`]: deep enough that
/// a task thread never waits for its next launch, so the figure is per-task cost.
const AHEAD: u32 = 256;

pub struct LocalRunner {
    runner: Arc<TaskRunner>,
    ends: Arc<EndBuffer>,
    statuses: mpsc::UnboundedReceiver<ExecutorMessage>,
    module: ModuleRef,
    args: Vec<String>,
    /// Distinct job ids per measurement, so attempts never collide in the runner.
    jobs: u64,
    _dir: tempfile::TempDir,
}

impl LocalRunner {
    /// A runner of `threads` task threads with `compiled` ready under `digest`, running
    /// every task with `args`. Its calls block: use it from a plain thread (or
    /// `spawn_blocking`) inside a tokio runtime, which launches that need fetching use.
    pub fn new(
        sandbox: Arc<Sandbox>,
        config: SandboxConfig,
        threads: usize,
        wasm: &[u8],
        args: Vec<String>,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let fetcher = FetchCache::open(dir.path().join("cache"), FetchOptions::default())?;
        let compiler = ModuleCompiler::new(
            sandbox.clone(),
            config,
            dir.path().join("compiled"),
            CompilerMode::InProcess,
        )?;
        let compiled = sandbox
            .compile(wasm)
            .map_err(|f| anyhow::anyhow!("compiling the module: {}", f.message))?;
        let ends = EndBuffer::open(dir.path().join("ends"), Budgets::default())?;
        let (outbox, statuses) = mpsc::unbounded_channel();
        ends.attach(outbox);
        let runner = TaskRunner::start(
            sandbox,
            fetcher,
            compiler,
            RunnerSettings {
                files_root: dir.path().join("files"),
                threads,
                max_log_bytes: 1 << 20,
                blocks: None,
                inline_result_bytes: usize::MAX,
                driver_link: None,
                egress_allow: Arc::default(),
            },
            ends.clone(),
        );
        let digest = Digest::of(wasm);
        let module = ModuleRef {
            digest: Some(digest),
            url: "http://unused.invalid/".into(),
            timestamp_ms: 0,
            size: None,
        };
        runner.preload(&module, digest, compiled);
        Ok(LocalRunner {
            runner,
            ends,
            statuses,
            module,
            args,
            jobs: 0,
            _dir: dir,
        })
    }

    /// The descriptions of one job of `tasks` tasks, last first (ready to `pop`).
    fn job(&mut self, tasks: u32) -> Vec<TaskDescription> {
        self.jobs += 1;
        let job = Arc::new(JobTemplate {
            key: self.jobs,
            job: JobId(format!("local-{}", self.jobs)),
            task_count: tasks,
            name: "local".into(),
            module: self.module.clone(),
            files: vec![],
            args: self.args.clone(),
            env: vec![],
            resources: Resources::default(),
            determinism: None,
            network: None,
        });
        (0..tasks)
            .rev()
            .map(|index| {
                TaskDescription::new(
                    job.clone(),
                    TaskLaunch {
                        job: job.key,
                        index,
                        attempt: 1,
                        generation: 1,
                        args: vec![],
                        env: vec![],
                        input: TaskInput::Inline(Vec::new()),
                        resources: None,
                        pins: None,
                    },
                )
            })
            .collect()
    }

    /// Wall time of `tasks` tasks with [`AHEAD`] launches kept queued. The descriptions
    /// are built before the clock starts: the figure is the runner's, not ours.
    pub fn throughput(&mut self, tasks: u32) -> anyhow::Result<Duration> {
        let mut descriptions = self.job(tasks);
        let started = Instant::now();
        let (mut launched, mut done) = (0, 0);
        while done < tasks {
            while launched < tasks && launched - done < AHEAD {
                self.runner
                    .launch(descriptions.pop().expect("one per task"));
                launched += 1;
            }
            done += self.drain()?;
        }
        Ok(started.elapsed())
    }

    /// One task from launch to its status, `jobs` times over: the executor's share of a
    /// single-task job's round trip.
    pub fn round_trips(&mut self, jobs: usize) -> anyhow::Result<Vec<Duration>> {
        let mut times = Vec::with_capacity(jobs);
        for _ in 0..jobs {
            let desc = self.job(1).pop().expect("one task");
            let started = Instant::now();
            self.runner.launch(desc);
            while self.drain()? == 0 {}
            times.push(started.elapsed());
        }
        Ok(times)
    }

    /// Waits for an end, then takes whatever else is ready, as the executor's writer
    /// does: one wake-up serves every end that arrived meanwhile. Tasks that ended.
    fn drain(&mut self) -> anyhow::Result<u32> {
        let first = self
            .statuses
            .blocking_recv()
            .ok_or_else(|| anyhow::anyhow!("the task runner stopped"))?;
        let (mut done, mut last) = (0, 0);
        for message in
            std::iter::once(first).chain(std::iter::from_fn(|| self.statuses.try_recv().ok()))
        {
            if let ExecutorMessage::StatusUpdate { seq, status } = message {
                if let Err(failure) = &status.end.outcome {
                    anyhow::bail!("task {} failed: {failure:?}", status.task.index);
                }
                (done, last) = (done + 1, seq);
            }
        }
        self.ends.acknowledge(last);
        Ok(done)
    }
}
