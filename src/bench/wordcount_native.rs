//! The wordcount graph's baseline: the same two guests run by wasmtime in this process,
//! through the sandbox the executors run every task in (the same engine, limits and
//! WASI world), with no driver, no wire and no fetch: the maps on as many threads as the
//! cluster has cores, each reading its slice from the file the cluster's map task
//! fetches, then the reduce over their results concatenated in task order, as a
//! `results` input is.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flint_executor::sandbox::{
    Compiled, Kill, Sandbox, SandboxConfig, TASK_THREAD_STACK, TaskEnv, TaskRun,
};
use flint_protocol::TaskResult;
use flint_protocol::defaults::{
    TASK_MAX_LOG_BYTES, TASK_MAX_OUTPUT_BYTES, TASK_MEMORY_MB, TASK_TIMEOUT_MS,
};

/// A task's result and its guest's wall time (us).
type Output = (Vec<u8>, u64);

/// The two guests compiled, ready to run.
pub struct Native {
    sandbox: Sandbox,
    map: Compiled,
    reduce: Compiled,
    threads: usize,
}

/// One run: from its start to the end of the last map, and to the reduce's end; the
/// guests' own time (instantiation to end) summed over the maps, and the reduce's.
pub struct NativeRun {
    pub maps: Duration,
    pub elapsed: Duration,
    pub map_guests: Duration,
    pub reduce_guest: Duration,
    pub result: Vec<u8>,
}

impl Native {
    /// Compiles both guests (not timed: the cluster's warm-up compiles them there too)
    /// and runs each once on a few words, so that no first-use cost lands in a run.
    pub fn new(map: &[u8], reduce: &[u8], threads: usize) -> anyhow::Result<Native> {
        let config = SandboxConfig {
            slots: threads as u32,
            max_memory_bytes: (crate::flags::MAX_MEMORY_MB as usize) << 20,
            fuel: false,
        };
        let sandbox = Sandbox::new(config)?;
        let compile = |wasm: &[u8]| {
            (sandbox.compile(wasm)).map_err(|f| anyhow::anyhow!("compiling: {}", f.message))
        };
        let (map, reduce) = (compile(map)?, compile(reduce)?);
        let native = Native {
            sandbox,
            map,
            reduce,
            threads,
        };
        let dir = tempfile::tempdir()?;
        let files: Vec<PathBuf> = (0..threads)
            .map(|i| dir.path().join(format!("warm-{i}.txt")))
            .collect();
        for file in &files {
            std::fs::write(file, "warm up the word count guests")?;
        }
        native.run(&files)?;
        Ok(native)
    }

    /// The maps over `files`, one task each, then the reduce. Blocks.
    pub fn run(&self, files: &[PathBuf]) -> anyhow::Result<NativeRun> {
        let outputs: Vec<Mutex<Option<Output>>> = files.iter().map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        let started = Instant::now();
        std::thread::scope(|scope| {
            let worker = || -> anyhow::Result<()> {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(file) = files.get(i) else {
                        return Ok(());
                    };
                    let input = std::fs::read(file)
                        .with_context(|| format!("reading {}", file.display()))?;
                    let output = self.task(&self.map, i, files.len(), input)?;
                    *outputs[i].lock().expect("a map thread panicked") = Some(output);
                }
            };
            let threads = (0..self.threads)
                .map(|_| on_task_thread(scope, worker))
                .collect::<std::io::Result<Vec<_>>>()?;
            for thread in threads {
                thread
                    .join()
                    .map_err(|_| anyhow::anyhow!("a map thread panicked"))??;
            }
            anyhow::Ok(())
        })?;
        let maps = started.elapsed();
        let (mut input, mut map_guests) = (Vec::new(), 0);
        for output in outputs {
            let (bytes, wall_us) = (output.into_inner())
                .expect("the map threads have ended")
                .context("a map without a result")?;
            input.extend_from_slice(&bytes);
            map_guests += wall_us;
        }
        let (result, reduce_us) = std::thread::scope(|scope| {
            on_task_thread(scope, || self.task(&self.reduce, 0, 1, input))?
                .join()
                .map_err(|_| anyhow::anyhow!("the reduce thread panicked"))?
        })?;
        Ok(NativeRun {
            maps,
            elapsed: started.elapsed(),
            map_guests: Duration::from_micros(map_guests),
            reduce_guest: Duration::from_micros(reduce_us),
            result,
        })
    }

    /// One task with a task's default limits: its result and the guest's wall time.
    fn task(
        &self,
        compiled: &Compiled,
        index: usize,
        count: usize,
        stdin: Vec<u8>,
    ) -> anyhow::Result<Output> {
        let report = self.sandbox.run(
            compiled,
            TaskRun {
                args: &[],
                env: &[],
                task: TaskEnv {
                    job: "native",
                    index: index as u32,
                    count: count as u32,
                    attempt: 1,
                },
                stdin,
                memory_bytes: (TASK_MEMORY_MB as usize) << 20,
                timeout: Duration::from_millis(TASK_TIMEOUT_MS),
                max_output_bytes: TASK_MAX_OUTPUT_BYTES as usize,
                max_log_bytes: TASK_MAX_LOG_BYTES as usize,
                kill: Kill::new(),
                fuel: None,
                seed: None,
                files_dir: None,
                result_target: None,
                egress: Default::default(),
            },
        );
        match report.outcome {
            Ok(TaskResult::Inline(bytes)) => Ok((bytes, report.usage.wall_us)),
            Ok(TaskResult::Block(_)) => bail!("task {index}: a block result, with no block store"),
            Err(failure) => bail!(
                "task {index} in-process: {}: {}; its log: {}",
                failure.kind,
                failure.message,
                String::from_utf8_lossy(&report.log)
            ),
        }
    }
}

/// A thread with a task thread's stack, as the sandbox needs.
fn on_task_thread<'scope, T: Send + 'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    f: impl FnOnce() -> T + Send + 'scope,
) -> std::io::Result<std::thread::ScopedJoinHandle<'scope, T>> {
    std::thread::Builder::new()
        .stack_size(TASK_THREAD_STACK)
        .spawn_scoped(scope, f)
}
