//! `flint bench --restarts N`: the work a driver restart loses (issue 41). The executors
//! are `flint executor` processes that dialled in, so that they outlive the driver; the
//! driver is a `flint driver` process started again on the same ports and data dir, so
//! that they find it by themselves. One job of testkit `burn` tasks keeps every core busy
//! while the driver is SIGKILLed and started again N times: once with executors that kill
//! their tasks on losing the driver (`--driver-loss-grace-ms 0`, `before`), once with the
//! default grace (`after`: they keep running them, and the restarted driver adopts them).
//!
//! The work lost is CPU time, measured rather than assumed: what the executors' task
//! threads spent (every attempt, killed ones too) less what each task's succeeded attempt
//! spent. A killed attempt's CPU time is exactly the work it threw away (`burn` is a busy
//! wait: its CPU time is its work). The attempts' wall-clock spans would not do: a live
//! job's are not stored across a restart, so the restarted driver cannot say for how long
//! the attempts it never heard of ran.

mod cluster;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use flint_protocol::api::{ExecutorState, InputSpec, JobSpec, JobView, TaskView};

use super::args::BenchArgs;
use super::measure::ensure_succeeded;
use super::procfs::{cpu_model, num_cpus};
use crate::client::Client;
use cluster::Cluster;

/// How long after the job's end the executors' figures are read: past a heartbeat
/// (`HEARTBEAT_INTERVAL_MS`), so that every attempt's CPU time is in them.
const SETTLE: Duration = Duration::from_millis(1_500);
/// Longest the executors may take to register, and the first round of tasks to end.
const START_TIMEOUT: Duration = Duration::from_secs(120);

pub async fn run(args: &BenchArgs, restarts: u32, wasm: Vec<u8>) -> anyhow::Result<()> {
    let shape = Shape::of(args, restarts)?;
    println!(
        "flint bench --restarts {restarts}: {} executor(s) x {} core(s), one job of {} testkit `burn {}` tasks; once every core has run one, the driver is SIGKILLed and started again every {} ms",
        shape.executors,
        shape.cores,
        shape.tasks,
        shape.task.as_millis(),
        shape.interval.as_millis()
    );
    println!("  machine: {} cpus, {}", num_cpus(), cpu_model());
    println!(
        "  lost = the executors' task-thread CPU time (every attempt, killed ones too) - each task's succeeded attempt's"
    );
    let mut figures = Vec::new();
    for mode in [Mode::Before, Mode::After] {
        let dir = tempfile::tempdir()?;
        match one_mode(args, &shape, mode, dir.path(), &wasm).await {
            Ok(f) => figures.push((mode, f)),
            Err(e) => {
                let kept = dir.keep();
                return Err(e.context(format!(
                    "`{}` (the processes' logs are in {})",
                    mode.name(),
                    kept.display()
                )));
            }
        }
    }
    println!(
        "  {:>6}  {:>8}  {:>8}  {:>13}  {:>11}  {:>11}  {:>9}  {:>16}  {:>14}  {:>7}",
        "mode",
        "grace ms",
        "restarts",
        "useful task-s",
        "lost task-s",
        "per restart",
        "of useful",
        "attempts / tasks",
        "driver back ms",
        "job s"
    );
    for (mode, f) in &figures {
        f.print(*mode);
    }
    let (before, after) = (&figures[0].1, &figures[1].1);
    let ratio = match before.lost_s() > 0.0 {
        true => format!("{:.1e}", after.lost_s() / before.lost_s()),
        false => "n/a (before lost nothing)".into(),
    };
    println!("  work lost, after / before: {ratio}");
    Ok(())
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Before,
    After,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Before => "before",
            Mode::After => "after",
        }
    }

    fn grace_ms(self) -> u64 {
        match self {
            Mode::Before => 0,
            Mode::After => flint_protocol::defaults::DRIVER_LOSS_GRACE_MS,
        }
    }

    /// `before` asks for the old behaviour; `after` is an executor's default.
    fn executor_flags(self) -> &'static [&'static str] {
        match self {
            Mode::Before => &["--driver-loss-grace-ms", "0"],
            Mode::After => &[],
        }
    }
}

/// What the flags ask for, with the job's task count.
struct Shape {
    restarts: u32,
    executors: u32,
    cores: u32,
    task: Duration,
    interval: Duration,
    tasks: u32,
}

impl Shape {
    /// Enough tasks to keep every core busy through every restart: a round of tasks per
    /// core for each task time in the restarts' span, and two more (the round before the
    /// first kill, and one to end on).
    fn of(args: &BenchArgs, restarts: u32) -> anyhow::Result<Shape> {
        let span_ms = u64::from(restarts) * args.restart_interval_ms;
        let rounds = span_ms.div_ceil(args.restart_task_ms) + 2;
        let tasks = u64::from(args.executors * args.cores) * rounds;
        if tasks > 100_000 {
            bail!(
                "--restarts {restarts} of --restart-interval-ms {} with --restart-task-ms {} makes a job of {tasks} tasks: more than 100,000",
                args.restart_interval_ms,
                args.restart_task_ms
            );
        }
        Ok(Shape {
            restarts,
            executors: args.executors,
            cores: args.cores,
            task: Duration::from_millis(args.restart_task_ms),
            interval: Duration::from_millis(args.restart_interval_ms),
            tasks: tasks as u32,
        })
    }
}

/// One mode's figures.
struct Figures {
    restarts: u32,
    /// From each kill to the restarted driver's first `/healthz` answer, on average.
    back: Duration,
    /// The executors' task threads' CPU time, and the tasks' succeeded attempts'.
    spent_us: u64,
    useful_us: u64,
    /// Tasks whose succeeded attempt's CPU time was not seen, counted at the median.
    estimated: u32,
    attempts: u64,
    tasks: u32,
    job: Duration,
}

impl Figures {
    fn lost_s(&self) -> f64 {
        (self.spent_us as f64 - self.useful_us as f64) / 1e6
    }

    fn print(&self, mode: Mode) {
        let lost = self.lost_s();
        let useful = self.useful_us as f64 / 1e6;
        println!(
            "  {:>6}  {:>8}  {:>8}  {:>13.3}  {:>11.3}  {:>11.3}  {:>7.2} %  {:>16}  {:>14.0}  {:>7.1}",
            mode.name(),
            mode.grace_ms(),
            self.restarts,
            useful,
            lost,
            lost / f64::from(self.restarts.max(1)),
            100.0 * lost / useful.max(1e-9),
            format!("{} / {}", self.attempts, self.tasks),
            self.back.as_secs_f64() * 1e3,
            self.job.as_secs_f64()
        );
        if self.estimated > 0 {
            println!(
                "  {:>6}  ({} of {} tasks' succeeded attempts were not seen, ended in the moment between the last look and a kill: counted at the others' median)",
                "", self.estimated, self.tasks
            );
        }
    }
}

/// A fresh cluster in `dir`, the job, the restarts, and the figures.
async fn one_mode(
    args: &BenchArgs,
    shape: &Shape,
    mode: Mode,
    dir: &Path,
    wasm: &[u8],
) -> anyhow::Result<Figures> {
    let mut cluster = Cluster::start(args, shape, mode, dir).await?;
    let client = Client::new(&cluster.url);
    cluster
        .executors_when(&client, "register", |e| e.state == ExecutorState::Alive)
        .await?;
    let module = client.upload_module(wasm.to_vec()).await?;
    let spec = JobSpec {
        name: Some(format!("bench-restarts-{}", mode.name())),
        module: module.id.to_string(),
        args: vec!["burn".into(), shape.task.as_millis().to_string()],
        inputs: Some(vec![InputSpec::Text(String::new()); shape.tasks as usize]),
        ..JobSpec::default()
    };
    let submitted = Instant::now();
    let job = client.submit(&spec, None).await?.id.to_string();
    first_round(&client, &job, shape.executors * shape.cores).await?;

    let mut useful = UsefulWork::default();
    let mut back = Vec::new();
    let mut last = Instant::now();
    for _ in 0..shape.restarts {
        tokio::time::sleep_until((last + shape.interval).into()).await;
        if client.job(&job, None).await?.state.is_final() {
            break;
        }
        useful.note(&client.tasks(&job).await?);
        last = Instant::now();
        back.push(cluster.restart().await?);
    }
    let view = job_end(&client, &job).await?;
    ensure_succeeded(view.state, "the job")?;
    let job_time = submitted.elapsed();
    useful.note(&client.tasks(&job).await?);

    tokio::time::sleep(SETTLE).await;
    let executors = cluster
        .executors_when(&client, "report an idle heartbeat after the job", |e| {
            e.state == ExecutorState::Alive
                && e.tasks_active == 0
                && e.last_heartbeat_ms
                    .is_some_and(|ms| ms < SETTLE.as_millis() as u64)
        })
        .await?;
    let (useful_us, estimated) = useful.total(shape.tasks);
    let restarts = back.len() as u32;
    Ok(Figures {
        restarts,
        back: back.iter().sum::<Duration>() / restarts.max(1),
        spent_us: executors.iter().map(|e| e.task_cpu_us).sum(),
        useful_us,
        estimated,
        attempts: executors.iter().map(|e| e.tasks_completed).sum(),
        tasks: shape.tasks,
        job: job_time,
    })
}

/// Until every core has run a task of the job: the module is compiled and from here the
/// cores are busy (the next tasks are launched ahead), so a kill lands mid-task.
async fn first_round(client: &Client, job: &str, cores: u32) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let view = client.job(job, None).await?;
        if view.counts.succeeded >= cores {
            return Ok(());
        }
        anyhow::ensure!(
            !view.state.is_final(),
            "the job ended {:?} before the restarts",
            view.state
        );
        anyhow::ensure!(
            started.elapsed() < START_TIMEOUT,
            "{cores} tasks did not end in {START_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The job's view once it has ended.
async fn job_end(client: &Client, job: &str) -> anyhow::Result<JobView> {
    loop {
        let view = client.job(job, Some(Duration::from_secs(60))).await?;
        if view.state.is_final() {
            return Ok(view);
        }
    }
}

/// Each task's succeeded attempt's CPU time, as seen so far. A driver knows what an
/// attempt used only from the executor's report, and keeps it in memory with the job: a
/// restarted driver has the tasks that ended before it started, not what they used. So
/// the tasks are read just before every kill, and once more at the end.
#[derive(Default)]
struct UsefulWork {
    cpu_us: HashMap<u32, u64>,
}

impl UsefulWork {
    fn note(&mut self, tasks: &[TaskView]) {
        for task in tasks {
            let succeeded = (task.history.iter())
                .find(|a| a.outcome.as_deref() == Some("succeeded"))
                .and_then(|a| a.usage.as_ref());
            if let Some(usage) = succeeded {
                self.cpu_us.entry(task.index).or_insert(usage.cpu_us);
            }
        }
    }

    /// The sum over `tasks` tasks, and how many of them were not seen: those whose end
    /// was committed between the last look and a kill, counted at the median of the rest.
    fn total(&self, tasks: u32) -> (u64, u32) {
        let mut seen: Vec<u64> = self.cpu_us.values().copied().collect();
        seen.sort_unstable();
        let median = seen.get(seen.len() / 2).copied().unwrap_or(0);
        let unseen = tasks.saturating_sub(seen.len() as u32);
        (
            seen.iter().sum::<u64>() + median * u64::from(unseen),
            unseen,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flint_protocol::ExecutorId;
    use flint_protocol::api::{TaskAttemptView, TaskState};
    use flint_protocol::usage::Usage;

    fn task(index: u32, attempts: &[(&str, u64)]) -> TaskView {
        let history = attempts
            .iter()
            .enumerate()
            .map(|(n, (outcome, cpu_us))| TaskAttemptView {
                attempt: n as u32 + 1,
                executor: ExecutorId("exec-0".into()),
                memory_mb: 0,
                timeout_ms: 0,
                outcome: Some(outcome.to_string()),
                speculative: false,
                usage: Some(Usage {
                    cpu_us: *cpu_us,
                    ..Usage::default()
                }),
                pins: None,
            });
        TaskView {
            index,
            state: TaskState::Succeeded,
            attempts: attempts.len() as u32,
            executor: None,
            exit_code: None,
            error: None,
            result: None,
            started_at: None,
            finished_at: None,
            usage: None,
            history: history.collect(),
            memoized_from: None,
        }
    }

    #[test]
    fn useful_work_is_each_tasks_succeeded_attempt_and_the_median_for_those_not_seen() {
        let mut useful = UsefulWork::default();
        useful.note(&[
            task(0, &[("lost", 700), ("succeeded", 2_000)]),
            task(1, &[]),
        ]);
        // A later look (another driver) does not count a task twice.
        useful.note(&[
            task(0, &[("succeeded", 9_999)]),
            task(2, &[("succeeded", 2_100)]),
        ]);
        useful.note(&[task(3, &[("succeeded", 1_900)])]);
        assert_eq!(useful.total(4), (2_000 + 2_100 + 1_900 + 2_000, 1));
        assert_eq!(useful.total(3), (6_000, 0));
    }

    #[test]
    fn the_job_keeps_every_core_busy_through_the_restarts() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Bench {
            #[command(flatten)]
            args: BenchArgs,
        }
        let args = Bench::parse_from(["bench", "--restarts=20", "--executors=2", "--cores=2"]).args;
        let shape = Shape::of(&args, 20).unwrap();
        // 20 x 3 s of restarts is 30 rounds of 2 s tasks, and two more, on 4 cores.
        assert_eq!(shape.tasks, 4 * 32);
        let args = Bench::parse_from([
            "bench",
            "--restarts=2",
            "--restart-task-ms=500",
            "--restart-interval-ms=700",
        ])
        .args;
        assert_eq!(Shape::of(&args, 2).unwrap().tasks, 2 * (3 + 2));
    }
}
